"""torchtitan: the curriculum in ``Trainer.train_step``, through the iterator of micro-batches it is handed.

torchtitan's ``Trainer.train_step(data_iterator)`` draws every micro-batch of one optimizer step
(``gradient_accumulation_steps`` x the pipeline micro-batches) before the first forward, as
``(input_dict, labels)``: ``input_dict["input"]`` the token ids (B, T), ``labels`` (B, T), and per-token
extras such as ``positions``. :func:`step_batches` draws them the same way, begins the curriculum's step,
cuts each one (:func:`cut_batch`) and sets the step's token-clock LR; a ``Trainer`` subclass hands its
iterator to ``super().train_step`` and ends the step after it (docs/FRAMEWORKS.md has the subclass).
Nothing here imports torchtitan.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from seqwarm.curriculum.inputs import set_lr
from seqwarm.curriculum.warmup import SequenceLengthWarmup

__all__ = ["cut_batch", "step_batches"]

Batch = tuple[dict[str, Any], torch.Tensor]


def cut_batch(slw: SequenceLengthWarmup, input_dict: Mapping[str, Any], labels: torch.Tensor) -> Batch:
    """One torchtitan micro-batch ``(input_dict, labels)`` cut to the length of ``slw``'s step in flight:
    ``input_dict["input"]``, ``labels`` and every other per-token tensor of ``input_dict`` (``positions``,
    which torchtitan builds its attention masks from after this). Its tokens are counted by ``slw``."""
    if not isinstance(input_dict.get("input"), torch.Tensor):
        raise ValueError(
            f"a torchtitan batch holds its token ids at input_dict['input']; got keys {sorted(input_dict)}"
        )
    clash = {"input_ids", "labels"} & set(input_dict)
    if clash:
        raise ValueError(f"input_dict has keys {sorted(clash)}, which cut_batch uses for the inputs and labels")
    extras = {k: v for k, v in input_dict.items() if k != "input"}
    out = slw.cut({"input_ids": input_dict["input"], "labels": labels, **extras})
    inputs, cut_labels = out.pop("input_ids"), out.pop("labels")
    return {"input": inputs, **out}, cut_labels


def step_batches(
    slw: SequenceLengthWarmup, data_iterator: Iterator[Batch], micro_batches: int, optimizers: Any = None
) -> Iterator[Batch]:
    """The ``micro_batches`` micro-batches of one optimizer step, drawn from ``data_iterator`` (torchtitan's
    ``batch_generator``), then cut: an iterator to hand to ``Trainer.train_step``. The step begins once all
    are drawn (data running out mid-step begins none); with an LR config, every param group of
    ``optimizers`` (torchtitan's ``OptimizersContainer`` or a torch optimizer) gets the step's LR here,
    before the step's ``optimizer.step()``. Call ``slw.end_step()`` after the step."""
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    drawn = [next(data_iterator) for _ in range(micro_batches)]
    slw.begin_step()
    cut = [cut_batch(slw, input_dict, labels) for input_dict, labels in drawn]
    lr = slw.step_lr()
    if lr is not None and optimizers is not None:
        for optimizer in _optimizers(optimizers):
            set_lr(optimizer, lr)
    return iter(cut)


def _optimizers(optimizers: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers that hold the param groups: an ``OptimizersContainer``'s own param group is a
    placeholder (its optimizers hold the real ones), so it is read as the list of its optimizers."""
    inner = getattr(optimizers, "optimizers", None)
    if isinstance(inner, (list, tuple)):
        return list(inner)
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)
