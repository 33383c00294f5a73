"""Document masking and the ``window`` mode for a Hugging Face causal LM: blocks as restarting ``position_ids``.

seqwarm's GPT takes ``document_ids`` ``(B, S)`` and attends only inside each run of equal ids (a document,
or a fragment of the window mode). A Transformers model takes the same block structure the padding-free
way: ``position_ids`` that restart at 0 at each block start. What transformers 5.x does with them (read in
``masking_utils.create_causal_mask`` and ``modeling_flash_attention_utils``, and measured on a tiny Llama
and GPT-2, tests/integrations/test_hf_blocks.py):

- ``create_causal_mask`` reads packed sequences from ``position_ids`` (a new one wherever an id is not the
  one before + 1), in every row of any batch size, but only when ``attention_mask`` is None **and no KV
  cache is in use**. A model builds a ``DynamicCache`` whenever ``use_cache`` is on, which its config
  defaults to even in training, and then attends across the whole row: :func:`block_forward` passes
  ``use_cache=False``.
- ``sdpa``, ``eager`` and ``flex_attention`` then get a block-diagonal causal mask per row
  (:data:`BY_ROW`).
- ``flash_attention_2/3/4`` read packed sequences from ``position_ids`` only at batch size 1, so the rows
  are laid end to end as one row (:data:`AS_ONE_ROW`); each row's first label becomes -100, so the
  loss keeps the same targets (HF shifts inside the model: the row before's last logit would otherwise
  predict it). Not run here (no flash-attn on CPU): :func:`check_block_attention` checks it on the model.
- any other implementation is refused.

What each implementation costs (transformers 5.25; docs/ENGINE.md has the table): ``sdpa`` and ``eager``
attend over the whole row through a dense ``(B, 1, S, S)`` mask (no causal fast path, no flash kernel), so
a short window or many documents cost more than the causal step; ``flex_attention`` skips the key blocks
outside a block (GPU; it has no CPU backward in torch 2.13); ``flash_attention_2/3/4``, with the rows laid
end to end, reach the varlen kernel (``flash_varlen_fn`` with ``cu_seqlens`` found in ``position_ids``):
the span's cost. seqwarm runs what the model's config names; on a GPU it recommends ``flash_attention_2``
where flash-attn is installed, else ``flex_attention``; on a CPU ``sdpa``.

The loss keeps every target seqwarm's GPT keeps: the last token of a document (its EOD) still predicts
the next document's first token, from its own document only; no label is masked at a boundary.

:func:`check_block_attention` runs the model once on two packed rows before training and refuses it
when a document's logits differ from that document run alone, whatever the reason (an architecture that
builds its own mask, ignores ``position_ids``, or a new transformers release).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from seqwarm.curriculum.batch import block_starts, run_starts
from seqwarm.util.errors import UserError

__all__ = ["AS_ONE_ROW", "BY_ROW", "attn_implementation", "block_forward", "block_positions", "check_block_attention"]

BY_ROW = ("sdpa", "eager", "flex_attention")
"""Attention implementations that mask each row's blocks from its ``position_ids``, at any batch size."""
AS_ONE_ROW = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
"""Attention implementations that read blocks from ``position_ids`` only at batch size 1."""


def attn_implementation(lm: nn.Module) -> str | None:
    """The attention implementation a Transformers model runs (``config._attn_implementation``)."""
    return getattr(getattr(lm, "config", None), "_attn_implementation", None)


def block_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """``(B, S)`` positions restarting at 0 at each run of equal ``document_ids`` in a row (a new tensor)."""
    b, s = document_ids.shape
    cols = torch.arange(s, device=document_ids.device).expand(b, s)
    return cols - run_starts(block_starts(document_ids))  # (B, S)


