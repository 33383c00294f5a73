"""The pretraining loop: budget by tokens, logging, full-length evaluation, atomic checkpoints, exact resume.

``run_training(cfg, opts)`` is what ``seqwarm train`` calls; it builds the GPT, the optimizer and the
:class:`~seqwarm.engine.CurriculumEngine`, then repeats: ``gradient_accumulation_steps`` micro-batches
at full length from the data (the engine cuts them to the curriculum's length), one optimizer step,
until the clock reaches the budget. Validation always runs at full length.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqwarm import __version__
from seqwarm.budget import stop_reason
from seqwarm.checkpoint import latest_checkpoint, rng_state, save_checkpoint, set_rng_state
from seqwarm.config import RunConfig
from seqwarm.distributed import DistInfo, barrier, device_for, gather_floats, wrap_model
from seqwarm.errors import SeqwarmError, UserError
from seqwarm.optim import build_optimizer
from seqwarm.metrics import MetricsWriter, console_line, format_duration, truncate_metrics

logger = logging.getLogger(__name__)

RESUME_KEYS = ("train_batch_size", "micro_batch_size", "gradient_accumulation_steps", "seq_length", "lr",
               "curriculum", "train_tokens", "train_iters", "train_samples", "count_tokens_by", "precision")


MAX_SKIPS_IN_A_ROW = 50
"""fp16 overflow-skipped steps in a row that end a run (dynamic scaling reaches the minimum scale from
2**16 in 16 halvings, 32 with DeepSpeed's default hysteresis of 2)."""


class TrainingDiverged(SeqwarmError):
    """The loss became NaN or infinite."""

    exit_code = 3


@dataclass
class TrainOptions:
    """Everything about a run that is not the training recipe (RunConfig)."""

    out: Path
    data: Path | None = None
    model: str = "tiny"
    seed: int = 1234
    device: str = "auto"
    eval_interval: int = 50
    eval_iters: int = 8
    """Validation micro-batches per evaluation (each ``micro_batch_size`` full-length windows)."""
    save_interval: int = 100
    keep_checkpoints: int = 3
    log_interval: int = 10
    resume: bool = False
    allow_config_change: bool = False
    progress_bar: bool = True
    tensorboard: bool = True
    extra_model_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_val_loss: float | None
    stop_reason: str
    summary: dict[str, Any]


def versions() -> dict[str, str]:
    out = {"seqwarm": __version__, "torch": torch.__version__, "numpy": np.__version__,
           "python": platform.python_version()}
    try:  # the installed version, without importing deepspeed (its import prints and is slow)
        from importlib.metadata import PackageNotFoundError, version
        out["deepspeed"] = version("deepspeed")
    except PackageNotFoundError:
        pass
    return out


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=lambda o: list(o) if isinstance(o, tuple) else str(o)))


@torch.no_grad()
def evaluate(engine, data, seq_length: int, micro_batch_size: int, eval_iters: int,
             device: torch.device) -> float:
    """Mean validation loss per target token at full length over the first eval_iters batches."""
    was_training = engine.module.training
    engine.eval()
    total, count = 0.0, 0.0
    try:
        for batch in data.val_batches(seq_length, micro_batch_size, num_windows=eval_iters * micro_batch_size):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            loss = engine(batch)
            weight = float(batch["loss_mask"].sum()) if "loss_mask" in batch else batch["input_ids"].numel()
            total += float(loss) * weight
            count += weight
    finally:
        engine.train(was_training)
    if count == 0:
        raise UserError(f"the validation split has no window of {seq_length + 1} tokens: prepare more "
                        "validation text (--val-fraction) or use a shorter --seq-length")
    return total / count


