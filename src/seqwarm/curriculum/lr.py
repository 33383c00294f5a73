"""Learning rate as a pure function of the clock.

``lr_at(progress, cfg)`` takes the clock *including* the step the LR is for: the engine computes the
step's new clock (its samples and tokens are known from the batch shapes), asks for the LR, sets it,
and steps the optimizer. So step 1 of a 100-iteration warmup runs at ``lr / 100`` and step 100 at the
peak; decay starts from the tokens recorded at the end of warmup (``Progress.warmup_end_tokens``) and
linear/cosine decay reach exactly ``min_lr`` at the decay end.

Units: warmup by iterations, samples or tokens (whichever is set); decay by tokens (or iterations or
samples). ``inverse-sqrt`` decays as ``lr * sqrt(W / x)`` in the warmup's unit (W = warmup length,
x = the clock in that unit), or ``lr / sqrt(step)`` without warmup, never below ``min_lr``.

The schedule owns its config: :class:`LRConfig`, built checked by :func:`lr_config_from` (peak and
min, decay style, one warmup unit, one decay unit, warmup before decay), which ``load_config`` calls
with the values it found and where each came from. The clock is read through the small
:class:`Clock` protocol, so this module needs nothing of :mod:`seqwarm.curriculum.clock` (which imports
:class:`LRConfig` for ``advance``).

Conversions from DeepSpeed's curriculum-learning tutorial for ``seqwarm plan``: :func:`decay_tokens_from_samples`,
:func:`decay_tokens_from_iters`, :func:`warmup_samples_from_tokens`, :func:`warmup_iters_from_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from seqwarm.util.problems import Checker

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-sqrt")
WARMUP_UNITS = ("iters", "samples", "tokens")
"""The units LR warmup may be measured in (``LRConfig.warmup_<unit>``), in order of precedence."""
DECAY_UNITS = ("tokens", "iters", "samples")
"""The units the decay may be measured in (``LRConfig.decay_<unit>``), in order of precedence."""


class Clock(Protocol):
    """What the schedule reads of the clock (a :class:`seqwarm.curriculum.clock.Progress`)."""

    @property
    def step(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def warmup_end_tokens(self) -> int | None: ...


@dataclass(frozen=True)
class LRConfig:
    """Learning-rate schedule: warmup in iters/samples/tokens, decay in tokens (or iters/samples).

    Build it checked with :func:`lr_config_from` (``load_config`` does); at most one warmup and one
    decay length is set.
    """

    lr: float = 6e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the decay (and the floor of inverse-sqrt)."""
    decay_style: str = "constant"
    """One of :data:`DECAY_STYLES`."""
    warmup_iters: int = 0
    """Linear warmup over this many optimizer steps (0: none)."""
    warmup_samples: int = 0
    """Linear warmup over this many samples (0: none)."""
    warmup_tokens: int = 0
    """Linear warmup over this many trained tokens (0: none)."""
    decay_tokens: int | None = None
    """Decay from the end of warmup until this many tokens are trained (the recipe's unit)."""
    decay_iters: int | None = None
    """Decay until this optimizer step instead."""
    decay_samples: int | None = None
    """Decay until this many samples instead."""

    @property
    def warmup_unit(self) -> str | None:
        for unit in WARMUP_UNITS:
            if getattr(self, f"warmup_{unit}"):
                return unit
        return None

    @property
    def decay_unit(self) -> str | None:
        for unit in DECAY_UNITS:
            if getattr(self, f"decay_{unit}") is not None:
                return unit
        return None


