"""The stages in the plan (:mod:`seqwarm.curriculum.stages`): where each begins, what it trains, and what is
wrong with the schedule as a whole.

:func:`~seqwarm.curriculum.plan.make_plan` walks the run's clock step by step; a :class:`StageWalk` decides
each step's length there as the curriculum object does at ``begin_step`` (the warmup's length, replaced by
a stage's from the first step whose clock — the tokens trained before it — has reached its
``start_tokens``), and records each stage's first step, rows and tokens. What only the walk can tell:

- a stage whose ``start_tokens`` falls before the warmup's first step at the pretraining length (its
  ``max_difficulty``) — an error (:attr:`StageWalk.problems`): the run would jump from a short warmup
  length to the stage's, cutting the warmup short;
- a stage that never begins before the budget ends — a warning: the budget may be shortened on purpose
  (a smoke test of a long recipe), but the run will never train at that length or with those positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seqwarm.curriculum.clock import micro_batch_shape, tokens_per_step
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.curriculum.stages import StageConfig, stage_at, stage_rows
from seqwarm.util.problems import Problem
from seqwarm.util.units import human_count

__all__ = [
    "StagePlan",
    "LengthUse",
    "StageWalk",
    "warmup_end_tokens",
    "micro_tokens",
    "stage_micro_rows",
    "longest_shape",
]


@dataclass
class StagePlan:
    """One stage as the run will train it."""

    stage: int
    """Its number, from 1."""
    start_tokens: int
    """The configured start."""
    length: int
    rope_theta: float | None
    rope_scaling: dict[str, Any] | None
    step: int | None = None
    """Its first step (None: it never begins before the budget ends)."""
    tokens_before: int | None = None
    """Tokens trained before its first step (at or just past ``start_tokens``)."""
    rows_per_step: int = 0
    """Sequences of ``length`` one optimizer step trains (all ranks, all micro-batches)."""
    tokens_per_step: int = 0
    steps: int = 0
    """Steps trained in it."""
    tokens: int = 0
    """Tokens trained in it."""


@dataclass
class LengthUse:
    """Steps and tokens the run trains at one length."""

    length: int
    steps: int = 0
    tokens: int = 0


def micro_tokens(cfg: Any) -> int:
    """The tokens of one micro-batch before the stages — at the pretraining length (the warmup's top, else
    the full length), cut as the curriculum's mode cuts: what a stage's micro-batch keeps."""
    mode = cfg.curriculum.mode if cfg.curriculum else None
    top = cfg.curriculum.max_difficulty if cfg.curriculum else cfg.full_length
    rows, columns = micro_batch_shape(cfg.micro_batch_size, cfg.full_length, min(top, cfg.full_length), mode)
    return rows * columns


def stage_micro_rows(cfg: Any, stage: StageConfig) -> int:
    """Rows of ``stage.length`` in one micro-batch of ``stage`` (one rank): :func:`~seqwarm.curriculum.stages.
    stage_rows` of the micro-batch's tokens before the stages. The windows are read at the stage's length."""
    return stage_rows(stage, micro_tokens(cfg))


def _stage_step(cfg: Any, stage: StageConfig) -> tuple[int, int]:
    """(rows, tokens) of one optimizer step in ``stage`` (all ranks): ``seqwarm train`` reads its windows at
    its length (:func:`stage_micro_rows`); a loop of its own (``cfg.stage_windows`` False) cuts its batches,
    at least as long as the stage, to the stage's length."""
    ranks = cfg.gradient_accumulation_steps * cfg.world_size
    if getattr(cfg, "stage_windows", True):
        rows = stage_micro_rows(cfg, stage) * ranks
        return rows, rows * stage.length
    mode = cfg.curriculum.mode if cfg.curriculum else None
    rows, length = micro_batch_shape(cfg.micro_batch_size, max(cfg.full_length, stage.length), stage.length, mode)
    return rows * ranks, rows * length * ranks


def longest_shape(cfg: Any) -> tuple[int, int]:
    """``(rows, length)`` of the training micro-batch (one rank) at the longest length the run trains, what the
    memory estimate and the trial step are sized by: with stages, the longest of the stages' (read at their
    lengths) and the micro-batch before them (cut to the pretraining length); else the full-length one."""
    stages = tuple(getattr(cfg, "stages", ()) or ())
    if not stages:
        return cfg.micro_batch_size, cfg.full_length
    mode = cfg.curriculum.mode if cfg.curriculum else None
    top = min(cfg.curriculum.max_difficulty if cfg.curriculum else cfg.full_length, cfg.full_length)
    shapes = [micro_batch_shape(cfg.micro_batch_size, cfg.full_length, top, mode)]
    shapes += [(stage_micro_rows(cfg, s), s.length) for s in stages]
    return max(shapes, key=lambda shape: (shape[1], shape[0]))


