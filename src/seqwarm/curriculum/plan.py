"""The whole run ahead of time: step -> length, tokens, learning rate; when it stops.

The plan replays exactly what the engine does (same pure functions: ``difficulty_at``, ``advance``,
``lr_at``, ``should_stop``), so what ``seqwarm plan`` prints is what training will do — up to the
token counts of ``count_tokens_by: loss_mask`` runs, which depend on the data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from seqwarm.curriculum.checks import CUSTOM
from seqwarm.curriculum.clock import Progress, advance, bucket_length, micro_batch_shape, stop_reason
from seqwarm.curriculum.lr import (
    LRConfig,
    decay_tokens_from_iters,
    decay_tokens_from_samples,
    lr_at,
    warmup_iters_from_tokens,
    warmup_samples_from_tokens,
)
from seqwarm.curriculum.plan_stages import LengthUse, StagePlan, StageWalk, eval_rows, model_length
from seqwarm.curriculum.run import PlanSettings
from seqwarm.curriculum.schedule import CurriculumConfig, difficulty_at
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError, Problem
from seqwarm.util.units import human_count

MAX_PLAN_STEPS = 50_000_000
WARMUP_CURRICULUM_RATIO = 30
MANY_PASSES = 4
"""Passes over the training data past which the budget gets a warning: up to about 4 epochs, repeated
data trains about as well as new data (Muennighoff et al., *Scaling Data-Constrained Language Models*,
2023); beyond that, returns fall fast and a small model memorizes a small corpus."""


@dataclass(frozen=True)
class PlanPoint:
    """The first step at a new length (and the run's last step)."""

    step: int
    seqlen: int
    tokens_per_step: int
    tokens: int
    """Tokens trained by the end of this step."""
    lr: float


@dataclass
class Plan:
    total_steps: int
    total_tokens: int
    total_samples: int
    stop_reason: str
    curriculum_end_step: int | None
    """First step at max_difficulty (None without a curriculum, or if the run ends before)."""
    tokens_at_curriculum_end: int | None
    """Tokens trained before the first full-length step."""
    warmup_end_step: int | None
    warmup_end_tokens: int | None
    points: list[PlanPoint] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    conversions: dict[str, int] = field(default_factory=dict)
    """DeepSpeed's curriculum-learning tutorial's unit conversions for the settings given, e.g. lr_decay_tokens."""
    shapes: list[tuple[int, int]] = field(default_factory=list)
    """The distinct ``(rows, columns)`` of the training micro-batches the model is given (per rank), in order
    of first use (:func:`train_shapes`)."""
    val_shape: tuple[int, int] | None = None
    """``(rows, columns)`` of a validation micro-batch: always at full length."""
    compiles: int = 0
    """Graphs ``--compile`` traces for the training steps and validation (:func:`compile_count`)."""
    compiles_why: str = ""
    """What :attr:`compiles` counts, in words."""
    stages: list[StagePlan] = field(default_factory=list)
    """The stages after the warmup (:mod:`~seqwarm.curriculum.plan_stages`): first step, tokens, rows, positions."""
    lengths: list[LengthUse] = field(default_factory=list)
    """Steps and tokens trained at each length, in order of first use."""
    problems: list[Problem] = field(default_factory=list)
    """What makes the schedule wrong (a stage that begins before the warmup ends); ``make_plan(check=True)``
    raises them as one ConfigError."""
    warmup_reached: float | None = None
    """With an LR warmup the run stops before finishing: the share of the peak LR reached at its last
    step (None when there is no warmup or it ends)."""
    steps: list[int] = field(default_factory=list, repr=False)
    seqlens: list[int] = field(default_factory=list, repr=False)
    cum_tokens: list[int] = field(default_factory=list, repr=False)
    lrs: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("steps", "seqlens", "cum_tokens", "lrs")}
        out["problems"] = [str(p) for p in self.problems]
        return out


