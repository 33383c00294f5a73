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

Two rules (``LRConfig.rule``). ``"seqwarm"`` is the one above. ``"megatron"`` is Megatron-DeepSpeed's
``OptimizerParamScheduler`` (``megatron/optimizer_param_scheduler.py``, driven by ``megatron/training.py``;
microsoft/Megatron-DeepSpeed at f4157be), step for step:

- its clock is in samples (``num_steps`` grows by the global batch per step) and in tokens (``num_tokens``
  is ``args.consumed_train_tokens``); it is stepped *after* each optimizer step (DeepSpeed's
  ``engine.step(lr_kwargs={"increment": ...})``), and the loop adds a step's tokens only after that. So
  step n trains at the LR computed from the samples of steps 1..n-1 and the tokens of steps 1..n-2
  (step 1 at the LR of an empty clock: 0 with a warmup);
- warmup: ``lr * steps / warmup`` while ``steps <= warmup`` (iterations count as iterations x global
  batch samples), or ``lr * tokens / lr_warmup_tokens`` with ``--lr-warmup-tokens``; with token decay
  and a warmup in iterations/samples, the tokens seen when ``steps`` reaches the warmup are recorded as
  the start of the decay;
- ``constant`` stays at the peak; past the decay end (``steps > lr_decay_steps``, or
  ``tokens > lr_decay_tokens``) every other style gives ``min_lr`` (``inverse-square-root`` too);
- ``inverse-square-root``: ``lr * sqrt(warmup) / sqrt(steps)`` (both at least 1 sample), in tokens once a
  decay-start token count is known; never below ``min_lr``;
- ``linear`` / ``cosine``: the ratio ``(steps - warmup) / (decay - warmup)`` (tokens: from the recorded
  start to ``lr_decay_tokens``), ``min + (1 - r) * (lr - min)`` or ``min + (cos(pi r) + 1) / 2 * (lr - min)``.

