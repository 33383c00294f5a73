"""The sequence-length schedule: a pure ``difficulty_at`` and a DeepSpeed-compatible scheduler.

``difficulty_at(step, block)`` is the whole schedule as a pure function of the optimizer step; the
:class:`CurriculumScheduler` wraps it with DeepSpeed's method names and one integer of state, so code
written against ``deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler`` keeps
working.

Rounding (SPEC §2): compute the formula, floor it, round down to a multiple of ``difficulty_step``,
raise it to the *aligned min* (the first multiple of the step that is >= ``min_difficulty``) and cap it
at ``max_difficulty``. From ``total_curriculum_step`` on, the value is exactly ``max_difficulty`` even
when max is not a multiple of the step — the one deliberate difference from DeepSpeed, which reaches
an unaligned max only some steps later.

The block is validated by :func:`seqwarm.config.load_config`; constructing a scheduler from a raw
dict validates it the same way, so a bad block raises :class:`seqwarm.config.ConfigError` listing every
problem instead of an ``AssertionError``/``KeyError``/``ZeroDivisionError`` at the first step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

FIXED_LINEAR = "fixed_linear"
FIXED_ROOT = "fixed_root"
FIXED_DISCRETE = "fixed_discrete"
CUSTOM = "custom"
SCHEDULE_TYPES = (FIXED_LINEAR, FIXED_ROOT, FIXED_DISCRETE, CUSTOM)


def aligned_min(min_difficulty: int, difficulty_step: int) -> int:
    """The first multiple of ``difficulty_step`` that is >= ``min_difficulty``."""
    return -(-min_difficulty // difficulty_step) * difficulty_step


def _root_difficulty(step: int, block: Mapping[str, Any], root_degree: float) -> int:
    cfg = block["schedule_config"]
    lo, hi = int(block["min_difficulty"]), int(block["max_difficulty"])
    total, quantum = int(cfg["total_curriculum_step"]), int(cfg["difficulty_step"])
    if step >= total:
        return hi
    frac = (max(step, 0) / total) ** (1.0 / root_degree)
    value = math.floor(frac * (hi - lo) + lo)
    value -= value % quantum
    value = max(value, aligned_min(lo, quantum))
    return min(value, hi)


def _discrete_difficulty(step: int, block: Mapping[str, Any]) -> int:
    cfg = block["schedule_config"]
    levels, thresholds = cfg["difficulty"], cfg["max_step"]
    for level, last_step in zip(levels, thresholds):
        if step <= last_step:
            return int(level)
    return int(levels[-1])


def difficulty_at(step: int, block: Mapping[str, Any]) -> int:
    """The sequence length for optimizer step ``step`` (1-based; step 0 is allowed).

    ``block`` is a validated curriculum block (``min_difficulty``, ``max_difficulty``,
    ``schedule_type``, ``schedule_config``) or a :class:`seqwarm.config.CurriculumConfig`.
    Pure: the same step always gives the same value. ``custom`` schedules need a scheduler.
    """
    if hasattr(block, "block"):
        block = block.block()
    kind = block["schedule_type"]
    if kind == FIXED_LINEAR:
        return _root_difficulty(step, block, 1.0)
    if kind == FIXED_ROOT:
        return _root_difficulty(step, block, float(block["schedule_config"]["root_degree"]))
    if kind == FIXED_DISCRETE:
        return _discrete_difficulty(step, block)
    raise ValueError(
        f"difficulty_at() cannot evaluate schedule_type {kind!r}: "
        "use CurriculumScheduler.set_custom_get_difficulty() for custom schedules"
    )


class CurriculumScheduler:
    """DeepSpeed-compatible curriculum scheduler for the ``seqlen`` metric.

    Same method names as DeepSpeed's legacy scheduler. The value starts at ``min_difficulty``;
    :meth:`update_difficulty` recomputes it only while it is below ``max_difficulty``.
    """

    def __init__(self, block: Mapping[str, Any]):
        from seqwarm.config import validate_curriculum_block

        if hasattr(block, "block"):
            block = block.block()
        self._block = validate_curriculum_block(block)
        self._custom: Callable[[int], int] | None = None
        self._current = int(self._block["min_difficulty"])

    # -- DeepSpeed API -------------------------------------------------------------------------
    def get_current_difficulty(self) -> int:
        return self._current

    def set_current_difficulty(self, difficulty: int) -> None:
        self._current = int(difficulty)

    def set_custom_get_difficulty(self, fn: Callable[[int], int]) -> None:
        """Use ``fn(global_steps) -> int`` for ``schedule_type: custom``."""
        self._custom = fn

    def get_state(self) -> dict[str, Any]:
        """DeepSpeed's state: the block's fields plus ``current_difficulty``."""
        state = dict(self._block)
        state["current_difficulty"] = self._current
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._current = int(state["current_difficulty"])

    def get_difficulty(self, global_steps: int) -> int:
        """The schedule's value at ``global_steps`` (does not change the current value)."""
        if self._block["schedule_type"] == CUSTOM:
            if self._custom is None:
                raise RuntimeError(
                    "schedule_type 'custom' needs a difficulty function: call "
                    "scheduler.set_custom_get_difficulty(fn) before training"
                )
            return int(self._custom(global_steps))
        return difficulty_at(global_steps, self._block)

    def update_difficulty(self, global_steps: int) -> int:
        """Advance to ``global_steps`` (the engine passes ``global_steps + 1``) and return the value."""
        if self._current < self._block["max_difficulty"]:
            self._current = self.get_difficulty(global_steps)
        return self._current

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"current_difficulty": self._current}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._current = int(state["current_difficulty"])

    @property
    def block(self) -> dict[str, Any]:
        return dict(self._block)

    def __repr__(self) -> str:
        return (
            f"CurriculumScheduler({self._block['schedule_type']}, "
            f"{self._block['min_difficulty']}->{self._block['max_difficulty']}, "
            f"current={self._current})"
        )
