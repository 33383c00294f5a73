"""The loop's side of the stages (:mod:`seqwarm.curriculum.stages`): the positions set on the model when a
stage begins, the same on every rank, and the change recorded.

The curriculum object decides the stage from the clock at ``begin_step``
(:class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup`) and says when it changed (``slw.stage_changed``,
also at the first step after a resume inside a stage, since the rotary tables are not saved).
The engine's ``begin_step`` sets the stage's positions on the model through the setters of
:mod:`seqwarm.curriculum.positions` (seqwarm's GPT's ``set_positions``, the hook for an ``hf:`` model;
:meth:`~seqwarm.curriculum.engine.CurriculumEngine.begin_step`, or ``DeepSpeedCurriculum.begin_step`` under
``--deepspeed``);
:meth:`StagePositions.follow`, called right after it, checks that every rank is in the same stage with the
same settings, and writes a ``stage`` row to metrics.jsonl and a console line.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from seqwarm.curriculum.stages import stage_at
from seqwarm.trainer.distributed import DistInfo, gather_floats

__all__ = ["StagePositions"]

logger = logging.getLogger(__name__)


class StagePositions:
    """Checks and records the step a stage begins at (see the module)."""

    def __init__(self, engine: Any, model: torch.nn.Module, info: DistInfo, device: torch.device, log: Any):
        self.slw = getattr(engine, "slw", None)
        self.info, self.device, self.log = info, device, log
        self.first = True
        stages = self.slw.stages.stages if self.slw is not None else ()
        if stages and info.is_main:
            logger.info(
                "stages: %s; windows are read at the full length and cut to each stage's length",
                "; ".join(f"from {s.start_tokens:,} tokens {s.describe()}" for s in stages),
            )

    def follow(self, step: int, tokens: int) -> None:
        """After ``begin_step`` of optimizer step ``step``: when the stage changed, check it and record it."""
        slw, first = self.slw, self.first
        self.first = False
        if slw is None or not slw.stage_changed or slw.stage is None:
            return
        stage, positions = slw.stage, slw.positions  # already set on the model by the engine's begin_step
        self._check_ranks(step, stage)
        reason = "resumed" if first and step > 1 else "begins"
        index = slw.stages.index
        logger.info("step %d: stage %d %s at %s tokens: %s", step, index + 1, reason, f"{tokens:,}", stage.describe())
        self.log.eval_row(
            {"kind": "stage", "step": step, "tokens": tokens, "stage": index + 1, "seqlen": stage.length}
            | {"reason": reason, **positions}
        )

    @property
    def applied(self) -> dict[str, Any] | None:
        """The stage whose positions the model has (``stage``, ``length``, ``rope_theta``, ``rope_scaling``),
        saved in each checkpoint (``positions``) for ``seqwarm eval`` / ``export``; None before the first.
        The last step's stage; right after a load, before any step, the clock's (which the engine's
        ``load_state_dict`` set on the model)."""
        slw = self.slw
        if slw is None or not slw.stages.stages:
            return None
        found = (
            (slw.stages.index, slw.stage) if slw.stage is not None else stage_at(slw.progress.tokens, slw.stages.stages)
        )
        if found is None:
            return None
        index, stage = found
        return {"stage": index + 1, "length": stage.length, **stage.positions()}

    def validation(self, evaluator: Any, engine: Any) -> dict[str, Any]:
        """In a run with stages whose pretraining length (the warmup's top) is below the validation length:
        ``val_loss_pretrain``, the validation loss at the pretraining length (``pretrain_seqlen``), at every
        evaluation — before the first stage too, so the short-context loss has a baseline to compare with."""
        slw = self.slw
        if slw is None or not slw.stages.stages:
            return {}
        length = slw.curriculum.max_difficulty if slw.curriculum is not None else evaluator.seq_length
        if length >= evaluator.seq_length:
            return {}
        return {"val_loss_pretrain": evaluator.at_length(engine, length), "pretrain_seqlen": length}

    def _check_ranks(self, step: int, stage: Any) -> None:
        """Every rank in the same stage with the same settings (a mismatch would train two models)."""
        if not self.info.enabled:
            return
        scaling = stage.rope_scaling
        mine = [float(stage.start_tokens), float(stage.length), float(stage.rope_theta or 0.0)]
        mine += [float(scaling.factor), float(len(scaling.type))] if scaling is not None else [0.0, 0.0]
        device = self.device if self.info.backend == "nccl" else torch.device("cpu")
        every = gather_floats(mine, self.info, device)
        if any(other != every[0] for other in every):
            raise RuntimeError(f"step {step}: the ranks disagree on the stage's length or positions: {every}")
