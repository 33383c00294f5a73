"""The clock that drives every schedule, and when a run stops.

``Progress(step, samples, tokens)`` counts optimizer steps taken, samples (full-length sequences drawn
from the data) and the tokens actually trained (after truncation/reshape, summed over data-parallel
ranks). It also records ``warmup_end_tokens``: the token count at the end of the step in which LR
warmup finished, where token-based decay starts. That value is set by :func:`advance` when the
warmup boundary is first reached or crossed (a ``>=`` test, so warmup need not be a whole number of
batches) and travels with the clock into checkpoints, so a resumed run decays exactly as before.

Under Megatron-DeepSpeed's LR rule (``LRConfig.rule == "megatron"``, see :mod:`seqwarm.curriculum.lr`)
the clock also carries what that scheduler has seen when it sets a step's LR — ``samples_before``,
``tokens_before`` and ``tokens_lagged`` — and ``warmup_end_tokens`` is the token count it records at the end
of warmup (the tokens of the steps before the previous one, when the warmup is first reached or passed).
Under seqwarm's rule those three stay None and are left out of :meth:`Progress.to_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from seqwarm.curriculum.lr import LRConfig, megatron_step_unit

COUNT_TOKENS_BY = ("shape", "loss_mask")
"""How the clock counts a cut micro-batch's tokens (``count_tokens_by``): ``shape``, the tokens the model is
given (padding left out); ``loss_mask``, its loss terms (the loss mask's sum, else the labels that are not
-100). The one rule that applies it is :func:`seqwarm.curriculum.batch.tokens_trained`."""


@dataclass(frozen=True)
class Limits:
    """When a run stops (None: no such limit): what :func:`stop_reason` reads."""

    train_tokens: int | None = None
    train_iters: int | None = None
    train_samples: int | None = None


class Budget(Protocol):
    """What :func:`stop_reason` reads: the run's budgets (None = not set), e.g. a ``RunConfig``."""

    @property
    def train_tokens(self) -> int | None: ...
    @property
    def train_iters(self) -> int | None: ...
    @property
    def train_samples(self) -> int | None: ...


@dataclass(frozen=True)
class Progress:
    """Optimizer steps, samples and tokens trained so far (global, over all ranks)."""

    step: int = 0
    samples: int = 0
    tokens: int = 0
    warmup_end_tokens: int | None = None
    """Tokens trained when LR warmup ended (None while it has not)."""
    samples_before: int | None = field(default=None, compare=False)
    """Megatron rule only: samples trained before the latest step."""
    tokens_before: int | None = field(default=None, compare=False)
    """Megatron rule only: tokens trained before the latest step."""
    tokens_lagged: int | None = field(default=None, compare=False)
    """Megatron rule only: tokens trained before the step before the latest one (the count Megatron's
    scheduler reads: the loop adds a step's tokens after stepping the scheduler)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in _MEGATRON_KEYS:
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Progress:
        return cls(
            step=int(d["step"]),
            samples=int(d["samples"]),
            tokens=int(d["tokens"]),
            warmup_end_tokens=None if d.get("warmup_end_tokens") is None else int(d["warmup_end_tokens"]),
            **{k: int(d[k]) for k in _MEGATRON_KEYS if d.get(k) is not None},
        )


_MEGATRON_KEYS = ("samples_before", "tokens_before", "tokens_lagged")


def warmup_done(progress: Progress, lr_cfg: LRConfig) -> bool:
    """Whether LR warmup is complete at ``progress`` (always true for no warmup)."""
    if lr_cfg.warmup_iters:
        return progress.step >= lr_cfg.warmup_iters
    if lr_cfg.warmup_samples:
        return progress.samples >= lr_cfg.warmup_samples
    if lr_cfg.warmup_tokens:
        return progress.tokens >= lr_cfg.warmup_tokens
    return True


def advance(progress: Progress, samples: int, tokens: int, lr_cfg: LRConfig) -> Progress:
    """The clock after one more optimizer step that trained ``samples`` sequences and ``tokens`` tokens."""
    if samples < 0 or tokens < 0:
        raise ValueError(f"a step cannot train a negative amount (samples={samples}, tokens={tokens})")
    if lr_cfg.rule == "megatron":
        return _advance_megatron(progress, samples, tokens, lr_cfg)
    nxt = Progress(progress.step + 1, progress.samples + samples, progress.tokens + tokens, progress.warmup_end_tokens)
    if nxt.warmup_end_tokens is None:
        if not (lr_cfg.warmup_iters or lr_cfg.warmup_samples or lr_cfg.warmup_tokens):
            return Progress(nxt.step, nxt.samples, nxt.tokens, 0)
        if warmup_done(nxt, lr_cfg):
            return Progress(nxt.step, nxt.samples, nxt.tokens, nxt.tokens)
    return nxt


def _advance_megatron(progress: Progress, samples: int, tokens: int, lr_cfg: LRConfig) -> Progress:
    """:func:`advance` under Megatron-DeepSpeed's rule: also what its scheduler has seen, and its warmup end."""
    lagged = progress.tokens_before if progress.tokens_before is not None else progress.tokens
    nxt = Progress(
        progress.step + 1,
        progress.samples + samples,
        progress.tokens + tokens,
        progress.warmup_end_tokens,
        samples_before=progress.samples,
        tokens_before=progress.tokens,
        tokens_lagged=lagged,
    )
    if nxt.warmup_end_tokens is None and lr_cfg.decay_tokens is not None and not lr_cfg.warmup_tokens:
        unit = megatron_step_unit(lr_cfg)
        warm = getattr(lr_cfg, f"warmup_{unit}")
        seen = progress.step if unit == "iters" else progress.samples  # the scheduler's steps for this LR
        if warm and seen >= warm:  # Megatron: `==` (and a crash when the warmup is passed over)
            nxt = replace(nxt, warmup_end_tokens=lagged)
    return nxt


