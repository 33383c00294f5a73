"""Full-length validation during training: the mean loss per target token over the first windows."""

from __future__ import annotations

import torch

from seqwarm.errors import UserError

__all__ = ["Evaluator", "evaluate"]


@torch.no_grad()
def evaluate(engine, data, seq_length: int, micro_batch_size: int, eval_iters: int,
             device: torch.device, label_style: str = "megatron") -> float:
    """Mean validation loss per target token at full length over the first eval_iters batches
    (``label_style="hf"``: HF-style batches, whose targets are the labels after the first position)."""
    was_training = engine.module.training
    engine.eval()
    total, count = 0.0, 0.0
    try:
        for batch in data.val_batches(seq_length, micro_batch_size, num_windows=eval_iters * micro_batch_size,
                                      label_style=label_style):
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
        raise UserError(f"the validation split has no window of {seq_length + 1} tokens: prepare more "
                        "validation text (--val-fraction) or use a shorter --seq-length")
    return total / count


class Evaluator:
    """Validation of one run: always at the model's full length, whatever the curriculum's length."""

    def __init__(self, data, seq_length: int, micro_batch_size: int, eval_iters: int, device: torch.device,
                 label_style: str = "megatron"):
        self.data, self.seq_length, self.micro_batch_size = data, seq_length, micro_batch_size
        self.eval_iters, self.device, self.label_style = eval_iters, device, label_style

    def __call__(self, engine) -> float:
        return evaluate(engine, self.data, self.seq_length, self.micro_batch_size, self.eval_iters, self.device,
                        label_style=self.label_style)
