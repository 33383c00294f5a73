"""The batch layouts a cut reads, and the cut of each: "every sequence keeps its first L real tokens".

Pipelines hand a training step batches in one of four layouts:

- ``dense``: rows of real tokens (packed documents, Megatron's windows, ``group_texts``). The cut keeps
  each row's first L columns (:func:`~seqwarm.curriculum.batch.truncate_batch`).
- ``right_padded`` / ``left_padded``: rows of one sequence each, padded to the batch's longest with an
  ``attention_mask`` (B, S) of 1 for real tokens and 0 for pads (labels -100 on pads). Right padding
  puts the pads after the tokens, left padding (what Llama and Mistral tokenizers ship with) before.
  The cut keeps each row's first ``min(real, L)`` real tokens, on the same side as before, and drops
  columns that would hold only padding: the result is ``max_i min(real_i, L)`` wide.
- ``padding_free``: one row (1, N) holding several sequences back to back, each with ``position_ids``
  that restart at 0 (Hugging Face's ``DataCollatorWithFlattening``, TRL's ``padding_free`` /
  ``packing=True``), optionally with flash-attention's ``cu_seq_lens_q/k``, ``max_length_q/k`` and a
  ``seq_idx``. The cut keeps each sequence's first L tokens; positions stay, and the sequence offsets
  and maxima are rewritten to match.

:func:`batch_layout` tells them apart (``attention_mask`` with a zero: padded, its side from where the
zeros are; flash-attention keys, or one row whose ``position_ids`` restart and that has no
``loss_mask``: padding-free; anything else: dense). A batch whose layout cannot be read (a mask with a
hole in a row, right and left padding mixed, several rows with sequence offsets) is a ``ValueError``
naming what it found, never a guess. All functions are pure: new dicts, the input untouched.

:func:`~seqwarm.curriculum.batch.tokens_trained` (re-exported here) is the one rule for how many tokens a cut
micro-batch of a layout trained, the count the token clock advances by, for every path (every layout and
mode, length buckets, inject, ``record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqwarm.curriculum.batch import (  # the counting rule lives with the ops; re-exported here
    MASK_KEY,
    batch_shape,
    real_tokens,
    tokens_trained,
    trained_targets,
    truncate_batch,
)

__all__ = [
    "LAYOUTS",
    "batch_layout",
    "check_cut",
    "cut_to_layout",
    "longest_sequence",
    "read_layout",
    "real_tokens",
    "tokens_trained",
    "trained_targets",
]

LAYOUTS = ("auto", "dense", "padded", "padding_free")
"""What a cut may be told the layout is (``auto``: read it from each batch; ``padded``: either side)."""

OFFSET_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k")
MAX_KEYS = ("max_length_q", "max_length_k")
FLASH_KEYS = (*OFFSET_KEYS, *MAX_KEYS, "seq_idx")


def _padding_side(mask: torch.Tensor) -> str | None:
    """``right`` / ``left`` for a (B, S) 0/1 mask with a zero, None without one; ValueError otherwise."""
    real = mask != 0  # (B, S)
    if bool(real.all()):
        return None
    count = real.sum(dim=1, keepdim=True)  # (B, 1)
    cols = torch.arange(real.shape[1], device=real.device)  # (S,)
    right = bool(((cols < count) == real).all())  # every row: real tokens first, pads after
    left = bool(((cols >= real.shape[1] - count) == real).all())  # every row: pads first
    if right and not left:
        return "right"
    if left and not right:
        return "left"
    if right and left:  # only rows all real or all padding: a side does not matter; call it right
        return "right"
    holes = [i for i in range(real.shape[0]) if not _one_run(real[i])]
    if not holes:
        raise ValueError(
            "attention_mask mixes both sides: some rows are padded on the right, others on the left; seqwarm "
            "cannot tell which tokens are a sequence's first (pad every row of a batch on the same side)"
        )
    row = holes[0]
    raise ValueError(
        f"attention_mask row {row} is {real[row].int().tolist()[:32]}: its real tokens are not one run at the "
        "start (right padding) or the end (left padding) of the row; seqwarm cannot tell which tokens are a "
        "sequence's first"
    )


def _one_run(row: torch.Tensor) -> bool:
    values = row.int()
    return int((values[1:] != values[:-1]).sum()) <= 1


def _restarts(pos: torch.Tensor) -> bool:
    """Whether a (1, N) row of position ids starts a new run anywhere after its first column."""
    return pos.shape[1] > 1 and bool((pos[:, 1:] != pos[:, :-1] + 1).any())


def batch_layout(batch: Mapping[str, Any]) -> str:
    """``dense`` | ``right_padded`` | ``left_padded`` | ``padding_free`` (see the module); ValueError
    for a batch whose layout cannot be read."""
    _, rows, _ = batch_shape(batch)
    flash = [k for k in FLASH_KEYS if k in batch]
    mask = batch.get(MASK_KEY)
    pos = batch.get("position_ids")
    if flash:
        if rows != 1:
            raise ValueError(
                f"the batch has {', '.join(flash)} (a padding-free batch) but {rows} rows: padding-free "
                "batches hold their sequences in one row"
            )
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool((mask != 0).all()):
            raise ValueError(f"the batch has {', '.join(flash)} (padding-free) and an attention_mask with padding")
        return "padding_free"
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        side = _padding_side(mask)
        if side is not None:
            return f"{side}_padded"
    if rows == 1 and isinstance(pos, torch.Tensor) and "loss_mask" not in batch and _restarts(pos):
        return "padding_free"
    return "dense"


def read_layout(batch: Mapping[str, Any], setting: str = "auto", strict: bool = True) -> str:
    """The layout of ``batch`` as a ``layout`` setting (one of :data:`LAYOUTS`) reads it: ``auto`` takes
    :func:`batch_layout`'s; a set layout must agree with the batch (a batch without padding agrees with
    any). ValueError when they disagree, or when the batch cannot be read and ``strict`` (else dense)."""
    if setting == "dense":
        return "dense"
    try:
        found = batch_layout(batch)
    except ValueError:
        if strict:
            raise
        return "dense"
    if setting == "auto":
        return found
    if found == "dense":  # no padding in this batch; one row may be a single padding-free sequence
        return "padding_free" if setting == "padding_free" and batch_shape(batch)[1] == 1 else "dense"
    if found == setting or setting == "padded" and found.endswith("_padded"):
        return found
    raise ValueError(f"layout {setting!r} was set, but this batch is {found.replace('_', '-')}")


def _gather(batch: Mapping[str, Any], index: torch.Tensor, rows: int, seq: int) -> dict[str, Any]:
    """Every per-token tensor (first dims (rows, seq), or (1, seq) position ids) gathered along dim 1 at
    ``index`` (rows, W); other values pass through."""
    out = dict(batch)
    for key, t in batch.items():
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.shape[1] != seq or key in OFFSET_KEYS:
            continue
        if t.shape[0] != rows and not (t.shape[0] == 1 and key == "position_ids"):
            continue
        if t.shape[0] != rows:
            t = t.expand(rows, *t.shape[1:])
        idx = index.to(t.device).view(*index.shape, *([1] * (t.dim() - 2))).expand(-1, -1, *t.shape[2:])
        out[key] = t.gather(1, idx)  # (rows, W, ...)
    return out


def _cut_padded(batch: Mapping[str, Any], seqlen: int, side: str) -> dict[str, Any]:
    mask = batch[MASK_KEY]
    rows, seq = mask.shape
    real = (mask != 0).sum(dim=1)  # (B,)
    keep = real.clamp(max=seqlen)  # (B,) real tokens each row keeps
    width = max(1, int(keep.max()))
    if side == "right":  # real tokens first: a prefix of `width` columns keeps each row's first `keep`
        return truncate_batch(batch, width)
    cols = torch.arange(width, device=mask.device)  # (W,)
    pads = (width - keep).unsqueeze(1)  # (B, 1) pads the new row starts with
    first = (seq - real).unsqueeze(1)  # (B, 1) column of each row's first real token
    index = torch.where(cols >= pads, first + cols - pads, torch.zeros_like(cols))  # (B, W); pads read col 0
    return _gather(batch, index, rows, seq)


def _sequence_lengths(batch: Mapping[str, Any], seq: int) -> torch.Tensor:
    """The lengths of the sequences of a padding-free row, from its offsets or its position ids."""
    for key in OFFSET_KEYS:
        offsets = batch.get(key)
        if isinstance(offsets, torch.Tensor):
            offsets = offsets.reshape(-1).to(torch.int64)
            if int(offsets[0]) != 0 or int(offsets[-1]) != seq or bool((offsets[1:] < offsets[:-1]).any()):
                raise ValueError(
                    f"batch[{key!r}] = {offsets.tolist()[:16]} does not split the row's {seq} tokens into "
                    "sequences (offsets from 0 to the row length, not decreasing)"
                )
            return offsets[1:] - offsets[:-1]
    pos = batch.get("position_ids")
    if not isinstance(pos, torch.Tensor):
        raise ValueError("a padding-free batch needs position_ids or cu_seq_lens_q to tell its sequences apart")
    pos = pos.reshape(-1)
    starts = torch.ones(seq, dtype=torch.bool, device=pos.device)
    starts[1:] = pos[1:] != pos[:-1] + 1
    at = torch.nonzero(starts).reshape(-1)  # (D,) where each sequence starts
    ends = torch.cat([at[1:], at.new_tensor([seq])])
    return ends - at


def _cut_padding_free(batch: Mapping[str, Any], seqlen: int) -> dict[str, Any]:
    _, rows, seq = batch_shape(batch)
    lengths = _sequence_lengths(batch, seq)  # (D,)
    kept = lengths.clamp(max=seqlen)  # (D,)
    if int(kept.sum()) == seq:
        return dict(batch)
    starts = torch.cumsum(lengths, 0) - lengths  # (D,) where each sequence starts in the row
    offset = torch.arange(seq, device=lengths.device) - torch.repeat_interleave(starts, lengths)  # (N,)
    index = torch.nonzero(offset < seqlen).reshape(1, -1)  # (1, N') each sequence's first L tokens
    out = _gather(batch, index, rows, seq)
    new_offsets = torch.cat([kept.new_zeros(1), torch.cumsum(kept, 0)])  # (D + 1,)
    for key in OFFSET_KEYS:
        if isinstance(batch.get(key), torch.Tensor):
            out[key] = new_offsets.to(batch[key].device, batch[key].dtype)
    for key in MAX_KEYS:
        if key in batch:
            out[key] = int(kept.max())
    return out


def check_cut(layout: str, mode: str | None, bucketed: bool, model_name: str = "the model") -> None:
    """ValueError for a cut that cannot keep each sequence's first L real tokens of a ``layout`` batch: an
    injected length on left-padded or padding-free rows (the model cuts columns, not sequences), a
    re-chunking mode (reshape, window) or a length bucket on anything but dense rows."""
    if mode not in ("truncate", "reshape", "window") and layout in ("left_padded", "padding_free"):
        raise ValueError(
            f"curriculum mode inject: {model_name} cuts its inputs to their first L columns itself, which in a "
            f"{layout.replace('_', '-')} batch are not each sequence's first L tokens; use curriculum mode "
            "'truncate' (seqwarm cuts each sequence)"
        )
    if layout != "dense" and (mode in ("reshape", "window") or bucketed):
        what = f"curriculum mode {mode}" if not bucketed else "a length bucket"
        raise ValueError(
            f"{what} works on dense rows; this batch is {layout.replace('_', '-')} (rows of one sequence each, or "
            "sequences back to back): re-chunking it would make rows of padding and join sequences across it. "
            "Use curriculum mode 'truncate', which keeps each sequence's first L real tokens"
        )


def cut_to_layout(batch: Mapping[str, Any], seqlen: int, layout: str) -> dict[str, Any]:
    """``batch`` cut so each of its sequences keeps its first ``seqlen`` real tokens, for ``layout`` as
    :func:`batch_layout` names it (a new dict; a batch already short enough comes back as a copy)."""
    if layout == "dense":
        return truncate_batch(batch, seqlen)
    if layout in ("right_padded", "left_padded"):
        return _cut_padded(batch, seqlen, layout.removesuffix("_padded"))
    if layout == "padding_free":
        return _cut_padding_free(batch, seqlen)
    raise ValueError(f"unknown batch layout {layout!r}")


def longest_sequence(batch: Mapping[str, Any], layout: str) -> int:
    """The longest sequence of a (cut) batch: its width, or in a padding-free row its longest sequence."""
    _, _, seq = batch_shape(batch)
    if layout != "padding_free":
        return seq
    return int(_sequence_lengths(batch, seq).max())
