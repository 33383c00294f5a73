"""Attention for seqwarm's GPT at the cost of the span it trains: causal rows, window fragments, documents.

The GPT builds one :class:`AttentionPlan` per forward from the batch's ``document_ids`` ``(B, T)`` (a
token attends to the earlier tokens of its own id: a document, a ``window`` fragment, or both) and every
layer calls :meth:`AttentionPlan.attend`. The plan never changes the numbers, only what is computed:

- ``causal``: no ``document_ids`` and no mask, ``is_causal=True`` (SDPA's causal fast path);
- ``dense``: a ``(B, 1, T, T)`` mask: with an ``attention_mask`` (padding, 4-D), and for ``document_ids``
  on the CPU under ``torch.compile``, of the model or of each block (no data-dependent shapes in a graph:
  one graph for the run);
- ``flex``: CUDA, FlexAttention with a block mask built from ``document_ids`` once per forward (every
  layer and the backward reuse it): key blocks no query block can see are skipped; the window length is
  data, so one compiled graph serves every length (not with dropout, which FlexAttention lacks);
- ``tiles`` (eager, otherwise): columns where every row starts a block cut the rows into tiles attention
  never crosses. Tiles of one width ``w`` (the window mode) run as rows, ``(B * T/w, H, w, hd)``, causal
  within: no mask at all without documents, a ``w x w`` mask per tile with documents inside them (up to
  :data:`QUERY_BLOCK` columns); a last, shorter tile (``T % w``) runs apart;
- ``chunks`` (eager, otherwise: document masking): query blocks of :data:`QUERY_BLOCK` columns, each
  attending only from the earliest block start any of its rows sees, through its own small mask; row by
  row instead when one row's long document would widen the other rows' key ranges.

``tiles`` and ``chunks`` read ``document_ids`` on the host (on a GPU without FlexAttention that is one
copy to the host per forward). With dropout the attention probabilities are drawn per call, so the
random numbers differ from the dense path's (the distribution does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from seqwarm.curriculum.batch import block_starts, run_starts

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - torch before 2.5
    create_block_mask = flex_attention = None

__all__ = ["AttentionPlan", "QUERY_BLOCK", "document_mask", "plan_attention"]

QUERY_BLOCK = 256
"""Query columns per call of the ``chunks`` plan, and the widest tile that gets a mask per tile."""


def document_mask(document_ids: torch.Tensor, t: int, mask: torch.Tensor | None) -> torch.Tensor:
    """Block-diagonal causal attention (True = may attend) from per-token ids ``(B, T)``: a query sees the
    keys at or before it that carry its id; intersected with ``mask`` (boolean or additive) when given.
    The dense reference every other plan equals."""
    same = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    causal = torch.ones(t, t, dtype=torch.bool, device=document_ids.device).tril()
    docs = (same & causal)[:, None]  # (B, 1, T, T); the diagonal is always True: no empty row
    if mask is None:
        return docs
    if mask.dtype == torch.bool:
        return mask & docs
    return mask.masked_fill(~docs, float("-inf"))


@dataclass(frozen=True)
class AttentionPlan:
    """How every layer of one forward attends (see the module docstring for the kinds)."""

    kind: str
    mask: torch.Tensor | None = None
    """``dense``: the ``(B|1, 1, T, T)`` mask."""
    width: int = 0
    """``tiles``: the tile width ``w``."""
    tile_masks: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
    """``tiles``: ``(B * T/w, 1, w, w)`` for the full tiles and ``(B, 1, r, r)`` for the last ``r`` columns,
    None where attention is plain causal."""
    spans: tuple[tuple[int, int, int, torch.Tensor | None], ...] = ()
    """``chunks``: ``(q0, q1, k0, mask (B|1, 1, q1 - q0, q1 - k0) or None for plain causal)`` per query block,
    of the whole batch, or with ``by_row`` of one row at a time (row 0's blocks, then row 1's, ...)."""
    by_row: bool = False
    key_index: torch.Tensor | None = None
    """``chunks``: every block's key columns, one block after the other (``by_row``: of the ``(B*T)`` tokens)."""
    block_mask: Any = None
    """``flex``: FlexAttention's ``BlockMask``."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
        """Attention of ``q, k, v`` ``(B, H, T, hd)`` under this plan: ``(B, H, T, hd)``."""
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        if self.kind == "dense":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=dropout_p)
        if self.kind == "flex":
            return _flex_kernel(q)(q, k, v, block_mask=self.block_mask)
        if self.kind == "tiles":
            return self._tiles(q, k, v, dropout_p)
        return self._by_row(q, k, v, dropout_p) if self.by_row else self._chunks(q, k, v, dropout_p)

    def _chunks(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
        # Queries split (backward: one cat) and every block's keys gathered at once (backward: one index_add),
        # not sliced block by block (backward: a full-size zero tensor per block).
        qs = q.split([q1 - q0 for q0, q1, _, _ in self.spans], dim=2)
        sizes = [q1 - k0 for _, q1, k0, _ in self.spans]
        ks, vs = (z.index_select(2, self.key_index).split(sizes, dim=2) for z in (k, v))
        outs = [_sdpa(qi, ki, vi, span[3], dropout_p) for qi, ki, vi, span in zip(qs, ks, vs, self.spans)]
        return torch.cat(outs, dim=2)  # (B, H, T, hd)

    def _by_row(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
        b, h, t, hd = q.shape

        def tokens(z: torch.Tensor) -> torch.Tensor:  # (B, H, T, hd) -> (B*T, H, hd)
            return z.transpose(1, 2).reshape(b * t, h, hd)

        qs = tokens(q).split([q1 - q0 for q0, q1, _, _ in self.spans])  # row 0's blocks, then row 1's, ...
        sizes = [q1 - k0 for _, q1, k0, _ in self.spans]
        ks, vs = (tokens(z).index_select(0, self.key_index).split(sizes) for z in (k, v))
        outs = [
            _sdpa(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None], vi.transpose(0, 1)[None], span[3], dropout_p)
            for qi, ki, vi, span in zip(qs, ks, vs, self.spans)
        ]  # (1, H, Q, hd) each
        y = torch.cat([o[0].transpose(0, 1) for o in outs])  # (B*T, H, hd)
        return y.view(b, t, h, hd).transpose(1, 2)  # (B, H, T, hd)

    def _tiles(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
        b, h, t, hd = q.shape
        w = self.width
        n = t // w
        main, tail = self.tile_masks

        def rows(z: torch.Tensor) -> torch.Tensor:  # (B, H, n*w, hd) -> (B*n, H, w, hd): a tile per row
            return z[:, :, : n * w].reshape(b, h, n, w, hd).transpose(1, 2).reshape(b * n, h, w, hd)

        outs = []
        if n:
            y = _sdpa(rows(q), rows(k), rows(v), main, dropout_p)
            outs.append(y.reshape(b, n, h, w, hd).transpose(1, 2).reshape(b, h, n * w, hd))
        if t > n * w:  # the last T % w columns: one shorter tile per row
            r = slice(n * w, t)
            outs.append(_sdpa(q[:, :, r], k[:, :, r], v[:, :, r], tail, dropout_p))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def _sdpa(q, k, v, mask: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """SDPA, causal (top-left: square blocks only) when ``mask`` is None."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=dropout_p)


