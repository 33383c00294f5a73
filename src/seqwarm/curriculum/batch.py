"""Shape a batch to the current curriculum length: truncate (drop tails) or reshape (keep tokens).

A batch is a ``dict`` of tensors in the Megatron/DeepSpeed layout::

    input_ids, labels, loss_mask, position_ids   (B, S)
    attention_mask (optional)                    (B, S) padding mask, or (B|1, 1, S, S) 4-D mask

Both functions are pure: they return a **new** dict and never modify the input dict or its tensors.
Whatever can be a view is a view (truncate is all views; reshape is views for contiguous inputs,
except the rewritten ``position_ids`` and a per-sample 4-D mask).

Which tensors are cut. ``B, S`` come from the *reference* tensor: ``input_ids`` if present, else the
first of ``labels``, ``loss_mask``, ``position_ids``. A tensor is **per-token** when it has at least two
dimensions and its first two are ``(B, S)`` — the four known keys must be exactly that (``position_ids``
may also be ``(1, S)``, broadcast over the batch) or a ``ValueError`` names the tensor and its shape.
Any other tensor shaped ``(B, S, ...)`` is cut along dim 1 like the known keys; everything else
(non-tensors, tensors of other shapes) passes through untouched. ``attention_mask`` is the one special
key: 4-D masks are cut as squares (see the functions).

``L >= S`` is a no-op (a shallow copy of the dict). ``L`` must be an ``int >= 1`` (``bool`` is not an
int here).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["truncate_batch", "reshape_batch", "bucket_batch", "bucket_length", "count_tokens", "batch_shape"]

PER_TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "position_ids")
MASK_KEY = "attention_mask"


def batch_shape(batch: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(key, B, S)`` of the batch's reference tensor (``input_ids``, else the first known key)."""
    for key in PER_TOKEN_KEYS:
        t = batch.get(key)
        if isinstance(t, torch.Tensor):
            if t.dim() != 2:
                raise ValueError(f"batch[{key!r}] must be 2-D (batch, seq), got shape {list(t.shape)}")
            return key, int(t.shape[0]), int(t.shape[1])
    raise ValueError(
        f"batch has none of the keys {list(PER_TOKEN_KEYS)} as a tensor "
        f"(got keys {sorted(map(str, batch))}); cannot tell its sequence length"
    )


def _check_length(seqlen: Any, batch: Mapping[str, Any]) -> tuple[str, int, int]:
    key, b, s = batch_shape(batch)
    ok = isinstance(seqlen, numbers.Integral) and not isinstance(seqlen, bool)
    if not ok or seqlen < 1:
        raise ValueError(
            f"sequence length must be an int >= 1, got {seqlen!r} ({type(seqlen).__name__}); "
            f"batch[{key!r}] has shape {[b, s]}"
        )
    return key, b, s


def _check_layout(batch: Mapping[str, Any], b: int, s: int) -> None:
    for key in PER_TOKEN_KEYS:
        t = batch.get(key)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"batch[{key!r}] must be a tensor, got {type(t).__name__}")
        ok = t.dim() == 2 and t.shape[1] == s and (t.shape[0] == b or key == "position_ids" and t.shape[0] == 1)
        if not ok:
            raise ValueError(
                f"batch[{key!r}] has shape {list(t.shape)}; expected {[b, s]} like the other per-token tensors"
            )
    m = batch.get(MASK_KEY)
    if m is None:
        return
    if not isinstance(m, torch.Tensor):
        raise ValueError(f"batch[{MASK_KEY!r}] must be a tensor, got {type(m).__name__}")
    padding = m.dim() == 2 and tuple(m.shape) == (b, s)
    square = m.dim() == 4 and m.shape[0] in (1, b) and m.shape[1] == 1 and tuple(m.shape[2:]) == (s, s)
    if not (padding or square):
        raise ValueError(
            f"batch[{MASK_KEY!r}] has shape {list(m.shape)}; expected a padding mask {[b, s]} or a "
            f"4-D mask {[b, 1, s, s]} / {[1, 1, s, s]}"
        )