def model_length(cfg: Any) -> int:
    """The longest sequence the model must hold, the length validation runs at: the full length, or the longest
    stage's when that is longer."""
    return max([cfg.full_length, *(s.length for s in getattr(cfg, "stages", ()) or ())])


def eval_rows(cfg: Any) -> int:
    """Rows per validation batch at :func:`model_length`: a stage's rows at that length, else the micro-batch."""
    length = model_length(cfg)
    if not getattr(cfg, "stage_windows", True):  # a loop of its own validates as it likes: its micro-batch
        return cfg.micro_batch_size
    rows = [stage_micro_rows(cfg, s) for s in getattr(cfg, "stages", ()) or () if s.length == length]
    return min(rows, default=cfg.micro_batch_size)


def warmup_end_tokens(cfg: Any) -> int | None:
    """Tokens trained before the first step at the warmup's ``max_difficulty`` when no stage cuts in
    (None without a warmup)."""
    cur = cfg.curriculum
    if cur is None:
        return None
    tokens, step = 0, 1
    while difficulty_at(step, cur) < cur.max_difficulty:
        tokens += tokens_per_step(cfg, difficulty_at(step, cur))
        step += 1
    return tokens


class StageWalk:
    """The stages' side of :func:`~seqwarm.curriculum.plan.make_plan`'s walk (see the module)."""

    def __init__(self, cfg: Any, stages: Sequence[StageConfig], path: str = "seqwarm.stages"):
        self.cfg, self.stages, self.path = cfg, tuple(stages), path
        self.plans = [StagePlan(i + 1, s.start_tokens, s.length, **s.positions()) for i, s in enumerate(self.stages)]
        self.problems: list[Problem] = []
        self.uses: dict[int, LengthUse] = {}
        self.current: StagePlan | None = None  # the stage of the step just decided (None: before the first)
        end = warmup_end_tokens(cfg) if self.stages else None
        for i, stage in enumerate(self.stages):
            if end is not None and stage.start_tokens < end:
                self._too_early(i, end)

    def length(self, step: int, before: int, warm: int) -> int:
        """The length of step ``step`` begun with ``before`` tokens trained, where the warmup alone gives
        ``warm``; records a stage's first step."""
        found = stage_at(before, self.stages) if self.stages else None
        self.current = None
        if found is None:
            return warm
        index, stage = found
        plan = self.plans[index]
        if plan.step is None:
            plan.step, plan.tokens_before = step, before
            plan.rows_per_step, plan.tokens_per_step = _stage_step(self.cfg, stage)
        plan.steps += 1
        plan.tokens += plan.tokens_per_step
        self.current = plan
        return stage.length

    def step_size(self, seqlen: int) -> tuple[int, int]:
        """(samples, tokens) of the step :meth:`length` just decided: a stage's rows at its length, else the
        run's batch cut to ``seqlen`` (:func:`~seqwarm.curriculum.clock.tokens_per_step`)."""
        if self.current is not None:
            return self.current.rows_per_step, self.current.tokens_per_step
        return self.cfg.train_batch_size, tokens_per_step(self.cfg, seqlen)

    def count(self, length: int, tokens: int) -> None:
        """One step trained ``tokens`` at ``length``."""
        use = self.uses.setdefault(length, LengthUse(length))
        use.steps += 1
        use.tokens += tokens

    def _too_early(self, index: int, end: int) -> None:
        self.problems.append(
            Problem(
                f"{self.path}[{index}].start_tokens",
                self.stages[index].start_tokens,
                "the stage would begin before the warmup reaches the pretraining length "
                f"{self.cfg.curriculum.max_difficulty} (its first step at that length begins after {end:,} tokens), "
                "cutting the warmup short",
                f"start it at {end:,} tokens or later, or shorten the warmup (total_curriculum_step)",
            )
        )

    def warnings(self, total_steps: int, total_tokens: int) -> list[str]:
        """A warning for each stage the run ends before, and for each whose rows cannot keep the micro-batch's
        tokens (its length does not divide them) without a ``micro_batch_size`` of its own."""
        out = []
        keep = micro_tokens(self.cfg) if self.stages and getattr(self.cfg, "stage_windows", True) else None
        for stage in self.stages if keep else ():
            if stage.micro_batch_size is None and (keep % stage.length or keep < stage.length):
                rows = stage_micro_rows(self.cfg, stage)
                out.append(
                    f"the stage of length {stage.length} trains {rows} row{'s' if rows > 1 else ''} per micro-batch, "
                    f"{rows * stage.length:,} tokens instead of the {keep:,} before the stages ({keep:,} is not a "
                    "multiple of its length); give the stage a micro_batch_size to say so, or a length that divides it"
                )
        for plan in self.plans:
            if plan.step is None:
                out.append(
                    f"stage {plan.stage} (from {human_count(plan.start_tokens)} tokens, length {plan.length}) never "
                    f"begins: the run ends at step {total_steps:,} after {human_count(total_tokens)} tokens; it "
                    "never trains at that length or with its positions (raise the budget, or drop the stage)"
                )
        return out
