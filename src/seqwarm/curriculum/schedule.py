"""The sequence-length curriculum: its config and the schedule.

``difficulty_at(step, cfg)`` is the whole schedule as a pure function of the optimizer step; the
:class:`CurriculumScheduler` wraps it with DeepSpeed's method names and one integer of state, so code
written against ``deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler`` keeps
working.

Rounding: compute the formula, floor it, round down to a multiple of ``difficulty_step``,
raise it to the *aligned min* (the first multiple of the step that is >= ``min_difficulty``) and cap it
at ``max_difficulty``. From ``total_curriculum_step`` on, the value is exactly ``max_difficulty`` even
when max is not a multiple of the step — the one deliberate difference from DeepSpeed, which reaches
an unaligned max only some steps later.

A block is checked once, into a frozen :class:`CurriculumConfig`: by :func:`seqwarm.config.load_config`
(which reads the legacy and data_efficiency forms with
:func:`~seqwarm.curriculum.checks.check_curriculum_block`), or by :func:`validate_curriculum_block` when
a scheduler is built from a raw dict. A bad block raises one :class:`~seqwarm.util.problems.ConfigError`
listing every problem instead of an ``AssertionError``/``KeyError``/``ZeroDivisionError`` at the first
step. A block's keys, its schedule types and the checks of its fields are in
:mod:`seqwarm.curriculum.checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from seqwarm.curriculum.checks import (
    CUSTOM,
    FIXED_DISCRETE,
    FIXED_LINEAR,
    FIXED_ROOT,
    LEGACY_KEYS,
    aligned_min,
    check_curriculum_block,
)
from seqwarm.util.problems import Checker, ConfigError, Problem, raise_if_problems

CURRICULUM_MODES = ("truncate", "reshape", "window", "inject", "variable")
"""How the length reaches the model (see :attr:`CurriculumConfig.mode`); ``variable`` draws rows of one
document each at the step's length from the data (docs/VARIABLE.md) instead of cutting full-length rows."""


@dataclass(frozen=True)
class CurriculumConfig:
    """The sequence-length curriculum, in DeepSpeed's terms, checked (build it from a block with
    :func:`validate_curriculum_block`, or read it with :func:`seqwarm.config.load_config`)."""

    enabled: bool
    """Always true once checked (a disabled block gives no curriculum at all)."""
    curriculum_type: str
    """The difficulty metric: ``seqlen`` (the only one seqwarm runs)."""
    min_difficulty: int
    """Starting length (tokens)."""
    max_difficulty: int
    """Final length: the model's full sequence length."""
    schedule_type: str
    """fixed_linear | fixed_root | fixed_discrete | custom."""
    schedule_config: Mapping[str, Any]
    """The schedule's settings (:data:`~seqwarm.curriculum.checks.SCHEDULE_KEYS` of its type), checked."""
    mode: str | None = None
    """How the length reaches the model: truncate | reshape | window | inject | variable | None (inject when
    the model's forward takes ``curriculum_seqlen``, else truncate)."""
    source: str = "curriculum_learning"
    """Where it came from: curriculum_learning (legacy block), data_efficiency, or flags."""

    def block(self) -> dict[str, Any]:
        """The DeepSpeed-style dict (the legacy block's fields), e.g. for a scheduler's ``get_state()``."""
        return {
            "enabled": self.enabled,
            "curriculum_type": self.curriculum_type,
            "min_difficulty": self.min_difficulty,
            "max_difficulty": self.max_difficulty,
            "schedule_type": self.schedule_type,
            "schedule_config": dict(self.schedule_config),
        }

    @property
    def total_curriculum_step(self) -> int | None:
        """Step from which the length is max (None for custom schedules)."""
        if self.schedule_type == FIXED_DISCRETE:
            return int(self.schedule_config["max_step"][-1]) + 1 if self.schedule_config["max_step"] else 0
        value = self.schedule_config.get("total_curriculum_step")
        return int(value) if value is not None else None


# --------------------------------------------------------------------------------------------------
# checking a block into a CurriculumConfig


def validate_curriculum_block(block: Mapping[str, Any], path: str = "curriculum_learning") -> CurriculumConfig:
    """Check one legacy curriculum block (the scheduler's input); raise ConfigError listing all problems.

    ``enabled`` may be left out (a block handed to a scheduler is meant to run).
    """
    chk = Checker()
    if not isinstance(block, Mapping):
        chk.add(path, block, "must be an object", "pass the curriculum block dict")
        raise_if_problems(chk)
    if "enabled" not in block:
        block = {**block, "enabled": True}
    out = check_curriculum_block(chk, block, path, LEGACY_KEYS, need_enabled=True)
    raise_if_problems(chk)
    if out is None:
        raise _disabled(path)
    return CurriculumConfig(**out)


def _disabled(path: str) -> ConfigError:
    return ConfigError(
        [Problem(f"{path}.enabled", False, "a scheduler needs an enabled curriculum", "set enabled to true")]
    )


# --------------------------------------------------------------------------------------------------
# the schedule


def _root_difficulty(step: int, cfg: CurriculumConfig, root_degree: float) -> int:
    sc = cfg.schedule_config
    lo, hi = cfg.min_difficulty, cfg.max_difficulty
    total, quantum = int(sc["total_curriculum_step"]), int(sc["difficulty_step"])
    if step >= total:
        return hi
    frac = (max(step, 0) / total) ** (1.0 / root_degree)
    value = math.floor(frac * (hi - lo) + lo)
    value -= value % quantum
    value = max(value, aligned_min(lo, quantum))
    return min(value, hi)