def _is_per_token(key: str, t: Any, b: int, s: int) -> bool:
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or key == MASK_KEY and t.dim() == 4:
        return False
    return t.shape[1] == s and (t.shape[0] == b or key == "position_ids" and t.shape[0] == 1)


def truncate_batch(batch: Mapping[str, Any], seqlen: int) -> dict[str, Any]:
    """Keep the first ``seqlen`` positions of every per-token tensor (all views, no copies).

    A prefix cut keeps EOD position resets and loss masks consistent. A 4-D ``attention_mask`` is cut
    to its top-left ``[seqlen, seqlen]`` square, exactly what DeepSpeed's ``curriculum_seqlen``
    models did. ``seqlen >= S`` returns a shallow copy.
    """
    _, b, s = _check_length(seqlen, batch)
    _check_layout(batch, b, s)
    out = dict(batch)
    if seqlen >= s:
        return out
    for key, t in batch.items():
        if key == MASK_KEY and isinstance(t, torch.Tensor) and t.dim() == 4:
            out[key] = t[:, :, :seqlen, :seqlen]
        elif _is_per_token(key, t, b, s):
            out[key] = t[:, :seqlen]
    return out


def bucket_length(seqlen: int, multiple: int, full: int) -> int:
    """The columns :func:`bucket_batch` keeps: ``seqlen`` rounded up to a multiple of ``multiple``, at most
    ``full`` (a length at or past ``full`` keeps every column)."""
    return min(full, -(-seqlen // multiple) * multiple)


def bucket_batch(batch: Mapping[str, Any], seqlen: int, multiple: int) -> dict[str, Any]:
    """:func:`truncate_batch` to ``seqlen``, but keep ``seqlen`` rounded up to a multiple of ``multiple``
    columns (at most ``S``) and take the columns past ``seqlen`` out of the loss: ``labels`` there become
    -100 and ``loss_mask`` 0 (new tensors; the input is not changed).

    A causal model's outputs at positions ``< seqlen`` do not depend on later positions, so the loss and
    its gradients are those of the batch truncated to ``seqlen`` (up to the rounding of matmuls of
    another shape; dropout draws its masks over more columns, so its random numbers differ). The shapes
    a whole curriculum trains at are then at most ``ceil(S / multiple)`` (static shapes for
    ``torch.compile(dynamic=False)`` or CUDA graphs), at the cost of computing the masked columns.
    Both label layouts work: labels aligned with the inputs (Megatron) and labels equal to the inputs
    (Hugging Face models shift them: the target of position ``seqlen - 1`` is then masked, as a cut
    at ``seqlen`` has none). Needs a ``labels`` tensor.
    """
    _, _, s = _check_length(seqlen, batch)
    ok = isinstance(multiple, numbers.Integral) and not isinstance(multiple, bool) and multiple >= 1
    if not ok:
        raise ValueError(f"the bucket multiple must be an int >= 1, got {multiple!r}")
    labels = batch.get("labels")
    if not isinstance(labels, torch.Tensor):
        raise ValueError(
            f"bucket_batch masks the loss past the length through the labels: the batch has no "
            f"'labels' tensor (keys {sorted(map(str, batch))}); use truncate_batch"
        )
    columns = bucket_length(seqlen, multiple, s)
    out = truncate_batch(batch, columns)
    if columns <= seqlen:
        return out
    past = torch.arange(columns, device=labels.device) >= seqlen  # (columns,), broadcast over the rows
    out["labels"] = out["labels"].masked_fill(past, -100)
    mask = out.get("loss_mask")
    if isinstance(mask, torch.Tensor):
        out["loss_mask"] = mask.masked_fill(past.to(mask.device), 0)
    return out


def _rechunk(t: torch.Tensor, b: int, s: int, seqlen: int, n: int) -> torch.Tensor:
    """(b, s, *rest) -> (n // seqlen, seqlen, *rest), token order kept; a view when contiguous."""
    rest = tuple(t.shape[2:])
    if t.shape[0] != b:  # (1, S) position ids broadcast over the batch
        t = t.expand(b, s, *rest)
    return t.reshape(b * s, *rest)[:n].reshape(n // seqlen, seqlen, *rest)


def _restart_positions(pos: torch.Tensor) -> torch.Tensor:
    """Make every run of consecutive position ids in each row start at 0.

    A run is a maximal stretch where each id is the previous one + 1; a run starts at the row start
    and wherever the ids do not continue (an EOD reset, or the seam between two original samples).
    """
    rows, length = pos.shape
    idx = torch.arange(length, device=pos.device).expand(rows, length)
    starts = torch.ones(rows, length, dtype=torch.bool, device=pos.device)
    starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    run_start = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (rows, L)
    return pos - pos.gather(1, run_start)


def reshape_batch(batch: Mapping[str, Any], seqlen: int) -> dict[str, Any]:
    """Re-chunk the batch into rows of ``seqlen`` tokens, keeping (almost) every token.

    Every per-token tensor is flattened in row-major order (sample 0, then sample 1, ...) and cut
    into ``R = (B*S) // seqlen`` rows, so ``input_ids[i]`` and ``labels[i]`` stay paired and the
    order of tokens is kept. The last ``(B*S) % seqlen`` tokens (fewer than ``seqlen``) are dropped;
    none when ``seqlen`` divides ``B*S``.

    ``position_ids`` are rewritten so that every run of consecutive ids starts at 0: a row that
    starts mid-document counts 0, 1, 2, ... from the row start; after an EOD reset (or at the seam
    where one original sample ends and the next begins) the ids restart at 0 as before. For the
    usual data (``arange`` rows, or resets to 0 after EOD) that is exactly "restart at every row
    start, keep every reset". Without ``position_ids`` the model's default ``arange`` per row is the
    same thing.

    ``attention_mask``: a ``(B, S)`` padding mask is re-chunked like the tokens. A 4-D mask of batch
    size 1 is taken to be the shared causal mask and cut to its top-left square (tokens may then
    attend across the seam between two original samples, as in any packed row). A 4-D mask with
    batch size ``B > 1`` (per-document masks) cannot be re-chunked and raises ``ValueError`` — use
    :func:`truncate_batch` for such batches.
    """
    _, b, s = _check_length(seqlen, batch)
    _check_layout(batch, b, s)
    out = dict(batch)
    if seqlen >= s:
        return out
    n = (b * s) // seqlen * seqlen
    for key, t in batch.items():
        if key == MASK_KEY and isinstance(t, torch.Tensor) and t.dim() == 4:
            if t.shape[0] != 1 and b > 1:
                raise ValueError(
                    f"reshape_batch cannot re-chunk a per-sample 4-D attention_mask of shape "
                    f"{list(t.shape)}: only a shared causal mask {[1, 1, s, s]} or a padding mask "
                    f"{[b, s]} can be reshaped; use truncate_batch (mode 'truncate') instead"
                )
            out[key] = t[:, :, :seqlen, :seqlen]
        elif _is_per_token(key, t, b, s):
            out[key] = _rechunk(t, b, s, seqlen, n)
    if isinstance(out.get("position_ids"), torch.Tensor):
        out["position_ids"] = _restart_positions(out["position_ids"])
    return out


def count_tokens(batch: Mapping[str, Any], use_loss_mask: bool = False) -> int:
    """Tokens in a (shaped) batch: ``B * S`` of the reference tensor, or ``loss_mask.sum()``.

    ``use_loss_mask=True`` needs a ``loss_mask`` tensor; reading its sum synchronises with the device.
    """
    _, b, s = batch_shape(batch)
    if not use_loss_mask:
        return b * s
    mask = batch.get("loss_mask")
    if not isinstance(mask, torch.Tensor):
        raise ValueError("count_tokens(use_loss_mask=True) needs a 'loss_mask' tensor in the batch")
    return int(mask.sum().item())
