"""Full-length validation during training: the mean loss per target token over the first windows."""

from __future__ import annotations

import logging

import torch

from seqwarm.util.errors import UserError

__all__ = ["Evaluator", "evaluate"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(
    engine,
    data,
    seq_length: int,
    micro_batch_size: int,
    eval_iters: int | None,
    device: torch.device,
    label_style: str = "megatron",
) -> float:
    """Mean validation loss per target token at full length over eval_iters batches of windows spread
    over the split (None: every window; ``label_style="hf"``: HF-style batches, whose targets are the
    labels after the first position)."""
    was_training = engine.module.training
    engine.eval()
    total, count = 0.0, 0.0
    try:
        windows = None if eval_iters is None else eval_iters * micro_batch_size
        for batch in data.val_batches(seq_length, micro_batch_size, num_windows=windows, label_style=label_style):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            loss = engine(batch)
            if label_style == "hf":  # the model predicts labels[:, 1:]
                weight = float((batch["labels"][:, 1:] != -100).sum())
            else:
                weight = float(batch["loss_mask"].sum()) if "loss_mask" in batch else batch["input_ids"].numel()
            total += float(loss) * weight
            count += weight
    finally:
        engine.train(was_training)
    if count == 0:
        raise UserError(
            f"the validation split has no window of {seq_length + 1} tokens: prepare more "
            "validation text (--val-fraction) or use a shorter --seq-length"
        )
    return total / count


class Evaluator:
    """Validation of one run: always at the model's full length, whatever the curriculum's length."""

    def __init__(
        self,
        data,
        seq_length: int,
        micro_batch_size: int,
        eval_iters: int,
        device: torch.device,
        label_style: str = "megatron",
        interval: int = 0,
    ):
        self.data, self.seq_length, self.micro_batch_size = data, seq_length, micro_batch_size
        self.eval_iters, self.device, self.label_style = eval_iters, device, label_style
        self.interval = interval
        """Evaluate every this many optimizer steps (0: only at the end of the run)."""
        self._batches: int | None = eval_iters
        """Batches per evaluation: eval_iters, or None (every window) when the split has fewer windows."""
        self._checked = False

    def due(self, step: int, last: bool) -> bool:
        """Whether to evaluate after ``step`` (``last``: the run ends with it, and evaluates then anyway)."""
        return bool(self.interval) and step % self.interval == 0 and not last

    def __call__(self, engine) -> float:
        if not self._checked:  # first evaluation: say once (not at every one) when the split is smaller
            self._checked = True
            asked = self.eval_iters * self.micro_batch_size
            total = len(self.data.windows("val", self.seq_length))
            if asked > total:
                logger.warning(
                    "the val split has %d windows of %d tokens; every evaluation uses all of them, "
                    "not %d (--eval-iters %d x micro-batch %d)",
                    total,
                    self.seq_length + 1,
                    asked,
                    self.eval_iters,
                    self.micro_batch_size,
                )
                self._batches = None
        return evaluate(
            engine,
            self.data,
            self.seq_length,
            self.micro_batch_size,
            self._batches,
            self.device,
            label_style=self.label_style,
        )