def _discrete_difficulty(step: int, cfg: CurriculumConfig) -> int:
    levels, thresholds = cfg.schedule_config["difficulty"], cfg.schedule_config["max_step"]
    for level, last_step in zip(levels, thresholds):
        if step <= last_step:
            return int(level)
    return int(levels[-1])


def _check_step(step: Any, where: str) -> None:
    if isinstance(step, bool) or not isinstance(step, Integral):
        raise TypeError(
            f"{where}: step must be an integer (the optimizer step), got {step!r} "
            f"({type(step).__name__}); pass e.g. int(step)"
        )


def _as_config(cfg: Any) -> CurriculumConfig:
    """``cfg`` as a CurriculumConfig: a validated block mapping is taken as it is (not checked again)."""
    if isinstance(cfg, CurriculumConfig):
        return cfg
    if isinstance(cfg, CurriculumScheduler):
        raise TypeError(
            "difficulty_at() takes a CurriculumConfig or a validated curriculum block, "
            "got a CurriculumScheduler: call scheduler.get_difficulty(step)"
        )
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"difficulty_at() takes a CurriculumConfig or a validated curriculum block (a dict), "
            f"got a {type(cfg).__name__}: pass RunConfig.curriculum, or "
            "validate_curriculum_block(block)"
        )
    missing = [k for k in ("min_difficulty", "max_difficulty", "schedule_type") if k not in cfg]
    if missing:
        raise TypeError(
            f"difficulty_at() got a block without {', '.join(missing)}: pass a "
            "CurriculumConfig, e.g. validate_curriculum_block(block)"
        )
    return CurriculumConfig(
        enabled=True,
        curriculum_type=cfg.get("curriculum_type", "seqlen"),
        min_difficulty=int(cfg["min_difficulty"]),
        max_difficulty=int(cfg["max_difficulty"]),
        schedule_type=cfg["schedule_type"],
        schedule_config=cfg.get("schedule_config") or {},
    )


def difficulty_at(step: int, cfg: CurriculumConfig | Mapping[str, Any]) -> int:
    """The sequence length for optimizer step ``step`` (1-based; step 0 is allowed).

    ``cfg`` is a :class:`CurriculumConfig` (e.g. ``RunConfig.curriculum``) or a validated curriculum
    block (``min_difficulty``, ``max_difficulty``, ``schedule_type``, ``schedule_config``); anything
    else is a TypeError saying what to pass. Pure: the same step always gives the same value.
    ``custom`` schedules need a scheduler.
    """
    _check_step(step, "difficulty_at()")
    cfg = _as_config(cfg)
    kind = cfg.schedule_type
    if kind == FIXED_LINEAR:
        return _root_difficulty(step, cfg, 1.0)
    if kind == FIXED_ROOT:
        return _root_difficulty(step, cfg, float(cfg.schedule_config["root_degree"]))
    if kind == FIXED_DISCRETE:
        return _discrete_difficulty(step, cfg)
    raise ValueError(
        f"difficulty_at() cannot evaluate schedule_type {kind!r}: "
        "use CurriculumScheduler.set_custom_get_difficulty() for custom schedules"
    )


class CurriculumScheduler:
    """DeepSpeed-compatible curriculum scheduler for the ``seqlen`` metric.

    Same method names as DeepSpeed's legacy scheduler. The value starts at ``min_difficulty``;
    :meth:`update_difficulty` recomputes it only while it is below ``max_difficulty``.

    ``cfg``: a :class:`CurriculumConfig` (already checked: used as it is), or a DeepSpeed curriculum
    block dict, as DeepSpeed-ported code passes, which is checked once here.
    """

    def __init__(self, cfg: CurriculumConfig | Mapping[str, Any]):
        if isinstance(cfg, CurriculumConfig):
            if not cfg.enabled:
                raise _disabled(cfg.source)
        elif isinstance(cfg, Mapping):
            cfg = validate_curriculum_block(cfg)
        else:
            raise TypeError(
                f"CurriculumScheduler() takes a CurriculumConfig or a curriculum block dict, got a {type(cfg).__name__}"
            )
        self._cfg = cfg
        self._custom: Callable[[int], int] | None = None
        self._current = cfg.min_difficulty

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
        state = self._cfg.block()
        state["current_difficulty"] = self._current
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._current = int(state["current_difficulty"])

    def get_difficulty(self, global_steps: int) -> int:
        """The schedule's value at ``global_steps`` (does not change the current value)."""
        if self._cfg.schedule_type == CUSTOM:
            if self._custom is None:
                raise RuntimeError(
                    "schedule_type 'custom' needs a difficulty function: call "
                    "scheduler.set_custom_get_difficulty(fn) before training"
                )
            return int(self._custom(global_steps))
        return difficulty_at(global_steps, self._cfg)

    def update_difficulty(self, global_steps: int) -> int:
        """Advance to ``global_steps`` (the engine passes ``global_steps + 1``) and return the value."""
        if self._current < self._cfg.max_difficulty:
            self._current = self.get_difficulty(global_steps)
        return self._current

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        return {"current_difficulty": self._current}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._current = int(state["current_difficulty"])

    @property
    def config(self) -> CurriculumConfig:
        """The checked curriculum this scheduler follows."""
        return self._cfg

    @property
    def block(self) -> dict[str, Any]:
        return self._cfg.block()

    def __repr__(self) -> str:
        return (
            f"CurriculumScheduler({self._cfg.schedule_type}, "
            f"{self._cfg.min_difficulty}->{self._cfg.max_difficulty}, "
            f"current={self._current})"
        )
