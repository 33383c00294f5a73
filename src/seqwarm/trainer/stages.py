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
same settings, switches the training windows to the stage's length and rows
(:class:`~seqwarm.trainer.stage_data.StageBatches`, built by :meth:`StagePositions.batches`), and writes a
``stage`` row to metrics.jsonl and a console line. :meth:`StagePositions.validation` adds the losses at the
pretraining length and at the current stage's to every evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from seqwarm.curriculum.plan_stages import eval_rows, longest_shape, stage_micro_rows
from seqwarm.curriculum.plan_stages import model_length as _model_length
from seqwarm.curriculum.stages import StageConfig, stage_at
from seqwarm.trainer.distributed import DistInfo, gather_floats
from seqwarm.trainer.stage_data import StageBatches
from seqwarm.util.errors import UserError

__all__ = ["StagePositions"]

logger = logging.getLogger(__name__)


class StagePositions:
    """Checks and records the step a stage begins at, and reads each stage's windows (see the module).

    ``cfg``: the run's config (its stages, micro-batch and ``seq_length``: the windows' length before the
    stages); ``model_length``: the longest sequence the model holds (its ``seq_length``); ``evaluator``: its
    batches get the rows of the longest length. Without ``cfg`` (a loop of its own) the windows are not
    managed here."""

    def __init__(
        self,
        engine: Any,
        model: torch.nn.Module,
        info: DistInfo,
        device: torch.device,
        log: Any,
        *,
        cfg: Any = None,
        model_length: int | None = None,
        evaluator: Any = None,
    ):
        self.slw = getattr(engine, "slw", None)
        self.info, self.device, self.log, self.cfg = info, device, log, cfg
        self.first = True
        self.source: StageBatches | None = None
        stages = self.slw.stages.stages if self.slw is not None else ()
        self.model_length = model_length
        self.base_length = (cfg.full_length if cfg is not None and stages else None) or model_length
        self.longest = longest_shape(cfg) if cfg is not None and stages else None  # (rows, length)
        needed = _model_length(cfg) if self.longest is not None else 0
        if model_length is not None and needed > model_length:
            raise UserError(
                f"a stage trains at length {needed}, longer than the model holds ({model_length}): build the "
                "model with seq_length at least the longest stage's (seqwarm train does for --rotary)"
            )
        if self.longest is not None and evaluator is not None and evaluator.seq_length == needed:
            evaluator.micro_batch_size = eval_rows(cfg)  # validation at the longest length, in a stage's rows there
        if stages and info.is_main:
            logger.info("stages: %s", "; ".join(f"from {s.start_tokens:,} tokens {self._words(s)}" for s in stages))

    @classmethod
    def for_run(cls, run: Any) -> StagePositions:
        """The stages of a :class:`~seqwarm.trainer.loop.Run` (its engine, model, config and evaluator)."""
        return cls(
            run.engine,
            run.model,
            run.info,
            run.device,
            run.log,
            cfg=run.cfg,
            model_length=run.model_cfg.seq_length,
            evaluator=run.evaluator,
        )

    def rows(self, stage: StageConfig) -> int:
        """Rows per micro-batch in ``stage`` (its windows are read at its length)."""
        return stage_micro_rows(self.cfg, stage)

    def _words(self, stage: StageConfig) -> str:
        if self.cfg is None:
            return stage.describe()
        rows = self.rows(stage)
        how = "its own micro_batch_size" if stage.micro_batch_size is not None else "the micro-batch's tokens kept"
        return f"{stage.describe()}, windows read at {stage.length}, {rows} rows per micro-batch ({how})"

    def batches(self, make: Callable[..., Any]) -> Any:
        """The run's training batches from ``make(length, rows)`` (``data.train_batches`` with the run's seed,
        ranks and labels): with stages, a :class:`StageBatches` that re-reads the windows at each stage."""
        if self.cfg is None or self.base_length is None:
            raise ValueError("StagePositions.batches needs the run's cfg and model_length")
        if self.longest is None:
            return make(self.model_length, self.cfg.micro_batch_size)
        self.source = StageBatches(make, self.base_length, self.cfg.micro_batch_size)
        return self.source

    @property
    def probe_shape(self) -> tuple[int, int]:
        """``(length, rows)`` of the trial step before step 1: the longest length the run trains."""
        if self.longest is None:
            return self.model_length, self.cfg.micro_batch_size
        return self.longest[1], self.longest[0]

    def follow(self, step: int, tokens: int, feed: Any = None) -> None:
        """After ``begin_step`` of optimizer step ``step``: when the stage changed, check it, read its windows
        (``feed``: the :class:`~seqwarm.trainer.feed.DeviceFeed` over :meth:`batches`) and record it."""
        slw, first = self.slw, self.first
        self.first = False
        if slw is None or not slw.stage_changed or slw.stage is None:
            return
        stage, positions = slw.stage, slw.positions  # already set on the model by the engine's begin_step
        self._check_ranks(step, stage)
        reason = "resumed" if first and step > 1 else "begins"
        index, extra, words = slw.stages.index, {}, stage.describe()
        if self.source is not None:
            rows = self.rows(stage)
            if feed is not None and (stage.length, rows) != self.source.shape:
                feed.close()  # a batch read ahead is given back to the old source first
            self.source.switch(stage.length, rows)
            extra, words = {"micro_batch_size": rows}, f"{words} ({rows} rows of {stage.length} per micro-batch)"
        logger.info("step %d: stage %d %s at %s tokens: %s", step, index + 1, reason, f"{tokens:,}", words)
        self.log.eval_row(
            {"kind": "stage", "step": step, "tokens": tokens, "stage": index + 1, "seqlen": stage.length}
            | {"reason": reason, **positions, **extra}
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
        if slw.stages.known:  # the last step's stage: the step whose tokens reach a stage still trained before it
            found = (slw.stages.index, slw.stage) if slw.stage is not None else None
        else:  # right after a load, before any step: the clock's (what the engine's load set on the model)
            found = stage_at(slw.progress.tokens, slw.stages.stages)
        if found is None:
            return None
        index, stage = found
        return {"stage": index + 1, "length": stage.length, **stage.positions()}

    def validation(self, evaluator: Any, engine: Any) -> dict[str, Any]:
        """In a run with stages whose pretraining length (the warmup's top) is below the validation length
        (the longest the run trains): ``val_loss_pretrain``, the validation loss at the pretraining length
        (``pretrain_seqlen``), at every evaluation — before the first stage too, so the short-context loss
        has a baseline to compare with; inside a stage shorter than the validation length and longer than
        the pretraining length, also ``val_loss_stage`` at the stage's length (``stage_seqlen``)."""
        slw = self.slw
        if slw is None or not slw.stages.stages:
            return {}
        length = slw.curriculum.max_difficulty if slw.curriculum is not None else self.base_length
        length = length or evaluator.seq_length
        out: dict[str, Any] = {}
        if length < evaluator.seq_length:
            out = {"val_loss_pretrain": evaluator.at_length(engine, length), "pretrain_seqlen": length}
        stage = slw.stage if slw.stage is not None else None
        if stage is not None and length < stage.length < evaluator.seq_length:
            rows = self.rows(stage) if self.cfg is not None else None
            out |= {"val_loss_stage": evaluator.at_length(engine, stage.length, rows), "stage_seqlen": stage.length}
        return out

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
