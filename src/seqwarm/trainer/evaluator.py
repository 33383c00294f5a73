"""Full-length validation during training: the mean loss per target token over windows spread over the split.

``--eval-iters N`` counts micro-batch windows of one process in a seqwarm run: N x micro-batch windows,
the same ones on every rank. A Megatron-style run (``cfg.lr.rule == "megatron"``) reads it as
Megatron-DeepSpeed does (``evaluate`` in its ``training.py`` runs ``eval_iters`` iterations, each of
``get_num_microbatches()`` micro-batches on every data-parallel rank): N x accumulation x micro-batch x
data-parallel ranks distinct windows, split across the ranks, the loss summed over them. Unlike Megatron,
every evaluation reads the same windows (its validation iterator moves on), so evaluations compare.
"""

from __future__ import annotations

import logging

import torch

from seqwarm.trainer.distributed import DistInfo, gather_floats
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
    document_masking: bool = False,
    *,
    num_windows: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    dist_info: DistInfo | None = None,
) -> float:
    """Mean validation loss per target token at full length over eval_iters batches of windows spread
    over the split (None: every window; ``label_style="hf"``: HF-style batches, whose targets are the
    labels after the first position; ``document_masking``: batches with ``document_ids``, attention
    inside each document). ``num_windows`` (instead of ``eval_iters``): that many windows in all, rank
    ``rank`` of ``world_size`` reading its share; with ``dist_info`` every process's sums make the mean."""
    was_training = engine.module.training
    engine.eval()
    total, count = 0.0, 0.0
    try:
        windows = (
            num_windows if num_windows is not None else None if eval_iters is None else eval_iters * micro_batch_size
        )
        batches = data.val_batches(
            seq_length,
            micro_batch_size,
            num_windows=windows,
            rank=rank,
            world_size=world_size,
            label_style=label_style,
            **({"document_masking": True} if document_masking else {}),
        )
        for batch in batches:
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
    if dist_info is not None and dist_info.enabled:  # every rank's share (pipeline stages: each once per stage)
        sums = gather_floats([total, count], dist_info, device)
        total, count = sum(s[0] for s in sums), sum(s[1] for s in sums)
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
        document_masking: bool = False,
        *,
        megatron: bool = False,
        accumulation: int = 1,
        data_parallel: tuple[int, int] = (0, 1),
        dist_info: DistInfo | None = None,
    ):
        self.data, self.seq_length, self.micro_batch_size = data, seq_length, micro_batch_size
        self.eval_iters, self.device, self.label_style = eval_iters, device, label_style
        self.interval = interval
        """Evaluate every this many optimizer steps (0: only at the end of the run)."""
        self.document_masking = document_masking
        self.megatron = megatron
        """``--eval-iters`` as Megatron-DeepSpeed reads it: iterations of the global batch, split across ranks."""
        self.rank, self.world_size = data_parallel if megatron else (0, 1)
        self.dist_info = dist_info if megatron else None
        per_iter = micro_batch_size * (accumulation * self.world_size if megatron else 1)
        self.num_windows: int | None = eval_iters * per_iter
        """Windows per evaluation (all ranks together in a Megatron-style run), or None: every window,
        when the split has fewer."""
        self._checked = False

    def due(self, step: int, last: bool) -> bool:
        """Whether to evaluate after ``step`` (``last``: the run ends with it, and evaluates then anyway)."""
        return bool(self.interval) and step % self.interval == 0 and not last

    def at_length(self, engine, length: int, rows: int | None = None) -> float:
        """The mean validation loss over as many windows of ``length`` tokens (a stage run's pretraining
        length, or a stage's), the same ones at every evaluation; ``rows`` per batch (None: the micro-batch)."""
        windows = self.num_windows if self.num_windows is not None else len(self.data.windows("val", length))
        return evaluate(
            engine,
            self.data,
            length,
            rows or self.micro_batch_size,
            None,
            self.device,
            label_style=self.label_style,
            document_masking=self.document_masking,
            num_windows=windows,
            rank=self.rank,
            world_size=self.world_size,
            dist_info=self.dist_info,
        )

    def __call__(self, engine) -> float:
        if not self._checked:  # first evaluation: say once (not at every one) when the split is smaller
            self._checked = True
            total = len(self.data.windows("val", self.seq_length))
            if self.num_windows > total:
                how = (
                    f"--eval-iters {self.eval_iters} x accumulation x micro-batch x {self.world_size} ranks"
                    if self.megatron
                    else f"--eval-iters {self.eval_iters} x micro-batch {self.micro_batch_size}"
                )
                logger.warning(
                    "the val split has %d windows of %d tokens; every evaluation uses all of them, not %d (%s)",
                    total,
                    self.seq_length + 1,
                    self.num_windows,
                    how,
                )
                self.num_windows = None
        return evaluate(
            engine,
            self.data,
            self.seq_length,
            self.micro_batch_size,
            None,
            self.device,
            label_style=self.label_style,
            document_masking=self.document_masking,
            num_windows=self.num_windows,
            rank=self.rank,
            world_size=self.world_size,
            dist_info=self.dist_info,
        )
