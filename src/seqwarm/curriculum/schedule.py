"""The sequence-length curriculum: its config, the checks of a curriculum block, and the schedule.

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
(which reads the legacy and data_efficiency forms with :func:`check_curriculum_block`), or by
:func:`validate_curriculum_block` when a scheduler is built from a raw dict. A bad block raises one
:class:`~seqwarm.util.problems.ConfigError` listing every problem instead of an
``AssertionError``/``KeyError``/``ZeroDivisionError`` at the first step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from seqwarm.util.problems import Checker, ConfigError, Problem, raise_if_problems, suggest

FIXED_LINEAR = "fixed_linear"
FIXED_ROOT = "fixed_root"
FIXED_DISCRETE = "fixed_discrete"
CUSTOM = "custom"
SCHEDULE_TYPES = (FIXED_LINEAR, FIXED_ROOT, FIXED_DISCRETE, CUSTOM)
CURRICULUM_MODES = ("truncate", "reshape", "inject")
"""How the length reaches the model (see :attr:`CurriculumConfig.mode`)."""

LEGACY_KEYS = ("enabled", "curriculum_type", "min_difficulty", "max_difficulty", "schedule_type", "schedule_config")
"""The keys of DeepSpeed's legacy ``curriculum_learning`` block (the scheduler's input)."""
SCHEDULE_KEYS = {
    FIXED_LINEAR: ("total_curriculum_step", "difficulty_step"),
    FIXED_ROOT: ("total_curriculum_step", "difficulty_step", "root_degree"),
    FIXED_DISCRETE: ("difficulty", "max_step"),
    CUSTOM: (),
}
"""The ``schedule_config`` keys each schedule type needs."""
ALL_SCHEDULE_KEYS = tuple(dict.fromkeys(k for keys in SCHEDULE_KEYS.values() for k in keys))


def aligned_min(min_difficulty: int, difficulty_step: int) -> int:
    """The first multiple of ``difficulty_step`` that is >= ``min_difficulty``."""
    return -(-min_difficulty // difficulty_step) * difficulty_step


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
    """The schedule's settings (:data:`SCHEDULE_KEYS` of its type), checked."""
    mode: str | None = None
    """How the length reaches the model: truncate | reshape | inject | None (inject when the model's
    forward takes ``curriculum_seqlen``, else truncate)."""
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
# checking a block


_SCHEDULE_FIXES = {
    "total_curriculum_step": "the number of steps over which the length rises from min to max, e.g. 15000",
    "difficulty_step": "every length is a multiple of it: 8 for fp16, 16 for int8, 1 otherwise",
    "root_degree": "2 for a square root, 3 for a cube root",
    "difficulty": "the lengths to use in order, e.g. [128, 512, 1024]",
    "max_step": "the last step of each length but the final one, e.g. [5000, 10000]",
}


def _check_schedule_value(chk: Checker, key: str, value: Any, path: str) -> Any:
    if key in ("total_curriculum_step", "difficulty_step"):
        return chk.integer(value, path, fix=f"use a positive integer: {_SCHEDULE_FIXES[key]}")
    if key == "root_degree":
        return chk.number(value, path, minimum=0.0, strict=True, fix=_SCHEDULE_FIXES[key])
    return chk.int_list(value, path)