Where the Megatron rule departs from that code (both fixes of a crash, identical wherever it runs): the
decay start is recorded when the warmup is first *reached or passed* (Megatron tests ``==`` and crashes
with a ``TypeError`` when the warmup is not a whole number of global batches), and a token decay without
any warmup starts from 0 tokens (Megatron subtracts ``None``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from seqwarm.curriculum.lr_checks import (  # the names of the settings and the checks of their values
    DECAY_STYLES,
    DECAY_UNITS,
    RULES,
    WARMUP_UNITS,
    check_lr_fields,
)
from seqwarm.util.problems import Checker, raise_if_problems


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

    Every instance is checked when it is built (one :class:`~seqwarm.util.problems.ConfigError` lists every
    problem with its fix): ``0 <= min_lr <= lr``, a known decay style and rule, at most one warmup and one
    decay length, the warmup ending before the decay. ``load_config`` builds it with :func:`lr_config_from`,
    which also fills in a decay length from the run's budget; a linear or cosine decay without one decays over
    the budget of the :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` it is handed to
    (:func:`with_budget`), and is an error without a budget.
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
    rule: str = "seqwarm"
    """One of :data:`RULES`. ``"megatron"``: Megatron-DeepSpeed's scheduler (see the module's docstring);
    then ``decay_iters`` (iteration-based training) or ``decay_samples`` (sample-based) is always set, as
    Megatron's ``lr_decay_steps``, and ``decay_tokens``, when set, decays by tokens instead."""

    def __post_init__(self) -> None:
        chk = Checker()
        check_lr_fields(chk, {f.name: getattr(self, f.name) for f in fields(self)})
        raise_if_problems(chk, "LRConfig")

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
    rule: str = "seqwarm",
) -> LRConfig:
    """Check LR settings and build the :class:`LRConfig`, recording every problem in ``chk``.

    ``given``: LRConfig field -> (value, the key path it came from), only the fields that were set.
    ``default_lr``: the peak when ``lr`` is not given (the optimizer's). ``budget``: the run's
    ``train_tokens`` / ``train_iters`` / ``train_samples`` (None = not set): linear and cosine decay
    default to the first one set. ``label(field)``: how a message names a field (e.g. its CLI flag).
    Rules: 0 <= min_lr <= peak; a known decay style; one warmup unit, one decay unit; warmup ends
    before the decay does. ``rule="megatron"`` applies Megatron-DeepSpeed's instead (:func:`_megatron_units`).
    """
    if rule not in RULES:
        raise ValueError(f"unknown LR rule {rule!r}; known: {', '.join(RULES)}")
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
    if style == "inverse-square-root":
        style = "inverse-sqrt"
    units: dict[str, int] = {}
    # Megatron decays by tokens *instead of* its step-unit decay length, which it always has
    decay_group = ("decay_iters", "decay_samples") if rule == "megatron" else tuple(f"decay_{u}" for u in DECAY_UNITS)
    groups = [(tuple(f"warmup_{u}" for u in WARMUP_UNITS), 0), (decay_group, 1)]
    if rule == "megatron":
        groups.append((("decay_tokens",), 1))
    for group, minimum in groups:
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
    if rule == "megatron":
        style = _megatron_units(chk, given, units, budget, label, style or "linear")
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
    if chk.problems:  # the caller raises them all; the LRConfig is never used
        return LRConfig()
    return LRConfig(lr=peak if peak is not None else default_lr, min_lr=min_lr, decay_style=style, rule=rule, **units)


def _megatron_units(
    chk: Checker,
    given: Mapping[str, tuple[Any, str]],
    units: dict[str, int],
    budget: Mapping[str, int | None],
    label: Callable[[str], str],
    style: str,
) -> str:
    """Megatron-DeepSpeed's rules for the LR lengths (``arguments.py`` and ``get_optimizer_param_scheduler``
    in ``training.py``): training is iteration-based (``--train-iters``) or sample-based
    (``--train-samples``), not both, and its warmup and decay lengths are in the same unit (or in tokens);
    the decay length defaults to the training length, also next to ``--lr-decay-tokens`` (which then decays
    instead). Fills ``units`` in place; returns the decay style (Megatron's default: linear)."""
    iters, samples = budget.get("train_iters"), budget.get("train_samples")
    if iters and samples:
        chk.add(
            "--train-samples",
            samples,
            "Megatron-DeepSpeed trains by iterations or by samples, not both",
            "keep --train-iters or --train-samples (--train-tokens may stay next to either)",
        )
        return style
    if not (iters or samples):
        chk.add(
            "--train-iters",
            None,
            "Megatron-DeepSpeed's LR schedule needs --train-iters or --train-samples (its decay length defaults to it)",
            "give --train-iters N (a generous cap next to --train-tokens), or --no-megatron for seqwarm's rule",
        )
        return style
    unit, other = ("iters", "samples") if iters else ("samples", "iters")
    for kind in ("warmup", "decay"):
        key = f"{kind}_{other}"
        if key in units:
            chk.add(
                given[key][1],
                units[key],
                f"{'iteration' if iters else 'sample'}-based training (--train-{unit}) takes its LR "
                f"{kind} in {unit} or tokens",
                f"give {label(f'{kind}_{unit}')} instead",
            )
            del units[key]
    units.setdefault(f"decay_{unit}", iters or samples)  # lr_decay_iters/samples default to the run's length
    return style


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
    """The learning rate for the step whose clock (including that step) is ``progress``.

    Under ``cfg.rule == "megatron"`` it is the LR Megatron-DeepSpeed's scheduler sets for that step: from
    the clock's ``samples_before`` and ``tokens_lagged`` (what :func:`seqwarm.curriculum.clock.advance`
    records under that rule), see :func:`megatron_lr`.
    """
    if cfg.rule == "megatron":
        steps, samples, tokens = megatron_clock(progress, cfg)
        return megatron_lr(steps, tokens, progress.warmup_end_tokens, cfg, samples=samples)
    if cfg.decay_style in ("linear", "cosine") and cfg.decay_unit is None:
        raise ValueError(
            f"{cfg.decay_style} decay without a decay length (LRConfig.decay_tokens, _iters or _samples) would hold "
            "the peak LR: set one, or hand the LRConfig to a SequenceLengthWarmup with a budget (with_budget)"
        )
    if progress.warmup_end_tokens is None:
        frac = _warmup_fraction(progress, cfg)
        if frac < 1.0:
            return cfg.lr * max(frac, 0.0)
    style = cfg.decay_style
    if style == "constant":
        return cfg.lr
    if style in ("inverse-sqrt", "inverse-square-root"):
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


def megatron_step_unit(cfg: LRConfig) -> str:
    """``"iters"`` or ``"samples"``: what a Megatron-rule run's training length is counted in."""
    if cfg.decay_iters is not None:
        return "iters"
    if cfg.decay_samples is not None:
        return "samples"
    raise ValueError("the megatron LR rule needs decay_iters or decay_samples (Megatron's lr_decay_steps)")


def megatron_clock(progress: Clock, cfg: LRConfig) -> tuple[int, int, int]:
    """``(steps, samples, tokens)`` Megatron-DeepSpeed's scheduler has seen when it sets the LR of the step
    whose clock is ``progress``: the steps (in :func:`megatron_step_unit`) and samples of the steps before
    it, and the tokens of the steps before the previous one. A clock :func:`~seqwarm.curriculum.clock.advance`
    made under the Megatron rule carries them; for another the counts are inferred from a constant batch
    (step 0: all zero)."""
    if progress.step <= 0:
        return 0, 0, 0
    samples = getattr(progress, "samples_before", None)
    if samples is None:
        samples = progress.samples - progress.samples // progress.step
    tokens = getattr(progress, "tokens_lagged", None)
    if tokens is None:
        tokens = progress.tokens * max(progress.step - 2, 0) // progress.step
    steps = progress.step - 1 if megatron_step_unit(cfg) == "iters" else samples
    return steps, samples, tokens


def megatron_lr(
    steps: int, tokens: int, decay_start: int | None, cfg: LRConfig, *, samples: int | None = None
) -> float:
    """Megatron-DeepSpeed's ``OptimizerParamScheduler.get_lr`` (see the module's docstring) at its clock.

    ``steps``: its step count in the unit of the training length (:func:`megatron_step_unit`; Megatron
    counts iterations as iterations x global batch samples, which gives the same ratios). ``samples``: the
    same count in samples (only ``inverse-square-root`` without a warmup reads it; default ``steps``).
    ``tokens``: its token count. ``decay_start``: the token count it recorded at the end of an
    iteration/sample warmup ahead of a token decay (None: none recorded).
    """
    unit = megatron_step_unit(cfg)
    warm = getattr(cfg, f"warmup_{unit}")  # 0 with a token warmup or none
    decay_steps = getattr(cfg, f"decay_{unit}")
    warm_tokens = cfg.warmup_tokens or decay_start  # Megatron's lr_warmup_tokens
    if warm_tokens is None:
        if warm > 0 and steps <= warm:
            return cfg.lr * steps / warm
    elif warm_tokens > 0 and tokens <= warm_tokens:
        return cfg.lr * tokens / warm_tokens
    style = cfg.decay_style
    if style == "constant":
        return cfg.lr
    if (steps > decay_steps) if cfg.decay_tokens is None else (tokens > cfg.decay_tokens):
        return cfg.min_lr
    if style in ("inverse-sqrt", "inverse-square-root"):
        if warm_tokens is not None:
            value = cfg.lr * math.sqrt(max(warm_tokens, 1)) / math.sqrt(max(tokens, 1))
        elif warm > 0:  # sqrt(warmup / steps): the global batch cancels out
            value = cfg.lr * math.sqrt(warm / steps)
        else:
            value = cfg.lr / math.sqrt(max(steps if samples is None else samples, 1))
        return max(cfg.min_lr, value)
    if cfg.decay_tokens is None:
        ratio = (steps - warm) / (decay_steps - warm)
    else:
        start = warm_tokens or 0  # no warmup at all: from 0 (Megatron subtracts None and crashes)
        ratio = (tokens - start) / (cfg.decay_tokens - start)
    ratio = min(max(ratio, 0.0), 1.0)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
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
