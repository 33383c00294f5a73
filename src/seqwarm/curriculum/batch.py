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

from seqwarm.curriculum.clock import bucket_length  # pure arithmetic, kept torch-free for the plan

__all__ = [
    "truncate_batch",
    "reshape_batch",
    "window_batch",
    "bucket_batch",
    "bucket_length",
    "count_tokens",
    "tokens_trained",
    "trained_targets",
    "real_tokens",
    "batch_shape",
    "number_documents",
    "block_starts",
    "run_starts",
]

PER_TOKEN_KEYS = ("input_ids", "labels", "loss_mask", "position_ids")
MASK_KEY = "attention_mask"
DOCUMENT_KEY = "document_ids"
"""Per-token document ids (B, S): a token attends only to earlier tokens of the same id in its row
(document masking, block-diagonal causal attention). A per-token tensor like the others, so every cut
moves it with its tokens; the model builds the attention mask from it."""


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
    return pos - pos.gather(1, run_starts(_id_breaks(pos)))


def _id_breaks(pos: torch.Tensor) -> torch.Tensor:
    """(R, N) bool: True at each row's first column and wherever the position ids do not continue (the
    id is not the one before + 1)."""
    breaks = torch.ones(pos.shape, dtype=torch.bool, device=pos.device)
    breaks[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    return breaks


def run_starts(starts: torch.Tensor) -> torch.Tensor:
    """(R, N) int64: for each column, the column its run starts at (``starts``: (R, N) bool, True where
    a run starts; column 0 always starts one). ``columns - run_starts(starts)`` are positions restarting
    at 0 at each run."""
    rows, length = starts.shape
    idx = torch.arange(length, device=starts.device).expand(rows, length)
    return torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (R, N)


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

    ``document_ids`` (document masking, any number of rows): re-chunked like the tokens, after each
    original row's documents are numbered apart (:func:`number_documents`), so a document never
    joins another across the seam between two original rows; a document split by a new row start
    continues, as its own block, at the start of the next row.

    ``attention_mask``: a ``(B, S)`` padding mask is re-chunked like the tokens. A 4-D mask of batch
    size 1 is taken to be the shared causal mask and cut to its top-left square (tokens may then
    attend across the seam between two original samples, as in any packed row). A 4-D mask with
    batch size ``B > 1`` (per-sample masks) cannot be re-chunked and raises ``ValueError``: carry
    per-token ``document_ids`` instead (the model builds the mask from them), or use
    :func:`truncate_batch`.
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
                    f"{[b, s]} can be reshaped; carry per-token {DOCUMENT_KEY!r} for per-document masks, or "
                    "use truncate_batch (mode 'truncate') instead"
                )
            out[key] = t[:, :, :seqlen, :seqlen]
        elif key == DOCUMENT_KEY and _is_per_token(key, t, b, s):
            out[key] = _rechunk(number_documents(t), b, s, seqlen, n)
        elif _is_per_token(key, t, b, s):
            out[key] = _rechunk(t, b, s, seqlen, n)
    if isinstance(out.get("position_ids"), torch.Tensor):
        out["position_ids"] = _restart_positions(out["position_ids"])
    return out


def block_starts(ids: torch.Tensor) -> torch.Tensor:
    """(R, N) bool: True at each row's first column and wherever the id differs from the one before."""
    starts = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return starts


def number_documents(ids: torch.Tensor) -> torch.Tensor:
    """(B, S) document ids renumbered 0, 1, 2, ... over the whole batch in row-major order: each run of
    equal ids in a row is one document, and no two rows share a number (a new tensor)."""
    starts = block_starts(ids)  # (B, S)
    return starts.reshape(-1).cumsum(0).reshape(ids.shape) - 1


