"""The variable-length mode's run ahead of time: buckets, steps per length and the schedule, no token read.

:func:`plan_variable` replays :class:`~seqwarm.curriculum.variable.VariableLengthSampler`'s draw (the same
sampler, drawing lengths without chunk indices) to the budget, so it shows exactly the lengths a run with
the same decomposition, ``tokens_per_step``, curriculum and seed trains: each bucket's length, chunks,
tokens and share of the corpus, rows and steps per epoch, the chunks an epoch leaves over, what the
decomposition drops (the remainders under ``min_length``, the documents shorter than it), the steps and
tokens each length gets over the run, and the schedule over the run — the cap on the length at each point
(``linear``, ``schedule``), the Grow-P2 cycles (``grow_p2``), epochs, and the LR on the token clock.
A blend (several decompositions with their ``weights``) is replayed as training draws it, one source a
step by weight (:class:`~seqwarm.curriculum.variable_blend.VariableSteps`, the object training draws
with). **Repetition**: per bucket, how many times its chunks are trained over the run (``passes``) and in
how many of its source's epochs; under a cap (``linear``, ``schedule``) on a corpus of long documents the
few short chunks are all the first steps may draw, so they are trained over and over (a new epoch each
time the allowed buckets run out): a warning says so when some bucket's chunks repeat more than
:data:`REPEAT_RATIO` times as often as the longest bucket's. ``seqwarm plan --curriculum-mode variable``
prints it (:mod:`seqwarm.curriculum.plan_variable_text`; ``--json``: :meth:`VariablePlan.to_dict`), and
``seqwarm train`` prints its bucket table at the start. Plain numpy: no torch (docs/VARIABLE.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from seqwarm.curriculum.clock import Limits, Progress, advance, stop_reason
from seqwarm.curriculum.decompose import Decomposition
from seqwarm.curriculum.lr import LRConfig, lr_at
from seqwarm.curriculum.lr_checks import with_budget
from seqwarm.curriculum.plan import MANY_PASSES
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.curriculum.variable_blend import VariableSteps
from seqwarm.util.errors import UserError

__all__ = [
    "BucketPlan",
    "SourcePlan",
    "CyclePlan",
    "VariablePoint",
    "VariablePlan",
    "plan_variable",
    "MAX_PLAN_STEPS",
    "REPEAT_RATIO",
    "repetition_warnings",
]

MAX_PLAN_STEPS = 5_000_000
"""The most steps :func:`plan_variable` replays (a few microseconds each)."""

REPEAT_RATIO = 4.0
"""A capped run (``linear``, ``schedule``) is warned about when some bucket's chunks are trained more than
this many times as often as the longest bucket's (and more than once): the cap spends its first steps on
the few short chunks of a corpus of long documents, over and over."""


@dataclass(frozen=True)
class BucketPlan:
    """One length: what the corpus holds of it, what an epoch uses, what the run trains."""

    length: int
    chunks: int
    tokens: int
    """Tokens its chunks hold (chunks x length)."""
    share: float
    """Its share of the decomposition's tokens (what ``natural`` trains in proportion to)."""
    rows_per_step: int
    """Rows of a step at this length, over all ranks: ``tokens_per_step / length``."""
    steps_per_epoch: int
    left_over_per_epoch: int
    """Chunks an epoch does not train (fewer than one step's rows)."""
    steps: int
    """Steps at this length over the run."""
    run_tokens: int
    """Tokens trained at this length over the run."""
    passes: float = 0.0
    """Times its chunks are trained over the run, on average: ``steps x rows_per_step / chunks``."""
    epochs_used: int = 0
    """Epochs of its source's sampler in which it trained (a cap starts a new epoch each time the lengths
    it allows run out)."""
    source: int = 0
    """Its source (a blend's index; 0 for one source)."""


@dataclass(frozen=True)
class SourcePlan:
    """One source of the run (a blend's, or the only one): its weight and what the run draws of it."""

    name: str
    weight: float
    documents: int
    steps_per_epoch: int
    steps: int
    """Steps of the run drawn from it (its weight's share, give or take one)."""
    epochs: float
    """Its steps / its steps per epoch."""