@dataclass(frozen=True)
class LoopSettings:
    """What :func:`make_plan` reads, for a loop configured by keywords rather than a config file: build it
    with :meth:`of`, or let :meth:`SequenceLengthWarmup.plan <seqwarm.curriculum.warmup.SequenceLengthWarmup.plan>`
    do (a :class:`~seqwarm.curriculum.run.PlanSettings`)."""

    full_length: int | None
    curriculum: CurriculumConfig | None
    lr: LRConfig
    train_tokens: int | None
    train_iters: int | None
    train_samples: int | None
    train_batch_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int = 1
    length_bucket: int | None = None
    document_masking: bool = False
    rampup_batch_size: Any = None
    warnings: tuple[str, ...] = ()
    stages: tuple[Any, ...] = ()
    stages_path: str = "stages"
    stage_windows: bool = False
    """False: the loop's own batches are cut to a stage's length, its rows kept (``seqwarm train`` reads a
    stage's windows at its length, with the micro-batch's tokens kept)."""

    @classmethod
    def of(
        cls,
        curriculum: CurriculumConfig | None,
        lr: LRConfig | None,
        budget: Any,
        batch_size: int,
        micro_batch_size: int | None = None,
        seq_length: int | None = None,
        length_bucket: int | None = None,
        mode: str | None = None,
        stages: tuple[Any, ...] = (),
    ) -> LoopSettings:
        """``budget``: ``train_tokens`` / ``train_iters`` / ``train_samples`` attributes; ``batch_size``:
        sequences per optimizer step (all ranks, all micro-batches), ``micro_batch_size`` rows per cut (it
        divides ``batch_size``; default ``batch_size``; reshape drops a partial row per cut); ``seq_length``:
        default the curriculum's top; ``mode``: how the length reaches the model (default the curriculum's);
        ``stages``: checked :class:`~seqwarm.curriculum.stages.StageConfig`."""
        if curriculum is not None and mode is not None:
            curriculum = replace(curriculum, mode=mode)
        micro = batch_size if micro_batch_size is None else micro_batch_size
        for name, value in (("batch_size", batch_size), ("micro_batch_size", micro)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"plan(): {name} must be an int >= 1, got {value!r}")
        if batch_size % micro:
            raise ValueError(f"plan(): micro_batch_size {micro} does not divide batch_size {batch_size}")
        full = seq_length if seq_length is not None else curriculum.max_difficulty if curriculum else None
        return cls(
            full_length=full,
            curriculum=curriculum,
            lr=lr if lr is not None else LRConfig(),
            train_tokens=budget.train_tokens,
            train_iters=budget.train_iters,
            train_samples=budget.train_samples,
            train_batch_size=batch_size,
            micro_batch_size=micro,
            gradient_accumulation_steps=batch_size // micro,
            length_bucket=length_bucket,
            stages=tuple(stages),
        )