def window_batch(batch: Mapping[str, Any], seqlen: int) -> dict[str, Any]:
    """The ``window`` mode: every tensor stays at full length, and each row is split into fragments of
    ``seqlen`` tokens that attend only inside themselves.

    ``document_ids`` (B, S) are written (or rewritten) so that a block is a fragment intersected with a
    document (without document ids: the fragments alone), numbered over the batch; ``position_ids``
    restart at every fragment start, and stay restarted wherever they already restarted (an EOD reset).
    Shapes never change, whatever ``seqlen`` (``seqlen >= S``: one fragment per row, still written out,
    so a compiled model sees the same inputs at every length). Nothing else changes: the loss covers
    every token, so a step trains on ``B * S`` tokens at every length.
    """
    key, b, s = _check_length(seqlen, batch)
    _check_layout(batch, b, s)
    ref = batch[key]
    cols = torch.arange(s, device=ref.device)  # (S,)
    fragment = (cols % seqlen == 0).expand(b, s)  # (B, S): True where a fragment starts
    docs = batch.get(DOCUMENT_KEY)
    starts = fragment if docs is None else fragment | block_starts(docs.to(ref.device))
    out = dict(batch)
    out[DOCUMENT_KEY] = starts.reshape(-1).cumsum(0).reshape(b, s) - 1  # (B, S), int64
    pos = batch.get("position_ids")
    restart = starts
    if isinstance(pos, torch.Tensor):
        restart = starts | _id_breaks(pos.expand(b, s)).to(starts.device)  # and where the ids already restart
    positions = cols.expand(b, s) - run_starts(restart)  # (B, S)
    out["position_ids"] = positions.to(pos.device if isinstance(pos, torch.Tensor) else ref.device)
    return out


def count_tokens(batch: Mapping[str, Any], use_loss_mask: bool = False) -> int:
    """Tokens in a (cut) batch of dense rows, by the clock's rule (:func:`tokens_trained`): ``B * S`` of the
    reference tensor, or with ``use_loss_mask=True`` its loss terms (``loss_mask``'s sum, else the labels
    that are not -100). Reading the sum synchronises with the device."""
    return int(tokens_trained(batch, "dense", "loss_mask" if use_loss_mask else "shape"))


def real_tokens(batch: Mapping[str, Any], layout: str) -> torch.Tensor | int:
    """The tokens a (cut) batch trains on, not counting padding: rows x columns for dense rows and
    padding-free rows, the attention mask's sum for padded rows (a tensor, not read back to the host).
    ``layout``: as :func:`seqwarm.curriculum.layouts.batch_layout` names it."""
    if layout in ("right_padded", "left_padded"):
        return (batch[MASK_KEY] != 0).sum(dtype=torch.int64)
    _, rows, seq = batch_shape(batch)
    return rows * seq


def trained_targets(batch: Mapping[str, Any]) -> torch.Tensor:
    """The loss terms of a (cut) batch: ``loss_mask``'s sum, else the labels that are not -100 (what
    Hugging Face collators mark)."""
    mask = batch.get("loss_mask")
    if isinstance(mask, torch.Tensor):
        return mask.detach().sum(dtype=torch.int64)
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor):
        return (labels != -100).sum(dtype=torch.int64)
    raise ValueError(
        "count_tokens_by 'loss_mask' needs a loss_mask tensor or labels (-100 where no loss) in every "
        f"training batch (got keys {sorted(map(str, batch))})"
    )


def tokens_trained(
    batch: Mapping[str, Any], layout: str, count_tokens_by: str, shape: tuple[int, int] | None = None
) -> torch.Tensor | int:
    """How many tokens the cut micro-batch ``batch`` trains — the one counting rule of every path
    (``layout``: as :func:`seqwarm.curriculum.layouts.batch_layout` names it).

    ``count_tokens_by="loss_mask"``: its loss terms (:func:`trained_targets`: ``loss_mask``'s sum, else the
    labels that are not -100). ``"shape"``: the tokens the model is given, padding left out
    (:func:`real_tokens`); dense rows count ``rows x length`` of ``shape`` when given (what reshape and
    length buckets train: :func:`~seqwarm.curriculum.clock.micro_batch_shape`), else of the batch."""
    if count_tokens_by == "loss_mask":
        return trained_targets(batch)
    if layout == "dense" and shape is not None:
        return shape[0] * shape[1]
    return real_tokens(batch, layout)