def lr_config_from(
    chk: Checker,
    given: Mapping[str, tuple[Any, str]],
    *,
    default_lr: float,
    budget: Mapping[str, int | None],
    label: Callable[[str], str] = str,
) -> LRConfig:
    """Check LR settings and build the :class:`LRConfig`, recording every problem in ``chk``.

    ``given``: LRConfig field -> (value, the key path it came from), only the fields that were set.
    ``default_lr``: the peak when ``lr`` is not given (the optimizer's). ``budget``: the run's
    ``train_tokens`` / ``train_iters`` / ``train_samples`` (None = not set): linear and cosine decay
    default to the first one set. ``label(field)``: how a message names a field (e.g. its CLI flag).
    Rules: 0 <= min_lr <= peak; a known decay style; one warmup unit, one decay unit; warmup ends
    before the decay does.
    """
    vals: dict[str, Any] = {}
    for key in ("lr", "min_lr"):
        if key in given:
            vals[key] = chk.number(given[key][0], given[key][1], fix="use a learning rate >= 0, e.g. 3e-4")
    peak = vals.get("lr")
    peak = default_lr if peak is None else peak
    min_lr = vals.get("min_lr") or 0.0
    if peak is not None and min_lr > peak:
        chk.add(given["min_lr"][1], min_lr, f"must not exceed the peak learning rate ({peak:g})", "lower min_lr")
    if peak == 0:
        chk.warn("the peak learning rate is 0: the model will not learn")
    style = None
    if "decay_style" in given:
        style = chk.choice(given["decay_style"][0], given["decay_style"][1], DECAY_STYLES, "decay style")
    units: dict[str, int] = {}
    for group, minimum in (
        (tuple(f"warmup_{u}" for u in WARMUP_UNITS), 0),
        (tuple(f"decay_{u}" for u in DECAY_UNITS), 1),
    ):
        set_here = [k for k in group if k in given]
        if len(set_here) > 1:
            chk.add(
                given[set_here[1]][1],
                given[set_here[1]][0],
                f"only one of {', '.join(label(k) for k in group)} may be set",
                f"keep just one (also set: {given[set_here[0]][1]})",
            )
        for key in set_here[:1]:
            value = chk.integer(given[key][0], given[key][1], minimum=minimum)
            if value is not None:
                units[key] = value
    if units.get("warmup_tokens"):
        chk.warn(
            "LR warmup is in tokens: the recipe keeps it in samples or iterations (token warmup slows the "
            "rise while sequences are short); convert with warmup_samples = tokens / min_difficulty"
        )
    decay_given = any(f"decay_{u}" in units for u in DECAY_UNITS)
    if style is None:
        style = "linear" if decay_given else "constant"
    if style in ("linear", "cosine") and not decay_given:
        for unit in DECAY_UNITS:
            if budget.get(f"train_{unit}"):
                units[f"decay_{unit}"] = budget[f"train_{unit}"]
                break
        else:
            chk.add(
                given["decay_style"][1],
                style,
                f"{style} decay needs a length to decay over",
                "set lr_decay_tokens (or a train_tokens budget, which it then defaults to)",
            )
    for unit in WARMUP_UNITS:
        warm, decay = units.get(f"warmup_{unit}"), units.get(f"decay_{unit}")
        if warm and decay and warm >= decay:
            chk.add(
                given[f"warmup_{unit}"][1],
                warm,
                f"warmup must end before the decay does ({decay:,} {unit})",
                "shorten the warmup or lengthen the decay",
            )
    return LRConfig(lr=peak if peak is not None else default_lr, min_lr=min_lr, decay_style=style, **units)


def _warmup_fraction(progress: Clock, cfg: LRConfig) -> float:
    if cfg.warmup_iters:
        return progress.step / cfg.warmup_iters
    if cfg.warmup_samples:
        return progress.samples / cfg.warmup_samples
    if cfg.warmup_tokens:
        return progress.tokens / cfg.warmup_tokens
    return 1.0


def _decay_fraction(progress: Clock, cfg: LRConfig) -> float:
    """How far through the decay (0 at the end of warmup, 1 at the decay end)."""
    if cfg.decay_tokens is not None:
        start = progress.warmup_end_tokens or 0
        done, end = progress.tokens - start, cfg.decay_tokens - start
    elif cfg.decay_iters is not None:
        start = cfg.warmup_iters if cfg.warmup_unit == "iters" else 0
        done, end = progress.step - start, cfg.decay_iters - start
    elif cfg.decay_samples is not None:
        start = cfg.warmup_samples if cfg.warmup_unit == "samples" else 0
        done, end = progress.samples - start, cfg.decay_samples - start
    else:
        return 0.0
    if end <= 0:
        return 1.0
    return min(max(done / end, 0.0), 1.0)


def lr_at(progress: Clock, cfg: LRConfig) -> float:
    """The learning rate for the step whose clock (including that step) is ``progress``."""
    if progress.warmup_end_tokens is None:
        frac = _warmup_fraction(progress, cfg)
        if frac < 1.0:
            return cfg.lr * max(frac, 0.0)
    style = cfg.decay_style
    if style == "constant":
        return cfg.lr
    if style == "inverse-sqrt":
        unit = cfg.warmup_unit
        if unit is None:
            value = cfg.lr / math.sqrt(max(progress.step, 1))
        else:
            x = {"iters": progress.step, "samples": progress.samples, "tokens": progress.tokens}[unit]
            w = getattr(cfg, f"warmup_{unit}")
            value = cfg.lr * math.sqrt(w / max(x, w))
        return max(value, cfg.min_lr)
    frac = _decay_fraction(progress, cfg)
    if frac >= 1.0:
        return cfg.min_lr
    if style == "linear":
        coeff = 1.0 - frac
    elif style == "cosine":
        coeff = 0.5 * (1.0 + math.cos(math.pi * frac))
    else:
        raise ValueError(f"unknown decay style {style!r}")
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def decay_tokens_from_samples(lr_decay_samples: int, full_seqlen: int) -> int:
    """``--lr-decay-samples`` -> ``--lr-decay-tokens``: multiply by the full length (1K GPT-2, 2K GPT-3)."""
    return lr_decay_samples * full_seqlen


def decay_tokens_from_iters(lr_decay_iters: int, full_seqlen: int, global_batch: int) -> int:
    """``--lr-decay-iters`` -> ``--lr-decay-tokens``: multiply by full length and global batch."""
    return lr_decay_iters * full_seqlen * global_batch


def warmup_samples_from_tokens(warmup_tokens: int, min_difficulty: int) -> int:
    """A warmup of X tokens as samples at the curriculum's starting length (rounded up)."""
    return -(-warmup_tokens // min_difficulty)


def warmup_iters_from_tokens(warmup_tokens: int, min_difficulty: int, global_batch: int) -> int:
    """A warmup of X tokens as iterations at the starting length and global batch (rounded up)."""
    return -(-warmup_tokens // (min_difficulty * global_batch))
