"""A DeepSpeed curriculum block: its keys, its schedule types, and the checks of its fields.

:func:`check_curriculum_block` checks a legacy ``curriculum_learning`` block or a ``data_efficiency``
metric block into a :class:`~seqwarm.util.problems.Checker`, recording every problem (a missing or
misspelt key, a bound or step that does not fit, a discrete schedule out of order) and warning about
lengths that do not suit Tensor Cores; it returns the normalised block (DeepSpeed's shape). The callers
build the frozen :class:`~seqwarm.curriculum.schedule.CurriculumConfig` from it:
:func:`seqwarm.config.load_config` (through :mod:`seqwarm.config.blocks`) and
:func:`seqwarm.curriculum.schedule.validate_curriculum_block`. :func:`aligned_min`, the first length of
an aligned schedule, is shared with the schedule itself.

Pure, like :mod:`seqwarm.curriculum.schedule`, which imports it: no torch, and no import of
:mod:`seqwarm.config` (which imports both).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seqwarm.util.problems import Checker, suggest

FIXED_LINEAR = "fixed_linear"
FIXED_ROOT = "fixed_root"
FIXED_DISCRETE = "fixed_discrete"
CUSTOM = "custom"
SCHEDULE_TYPES = (FIXED_LINEAR, FIXED_ROOT, FIXED_DISCRETE, CUSTOM)
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
