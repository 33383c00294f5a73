"""What every evaluator shares: calling the model, eval mode, progress bars, reading files; and the
full-length validation loss of a prepared folder."""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from seqwarm.data.dataset import check_label_style, iter_eval_batches
from seqwarm.util.errors import UserError

Model = Callable[[torch.Tensor], Any]
"""Maps ``input_ids (B, T)`` to ``logits (B, T, V)`` (or an object with ``.logits``)."""


def device_of(model: Any, device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


class EvalMode:
    """``model.eval()`` for the duration, then the previous mode back (no-op for plain callables)."""

    def __init__(self, model: Any):
        self.model = model if isinstance(model, torch.nn.Module) else None

    def __enter__(self):
        if self.model is not None:
            self.was_training = self.model.training
            self.model.eval()

    def __exit__(self, *exc):
        if self.model is not None:
            self.model.train(self.was_training)


def model_logits(model: Model, input_ids: torch.Tensor, **blocks: torch.Tensor) -> torch.Tensor:
    """The logits ``(B, T, V)`` of ``model`` on ``input_ids``; ``blocks``: ``position_ids`` and
    ``document_ids`` of document masking, passed on as keywords."""
    out = model(input_ids, **blocks)
    out = getattr(out, "logits", out)
    if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[:2] != input_ids.shape:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"the model must map input_ids {list(input_ids.shape)} to logits (B, T, V); got {shape}")
    return out


def progress_bar(total: int, desc: str, unit: str, progress: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
        disable=None if progress else True,
    )


def safe_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def model_seq_length(model: Any, seq_length: int | None) -> int:
    if seq_length is not None:
        return int(seq_length)
    cfg = getattr(model, "config", None)
    length = getattr(cfg, "seq_length", None) or getattr(cfg, "n_positions", None)
    if length is None:
        raise ValueError("pass seq_length: the model has no config.seq_length")
    return int(length)


def read_text_file(path: str | Path, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} file {str(p)!r} does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{what} file {str(p)!r} is not UTF-8 text ({err})") from None
    except OSError as err:
        raise UserError(f"cannot read {what} file {str(p)!r}: {err}") from None
    if not text.strip():
        raise UserError(f"{what} file {str(p)!r} is empty")
    return text


def _takes_document_ids(model: Any) -> bool:
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return "document_ids" in inspect.signature(forward).parameters
    except (TypeError, ValueError):  # no signature to read: let the call say
        return True


@torch.no_grad()
def evaluate_val(
    model: Model,
    data,
    *,
    seq_length: int | None = None,
    batch_size: int = 8,
    num_windows: int | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    document_masking: bool = False,
    label_style: str = "megatron",
) -> dict[str, Any]:
    """Full-length loss/ppl on the val split of a :class:`~seqwarm.data.PreparedData` (all windows or
    ``num_windows`` of them spread evenly over the split; a blend's split by its weights, as training
    validates it): ``loss`` (mean NLL per target token), ``ppl``,
    ``num_windows``, ``num_tokens`` (targets scored), ``seq_length``, ``document_masking``.

    ``document_masking`` (a run trained with it): attention stays inside each document of a window, as
    in training's own validation; the model is called ``model(input_ids, position_ids=...,
    document_ids=...)`` (seqwarm's GPT, or an HF model wrapped to take ``document_ids``).
    ``label_style="hf"`` (a run of a Hugging Face model): the targets its training validation scored,
    the window's last input not predicting past the window (``S - 1`` targets of ``S`` inputs)."""
    check_label_style(label_style)
    if document_masking and not _takes_document_ids(model):  # an HF model would drop them: attend across
        raise ValueError(
            "document_masking: the model's forward takes no document_ids (wrap a Transformers model in "
            "seqwarm.integrations.hf.run.CausalLMLoss, which passes them as restarting position_ids)"
        )
    seq_length = model_seq_length(model, seq_length)
    masking = {"document_masking": True} if document_masking else {}
    windows = data.windows("val", seq_length, **masking)
    count = len(windows) if num_windows is None else min(len(windows), num_windows)
    if hasattr(data, "val_batches"):  # the windows training validates on (a blend: by its weights)
        asked = None if num_windows is None else count  # None: all (a blend: all its weights allow)
        batches = data.val_batches(seq_length, batch_size, num_windows=asked, **masking)
    else:
        batches = iter_eval_batches(windows, batch_size, num_windows=count)
    dev = device_of(model, device)
    total_nll, total, rows = 0.0, 0.0, 0
    bar = progress_bar(count, "val", "win", progress)
    try:
        with EvalMode(model):
            for batch in batches:
                blocks = {k: batch[k].to(dev) for k in ("position_ids", "document_ids")} if document_masking else {}
                logits = model_logits(model, batch["input_ids"].to(dev), **blocks).float()
                nll = F.cross_entropy(logits.transpose(1, 2), batch["labels"].to(dev), reduction="none")
                mask = batch["loss_mask"].to(dev)
                if label_style == "hf":  # HF labels are the inputs, shifted by the model: no target after the last
                    mask = mask.clone()
                    mask[:, -1] = 0
                total_nll += float((nll * mask).double().sum())
                total += float(mask.sum())
                rows += len(batch["input_ids"])
                bar.update(len(batch["input_ids"]))
    finally:
        bar.close()
    loss = total_nll / max(total, 1.0)
    return {
        "loss": loss,
        "ppl": safe_exp(loss),
        "num_windows": rows,
        "num_tokens": int(total),
        "seq_length": seq_length,
        "document_masking": document_masking,
    }