def stop_reason(progress: Progress, cfg: Budget) -> str | None:
    """Why the run is over at ``progress`` — the token budget first, then the iteration/sample caps."""
    if cfg.train_tokens is not None and progress.tokens >= cfg.train_tokens:
        return f"reached the token budget ({progress.tokens:,} >= {cfg.train_tokens:,} tokens)"
    if cfg.train_iters is not None and progress.step >= cfg.train_iters:
        return f"reached train_iters ({cfg.train_iters:,} steps)"
    if cfg.train_samples is not None and progress.samples >= cfg.train_samples:
        return f"reached train_samples ({cfg.train_samples:,} samples)"
    return None


def should_stop(progress: Progress, cfg: Budget) -> bool:
    """True after the first optimizer step at which a budget is reached."""
    return stop_reason(progress, cfg) is not None


def micro_batch_shape(rows: int, seq: int, seqlen: int, mode: str | None) -> tuple[int, int]:
    """``(rows, length)`` a micro-batch of ``rows`` sequences of ``seq`` tokens becomes at length ``seqlen``.

    The one counting rule of :mod:`seqwarm.curriculum.batch`'s ops, as arithmetic (the engines count tokens and
    ``seqwarm plan`` projects them with it). ``seqlen >= seq``: unchanged. ``"reshape"``: the
    ``rows * seq`` tokens re-chunked into rows of ``seqlen``, the last ``(rows * seq) % seqlen``
    dropped. ``"window"``: unchanged at every length (the length is the attention span inside rows
    kept at full length). Any other mode (``"truncate"``, ``"inject"``, None = auto): every row cut to
    ``seqlen``.
    """
    if rows < 1 or seq < 1 or seqlen < 1:
        raise ValueError(f"a micro-batch needs rows, seq and seqlen >= 1, got {rows}, {seq}, {seqlen}")
    if seqlen >= seq or mode == "window":
        return rows, seq
    if mode == "reshape":
        return (rows * seq) // seqlen, seqlen
    return rows, seqlen


def bucket_length(seqlen: int, multiple: int, full: int) -> int:
    """The columns :func:`bucket_batch` keeps: ``seqlen`` rounded up to a multiple of ``multiple``, at most
    ``full`` (a length at or past ``full`` keeps every column)."""
    return min(full, -(-seqlen // multiple) * multiple)


def tokens_per_step(cfg: Any, seqlen: int) -> int:  # cfg: a run config (curriculum.run.PlanSettings)
    """Tokens one optimizer step trains at length ``seqlen`` (global, all ranks).

    truncate/inject: every sequence is cut to ``seqlen``. reshape: each micro-batch keeps its tokens,
    re-chunked into rows of ``seqlen`` (up to ``seqlen - 1`` tokens per micro-batch dropped). window: every
    token at every length (the baseline's tokens per step).
    """
    full = cfg.full_length
    if full is None:
        raise ValueError("the full sequence length is unknown: set seq_length")
    mode = cfg.curriculum.mode if cfg.curriculum else None
    rows, length = micro_batch_shape(cfg.micro_batch_size, full, seqlen, mode)
    return rows * length * cfg.gradient_accumulation_steps * cfg.world_size
