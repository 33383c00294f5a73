"""The token-clock learning rate as a real ``torch.optim.lr_scheduler.LRScheduler``, for any loop.

:class:`CurriculumLRScheduler`'s LR is :func:`~seqwarm.curriculum.lr.lr_at` of seqwarm's token clock, for
plain loops, Accelerate users and the Hugging Face ``CurriculumTrainer``. ``lr_at`` takes the clock
*including* the step the LR is for, so feed it before the optimizer step::

    scheduler.step(slw.step_progress())   # every group: lr_at(clock with this step) * lr_scale
    optimizer.step()
    slw.end_step()                        # (a SequenceLengthWarmup)

Built over a :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` its state dict carries the curriculum's
(clock, schedule), so checkpointing the scheduler (``accelerator.register_for_checkpointing``, or the
Trainer's ``scheduler.pt``) checkpoints the curriculum. Do not wrap it in ``accelerator.prepare``:
Accelerate's wrapper steps a scheduler after the optimizer, one step late for this clock. (Until 0.2 it
lived only in :mod:`seqwarm.integrations.hf.trainer`, which still re-exports it.)
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.lr import LRConfig, lr_at
from seqwarm.curriculum.run import as_run_config
from seqwarm.curriculum.warmup import SequenceLengthWarmup

__all__ = ["CurriculumLRScheduler"]

STATE_FORMAT = "seqwarm.hf_scheduler/1"
"""The tag of its state dict (the name it had under ``integrations.hf``: saved schedulers still load)."""


class CurriculumLRScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Every param group's LR is ``lr_at(progress, lr_config) * group.get("lr_scale", 1.0)``.

    ``source``: a :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` (its LR config; its state is saved with
    the scheduler's), a :class:`~seqwarm.config.RunConfig`, an :class:`~seqwarm.curriculum.lr.LRConfig`,
    or a DeepSpeed-style dict / JSON path. :meth:`step` takes the clock of the step about to be applied
    (the clock *including* it: call it before ``optimizer.step()``); without an argument it re-applies
    the last clock given (so a caller that steps it after the optimizer, like ``Trainer``, changes nothing).
    ``get_last_lr()`` is the LR of the step in flight. Its first clock at step 1 while the optimizer already
    has state (loaded from a checkpoint) is a warning: the curriculum's state was not restored, so the ramp
    and the LR schedule would start again from the beginning.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, source: Any, last_epoch: int = -1):
        self.slw = source if isinstance(source, SequenceLengthWarmup) else None
        if self.slw is not None:
            if source.lr_config is None:
                raise ValueError("the SequenceLengthWarmup has no LR config (lr=...): it sets no learning rate")
            self.lr_config = source.lr_config
        elif isinstance(source, LRConfig):
            self.lr_config = source
        else:
            self.lr_config = as_run_config(source, 1).lr
        self.progress = self.slw.progress if self.slw is not None else Progress()
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        lr = lr_at(self.progress, self.lr_config)
        return [lr * group.get("lr_scale", 1.0) for group in self.optimizer.param_groups]

    def step(self, progress: Progress | None = None) -> None:  # type: ignore[override]
        """Set every group's LR for the clock ``progress`` (None: the last clock given, again: the step
        count does not move, so a caller that also steps it after the optimizer counts each step once)."""
        if progress is not None:
            if progress.step == 1 and self.last_epoch == 0 and any(self.optimizer.state.values()):
                warnings.warn(
                    "the clock is at its first step but the optimizer has state (loaded from a checkpoint?): "
                    "the curriculum's state was not restored, so the length ramp and the LR schedule start "
                    "again. Save slw.state_dict() (or this scheduler's state_dict()) with every checkpoint "
                    "and load it on resume",
                    stacklevel=2,
                )
            self.progress = progress
        if progress is not None or self.last_epoch < 0:  # (the constructor's own first call counts)
            self.last_epoch += 1
        values = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = values

    def state_dict(self) -> dict[str, Any]:
        """The clock, the last LRs and, over a SequenceLengthWarmup, its state (plain types: ``weights_only`` loads)."""
        return {
            "format": STATE_FORMAT,
            "last_epoch": self.last_epoch,
            "last_lr": list(self._last_lr),
            "progress": self.progress.to_dict(),
            "core": self.slw.state_dict() if self.slw is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a CurriculumLRScheduler state dict (format {state.get('format')!r})")
        self.last_epoch = int(state["last_epoch"])
        self._last_lr = [float(v) for v in state["last_lr"]]
        self.progress = Progress.from_dict(state["progress"])
        if self.slw is not None and state.get("core") is not None:
            self.slw.load_state_dict(state["core"])
