"""Model FLOPs of what a step actually trained, and their share of the device's peak (MFU).

Per optimizer step, counted on the host from the micro-batches the loop cut (no device sync)::

    FLOPs = 6 * N * tokens + 12 * n_layer * d_model * pairs

- ``N`` (:func:`matmul_params`): the parameters a token is multiplied by: every parameter held by a
  module other than an ``nn.Embedding``, each once. The LM head tied to the token embedding counts (it
  is a ``d_model x vocab`` matmul per token); the position table and an untied input embedding do not
  (lookups). Biases and norm weights count too (a rounding error next to the matrices).
- ``tokens``: rows x columns the model ran forward and backward on; with a length bucket only the
  columns up to the step's length (the masked ones past it are not the model's work).
- ``pairs`` (:func:`attention_pairs`): the query-key pairs attention must compute. A row is split into
  blocks: runs of equal ``document_ids`` (a window fragment, a document, or both), or the whole row
  without them; a block of ``l`` tokens is causal and needs ``l (l + 1) / 2`` pairs. A step at a short
  length, a window of ``W``, or a row of many documents therefore counts the span it trained, not the
  full length's ``S (S + 1) / 2``.

``6 N`` per token is the forward (2 FLOPs per multiply-add) plus the backward (twice the forward) of the
matmuls (Kaplan et al. 2020, section 2.1; Chinchilla, appendix F). Attention adds, per layer and per
pair, ``2 d_model`` for the score and ``2 d_model`` for the weighted value, three times over for forward
and backward: ``12 d_model``. PaLM's appendix B writes the attention term per token as ``12 L H Q T``
with ``T`` the sequence length, which counts every key of the sequence (the masked half of a causal
row too), and nanoGPT's ``estimate_mfu`` uses it with ``T`` the full block size at every step; here a
token counts the keys its block lets it see, so at full length the attention term is about half of
PaLM's (as causal FLOP counts in FlashAttention's benchmarks are).

MFU is the achieved model FLOP/s per device over the device's peak: given (``seqwarm.peak_tflops`` /
``--peak-tflops``), or for a bf16/fp16 run on one of the CUDA devices named in :data:`KNOWN_PEAKS`
(dense 16-bit tensor-core peaks). Any other device, fp32 included: no MFU, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from seqwarm.curriculum.batch import DOCUMENT_KEY, batch_shape, block_starts

__all__ = ["KNOWN_PEAKS", "FlopsMeter", "attention_pairs", "batch_flops", "known_peak", "matmul_params"]

KNOWN_PEAKS = {
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA H100 80GB HBM3": 989.5,
    "NVIDIA H100 PCIe": 756.5,
    "NVIDIA H200": 989.5,
}
"""``torch.cuda.get_device_name()`` -> dense bf16/fp16 TFLOP/s (NVIDIA's data sheets: half the "with
sparsity" figure).
Only these exact names: a MIG slice, another board or a renamed one gets no peak."""


def attention_pairs(rows: int, columns: int, document_ids: torch.Tensor | None = None) -> int:
    """Causal query-key pairs of ``rows`` rows of ``columns`` tokens: ``sum l (l + 1) / 2`` over each row's
    blocks (runs of equal ``document_ids`` ``(rows, >= columns)``, read up to ``columns``; without them
    one block per row). ``document_ids`` should be on the host (a device tensor is read back)."""
    if document_ids is None:
        return rows * columns * (columns + 1) // 2
    starts = block_starts(document_ids[:, :columns]).reshape(-1)  # every row starts a block: none crosses rows
    at = starts.nonzero().reshape(-1)
    lengths = torch.diff(at, append=torch.tensor([starts.numel()], device=at.device))
    return int((lengths * (lengths + 1) // 2).sum())


def batch_flops(batch: Mapping[str, Any], n_params: int, n_layer: int, d_model: int, columns: int | None = None) -> int:
    """Model FLOPs (forward + backward) of one cut micro-batch of dense rows (module docstring);
    ``columns``: count only the first ``columns`` of each row (a length bucket's length)."""
    _, rows, width = batch_shape(batch)
    width = width if columns is None else min(width, columns)
    pairs = attention_pairs(rows, width, batch.get(DOCUMENT_KEY))
    return 6 * n_params * rows * width + 12 * n_layer * d_model * pairs


def matmul_params(model: nn.Module) -> int:
    """``N`` of the module docstring: parameters held by a module that is not an ``nn.Embedding``, each once."""
    seen: dict[int, int] = {}
    for module in model.modules():
        if not isinstance(module, nn.Embedding):
            seen.update((id(p), p.numel()) for p in module.parameters(recurse=False))
    return sum(seen.values())


def known_peak(device: torch.device, precision: str) -> tuple[float, str] | None:
    """The dense 16-bit peak TFLOP/s of a CUDA device named in :data:`KNOWN_PEAKS` and where it came from,
    for a bf16/fp16 run; None otherwise."""
    if device.type != "cuda" or precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    peak = KNOWN_PEAKS.get(name)
    return None if peak is None else (peak, f"{name}, dense {precision}")


class FlopsMeter:
    """The model FLOPs of each step the loop trains, per device (:func:`batch_flops` of this rank's cut
    micro-batches x ``share``: the data-parallel replicas over all devices, below 1 when a replica spans
    several devices); does nothing when ``peak_tflops`` is None."""

    def __init__(
        self,
        n_params: int,
        n_layer: int,
        d_model: int,
        peak_tflops: float | None,
        *,
        window: bool,
        share: float = 1.0,
        source: str = "",
    ):
        self.n_params, self.n_layer, self.d_model, self.share = n_params, n_layer, d_model, share
        self.peak_tflops, self.source = peak_tflops, source
        self.window = window  # rows stay at full length: every column is trained, whatever the step's length
        self._flops = 0

    @classmethod
    def for_run(cls, model_cfg, cfg, device: torch.device, choices, share: float, *, main: bool = True) -> FlopsMeter:
        """The meter of a run (on rank 0, ``main``; off elsewhere): its peak is the config's ``peak_tflops``,
        else :func:`known_peak`; ``N`` is counted on the model built on the meta device (seqwarm's GPT or a
        Hugging Face model)."""
        given = getattr(cfg, "peak_tflops", None)
        found = (given, "--peak-tflops") if given else known_peak(device, choices.precision)
        window = choices.mode == "window"
        if found is None or not main:
            return cls(0, 0, 0, None, window=window)
        from seqwarm.trainer.model import GPT

        with torch.device("meta"):
            model = model_cfg.build() if hasattr(model_cfg, "build") else GPT(model_cfg)
        n, layers, width = matmul_params(model), model_cfg.n_layer, model_cfg.n_embd
        return cls(n, layers, width, found[0], window=window, share=share, source=found[1])

    @property
    def resolved(self) -> dict[str, Any]:
        """What config.json records of it: ``{"mfu": {peak, its source, N, n_layer, d_model}}``; {} when off."""
        if self.peak_tflops is None:
            return {}
        keys = ("peak_tflops", "source", "n_params", "n_layer", "d_model", "share")
        return {"mfu": {k: getattr(self, k) for k in keys}}

    def add(self, batch: Mapping[str, Any], length: int | None) -> Mapping[str, Any]:
        """Count a cut micro-batch of the step in flight (``length``: the step's curriculum length, read on the
        host); returns ``batch``."""
        if self.peak_tflops is not None:
            columns = None if self.window or length is None else length
            self._flops += batch_flops(batch, self.n_params, self.n_layer, self.d_model, columns)
        return batch

    def take(self) -> float:
        """The step's FLOPs per device since the last call (0 when off), and start the next step at 0."""
        flops, self._flops = self._flops * self.share, 0
        return flops
