"""The learning-rate settings' names and the checks of their values, apart from the schedule.

:class:`~seqwarm.curriculum.lr.LRConfig` checks itself with :func:`check_lr_fields` when it is built;
:func:`with_budget` gives a linear or cosine decay without a decay length the run's budget to span. No
import of :mod:`seqwarm.curriculum.lr` (which imports this), and no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from seqwarm.util.problems import Checker, ConfigError, Problem

logger = logging.getLogger(__name__)

__all__ = ["DECAY_STYLES", "DECAY_UNITS", "RULES", "WARMUP_UNITS", "check_lr_fields", "with_budget"]

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-sqrt", "inverse-square-root")
"""The decay styles; ``inverse-square-root`` (Megatron's spelling) is ``inverse-sqrt``."""
RULES = ("seqwarm", "megatron")
"""How a step's LR follows from the clock: seqwarm's (the clock including the step) or Megatron-DeepSpeed's."""
WARMUP_UNITS = ("iters", "samples", "tokens")
"""The units LR warmup may be measured in (``LRConfig.warmup_<unit>``), in order of precedence."""
DECAY_UNITS = ("tokens", "iters", "samples")
"""The units the decay may be measured in (``LRConfig.decay_<unit>``), in order of precedence."""


def check_lr_fields(chk: Checker, values: Mapping[str, Any]) -> None:
    """Record in ``chk`` every problem of an :class:`LRConfig`'s field values (named by field)."""
    peak = chk.number(values["lr"], "lr", fix="use a learning rate >= 0, e.g. 3e-4")
    low = chk.number(values["min_lr"], "min_lr", fix="use a learning rate >= 0, e.g. 3e-5")
    if peak is not None and low is not None and low > peak:
        chk.add("min_lr", low, f"must not exceed the peak learning rate lr ({peak:g})", f"use min_lr <= {peak:g}")
    chk.choice(values["decay_style"], "decay_style", DECAY_STYLES, "decay style")
    rule = chk.choice(values["rule"], "rule", RULES, "LR rule")
    warm = {u: chk.integer(values[f"warmup_{u}"], f"warmup_{u}", minimum=0) for u in WARMUP_UNITS}
    decay = {u: values[f"decay_{u}"] for u in DECAY_UNITS if values[f"decay_{u}"] is not None}
    decay = {u: v for u, v in decay.items() if chk.integer(v, f"decay_{u}", minimum=1) is not None}
    if len([u for u, v in warm.items() if v]) > 1:
        chk.add("warmup_*", warm, "only one warmup length may be set", "keep one of warmup_iters, _samples, _tokens")
    steps = [u for u in decay if u != "tokens"] if rule == "megatron" else list(decay)
    if len(steps) > 1:
        chk.add(
            "decay_*",
            decay,
            "only one decay length may be set",
            f"keep one of {', '.join('decay_' + u for u in steps)}",
        )
    if rule == "megatron" and not steps:
        chk.add(
            "decay_iters", None, "the megatron rule needs Megatron's lr_decay_steps", "set decay_iters or decay_samples"
        )
    for unit in WARMUP_UNITS:
        if warm.get(unit) and decay.get(unit) and warm[unit] >= decay[unit]:
            chk.add(
                f"warmup_{unit}",
                warm[unit],
                f"warmup must end before the decay does ({decay[unit]:,} {unit})",
                "shorten the warmup or lengthen the decay",
            )


def with_budget(cfg: Any, budget: Mapping[str, int | None], source: str = "SequenceLengthWarmup") -> Any:
    """``cfg`` (an :class:`~seqwarm.curriculum.lr.LRConfig`) with a decay length: a linear or cosine decay
    given none decays over the run's budget (``train_tokens``, else ``train_iters``, else ``train_samples``),
    as in a DeepSpeed config; without a budget either, a :class:`~seqwarm.util.problems.ConfigError` (it
    would hold the peak LR all run)."""
    if cfg.decay_style not in ("linear", "cosine") or cfg.decay_unit is not None:
        return cfg
    for unit in DECAY_UNITS:
        if budget.get(f"train_{unit}"):  # said once, at construction: the decay is not the user's number
            logger.info(
                "%s: the %s LR decay spans the budget, decay_%s=%s",
                source,
                cfg.decay_style,
                unit,
                budget[f"train_{unit}"],
            )
            return replace(cfg, **{f"decay_{unit}": budget[f"train_{unit}"]})
    problem = Problem(
        "lr.decay_style",
        cfg.decay_style,
        f"{cfg.decay_style} decay needs a length to decay over, and there is no budget to default it to",
        "set LRConfig(decay_tokens=...), or give a budget (train_tokens=...), which the decay then spans",
    )
    raise ConfigError([problem], source=source)