def _check_schedule(
    chk: Checker, block: Mapping[str, Any], path: str, lo: int | None, hi: int | None, kind: str | None
) -> dict[str, Any]:
    """Check ``schedule_config`` for ``kind``; return the cleaned dict (possibly partial)."""
    sc_path = f"{path}.schedule_config"
    if kind == CUSTOM:
        sc = chk.section(block, "schedule_config", sc_path) or {}
        return dict(sc)
    sc = chk.section(block, "schedule_config", sc_path)
    if sc is None:
        if block.get("schedule_config") is None and kind is not None:
            keys = ", ".join(SCHEDULE_KEYS[kind])
            chk.require(
                block,
                "schedule_config",
                sc_path,
                f"for schedule_type {kind!r}",
                f'add "schedule_config": {{...}} with {keys}',
            )
        return {}
    out: dict[str, Any] = {}
    needed = SCHEDULE_KEYS[kind] if kind is not None else ()
    for key in sc:
        if key in needed:
            continue
        if key in ALL_SCHEDULE_KEYS:
            if kind is not None:
                chk.warn(f"{sc_path}.{key} is ignored by schedule_type {kind!r}")
            else:  # unknown schedule type: still check the values that are there
                _check_schedule_value(chk, key, sc[key], f"{sc_path}.{key}")
        else:
            choices = needed or ALL_SCHEDULE_KEYS
            guess = suggest(key, choices)
            chk.add(
                f"{sc_path}.{key}",
                sc[key],
                f"unknown key for schedule_type {kind!r}" if kind else "unknown key",
                f'did you mean "{guess}"?' if guess else f"remove it (known: {', '.join(choices)})",
            )
    for key in needed:
        value = chk.require(
            sc, key, f"{sc_path}.{key}", f"for schedule_type {kind!r}", f"add it: {_SCHEDULE_FIXES[key]}"
        )
        if value is not None:
            out[key] = _check_schedule_value(chk, key, value, f"{sc_path}.{key}")
    if kind in (FIXED_LINEAR, FIXED_ROOT):
        step = out.get("difficulty_step")
        if step is not None and lo is not None and hi is not None and lo <= hi:
            if aligned_min(lo, step) > hi:
                chk.add(
                    f"{sc_path}.difficulty_step",
                    step,
                    f"no multiple of it lies in [min_difficulty, max_difficulty] = [{lo}, {hi}]",
                    "use a smaller difficulty_step or a larger max_difficulty",
                )
            else:
                if step % 8:
                    chk.warn(
                        f"{sc_path}.difficulty_step = {step}: a multiple of 8 (fp16) or 16 (int8) "
                        "lets GPU Tensor Cores run at full speed"
                    )
                if lo % step:
                    chk.warn(
                        f"{path}.min_difficulty = {lo} is not a multiple of difficulty_step {step}: "
                        f"the schedule starts at {aligned_min(lo, step)}"
                    )
                if hi % step:
                    chk.warn(
                        f"{path}.max_difficulty = {hi} is not a multiple of difficulty_step {step}: "
                        "seqwarm uses exactly max_difficulty from total_curriculum_step on "
                        "(DeepSpeed reached it some steps later)"
                    )
    if kind == FIXED_DISCRETE:
        levels, steps = out.get("difficulty"), out.get("max_step")
        if levels is not None and steps is not None and len(steps) != len(levels) - 1:
            chk.add(
                f"{sc_path}.max_step",
                steps,
                f"must have exactly one element fewer than difficulty ({len(levels)} levels)",
                f"give {len(levels) - 1} step thresholds, one per level but the last",
            )
        if levels is not None:
            if any(b < a for a, b in zip(levels, levels[1:])):
                chk.add(
                    f"{sc_path}.difficulty", levels, "must be sorted from short to long", f"sort it: {sorted(levels)}"
                )
            if lo is not None and hi is not None:
                outside = [v for v in levels if v < lo or v > hi]
                if outside:
                    chk.add(
                        f"{sc_path}.difficulty",
                        levels,
                        f"values {outside} lie outside [min_difficulty, max_difficulty] = [{lo}, {hi}]",
                        "keep every level between min_difficulty and max_difficulty",
                    )
        if steps is not None and any(b <= a for a, b in zip(steps, steps[1:])):
            chk.add(
                f"{sc_path}.max_step", steps, "must be strictly increasing", "list the switch steps in increasing order"
            )
    return out


def check_curriculum_block(
    chk: Checker, block: Mapping[str, Any], path: str, known: tuple[str, ...], need_enabled: bool
) -> dict[str, Any] | None:
    """Check a legacy block or a data_efficiency metric block, recording every problem in ``chk``.

    ``known``: the keys the block may hold (:data:`LEGACY_KEYS` for the legacy block). Returns the
    normalised block (DeepSpeed shape, ``enabled`` true), or None when it is disabled or broken.
    """
    chk.unknown_keys(block, known, path)
    enabled = True
    if need_enabled:
        enabled = chk.boolean(block.get("enabled", False), f"{path}.enabled")
        if enabled is False:
            return None  # a disabled block is not checked further: DeepSpeed ignores it too
    ctype = block.get("curriculum_type", "seqlen")
    if "curriculum_type" in known:
        ctype = chk.choice(ctype, f"{path}.curriculum_type", ("seqlen",), "curriculum_type")
    bounds = {}
    for key, fix in (
        ("min_difficulty", "the starting length, e.g. 8 (64 for billion-parameter models)"),
        ("max_difficulty", "the model's full sequence length, e.g. 1024"),
    ):
        value = chk.require(block, key, f"{path}.{key}", "when the curriculum is enabled", f"add it: {fix}")
        bounds[key] = None if value is None else chk.integer(value, f"{path}.{key}", fix=f"use {fix}")
    lo, hi = bounds["min_difficulty"], bounds["max_difficulty"]
    if lo is not None and hi is not None and lo > hi:
        chk.add(
            f"{path}.min_difficulty", lo, f"must not exceed max_difficulty ({hi})", "swap them, or lower min_difficulty"
        )
    if lo is not None and lo % 8:
        chk.warn(f"{path}.min_difficulty = {lo}: a multiple of 8 (fp16) or 16 (int8) suits GPU Tensor Cores")
    kind = chk.require(
        block,
        "schedule_type",
        f"{path}.schedule_type",
        "when the curriculum is enabled",
        'add "schedule_type": "fixed_linear" (recommended)',
    )
    if kind is not None:
        kind = chk.choice(kind, f"{path}.schedule_type", SCHEDULE_TYPES, "schedule_type")
    if kind == FIXED_ROOT:
        chk.warn(f"{path}.schedule_type fixed_root showed no clear advantage over fixed_linear and has one more knob")
    schedule = _check_schedule(chk, block, path, lo, hi, kind)
    if None in (lo, hi, kind, ctype) or not enabled:
        return None
    return {
        "enabled": True,
        "curriculum_type": ctype,
        "min_difficulty": lo,
        "max_difficulty": hi,
        "schedule_type": kind,
        "schedule_config": schedule,
    }


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