@dataclass(frozen=True)
class VariablePoint:
    """The run at the end of ``step``, and the steps since the previous point."""

    step: int
    tokens: int
    epoch: int
    cycle: int
    cap: int | None
    """The longest length allowed at this step (``linear``, ``schedule``; None: every length)."""
    mean_length: float
    """The mean length of the steps since the previous point."""
    shortest: int
    longest: int
    lr: float | None


@dataclass(frozen=True)
class CyclePlan:
    """One Grow-P2 cycle (or, for the other curricula, one epoch): its steps and the lengths at its ends."""

    epoch: int
    cycle: int
    first_step: int
    last_step: int
    first_length: int
    last_length: int
    mean_length: float


@dataclass(frozen=True)
class VariablePlan:
    curriculum: str
    num_cycles: int
    seed: int
    tokens_per_step: int
    world_size: int
    min_length: int
    max_length: int
    shift: int
    documents: int
    chunk_tokens: int
    """Tokens the chunks hold: what an epoch can train at most."""
    dropped_tokens: int
    empty_documents: int
    buckets: tuple[BucketPlan, ...]
    steps_per_epoch: int
    total_steps: int
    total_tokens: int
    total_samples: int
    stop_reason: str
    epochs: float
    """Steps of the run / steps per epoch (a blend: the most of any source, its steps / its steps per epoch)."""
    skipped_steps: int
    """Steps of longer buckets an epoch ended without (under a cap)."""
    points: tuple[VariablePoint, ...]
    cycles: tuple[CyclePlan, ...]
    caps: tuple[tuple[int, int], ...]
    """``(step, cap)`` where the cap changes (``linear``, ``schedule``); empty otherwise."""
    warnings: tuple[str, ...]
    sources: tuple[SourcePlan, ...] = ()
    lengths: tuple[int, ...] = ()
    """Each step's length, in order (only with ``keep_steps=True``)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mode"] = "variable"
        out["caps"] = [list(c) for c in self.caps]
        return out


def plan_variable(
    decomposition: Decomposition | Sequence[Decomposition],
    tokens_per_step: int,
    *,
    curriculum: str = "natural",
    num_cycles: int = 8,
    total_steps: int | None = None,
    schedule: CurriculumConfig | dict[str, Any] | None = None,
    seed: int = 0,
    world_size: int = 1,
    weights: Sequence[float] | None = None,
    names: Sequence[str] | None = None,
    train_tokens: int | None = None,
    train_iters: int | None = None,
    train_samples: int | None = None,
    lr: LRConfig | None = None,
    rows: int = 24,
    keep_steps: bool = False,
) -> VariablePlan:
    """The run of a :class:`~seqwarm.curriculum.variable.VariableLengthSampler` with these settings (the
    sampler's keywords, errors and all) to the budget (``train_tokens`` / ``train_iters`` /
    ``train_samples``; none: one epoch), its schedule summed up in about ``rows`` points. ``lr``: the
    LR on the token clock at each point (a decay without a length spans the budget). A sequence of
    decompositions with ``weights`` (and ``names``) is a blend: source ``k`` draws with seed ``seed + k``
    and each step trains the source whose share lags its weight the most, as training draws it.
    ``keep_steps``: every step's length in :attr:`VariablePlan.lengths`."""
    blend = not isinstance(decomposition, Decomposition)
    decompositions = list(decomposition) if blend else [decomposition]
    weights = list(weights) if weights is not None else [1.0] * len(decompositions)
    sampler_keys = {"curriculum": curriculum, "num_cycles": num_cycles, "total_steps": total_steps}
    draw = VariableSteps(
        decompositions,
        weights,
        tokens_per_step,
        seed=seed,
        world_size=world_size,
        names=names if blend else None,
        schedule=schedule,
        **sampler_keys,
    )
    per_epoch = sum(s.steps_per_epoch for s in draw.samplers)
    limits = Limits(train_tokens, train_iters, train_samples)
    notes: list[str] = []
    if not any((train_tokens, train_iters, train_samples)):
        limits = Limits(train_iters=per_epoch)
        notes.append(f"no budget: one epoch planned ({per_epoch:,} steps)")
    budget = {"train_tokens": limits.train_tokens, "train_iters": limits.train_iters}
    lr_cfg = with_budget(lr, {**budget, "train_samples": train_samples}, "plan") if lr is not None else None
    drawn, sources, epochs, cycles, caps = [], [], [], [], []
    progress, clock_lr = Progress(), lr_cfg or LRConfig()
    while stop_reason(progress, limits) is None:
        if progress.step >= MAX_PLAN_STEPS:
            raise UserError(f"plan: the budget takes more than {MAX_PLAN_STEPS:,} steps; plan a smaller budget")
        k, step = draw.next_step(indices=False)
        progress = advance(progress, tokens_per_step // step.length, tokens_per_step, clock_lr)
        drawn.append(step.length)
        sources.append(k)
        epochs.append(step.epoch)
        cycles.append(step.cycle)
        caps.append(draw.cap(k, step.step))
    seq, src, ep = (np.asarray(a, dtype=np.int64) for a in (drawn, sources, epochs))
    buckets = []
    for k, sampler in enumerate(draw.samplers):
        for length, b in sampler.stats()["buckets"].items():
            mine = (seq == length) & (src == k)
            steps = int(mine.sum())
            rows_per_step = tokens_per_step // length
            buckets.append(
                BucketPlan(
                    length=length,
                    chunks=b["chunks"],
                    tokens=b["tokens"],
                    share=b["share"],
                    rows_per_step=rows_per_step,
                    steps_per_epoch=b["steps_per_epoch"],
                    left_over_per_epoch=b["chunks_left_over_per_epoch"],
                    steps=steps,
                    run_tokens=steps * tokens_per_step,
                    passes=steps * rows_per_step / b["chunks"] if b["chunks"] else 0.0,
                    epochs_used=int(np.unique(ep[mine]).size),
                    source=k,
                )
            )
    source_plans = tuple(
        SourcePlan(
            name=(names[k] if names else f"source {k}"),
            weight=weights[k] / sum(weights),
            documents=d.num_documents,
            steps_per_epoch=sampler.steps_per_epoch,
            steps=int((src == k).sum()),
            epochs=int((src == k).sum()) / sampler.steps_per_epoch,
        )
        for k, (d, sampler) in enumerate(zip(decompositions, draw.samplers))
    )
    first = draw.samplers[0]
    plan = VariablePlan(
        curriculum=curriculum,
        num_cycles=first.num_cycles,
        seed=first.seed,
        tokens_per_step=tokens_per_step,
        world_size=world_size,
        min_length=first.decomposition.min_length,
        max_length=first.decomposition.max_length,
        shift=first.decomposition.shift,
        documents=sum(d.num_documents for d in decompositions),
        chunk_tokens=int(sum(sum(d.tokens_per_bucket()) for d in decompositions)),
        dropped_tokens=sum(d.dropped_tokens for d in decompositions),
        empty_documents=sum(d.empty_documents for d in decompositions),
        buckets=tuple(buckets),
        steps_per_epoch=per_epoch,
        total_steps=progress.step,
        total_tokens=progress.tokens,
        total_samples=progress.samples,
        stop_reason=stop_reason(progress, limits) or "",
        epochs=max(s.epochs for s in source_plans),
        skipped_steps=sum(s.skipped_steps for s in draw.samplers),
        points=_points(seq, epochs, cycles, caps, tokens_per_step, lr_cfg, rows),
        cycles=_cycles(seq, epochs, cycles) if not blend or len(decompositions) == 1 else (),
        caps=tuple((i + 1, c) for i, c in enumerate(caps) if c is not None and (i == 0 or caps[i - 1] != c)),
        warnings=(),
        sources=source_plans,
        lengths=tuple(int(x) for x in seq) if keep_steps else (),
    )
    return _with_warnings(plan, notes)


def _points(seq, epochs, cycles, caps, tokens_per_step, lr_cfg, rows) -> tuple[VariablePoint, ...]:
    """About ``rows`` points, evenly spaced in steps, the last at the run's end."""
    n = seq.size
    count = max(1, min(rows, n))  # a run of fewer steps than rows: a row per step
    ends = sorted({max(1, round(n * (i + 1) / count)) for i in range(count)})
    points, start, progress = [], 0, Progress()
    clock = lr_cfg or LRConfig()
    for end in ends:
        part = seq[start:end]
        for length in part:  # the LR's clock (warmup end included) follows every step
            progress = advance(progress, tokens_per_step // int(length), tokens_per_step, clock)
        points.append(
            VariablePoint(
                step=end,
                tokens=end * tokens_per_step,
                epoch=int(epochs[end - 1]),
                cycle=int(cycles[end - 1]),
                cap=caps[end - 1],
                mean_length=float(part.mean()),
                shortest=int(part.min()),
                longest=int(part.max()),
                lr=lr_at(progress, lr_cfg) if lr_cfg is not None else None,
            )
        )
        start = end
    return tuple(points)


def _cycles(seq, epochs, cycles) -> tuple[CyclePlan, ...]:
    """The runs of steps with one (epoch, cycle): Grow-P2's cycles, or the epochs."""
    out, start = [], 0
    for i in range(1, seq.size + 1):
        if i == seq.size or (epochs[i], cycles[i]) != (epochs[start], cycles[start]):
            part = seq[start:i]
            out.append(
                CyclePlan(
                    epoch=int(epochs[start]),
                    cycle=int(cycles[start]),
                    first_step=start + 1,
                    last_step=i,
                    first_length=int(part[0]),
                    last_length=int(part[-1]),
                    mean_length=float(part.mean()),
                )
            )
            start = i
    return tuple(out)


def _with_warnings(plan: VariablePlan, notes: list[str]) -> VariablePlan:
    """What a user should know before the run: data passes, lengths that never train, the cap's end, the
    short chunks a cap repeats."""
    said = list(notes)
    never = sorted({b.length for b in plan.buckets if b.steps_per_epoch == 0})
    if never:
        said.append(
            f"length{'s' if len(never) > 1 else ''} {', '.join(map(str, never))} never train: fewer chunks than one "
            "step's rows (lower tokens_per_step, or max_length)"
        )
    if plan.epochs > MANY_PASSES:
        said.append(
            f"the budget makes {plan.epochs:.1f} passes over the chunks ({plan.steps_per_epoch:,} steps an epoch): "
            f"past ~{MANY_PASSES} passes repeated data trains little; use more data or a smaller budget"
        )
    if plan.caps and plan.caps[-1][1] < plan.max_length:
        said.append(
            f"the cap reaches only {plan.caps[-1][1]} by the run's last step: lengths up to {plan.max_length} never "
            "train (a shorter schedule, or a larger budget)"
        )
    if plan.skipped_steps:
        said.append(
            f"{plan.skipped_steps:,} steps of longer lengths were skipped: epochs ended early under the cap "
            "(their chunks wait for a later epoch)"
        )
    said += repetition_warnings(plan)
    return replace(plan, warnings=tuple(said))


def repetition_warnings(plan: VariablePlan) -> list[str]:
    """One line per source whose cap (``linear``, ``schedule``) trains some bucket's chunks more than
    :data:`REPEAT_RATIO` times as often as its longest bucket's, and more than once each."""
    if plan.curriculum not in ("linear", "schedule"):
        return []
    said = []
    for k, source in enumerate(plan.sources or ()):
        mine = [b for b in plan.buckets if b.source == k and b.steps_per_epoch > 0]
        if len(mine) < 2:
            continue
        longest, worst = mine[-1], max(mine[:-1], key=lambda b: b.passes)  # buckets: shortest first
        if worst.passes <= 1 or worst.passes <= REPEAT_RATIO * longest.passes:
            continue
        where = f"{source.name}: " if len(plan.sources) > 1 else ""
        said.append(
            f"{where}the cap on the length ({plan.curriculum}) trains the few short chunks over and over: length "
            f"{worst.length}'s {worst.chunks:,} chunks {worst.passes:.1f} times each (in {worst.epochs_used:,} "
            f"epochs), the longest bucket's ({longest.length}) {longest.passes:.2f} times, more than "
            f"{REPEAT_RATIO:g}x as often; use --variable-curriculum natural or grow_p2, or a corpus with shorter "
            "documents"
        )
    return said
