"""Learning rate as a pure function of the clock (SPEC §4).

``lr_at(progress, cfg)`` takes the clock *including* the step the LR is for: the engine computes the
step's new clock (its samples and tokens are known from the batch shapes), asks for the LR, sets it,
and steps the optimizer. So step 1 of a 100-iteration warmup runs at ``lr / 100`` and step 100 at the
peak; decay starts from the tokens recorded at the end of warmup (``Progress.warmup_end_tokens``) and
linear/cosine decay reach exactly ``min_lr`` at the decay end.

Units: warmup by iterations, samples or tokens (whichever is set); decay by tokens (or iterations or
samples). ``inverse-sqrt`` decays as ``lr * sqrt(W / x)`` in the warmup's unit (W = warmup length,
x = the clock in that unit), or ``lr / sqrt(step)`` without warmup, never below ``min_lr``.

Conversions from the tutorial (SPEC §4) for ``seqwarm plan``: :func:`decay_tokens_from_samples`,
:func:`decay_tokens_from_iters`, :func:`warmup_samples_from_tokens`, :func:`warmup_iters_from_tokens`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from seqwarm.budget import Progress

if TYPE_CHECKING:
    from seqwarm.config import LRConfig


def _warmup_fraction(progress: Progress, cfg: LRConfig) -> float:
    if cfg.warmup_iters:
        return progress.step / cfg.warmup_iters
    if cfg.warmup_samples:
        return progress.samples / cfg.warmup_samples
    if cfg.warmup_tokens:
        return progress.tokens / cfg.warmup_tokens
    return 1.0


def _decay_fraction(progress: Progress, cfg: LRConfig) -> float:
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


def lr_at(progress: Progress, cfg: LRConfig) -> float:
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