def make_plan(cfg: PlanSettings, *, keep_series: bool = False, check: bool = True) -> Plan:
    """Simulate the run's clock until it stops (or, with no budget, until the curriculum ends and the last
    stage begins). ``cfg``: a run config (``seqwarm plan``'s), or :class:`LoopSettings` for a loop configured
    by keywords (``SequenceLengthWarmup.plan``). ``check``: raise :attr:`Plan.problems` as one ConfigError
    (False: leave them in the plan, for a caller that shows the plan first)."""
    if cfg.full_length is None:
        raise UserError("the full sequence length is unknown: set seq_length (--seq-length) or a curriculum")
    cur = cfg.curriculum
    if cur is not None and cur.schedule_type == CUSTOM:
        raise UserError("a custom schedule is a Python function: it cannot be planned from a config file")
    no_budget = cfg.train_tokens is None and cfg.train_iters is None and cfg.train_samples is None
    stages = tuple(getattr(cfg, "stages", ()) or ())
    if no_budget and cur is None and not stages:
        raise UserError("nothing to plan: give a budget (--train-tokens, --train-iters or --train-samples)")
    walk = StageWalk(cfg, stages, getattr(cfg, "stages_path", "seqwarm.stages"))
    warnings: list[str] = []
    full = cfg.full_length
    progress = Progress()
    plan = Plan(0, 0, 0, "", None, None, None, None, warnings=warnings)
    prev_len = None
    current = cur.min_difficulty if cur else full
    while True:
        step = progress.step + 1
        if cur is not None and current < cur.max_difficulty:  # the scheduler's update rule
            current = difficulty_at(step, cur)
        before = progress.tokens
        seqlen = walk.length(step, before, current)  # a stage's length from its start on
        samples, tps = walk.step_size(seqlen)  # a stage's rows are read at its length
        walk.count(seqlen, tps)
        progress = advance(progress, samples, tps, cfg.lr)
        lr = lr_at(progress, cfg.lr)
        if cur is not None and plan.curriculum_end_step is None and current >= cur.max_difficulty:
            plan.curriculum_end_step = step
            plan.tokens_at_curriculum_end = before
        if plan.warmup_end_step is None and progress.warmup_end_tokens is not None:
            plan.warmup_end_step = step if cfg.lr.warmup_unit else 0
            plan.warmup_end_tokens = progress.warmup_end_tokens
        if seqlen != prev_len:
            plan.points.append(PlanPoint(step, seqlen, tps, progress.tokens, lr))
            prev_len = seqlen
        if keep_series:
            plan.steps.append(step)
            plan.seqlens.append(seqlen)
            plan.cum_tokens.append(progress.tokens)
            plan.lrs.append(lr)
        reason = stop_reason(progress, cfg)
        ended = cur is None or plan.curriculum_end_step is not None
        if reason is None and no_budget and ended and (not stages or walk.plans[-1].step is not None):
            reason = (
                f"no budget given: planned to the {'start of the last stage' if stages else 'end of the curriculum'}"
            )
        if reason is not None:
            break
        if step >= MAX_PLAN_STEPS:
            raise UserError(f"the run would take more than {MAX_PLAN_STEPS:,} steps; check the budget and batch size")
    if plan.points[-1].step != progress.step:
        plan.points.append(PlanPoint(progress.step, seqlen, tps, progress.tokens, lr))
    plan.total_steps, plan.total_tokens, plan.total_samples = progress.step, progress.tokens, progress.samples
    plan.stop_reason = reason
    plan.conversions = conversions(cfg)
    lengths = list(dict.fromkeys(p.seqlen for p in plan.points))  # distinct, in order of first use
    ranks = cfg.gradient_accumulation_steps * cfg.world_size
    staged = {s.length: (s.rows_per_step // ranks, s.length) for s in walk.plans if s.step is not None}
    plan.shapes = train_shapes(cfg, lengths, staged)
    plan.val_shape = (eval_rows(cfg), model_length(cfg))  # validation: at the longest length the run trains
    plan.compiles, plan.compiles_why = compile_count(cfg, lengths, staged)
    if cfg.lr.warmup_unit and plan.warmup_end_step is None and not no_budget:
        plan.warmup_reached = lr / cfg.lr.lr if cfg.lr.lr else 0.0
    plan.stages, plan.lengths, plan.problems = walk.plans, list(walk.uses.values()), walk.problems
    plan.warnings += walk.warnings(plan.total_steps, plan.total_tokens)
    _plan_warnings(cfg, plan, no_budget=no_budget)
    if check and plan.problems:
        raise ConfigError(plan.problems)
    return plan


def _step_shape(cfg: PlanSettings, seqlen: int, staged: dict | None = None) -> tuple[int, int]:
    """``(rows, columns)`` of one micro-batch at ``seqlen`` as the model is given it: the mode's cut
    (:func:`~seqwarm.curriculum.clock.micro_batch_shape`), or with a length bucket the length rounded up to
    the bucket (the loss masked past it). Inject mode: the loop hands the model the first L columns.
    ``staged``: a stage's ``(rows, length)`` by its length (its windows are read at that length)."""
    if staged and seqlen in staged:
        return staged[seqlen]
    full = cfg.full_length
    if cfg.curriculum is None:
        return cfg.micro_batch_size, full
    rows, columns = micro_batch_shape(cfg.micro_batch_size, full, seqlen, cfg.curriculum.mode)
    if cfg.length_bucket:
        columns = bucket_length(seqlen, cfg.length_bucket, full)
    return rows, columns


def train_shapes(cfg: PlanSettings, seqlens: list[int], staged: dict | None = None) -> list[tuple[int, int]]:
    """The distinct ``(rows, columns)`` micro-batch shapes of training steps at the lengths ``seqlens``, in
    order of first use: truncate and inject keep the rows; reshape re-chunks them (``rows * S // L`` rows);
    window keeps ``(rows, S)`` at every length; a length bucket rounds the columns up to its multiples."""
    return list(dict.fromkeys(_step_shape(cfg, length, staged) for length in seqlens))


def _inputs(cfg: PlanSettings, seqlen: int) -> frozenset[str]:
    """The optional inputs the loop passes at ``seqlen`` beyond ``input_ids`` / ``labels``, with the default
    data (positions ``0..S-1`` in every window, a loss mask of ones): the feed leaves a trivial
    ``position_ids`` / ``loss_mask`` out (``seqwarm.trainer.feed.lean_batch``), so a length at which one
    turns trivial calls the model with other arguments, which Dynamo traces apart."""
    cur, full = cfg.curriculum, cfg.full_length
    if cur is not None and cur.mode == "window":  # at every length, the full length too: the loop keeps
        return frozenset({"document_ids", "position_ids"})  # window's positions even where they are trivial
    if cur is None or seqlen >= full:
        keys: set[str] = set()
    elif cfg.length_bucket:
        keys = {"loss_mask"} if bucket_length(seqlen, cfg.length_bucket, full) > seqlen else set()
    elif cur.mode == "reshape":
        keys = {"position_ids"} if full % seqlen else set()  # rows across two windows restart their ids
    else:
        keys = set()
    if cfg.document_masking:  # document ids always, positions restarting at every document
        keys |= {"document_ids", "position_ids"}
    return frozenset(keys)


def compile_count(cfg: PlanSettings, seqlens: list[int], staged: dict | None = None) -> tuple[int, str]:
    """Graphs ``--compile`` (``torch.compile`` of seqwarm's GPT, Dynamo's default ``dynamic=None``) traces for
    training at ``seqlens`` and full-length validation, and why.

    What the code does: the engine marks dim 1 (the length) of every training input
    ``torch._dynamo.maybe_mark_dynamic``, so one graph serves every length (Dynamo specializes sizes 0 and 1:
    a length of 1 gets its own); the rows are not marked, so a second row count (reshape) recompiles once
    with the rows dynamic (Dynamo's automatic dynamic shapes); each set of inputs (:func:`_inputs`) is a
    graph of its own; in inject mode the int ``curriculum_seqlen`` is specialized on its first value and
    made dynamic when it changes (one more graph); validation runs under ``no_grad``, a guard: one more.
    Counted for contiguous inputs, which ``SequenceLengthWarmup.cut`` hands back; the trial step on CUDA
    (full length, before step 1, not marked) adds one."""
    groups: dict[frozenset[str], list[tuple[int, int]]] = {}
    for length in seqlens:
        groups.setdefault(_inputs(cfg, length), []).append(_step_shape(cfg, length, staged))
    train = 0
    rows_vary = False
    for shapes in groups.values():
        rows = {r for r, _ in shapes}
        train += 1 + (len(rows) > 1) + (len(rows) > 1 and 1 in rows) + any(c == 1 for _, c in shapes)
        rows_vary = rows_vary or len(rows) > 1
    cur = cfg.curriculum
    injected = cur is not None and cur.mode in (None, "inject") and not cfg.length_bucket and len(seqlens) > 1
    parts = [f"{train} for training (the length dim is marked dynamic: one graph serves every length"]
    if len(groups) > 1:
        parts[0] += f"; {len(groups)} sets of inputs, as position_ids / loss_mask turn trivial and are left out"
    if rows_vary:
        parts[0] += "; +1 when the row count first changes"
    parts[0] += ")"
    if injected:
        parts.append("1 when curriculum_seqlen first changes (an int is specialized on its first value)")
    parts.append("1 for full-length validation (no_grad)")
    pretrain = cur.max_difficulty if cur is not None else cfg.full_length
    both = bool(getattr(cfg, "stages", ())) and pretrain < model_length(cfg)  # val_loss_pretrain: a 2nd length
    if both:
        parts.append(f"1 for validation at the pretraining length {pretrain}")
    why = " + ".join(parts) + "; on CUDA +1 for the trial step before step 1"
    return train + injected + 1 + both, why


def data_use(plan: Plan, train_windows: int) -> tuple[str, str | None]:
    """How often the budget goes over the training data: a console line and, past :data:`MANY_PASSES`
    passes, a warning. ``train_windows``: the full-length windows (samples) of the training split; the
    plan's samples are drawn from them, so a curriculum (which trains only a prefix of each) makes more
    passes than tokens / data tokens."""
    passes = plan.total_samples / max(train_windows, 1)
    line = (
        f"data use:    {passes:.2f} passes over the training data ({plan.total_samples:,} samples drawn "
        f"from {train_windows:,} windows)"
    )
    warning = None
    if passes > MANY_PASSES:
        warning = (
            f"the budget goes over the training data {passes:.0f} times ({plan.total_samples:,} samples, "
            f"{train_windows:,} windows): past ~{MANY_PASSES} passes repeated data trains little and a "
            "small corpus is memorized; prepare more text or lower the budget (--train-tokens)"
        )
    return line, warning


def conversions(cfg: PlanSettings) -> dict[str, int]:
    """Megatron-flag equivalents the tutorial asks for: decay in tokens, warmup in samples/iterations."""
    out: dict[str, int] = {}
    full, lr = cfg.full_length, cfg.lr
    if lr.decay_samples is not None:
        out["lr_decay_tokens"] = decay_tokens_from_samples(lr.decay_samples, full)
    if lr.decay_iters is not None:
        out["lr_decay_tokens"] = decay_tokens_from_iters(lr.decay_iters, full, cfg.train_batch_size)
    start = cfg.curriculum.min_difficulty if cfg.curriculum else full
    if lr.warmup_tokens:
        out["lr_warmup_samples"] = warmup_samples_from_tokens(lr.warmup_tokens, start)
        out["lr_warmup_iters"] = warmup_iters_from_tokens(lr.warmup_tokens, start, cfg.train_batch_size)
    return out


def _plan_warnings(cfg: PlanSettings, plan: Plan, *, no_budget: bool = False) -> None:
    """The plan's advice. ``no_budget``: the plan stops where the curriculum ends, so the curriculum's
    share of the run says nothing (it is the whole plan) and is not warned about."""
    cur = cfg.curriculum
    w = plan.warnings
    if cur is not None and plan.curriculum_end_step is None:
        w.append(
            f"the curriculum is longer than the run: training stops at step {plan.total_steps:,} "
            f"before reaching max_difficulty {cur.max_difficulty} (total_curriculum_step "
            f"{cur.total_curriculum_step:,})"
        )
    elif (
        cur is not None
        and not no_budget
        and plan.curriculum_end_step
        and plan.curriculum_end_step > 0.8 * plan.total_steps
    ):
        w.append(
            f"the curriculum takes {plan.curriculum_end_step / plan.total_steps:.0%} of the run's steps: "
            "little training happens at full length"
        )
    if plan.warmup_reached is not None:
        unit = cfg.lr.warmup_unit
        w.append(
            f"the LR warmup ({getattr(cfg.lr, 'warmup_' + unit):,} {unit}) is longer than the run "
            f"({plan.total_steps:,} steps, {plan.total_samples:,} samples, {human_count(plan.total_tokens)} "
            f"tokens): the LR ends at {plan.warmup_reached:.0%} of its peak {cfg.lr.lr:g} and never decays; "
            "shorten the warmup or raise the budget"
        )
    cur_end = plan.curriculum_end_step or (cur.total_curriculum_step if cur else None)
    # The paper's GPT-2 settings end the curriculum ~5-15x after LR warmup; far beyond that, the full
    # LR trains on very short sequences for a long time.
    if (
        cur is not None
        and cfg.lr.warmup_unit is not None
        and plan.warmup_end_step
        and cur_end
        and plan.warmup_end_step * WARMUP_CURRICULUM_RATIO < cur_end
    ):
        w.append(
            f"LR warmup ends at step {plan.warmup_end_step:,}, {cur_end / plan.warmup_end_step:.0f}x before "
            f"the curriculum does (step {cur_end:,}): the full LR meets very short sequences for long; "
            "tune total_curriculum_step against the warmup (`seqwarm tune`)"
        )
    if cfg.lr.decay_tokens is not None and cfg.train_tokens and cfg.lr.decay_tokens > cfg.train_tokens:
        w.append(
            f"LR decay ends at {human_count(cfg.lr.decay_tokens)} tokens, after the budget "
            f"({human_count(cfg.train_tokens)}): the LR never reaches min_lr"
        )
    if cfg.lr.decay_iters is not None and cur is not None:
        w.append(
            "LR decays by iterations: early curriculum steps carry few tokens, so it decays too fast; "
            "use lr_decay_tokens (decay_tokens_from_iters converts)"
        )
    if cfg.rampup_batch_size and cur is not None:
        w.append(
            "a batch-size ramp (rampup_batch_size) is configured: never combine it with a sequence-length "
            "curriculum (both cut tokens per batch; the paper found SLW the more stable) — training refuses it"
        )
    for message in cfg.warnings:
        if message not in w:
            w.append(message)
