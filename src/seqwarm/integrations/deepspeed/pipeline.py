"""seqwarm's GPT as a DeepSpeed ``PipelineModule``, and the engine adapter that trains it.

Layers: the embedding (token + learned position embeddings, dropout), one layer per transformer
block, the final LayerNorm, and the LM head, which is the embedding module again (a ``TiedLayerSpec``:
DeepSpeed keeps the first and last stage's copies of the tied weight in sync). The blocks are split
evenly over the stages; the loss (mean cross-entropy over ``loss_mask``, as ``GPT.forward``) is the
pipeline's ``loss_fn``. The layers wrap the GPT's own modules, so the pipeline starts from exactly the
weights the GPT was built with.

A micro-batch enters as ``((input_ids, position_ids), (labels, loss_mask))``: the first stage reads
the inputs, the last the labels (:func:`to_pipe_batch`). Keyword arguments cannot flow through the
stages, so the curriculum length is applied to the data before ``train_batch`` (truncate or reshape),
and ``reset_activation_shape()`` is called whenever the micro-batch's shape changes: between training
lengths, around the full-length evaluation (``eval_batch``) and between its batches (the last one may
have fewer rows). Causal attention only (no attention_mask), learned positions
only (no --rotary).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from seqwarm.integrations.deepspeed.curriculum import DeepSpeedEngineAdapter, require_deepspeed
from seqwarm.trainer.attention import AttentionPlan
from seqwarm.util.errors import UserError

__all__ = [
    "GPTEmbeddingPipe",
    "GPTBlockPipe",
    "gpt_pipeline_module",
    "gpt_pipeline_loss",
    "to_pipe_batch",
    "PipelineEngineAdapter",
    "pipeline_param_prefixes",
]


class GPTEmbeddingPipe(nn.Module):
    """First stage: ``(input_ids, position_ids) -> x (B, T, C)``; its ``wte`` is also the LM head."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module, vocab_size: int | None = None):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop
        self.vocab_size = vocab_size or wte.num_embeddings
        """The real vocabulary: rows past it are padding (no probability)."""

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        input_ids, position_ids = inputs
        return self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)


def _lm_head(embedding: GPTEmbeddingPipe, x: torch.Tensor) -> torch.Tensor:
    """Last stage: logits (B, T, V) with the tied token-embedding matrix."""
    return F.linear(x, embedding.wte.weight)[..., : embedding.vocab_size]


class GPTBlockPipe(nn.Module):
    """One transformer block (causal attention, no mask) as a one-tensor pipeline layer."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, None, _CAUSAL)  # learned positions (no rotary tables); the plain causal plan


_CAUSAL = AttentionPlan("causal")
"""What a pipeline block attends with: the pipeline refuses window mode and document masking."""


def gpt_pipeline_loss(logits: torch.Tensor, labels: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over ``loss_mask`` (what ``GPT.forward`` returns with a loss_mask)."""
    targets, loss_mask = labels
    losses = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    mask = loss_mask.reshape(-1).to(losses.dtype)
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def gpt_pipeline_module(gpt: nn.Module, num_stages: int, **pipeline_kwargs: Any):
    """A ``deepspeed.pipe.PipelineModule`` over ``gpt``'s modules, blocks split evenly over the stages.

    Call it on every rank (it creates process groups) after ``torch.distributed`` is initialised.
    ``pipeline_kwargs`` go to ``PipelineModule`` (e.g. ``activation_checkpoint_interval``).
    """
    require_deepspeed("--pipeline-stages")
    from deepspeed.pipe import PipelineModule, TiedLayerSpec

    cfg = gpt.config
    if cfg.rotary or gpt.wpe is None:
        raise UserError("--pipeline-stages supports learned position embeddings only: drop --rotary")
    if num_stages < 1 or cfg.n_layer < num_stages:
        raise UserError(
            f"--pipeline-stages {num_stages}: the model has {cfg.n_layer} blocks; use between 1 "
            f"and {cfg.n_layer} stages"
        )
    embed = ("embed", GPTEmbeddingPipe, gpt.wte, gpt.wpe, gpt.drop, cfg.vocab_size)
    layers = [TiedLayerSpec(*embed, tied_weight_attr=["wte.weight"])]
    layers += [GPTBlockPipe(block) for block in gpt.blocks]
    layers += [gpt.ln_f, TiedLayerSpec(*embed, forward_fn=_lm_head, tied_weight_attr=["wte.weight"])]
    kwargs = {"partition_method": "type:GPTBlockPipe", "loss_fn": gpt_pipeline_loss, **pipeline_kwargs}
    return PipelineModule(layers=layers, num_stages=num_stages, **kwargs)


def pipeline_param_prefixes(n_layer: int) -> list[tuple[str, ...]]:
    """GPT state-dict prefixes of each pipeline layer (the head is the tied embedding: none of its own)."""
    return [("wte.", "wpe."), *((f"blocks.{i}.",) for i in range(n_layer)), ("ln_f.",), ()]


def to_pipe_batch(batch: Mapping[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``((input_ids, position_ids), (labels, loss_mask))`` from a seqwarm batch dict."""
    if "attention_mask" in batch:
        raise ValueError("the GPT pipeline is causal only: the batch must not carry an attention_mask")
    ids = batch["input_ids"]
    pos = batch.get("position_ids")
    if pos is None:
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    elif pos.shape[0] != ids.shape[0]:
        pos = pos.expand_as(ids)
    mask = batch.get("loss_mask")
    if mask is None:  # every position with a target (a length bucket's masked columns have labels -100)
        mask = (batch["labels"] != -100).to(torch.float32)
    return (ids, pos.contiguous()), (batch["labels"], mask)


class PipelineEngineAdapter(DeepSpeedEngineAdapter):
    """A ``PipelineEngine`` behind the CurriculumEngine surface (:class:`seqwarm.trainer.backends.PipelineEngine`):
    :meth:`train_batch` trains the micro-batches of one whole optimizer step; calling the adapter in eval
    mode runs ``eval_batch`` on one full-length batch."""

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        if self.module.training:
            raise RuntimeError("a pipeline engine trains whole steps: use train_batch(micro_batches)")
        self.curriculum.pipe_shape(tuple(batch["input_ids"].shape))  # a partial last batch has fewer rows
        return self.module.eval_batch(iter([to_pipe_batch(batch)]), num_micro_batches=1)

    def train_batch(self, micro_batches: Iterable[Mapping[str, torch.Tensor]]) -> tuple[float, bool]:
        """One optimizer step over micro-batches :meth:`cut` already made: the LR of the clock including
        them set, DeepSpeed's ``train_batch``. The mean loss (over micro-batches and data-parallel ranks) and
        whether the update was applied; the step stays open (:meth:`end_step` closes it)."""
        loss = self.curriculum.train_batch([to_pipe_batch(b) for b in micro_batches], end=False)
        return float(loss), self._applied()

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a pipeline engine runs backward inside train_batch")

    def step(self) -> None:
        raise RuntimeError("a pipeline engine steps inside train_batch")

    def update(self) -> bool:
        raise RuntimeError("a pipeline engine steps inside train_batch")
