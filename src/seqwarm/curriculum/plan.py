"""The whole run ahead of time: step -> length, tokens, learning rate; when it stops.

The plan replays exactly what the engine does (same pure functions: ``difficulty_at``, ``advance``,
``lr_at``, ``should_stop``), so what ``seqwarm plan`` prints is what training will do — up to the
token counts of ``count_tokens_by: loss_mask`` runs, which depend on the data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from seqwarm.config import RunConfig
from seqwarm.curriculum.checks import CUSTOM
from seqwarm.curriculum.clock import Progress, advance, stop_reason, tokens_per_step
from seqwarm.curriculum.lr import (
    decay_tokens_from_iters,
    decay_tokens_from_samples,
    lr_at,
    warmup_iters_from_tokens,
    warmup_samples_from_tokens,
)
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.util.errors import UserError
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
    warmup_reached: float | None = None
    """With an LR warmup the run stops before finishing: the share of the peak LR reached at its last
    step (None when there is no warmup or it ends)."""
    steps: list[int] = field(default_factory=list, repr=False)
    seqlens: list[int] = field(default_factory=list, repr=False)
    cum_tokens: list[int] = field(default_factory=list, repr=False)
    lrs: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("steps", "seqlens", "cum_tokens", "lrs")}
        return out


def make_plan(cfg: RunConfig, *, keep_series: bool = False) -> Plan:
    """Simulate the run's clock until it stops (or, with no budget, until the curriculum ends)."""
    if cfg.full_length is None:
        raise UserError("the full sequence length is unknown: set seq_length (--seq-length) or a curriculum")
    cur = cfg.curriculum
    if cur is not None and cur.schedule_type == CUSTOM:
        raise UserError("a custom schedule is a Python function: it cannot be planned from a config file")
    no_budget = cfg.train_tokens is None and cfg.train_iters is None and cfg.train_samples is None
    if no_budget and cur is None:
        raise UserError("nothing to plan: give a budget (--train-tokens, --train-iters or --train-samples)")
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
        seqlen = current
        tps = tokens_per_step(cfg, seqlen)
        before = progress.tokens
        progress = advance(progress, cfg.train_batch_size, tps, cfg.lr)
        lr = lr_at(progress, cfg.lr)
        if cur is not None and plan.curriculum_end_step is None and seqlen >= cur.max_difficulty:
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
        if reason is None and no_budget and plan.curriculum_end_step is not None:
            reason = "no budget given: planned to the end of the curriculum"
        if reason is not None:
            break
        if step >= MAX_PLAN_STEPS:
            raise UserError(f"the run would take more than {MAX_PLAN_STEPS:,} steps; check the budget and batch size")
    if plan.points[-1].step != progress.step:
        plan.points.append(PlanPoint(progress.step, seqlen, tps, progress.tokens, lr))
    plan.total_steps, plan.total_tokens, plan.total_samples = progress.step, progress.tokens, progress.samples
    plan.stop_reason = reason
    plan.conversions = conversions(cfg)
    if cfg.lr.warmup_unit and plan.warmup_end_step is None and not no_budget:
        plan.warmup_reached = lr / cfg.lr.lr if cfg.lr.lr else 0.0
    _plan_warnings(cfg, plan)
    return plan


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


def conversions(cfg: RunConfig) -> dict[str, int]:
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


def _plan_warnings(cfg: RunConfig, plan: Plan) -> None:
    cur = cfg.curriculum
    w = plan.warnings
    if cur is not None and plan.curriculum_end_step is None:
        w.append(
            f"the curriculum is longer than the run: training stops at step {plan.total_steps:,} "
            f"before reaching max_difficulty {cur.max_difficulty} (total_curriculum_step "
            f"{cur.total_curriculum_step:,})"
        )
    elif cur is not None and plan.curriculum_end_step and plan.curriculum_end_step > 0.8 * plan.total_steps:
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