def block_forward(
    lm: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor | None, document_ids: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(loss, logits (B, S, V))`` of ``lm`` with attention inside each block of ``document_ids`` (B, S).

    The positions are derived from ``document_ids`` (not taken from the batch) so that the blocks the
    model masks are exactly the ones seqwarm's GPT masks; ``labels`` are HF-style (the model shifts).
    """
    impl = attn_implementation(lm)
    b, s = input_ids.shape
    positions = block_positions(document_ids.to(input_ids.device))
    if impl in BY_ROW:
        out = lm(input_ids=input_ids, labels=labels, position_ids=positions, use_cache=False)
        return out.loss, out.logits
    if impl in AS_ONE_ROW:
        if labels is not None:  # the row before's last logit must not predict this row's first token
            labels = labels.clone()
            labels[:, 0] = -100
            labels = labels.reshape(1, b * s)
        out = lm(
            input_ids=input_ids.reshape(1, b * s),  # (1, B*S): every row starts at position 0, a block of its own
            labels=labels,
            position_ids=positions.reshape(1, b * s),
            use_cache=False,
        )
        return out.loss, out.logits.reshape(b, s, -1)
    raise ValueError(
        f"attention implementation {impl!r} does not mask blocks given as position_ids; use one of "
        f"{', '.join(BY_ROW + AS_ONE_ROW)}"
    )


def _probe(lm: nn.Module) -> tuple[float, float]:
    """(largest logit difference between two packed rows of documents and each document alone, the same
    for the rows without blocks: what attending across documents changes). Deterministic tokens, eval
    mode, no gradient: no RNG is drawn, so a run's numbers do not depend on the probe."""
    device = next(lm.parameters()).device
    lengths = (5, 3, 4, 4)  # two rows of 8 tokens, two documents each
    rows, cols = 2, 8
    ids = (torch.arange(rows * cols, device=device) * 7 + 3).remainder(lm.config.vocab_size).reshape(rows, cols)
    docs = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).reshape(rows, cols)
    was_training = lm.training
    lm.eval()
    try:
        with torch.no_grad():
            _, packed = block_forward(lm, ids, None, docs.to(device))
            flat, start, alone = ids.reshape(-1), 0, []
            for n in lengths:
                alone.append(lm(input_ids=flat[None, start : start + n], use_cache=False).logits[0])
                start += n
            alone_t = torch.cat(alone).reshape(packed.shape)
            across = lm(input_ids=ids, use_cache=False).logits
    finally:
        lm.train(was_training)
    return float((packed - alone_t).abs().max()), float((across - alone_t).abs().max())


def check_block_attention(lm: nn.Module, what: str, architecture: str, instead: str | None = None) -> None:
    """UserError unless ``lm`` really attends inside blocks given as restarting ``position_ids``
    (``what``: the setting that asks for them; ``instead``: what the user can do otherwise, for the
    message; default: train without ``what`` or with a GPT preset)."""
    instead = instead or f"train without {what}, or use a GPT preset (--model tiny, ...)"
    impl = attn_implementation(lm)
    works = "'sdpa' (the default) or 'eager'"
    if impl not in BY_ROW + AS_ONE_ROW:
        raise UserError(
            f"{what} with --model hf:: {architecture} runs attention implementation {impl!r}, which does not "
            f'mask documents given as position_ids; set "attn_implementation" to {works} in its config.json'
        )
    try:
        leak, across = _probe(lm)
    except (TypeError, ValueError, RuntimeError) as err:
        raise UserError(
            f"{what} with --model hf:: {architecture} ({impl}) failed on a packed probe row ({err}); seqwarm "
            f"passes the documents as restarting position_ids with use_cache=False; {instead}"
        ) from None
    # Float rounding is far below a tenth of what attending across documents changes.
    if leak > 0.1 * across:
        other = f'set "attn_implementation" to {works} in its config.json, ' if impl not in ("sdpa", "eager") else ""
        raise UserError(
            f"{what} with --model hf:: {architecture} ({impl}) attends across documents given as restarting "
            f"position_ids (a packed probe row's logits differ from each document alone by up to {leak:.3g}, "
            f"{across:.3g} without the blocks), so it would train with cross-document attention; {other}"
            f"{instead}"
        )
