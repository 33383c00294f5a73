"""The pretraining loop: budget by tokens, logging, full-length evaluation, atomic checkpoints, exact resume.

:class:`Run` is the loop. An *engine builder* (:mod:`seqwarm.trainer.backends`: one device, DDP or
FSDP2; the DeepSpeed one in :mod:`seqwarm.integrations.deepspeed.run`) builds the GPT, its optimizer and
the engine the loop drives (a :class:`~seqwarm.trainer.backends.Engine`), and supplies the checkpointer
(:mod:`seqwarm.trainer.checkpoint`); the run's precision and curriculum mode are decided before
(:func:`~seqwarm.trainer.backends.decide`). One optimizer step reads top to bottom in
:meth:`Run._train_step`: the step's length decided once, each micro-batch drawn raw from the feed
(:mod:`seqwarm.trainer.feed`), cut once on the host, copied to the device, forward and backward; the
update (clip, the LR from the clock); the step's end, which moves the clock. The loop steps until the
clock reaches the budget, calling the evaluator (:mod:`seqwarm.trainer.evaluator`, always full length),
the metrics logger (:mod:`seqwarm.trainer.metrics`) and the checkpointer.
:func:`seqwarm.run.training.run_training` sets a run up from a :class:`~seqwarm.run.spec.RunSpec`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from seqwarm.config import RunConfig
from seqwarm.data.variable import variable_data
from seqwarm.trainer.backends import EngineBuilder, RunChoices, TorchEngineBuilder, decide
from seqwarm.trainer.checkpoint import first_nonfinite, list_checkpoints, rng_state, set_rng_state
from seqwarm.trainer.distributed import DistInfo, device_for, gather_floats, mean_over_ranks
from seqwarm.trainer.evaluator import Evaluator
from seqwarm.trainer.feed import DeviceFeed
from seqwarm.trainer.flops import FlopsMeter
from seqwarm.trainer.history import append_event
from seqwarm.trainer.metrics import MetricsLogger, adam_stats, optimizer_states, step_point, truncate_metrics
from seqwarm.trainer.options import RunOptions
from seqwarm.trainer.plots import plot_run
from seqwarm.trainer.record import TrainResult, data_record, jsonable, run_summary, versions
from seqwarm.trainer.resume import check_resume_config, saved_section
from seqwarm.trainer.stages import StagePositions
from seqwarm.trainer.stop import RunStopped, StopNow, StopRequest
from seqwarm.trainer.trackers import forget_wandb_run, tracker_config
from seqwarm.trainer.trial import trial_step
from seqwarm.util.errors import SeqwarmError

logger = logging.getLogger(__name__)

MAX_SKIPS_IN_A_ROW = 50
"""fp16 overflow-skipped steps in a row that end a run (dynamic scaling reaches the minimum scale from
2**16 in 16 halvings, 32 with DeepSpeed's default hysteresis of 2)."""


class TrainingDiverged(SeqwarmError):
    """The loss became NaN or infinite."""

    exit_code = 3


@dataclass
class StepEntry:
    """A step whose loss the loop has not read yet: read with the others at the next log, eval or save step
    (one host transfer, one gather across ranks)."""

    step: int
    length: int | None  # its curriculum length (every rank must have trained at the same one)
    loss: Any  # this rank's mean loss: a 0-d tensor on the device, or a float
    tokens: int = 0  # the clock's tokens after the step
    step_tokens: int = 0  # the tokens it trained (summed over ranks)
    seconds: float = 0.0
    point: dict[str, Any] | None = None  # the trackers' per-step point when one is due (the loss added once read)
    flops: float = 0.0  # its model FLOPs per device (trainer.flops; 0 without a peak)


class Run:
    """One training run in a folder: the loop, calling its engine, checkpointer, evaluator and logger.

    ``cfg``: the checked recipe. ``options``: how the run is driven (:class:`~seqwarm.trainer.options.RunOptions`:
    the folder, seed, device, intervals, trackers, resume, and what to record of them). ``choices``: the
    precision and curriculum mode decided before anything is built (None: :func:`~seqwarm.trainer.backends.decide`
    here). ``memory_probe``: one forward + backward at the full length and micro-batch before the first step,
    so an OOM comes in the first minute and the ETA knows a long step's cost from step 1 (None: run it, except
    for a compiled run on a CPU; True / False: always / never); the numbers are the same with or without it.
    ``stop``: what ends it early (default: the stop signals and ``options.exit_duration_in_mins``).
    """

    def __init__(
        self,
        cfg: RunConfig,
        options: RunOptions,
        data,
        model_cfg,
        *,
        dist_info: DistInfo | None = None,
        builder: EngineBuilder | None = None,
        choices: RunChoices | None = None,
        memory_probe: bool | None = None,
        stop: StopRequest | None = None,
    ):
        opts = options
        self.cfg, self.opts, self.data, self.model_cfg = cfg, opts, data, model_cfg
        self.memory_probe = memory_probe
        self.stop = stop or StopRequest(minutes=opts.exit_duration_in_mins)
        self.info = dist_info or DistInfo()
        self.is_main = self.info.is_main
        builder = builder or TorchEngineBuilder()
        dp_rank, dp_world = builder.data_parallel(self.info)
        if dp_world != cfg.world_size:
            raise ValueError(f"config world_size {cfg.world_size} != {dp_world} data-parallel processes")
        self.device = device_for(self.info, opts.device)
        self.run_dir = Path(opts.out)
        self.ckpt_dir = self.run_dir / "checkpoints"
        resumed = saved_section(self.run_dir, "run").get("precision") if opts.resume else None
        self.choices = choices = choices or decide(cfg, builder, model_cfg, self.device, resumed)
        if choices.mode == "variable":  # its training rows come at each step's length, from the data
            self.data = data = variable_data(data, cfg)
        tf32 = self.device.type == "cuda" and choices.precision == "fp32"
        if tf32:  # fp32 weights and reductions, TF32 tensor-core matmuls (~8x fp32 on an A100/H100)
            torch.set_float32_matmul_precision("high")
        self.precision_info = {"precision": choices.precision, "source": choices.precision_source, "tf32_matmul": tf32}
        logger.debug(
            "precision %s (%s)%s", choices.precision, choices.precision_source, ", TF32 matmuls" if tf32 else ""
        )
        saved_model = saved_section(self.run_dir, "model") if opts.resume else {}
        if saved_model and hasattr(model_cfg, "vocab_multiple") and "vocab_multiple" not in saved_model:
            # written before the vocabulary was padded: the resumed run keeps its (unpadded) shapes
            model_cfg = self.model_cfg = model_cfg.replace(vocab_multiple=1)
        torch.manual_seed(opts.seed)  # same initial weights on every rank
        built = builder.build(model_cfg, cfg, self.info, self.device, choices)
        self.model, self.optimizer, self.engine = built.model, built.optimizer, built.engine
        self.whole_steps = built.whole_steps
        self.checkpointer = builder.checkpointer(
            built, self.ckpt_dir, self.info, opts.keep_checkpoints, opts.save_interval
        )
        self.evaluator = Evaluator(
            data,
            model_cfg.seq_length,
            cfg.micro_batch_size,
            opts.eval_iters,
            self.device,
            label_style=built.label_style,
            interval=opts.eval_interval,
            document_masking=cfg.document_masking,
            megatron=cfg.lr.rule == "megatron",
            accumulation=cfg.gradient_accumulation_steps,
            data_parallel=(dp_rank, dp_world),
            dist_info=self.info,
        )
        data.windows("val", model_cfg.seq_length)  # a val split too short for one window fails now, not at the end
        share = dp_world / self.info.world_size  # a replica's FLOPs spread over its devices (pipeline stages)
        self.meter = FlopsMeter.for_run(model_cfg, cfg, self.device, choices, share, main=self.is_main)
        if self.is_main and not list_checkpoints(self.ckpt_dir):  # nothing to resume: a new W&B run
            forget_wandb_run(self.run_dir)
        self.log = MetricsLogger(
            self.run_dir,
            budget_tokens=cfg.train_tokens,
            is_main=self.is_main,
            log_interval=max(1, opts.log_interval),
            progress_bar=opts.progress_bar,
            tensorboard=opts.tensorboard,
            point_interval=opts.tensorboard_log_interval,
            peak_tflops=self.meter.peak_tflops,
            curves=plot_run,
            trackers=tracker_config(
                cfg.deepspeed,
                self.run_dir,
                tensorboard=opts.tensorboard,
                tensorboard_dir=opts.tensorboard_dir,
                wandb_project=opts.wandb_project,
                wandb_run_name=opts.wandb_run_name,
            ),
        )
        self.stages = StagePositions.for_run(self)  # with stages: their windows read at each stage's length
        self._optimizer_states = (
            (lambda: optimizer_states(self.optimizer)) if opts.log_optimizer_states_to_tensorboard else None
        )
        self.batches = self.stages.batches(  # data.train_batches(length, rows, ...)
            partial(
                data.train_batches,
                seed=opts.seed,
                rank=dp_rank,
                world_size=dp_world,
                label_style=built.label_style,
                **({"document_masking": True} if cfg.document_masking else {}),
            )
        )
        # seqwarm's GPT: a trivial loss mask / positions are its defaults, so they need not be copied; but
        # window mode keeps its positions, which turn trivial at the full length: a compiled model would
        # see other inputs there and trace a second training graph (window's point is one)
        drop = ("loss_mask",) if choices.mode == "window" else True
        self.feed = DeviceFeed(self.batches, self.device, drop_trivial=built.label_style == "megatron" and drop)
        """The micro-batches: drawn raw (read one ahead on CUDA), copied to the device once the loop cut them."""
        self.elapsed_before = 0.0
        self.t_start = time.perf_counter()
        self.last_val: float | None = None
        self.last_saved: Path | None = None
        """The newest checkpoint this run wrote or resumed from (every saved one is finite)."""
        self.resumed_from: dict[str, Any] | None = None  # the resumed checkpoint's config
        self.saved_step: int | None = None  # a stop right after a save does not write it twice
        self.resolved = {
            "run": jsonable(choices.recorded(cfg).to_dict()),
            "model": {"preset": opts.model_name, **asdict(model_cfg), "num_params": model_cfg.num_params()},
            "data": data_record(data),
            "options": jsonable({**opts.recorded, "memory_probe": memory_probe}),
            "world_size": cfg.world_size,
            "parallelism": built.parallelism,
            "device": str(self.device),
            "precision": self.precision_info,
            "versions": versions(),
            **self.meter.resolved,
            **built.resolved,
        }

    def elapsed(self) -> float:
        """Training wall-clock seconds of the run, earlier sessions included."""
        return self.elapsed_before + (time.perf_counter() - self.t_start)

    # -- checkpoints ------------------------------------------------------------------------------
    def _check_resume_config(self, path, saved: dict) -> None:
        check_resume_config(path, saved, self.resolved, allow_config_change=self.opts.allow_config_change)

    def last_good(self) -> str:
        """The divergence message's pointer to the newest finite checkpoint that exists."""
        path = self.last_saved
        if path is not None and Path(path).exists():
            return f"the last good checkpoint is {path} (resume from it with --resume)"
        return "no checkpoint was written before it (nothing to resume from)"

    def _nonfinite_state(self) -> str | None:
        """The first model parameter or optimizer state holding NaN/inf on any rank, else None."""
        bad = first_nonfinite(self.model, self.optimizer)
        if self.info.enabled:  # every rank must agree, or the save (a collective) would hang
            device = self.device if self.info.backend == "nccl" else torch.device("cpu")
            flags = gather_floats([1.0 if bad else 0.0], self.info, device)
            if bad is None and any(f[0] for f in flags):
                bad = "the state of another rank"
        return bad

    def save(self) -> Path | None:
        bad = self._nonfinite_state()
        if bad is not None:  # never write a checkpoint a resume would diverge from at once
            raise TrainingDiverged(
                f"the {bad} became NaN or infinite by step {self.engine.progress.step} (the loss was still finite); "
                f"not saving it: {self.last_good()}. Lower the learning rate, raise min_difficulty, or "
                "lengthen the curriculum"
            )
        loop_state = {
            "data": self.feed.state_dict(),
            "rng": rng_state(),
            "config": self.resolved,
            "elapsed_s": self.elapsed(),
            "last_val": self.last_val,
            "positions": self.stages.applied,  # the stage's rotary settings the weights trained with
        }
        path = self.checkpointer.save(self.engine.progress.step, loop_state)
        self.saved_step = self.engine.progress.step
        if path is not None:
            self.last_saved = Path(path)
            append_event(self.run_dir, "checkpoint", step=self.engine.progress.step)  # rank 0: the record
        return path

    def resume(self) -> bool:
        """Continue from the latest checkpoint in the run folder; False when there is none."""
        found = self.checkpointer.load(self._check_resume_config)
        if found is None:
            if self.is_main:  # a run killed before its first checkpoint: its rows are written again
                truncate_metrics(self.run_dir / "metrics.jsonl", 0)
            return False
        path, state = found
        self.resumed_from = state["config"]  # the config the checkpoint was written with (history.jsonl)
        self.last_saved, self.saved_step = Path(path), self.engine.progress.step
        self.feed.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.last_val = state.get("last_val")
        if self.is_main:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.engine.progress.step)
            logger.info(
                "resumed from %s (step %d, %s tokens)",
                path,
                self.engine.progress.step,
                f"{self.engine.progress.tokens:,}",
            )
        return True

    # -- the loop ---------------------------------------------------------------------------------
    def _evaluate(self) -> float:
        val = self.evaluator(self.engine)
        self.last_val, p = val, self.engine.progress
        self.log.eval_row(
            {
                "kind": "eval",
                "step": p.step,
                "tokens": p.tokens,
                "samples": p.samples,
                "val_loss": val,
                "val_ppl": math.exp(min(val, 50.0)),
                "seqlen": self.evaluator.seq_length,
                **self.stages.validation(self.evaluator, self.engine),  # with stages: at the pretraining length
                "elapsed_s": self.elapsed(),
            }
        )
        return val

    def _probe_memory(self) -> None:
        """The engine's :meth:`~seqwarm.curriculum.engine.CurriculumEngine.probe_memory` at the full length
        (:func:`~seqwarm.trainer.trial.trial_step`); its timed run is the ETA's first long step."""
        probe = getattr(self.engine, "probe_memory", None)
        wanted = self.memory_probe
        if wanted is None:  # on a CPU, a compiled run would compile the trial's graph too (20-70 s): skip it
            wanted = self.device.type == "cuda" or not (self.cfg.compile or self.resolved.get("compile"))
        if not callable(probe) or not wanted:
            return
        (length, micro), step = self.stages.probe_shape, self.engine.progress.step + 1  # the longest length
        seconds = trial_step(
            probe, length=length, micro=micro, vocab_size=self.data.vocab_size, device=self.device, step=step
        )
        self.log.trial(micro * length * self.info.world_size, seconds)
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            logger.info("trial step at length %d x %d fits: peak %.2f GiB", length, micro, peak)

    def _train_step(self) -> Any:
        """One optimizer step, top to bottom; this rank's mean loss (a 0-d tensor on the device, or a float,
        read at the next log, eval or save step). An fp16 overflow skips the update: the clock stays."""
        engine, feed, micro_batches = self.engine, self.feed, self.cfg.gradient_accumulation_steps
        engine.begin_step()  # the step's length, decided once, before its micro-batches are drawn
        self.stages.follow(engine.progress.step + 1, engine.progress.tokens, feed)  # a new stage: its windows
        if self.whole_steps:  # a pipeline trains the step's micro-batches in one call (DeepSpeed's train_batch)
            cuts = [self.meter.add(engine.cut(feed.draw()), engine.current_seqlen) for _ in range(micro_batches)]
            loss, applied = engine.train_batch([feed.to_device(cut) for cut in cuts])
        else:
            losses, applied = [], False
            for _ in range(micro_batches):
                raw = feed.draw()  # full length, on the host (read one ahead on CUDA)
                cut = self.meter.add(engine.cut(raw), engine.current_seqlen)  # one cut, counted (and its FLOPs)
                batch = feed.to_device(cut)  # only the columns the cut keeps are copied
                loss = engine.run(batch)  # forward (gradients are reduced across ranks on the step's last)
                engine.backward(loss)
                losses.append(loss.detach())
                applied = engine.update()  # after the step's last micro-batch: clip, the LR from the clock, update
            loss = torch.stack(losses).mean()
        engine.end_step(applied)  # the clock moves by the step's tokens, summed over ranks (not on an fp16 skip)
        return loss

    def _checked_losses(self, entries: list[StepEntry]) -> list[float]:
        """The losses of ``entries``: one host transfer, one gather across ranks; TrainingDiverged at the
        first step whose loss is not finite."""
        values = [e.loss for e in entries]
        if all(isinstance(v, torch.Tensor) for v in values):
            losses = torch.stack([v.detach().float().reshape(()) for v in values]).tolist()
        else:
            losses = [float(v) for v in values]
        if self.info.enabled:
            device = self.device if self.info.backend == "nccl" else torch.device("cpu")
            steps, lengths = [e.step for e in entries], [int(e.length or 0) for e in entries]
            losses = mean_over_ranks(losses, steps, lengths, self.info, device)
        for e, loss in zip(entries, losses):
            if not math.isfinite(loss):
                raise TrainingDiverged(
                    f"the training loss became {loss} at step {e.step} (length {e.length}); {self.last_good()}. "
                    "Lower the learning rate, raise min_difficulty, or lengthen the curriculum"
                )
        return losses

    def _log_pending(self, pending: list[StepEntry]) -> None:
        """Read the losses of the steps since the last read and add the steps to the log window."""
        if pending:
            for e, loss in zip(pending, self._checked_losses(pending)):
                self.log.step(e.tokens, e.step_tokens, loss, e.seconds, e.flops)
                if e.point is not None:
                    self.log.point({**e.point, "loss": loss})
            pending.clear()

    def train(self) -> TrainResult:
        self.t_start = time.perf_counter()
        cfg, engine = self.cfg, self.engine
        reason = engine.stop_reason()  # the budget: the engine's clock against the config's limits
        skips_in_a_row = 0
        pending: list[StepEntry] = []  # steps whose loss is not read yet
        self.log.open(engine.progress.tokens)
        engine.train()
        self._probe_memory()
        self.stop.install()  # a stop signal ends the run at the next step boundary, saved
        try:
            while reason is None:
                # on request: the same step on every rank, saved
                if stopped := self.stop.agreed(self.info, engine.progress.step):
                    self._log_pending(pending)  # the losses since the last read, checked
                    if engine.progress.step and self.saved_step != engine.progress.step:
                        self.save()
                    raise RunStopped(stopped, engine.progress, self.last_saved or self.ckpt_dir)
                t0 = time.perf_counter()
                before = engine.progress
                step_loss = self._train_step()
                flops = self.meter.take()
                p = engine.progress
                if p.step == before.step:  # fp16 overflow: skipped, nothing advanced; no eval/log/save
                    self._checked_losses([StepEntry(p.step, engine.current_seqlen, step_loss)])
                    skips_in_a_row += 1
                    if skips_in_a_row >= MAX_SKIPS_IN_A_ROW:
                        raise TrainingDiverged(
                            f"fp16 gradients overflowed {skips_in_a_row} steps in a row at step {p.step + 1} "
                            f"(loss scale now {getattr(engine, 'loss_scale', '?')}); {self.last_good()}. "
                            "Use bf16, or lower the learning rate"
                        )
                    continue
                skips_in_a_row = 0
                seconds = time.perf_counter() - t0
                point = step_point(self.log.point_interval, engine, p, cfg, seconds, self._optimizer_states)
                trained = p.tokens - before.tokens
                pending.append(
                    StepEntry(p.step, engine.current_seqlen, step_loss, p.tokens, trained, seconds, point, flops)
                )
                reason = engine.stop_reason()
                last = reason is not None  # the run ends with this step: evaluated and saved below anyway
                evaluate, save = self.evaluator.due(p.step, last), self.checkpointer.due(p.step, last)
                if evaluate or save or self.log.due(p.step, last=last):
                    self._log_pending(pending)  # the step's one host read (and one gather across ranks)
                if evaluate:
                    self._evaluate()
                if self.log.due(p.step, last=last):
                    head = {
                        "step": p.step,
                        "tokens": p.tokens,
                        "samples": p.samples,
                        "seqlen": engine.current_seqlen,
                        "lr": engine.lr,
                    }
                    tail = {"grad_norm": engine.grad_norm, "elapsed_s": self.elapsed(), **adam_stats(self.optimizer)}
                    self.log.train_row(head, tail, self.last_val)
                if save:
                    self.save()
            final_val = self._evaluate()
            self.save()
        except KeyboardInterrupt as exc:  # a second signal: say what the run folder keeps
            raise StopNow(getattr(exc, "signum", 2), self.last_good()) from None
        finally:
            self.stop.restore()
            self.feed.close()
            self.log.close()
        self.checkpointer.finish(engine.progress, self.resolved, self.last_val)
        summary = run_summary(self, final_val, reason)
        self.log.finish(summary)
        return TrainResult(self.run_dir, engine.progress.step, engine.progress.tokens, final_val, reason, summary)