class Run:
    """One training run in a folder: set-up, the loop, evaluation and checkpoints."""

    def __init__(self, cfg: RunConfig, opts: TrainOptions, data, model_cfg, *,
                 dist_info: DistInfo | None = None, fsdp: bool = False):
        self.cfg, self.opts, self.data, self.model_cfg = cfg, opts, data, model_cfg
        self.info = dist_info or DistInfo()
        self.is_main = self.info.is_main
        self.fsdp = fsdp
        dp_rank, dp_world = self._data_parallel()
        if dp_world != cfg.world_size:
            raise ValueError(f"config world_size {cfg.world_size} != {dp_world} data-parallel processes")
        self.device = device_for(self.info, opts.device)
        self.run_dir = Path(opts.out)
        self.ckpt_dir = self.run_dir / "checkpoints"
        torch.manual_seed(opts.seed)  # same initial weights on every rank
        self.model, self.optimizer, self.engine = self._build_engine()
        self.batches = data.train_batches(model_cfg.seq_length, cfg.micro_batch_size, seed=opts.seed,
                                          rank=dp_rank, world_size=dp_world)
        self.elapsed_before = 0.0
        self.last_val: float | None = None
        self.resolved = {
            "run": _jsonable(cfg.to_dict()),
            "model": {"preset": opts.model, **asdict(model_cfg), "num_params": model_cfg.num_params()},
            "data": {"folder": str(Path(data.folder).resolve()), "tokenizer": data.meta.get("tokenizer"),
                     "vocab_size": data.vocab_size,
                     "train_tokens": data.meta["splits"]["train"]["tokens"],
                     "val_tokens": data.meta["splits"]["val"]["tokens"]},
            "options": _jsonable({k: v for k, v in asdict(opts).items() if k not in ("resume",)}),
            "world_size": cfg.world_size,
            "parallelism": "fsdp2" if fsdp else ("ddp" if self.info.enabled else "none"),
            "device": str(self.device),
            "versions": versions(),
        }

    # -- what subclasses (seqwarm.integrations.deepspeed_run) replace ----------------------------
    def _data_parallel(self) -> tuple[int, int]:
        """This rank's index among the data-parallel replicas, and their number."""
        return self.info.rank, self.info.world_size

    def _build_engine(self):
        """The unwrapped GPT, its optimizer and the engine the loop drives (CurriculumEngine here)."""
        from seqwarm.engine import CurriculumEngine
        from seqwarm.model import GPT

        model = GPT(self.model_cfg).to(self.device)  # the unwrapped model (sharded in place by FSDP2)
        wrapped = wrap_model(model, self.info, self.fsdp, self.device)
        optimizer = build_optimizer(model, self.cfg)  # after sharding: FSDP2 params are DTensors
        return model, optimizer, CurriculumEngine(wrapped, optimizer, self.cfg)

    def _train_step(self) -> float:
        """One optimizer step (gradient_accumulation_steps micro-batches); this rank's mean loss."""
        step_losses = []
        for _ in range(self.cfg.gradient_accumulation_steps):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in self.batches.next_batch().items()}
            loss = self.engine(batch)
            self.engine.backward(loss)
            step_losses.append(loss.detach())
            self.engine.step()
        return float(torch.stack(step_losses).mean())

    def _check_resume_config(self, path, saved: dict) -> None:
        """UserError when the checkpoint's recipe or model differs (unless --allow-config-change)."""
        old, new = saved["run"], self.resolved["run"]
        changed = [k for k in RESUME_KEYS if old.get(k) != new.get(k)]
        if saved["model"] != self.resolved["model"]:
            changed.append("model")
        if changed and not self.opts.allow_config_change:
            raise UserError(f"{path} was written with a different {', '.join(changed)}; resume with the same "
                            "settings, or pass --allow-config-change to continue anyway")

    # -- checkpoints ------------------------------------------------------------------------------
    def _full_state(self) -> tuple[dict, dict]:
        """Model and optimizer state as full (unsharded) tensors; a collective under FSDP2."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            return get_state_dict(self.model, self.optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict(), self.optimizer.state_dict()

    def save(self) -> Path | None:
        model_state, optim_state = self._full_state()  # every rank takes part (FSDP2 gathers)
        if not self.is_main:
            barrier(self.info)
            return None
        engine_state = self.engine.state_dict(include_optimizer=False)
        engine_state["optimizer"] = optim_state
        payload = {
            "model": model_state,
            "engine": engine_state,
            "data": self.batches.state_dict(),
            "rng": rng_state(),
            "config": self.resolved,
            "elapsed_s": self.elapsed_before + (time.perf_counter() - self.t_start),
            "last_val": self.last_val,
        }
        path = save_checkpoint(self.ckpt_dir, self.engine.global_steps, payload, keep=self.opts.keep_checkpoints)
        barrier(self.info)
        return path

    def resume(self) -> bool:
        found = latest_checkpoint(self.ckpt_dir)
        if found is None:
            return False
        path, state = found
        if state.get("deepspeed"):  # a model export of a --deepspeed run: its state is in checkpoints/deepspeed
            raise UserError(f"{self.run_dir} was trained with --deepspeed; resume it with --deepspeed")
        self._check_resume_config(path, state["config"])
        engine_state = dict(state["engine"])
        optim_state = engine_state.pop("optimizer")
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=optim_state, options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(optim_state)
        self.engine.load_state_dict(engine_state)
        self._restore_loop_state(path, state)
        return True

    def _restore_loop_state(self, path, state: dict) -> None:
        """What every resume restores after the engine: data position, RNG, wall clock, metrics rows."""
        self.batches.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        self.last_val = state.get("last_val")
        if self.is_main:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.engine.global_steps)
            logger.info("resumed from %s (step %d, %s tokens)", path, self.engine.global_steps,
                        f"{self.engine.progress.tokens:,}")

    # -- the loop ---------------------------------------------------------------------------------
    def _eval_row(self, writer) -> float:
        full = self.model_cfg.seq_length
        val = evaluate(self.engine, self.data, full, self.cfg.micro_batch_size, self.opts.eval_iters, self.device)
        self.last_val = val
        p = self.engine.progress
        row = {"kind": "eval", "step": p.step, "tokens": p.tokens, "samples": p.samples, "val_loss": val,
               "val_ppl": math.exp(min(val, 50.0)), "seqlen": full,
               "elapsed_s": self.elapsed_before + time.perf_counter() - self.t_start}
        if writer is not None:
            writer.write(row)
        return val

    def train(self) -> TrainResult:
        self.t_start = time.perf_counter()
        cfg, opts = self.cfg, self.opts
        writer = MetricsWriter(self.run_dir, tensorboard=opts.tensorboard) if self.is_main else None
        bar = self._progress_bar()
        window_tokens, window_time = 0, 0.0
        losses: list[torch.Tensor] = []
        reason = stop_reason(self.engine.progress, cfg)
        skips_in_a_row = 0
        self.engine.train()
        try:
            while reason is None:
                t0 = time.perf_counter()
                tokens_before = self.engine.progress.tokens
                step_before = self.engine.progress.step
                step_loss = self._train_step()
                if self.info.enabled:  # mean loss over ranks; every rank must be at the same length
                    per_rank = gather_floats([step_loss, float(self.engine.current_seqlen or 0)], self.info,
                                             self.device if self.info.backend == "nccl" else torch.device("cpu"))
                    lengths = {int(r[1]) for r in per_rank}
                    if len(lengths) != 1:
                        raise RuntimeError(f"ranks disagree on the curriculum length at step "
                                           f"{self.engine.global_steps}: {sorted(lengths)}")
                    step_loss = sum(r[0] for r in per_rank) / len(per_rank)
                p = self.engine.progress
                if not math.isfinite(step_loss):
                    raise TrainingDiverged(
                        f"the training loss became {step_loss} at step {p.step} (length "
                        f"{self.engine.current_seqlen}); the last good checkpoint in {self.ckpt_dir} is intact. "
                        "Lower the learning rate, raise min_difficulty, or lengthen the curriculum")
                if p.step == step_before:  # fp16 overflow: skipped, nothing advanced; no eval/log/save
                    skips_in_a_row += 1
                    if skips_in_a_row >= MAX_SKIPS_IN_A_ROW:
                        raise TrainingDiverged(
                            f"fp16 gradients overflowed {skips_in_a_row} steps in a row at step {p.step + 1} "
                            f"(loss scale now {getattr(self.engine, 'loss_scale', '?')}); the last good checkpoint "
                            f"in {self.ckpt_dir} is intact. Use bf16, or lower the learning rate")
                    continue
                skips_in_a_row = 0
                dt = time.perf_counter() - t0
                step_tokens = p.tokens - tokens_before
                window_tokens += step_tokens
                window_time += dt
                losses.append(step_loss)
                if bar is not None:
                    bar.update(self._bar_amount(step_tokens))
                reason = stop_reason(p, cfg)
                if opts.eval_interval and p.step % opts.eval_interval == 0 and reason is None:
                    self._eval_row(writer)
                if p.step % opts.log_interval == 0 or reason is not None or p.step == 1:
                    tps = window_tokens / max(window_time, 1e-9)
                    row = {"kind": "train", "step": p.step, "tokens": p.tokens, "samples": p.samples,
                           "seqlen": self.engine.current_seqlen, "lr": self.engine.lr,
                           "loss": sum(losses) / len(losses), "tokens_per_s": tps,
                           "grad_norm": self.engine.grad_norm,
                           "elapsed_s": self.elapsed_before + time.perf_counter() - self.t_start,
                           **self._adam_stats()}
                    if writer is not None:
                        writer.write(row)
                        self._console(row, tps, bar)
                    losses, window_tokens, window_time = [], 0, 0.0
                if opts.save_interval and p.step % opts.save_interval == 0 and reason is None:
                    self.save()
            final_val = self._eval_row(writer)
            self.save()
        finally:
            if bar is not None:
                bar.close()
            if writer is not None:
                writer.close()
        summary = self._summary(final_val, reason)
        return TrainResult(self.run_dir, self.engine.global_steps, self.engine.progress.tokens, final_val,
                           reason, summary)

    def _adam_stats(self) -> dict[str, float]:
        """l1 norm and max of Adam's second moment (the stability signal the paper's authors logged)."""
        vs = [s["exp_avg_sq"] for s in self.optimizer.state.values() if "exp_avg_sq" in s]
        if not vs:
            return {}
        l1 = float(sum(v.abs().sum() for v in vs))
        top = float(max(v.max() for v in vs))
        return {"adam_v_l1": l1, "adam_v_max": top}

    def _progress_bar(self):
        if not (self.is_main and self.opts.progress_bar):
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        total = self.cfg.train_tokens or None
        bar = tqdm(total=total, unit="tok", unit_scale=True, dynamic_ncols=True, disable=None, leave=False,
                   initial=self.engine.progress.tokens if total else 0, file=sys.stderr, desc="train")
        return bar

    def _bar_amount(self, step_tokens: int) -> int:
        if self.cfg.train_tokens:
            return min(step_tokens, max(0, self.cfg.train_tokens - (self.engine.progress.tokens - step_tokens)))
        return step_tokens

    def _console(self, row: dict[str, Any], tps: float, bar) -> None:
        eta = None
        if self.cfg.train_tokens and tps > 0:
            eta = max(0, self.cfg.train_tokens - row["tokens"]) / tps
        line = console_line(row, self.cfg.train_tokens, self.last_val, eta)
        if bar is not None and not bar.disable:
            bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def _summary(self, final_val: float, reason: str) -> dict[str, Any]:
        p = self.engine.progress
        wall = self.elapsed_before + time.perf_counter() - self.t_start
        summary = {
            "final_val_loss": final_val, "final_val_ppl": math.exp(min(final_val, 50.0)),
            "steps": p.step, "tokens": p.tokens, "samples": p.samples, "wall_time_s": wall,
            "tokens_per_s": p.tokens / wall if wall > 0 else None, "stop_reason": reason,
            "curriculum": self.resolved["run"]["curriculum"], "skipped_steps": self.engine.skipped_steps,
            "num_params": self.model_cfg.num_params(),
        }
        if self.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            try:
                from seqwarm.plots import plot_run
                plot_run(self.run_dir)
            except Exception as err:  # noqa: BLE001 - a plot must never fail a finished run
                logger.warning("could not draw curves.png: %s", err)
        return summary


def prepare_run_dir(opts: TrainOptions, info: DistInfo | None = None) -> None:
    """Check the run folder on every rank (same answer everywhere), then create it on rank 0."""
    info = info or DistInfo()
    run_dir = Path(opts.out)
    has_ckpt = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    if opts.resume:
        if not has_ckpt:
            raise UserError(f"--resume: {run_dir} has no checkpoint to resume from "
                            "(drop --resume to start a new run there)")
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
    barrier(info)  # every rank has looked before rank 0 writes anything
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier(info)


def write_resolved_config(run: Run) -> Path:
    path = run.run_dir / "config.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(run.resolved, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def format_start(run: Run) -> list[str]:
    from seqwarm.config.describe import describe

    m = run.resolved["model"]
    d = run.resolved["data"]
    lines = [f"run:         {run.run_dir}",
             f"model:       {m['preset']} GPT, {m['num_params'] / 1e6:.1f}M parameters, {m['n_layer']} layers, "
             f"d {m['n_embd']}, {m['n_head']} heads, length {m['seq_length']}, vocab {m['vocab_size']}",
             f"data:        {d['folder']} ({d['train_tokens']:,} train / {d['val_tokens']:,} val tokens, "
             f"{d['tokenizer'] if isinstance(d['tokenizer'], str) else json.dumps(d['tokenizer'])})",
             f"device:      {run.device}, {torch.get_num_threads()} threads, world size {run.info.world_size}"
             + (f" ({run.resolved['parallelism']})" if run.resolved["parallelism"] != "none" else "")]
    lines += describe(run.cfg)
    lines.append(f"resolved config: {run.run_dir / 'config.json'}")
    return lines


def finish_lines(result: TrainResult) -> list[str]:
    s = result.summary
    return [f"done: {result.stop_reason}",
            f"final full-length val loss {s['final_val_loss']:.4f} (ppl {s['final_val_ppl']:.1f}) after "
            f"{s['steps']:,} steps, {s['tokens']:,} tokens, {format_duration(s['wall_time_s'])} "
            f"({s['tokens_per_s'] or 0:,.0f} tok/s)",
            f"results: {result.run_dir}/summary.json, metrics.jsonl, curves.png"]