_compiled_flex: Any = None


def _flex_kernel(q: torch.Tensor) -> Any:
    """FlexAttention for ``q``: the plain function inside a compiled graph (Dynamo fuses it) and on the CPU,
    compiled once on first use in an eager CUDA model (uncompiled it would materialise the scores)."""
    global _compiled_flex
    if torch.compiler.is_compiling() or not q.is_cuda:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def _flex_plan(document_ids: torch.Tensor, t: int) -> AttentionPlan:
    ids = document_ids

    def same_block_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (ids[b, q_idx] == ids[b, kv_idx])

    compiled = ids.is_cuda and not torch.compiler.is_compiling()  # inside a graph Dynamo traces it anyway
    block_mask = create_block_mask(same_block_causal, ids.shape[0], None, t, t, device=ids.device, _compile=compiled)
    return AttentionPlan("flex", block_mask=block_mask)


def _block_mask(ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """``(R, 1, K - offset, K)``: may query ``i`` (column ``offset + i`` of ``ids`` ``(R, K)``) attend key ``j``."""
    same = ids[:, offset:, None] == ids[:, None, :]  # (R, Q, K)
    causal = torch.ones(same.shape[1:], dtype=torch.bool, device=ids.device).tril(offset)
    return (same & causal)[:, None]


def _to(mask: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if mask is None else mask.to(device, non_blocking=True)


def _shape_plan(ids: torch.Tensor, t: int, device: torch.device) -> AttentionPlan:
    """The ``tiles`` or ``chunks`` plan of host ``ids`` ``(B, T)`` (module docstring), masks on ``device``."""
    b = ids.shape[0]
    starts = block_starts(ids)  # (B, T): a block starts here
    cut = starts.all(0)  # (T,): every row starts a block here, so no attention crosses the column
    later = cut[1:].nonzero()
    w = int(later[0, 0]) + 1 if len(later) else t
    n = t // w
    if bool(cut[::w].all()):
        inner = starts.clone()
        inner[:, ::w] = False  # block starts inside a tile
        if not bool(inner.any()):
            return AttentionPlan("tiles", width=w)
        if w <= QUERY_BLOCK:
            main = _block_mask(ids[:, : n * w].reshape(b * n, w)) if n and bool(inner[:, : n * w].any()) else None
            tail = _block_mask(ids[:, n * w :]) if t > n * w and bool(inner[:, n * w :].any()) else None
            return AttentionPlan("tiles", width=w, tile_masks=tuple(_to(m, device) for m in (main, tail)))
    first = run_starts(starts)[:, ::QUERY_BLOCK]  # (B, blocks): where each query block's first block starts
    ends = torch.arange(QUERY_BLOCK, t + QUERY_BLOCK, QUERY_BLOCK).clamp(max=t)  # (blocks,)
    lows = first.min(0).values  # each query block's earliest visible key in any row
    # One row at a time when the rows' own key ranges are much narrower than the batch's (a long document in
    # one row would otherwise widen every row's range): more, smaller calls.
    by_row = b > 1 and 5 * int((ends - first).sum()) < 4 * b * int((ends - lows).sum())
    spans, keys = [], []
    for r in range(b) if by_row else (None,):
        rows = slice(r, r + 1) if by_row else slice(None)
        for q0, q1, k0 in zip(range(0, t, QUERY_BLOCK), ends.tolist(), (first[r] if by_row else lows).tolist()):
            plain = k0 == q0 and not bool(starts[rows, q0 + 1 : q1].any())  # one block per row: causal
            spans.append((q0, q1, k0, None if plain else _to(_block_mask(ids[rows, k0:q1], q0 - k0), device)))
            keys.append(torch.arange(k0, q1) + (r * t if by_row else 0))  # by_row: columns of (B*T)
    key_index = torch.cat(keys).to(device)
    return AttentionPlan("chunks", spans=tuple(spans), by_row=by_row, key_index=key_index)


def plan_attention(
    document_ids: torch.Tensor | None, t: int, mask: torch.Tensor | None, dropout: bool = False, compiled: bool = False
) -> AttentionPlan:
    """The plan for a forward of length ``t``: ``document_ids`` ``(B, T)`` or None, ``mask`` a boolean or
    additive ``(B|1, 1, T, T)`` SDPA mask or None, ``dropout``: attention dropout is on, ``compiled``: the
    layers that run the plan are compiled apart (FSDP2 compiles each block), so the plan must not carry
    data-dependent shapes either."""
    if document_ids is None:
        return AttentionPlan("causal") if mask is None else AttentionPlan("dense", mask=mask)
    if document_ids.dim() != 2 or document_ids.shape[1] != t:
        raise ValueError(f"document_ids must be (batch, {t}), got shape {list(document_ids.shape)}")
    if mask is not None:
        return AttentionPlan("dense", mask=document_mask(document_ids, t, mask))
    if document_ids.is_cuda and not dropout and flex_attention is not None:
        return _flex_plan(document_ids, t)
    if compiled or torch.compiler.is_compiling():
        return AttentionPlan("dense", mask=document_mask(document_ids, t, None))
    return _shape_plan(document_ids.detach().cpu(), t, document_ids.device)
