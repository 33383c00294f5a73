"""What a run records and says about itself: the versions it ran with, its resolved config
(``RUN/config.json``, written when the run starts and never rewritten by a resume), the session's line in
``RUN/history.jsonl`` (:func:`record_session`), the lines it prints at the start and the end, and its result.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqwarm.config.describe import describe
from seqwarm.data.meta import data_fingerprint
from seqwarm.trainer.history import append_event
from seqwarm.trainer.metrics import format_duration
from seqwarm.trainer.resume import config_changes, format_changes
from seqwarm.util.atomic import write_json
from seqwarm.util.fsnames import path_record
from seqwarm.util.version import __version__

__all__ = [
    "TrainResult",
    "data_record",
    "finish_lines",
    "format_start",
    "jsonable",
    "record_session",
    "run_summary",
    "versions",
    "write_resolved_config",
]


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    tokens: int
    final_val_loss: float | None
    stop_reason: str
    summary: dict[str, Any]


def versions() -> dict[str, str]:
    out = {
        "seqwarm": __version__,
        "torch": str(torch.__version__),
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    try:  # the installed version, without importing deepspeed (its import prints and is slow)
        out["deepspeed"] = version("deepspeed")
    except PackageNotFoundError:
        pass
    return out


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values (tuples become lists, paths :func:`~seqwarm.util.fsnames.path_record`'s
    text, the same bytes in any locale, anything else unknown a string)."""

    def plain(o: Any) -> Any:
        return list(o) if isinstance(o, tuple) else path_record(o) if isinstance(o, os.PathLike) else str(o)

    return json.loads(json.dumps(obj, default=plain))


def data_record(data: Any) -> dict[str, Any]:
    """What config.json records of a run's data (a prepared folder or a Megatron blend): where it is, its
    tokenizer, vocabulary, fingerprint and split sizes (and a blend's sources)."""
    meta = data.meta
    megatron = meta.get("format") == "megatron"
    return {
        "folder": path_record(Path(data.folder).resolve()),
        "tokenizer": meta.get("tokenizer"),
        "vocab_size": data.vocab_size,
        "fingerprint": data_fingerprint(meta),
        "train_tokens": meta["splits"]["train"]["tokens"],
        "val_tokens": meta["splits"]["val"]["tokens"],
        **({"megatron": {k: meta[k] for k in ("sources", "split", "split_rounding", "eod_id")}} if megatron else {}),
    }


def write_resolved_config(run: Any) -> Path:
    """``RUN/config.json`` of a :class:`seqwarm.trainer.loop.Run`: everything the run was resolved to
    (written atomically)."""
    return write_json(run.run_dir / "config.json", run.resolved)


def record_session(run: Any, saved: dict[str, Any] | None, moved_to: Path | None = None) -> list[str]:
    """Add this session to the record of ``run`` (a :class:`seqwarm.trainer.loop.Run`; rank 0 calls it) and
    return the lines to print. A new run (``saved`` None) writes config.json and a ``start`` line
    (``moved_to``: where ``--start-over`` moved the old record); a resumed one leaves config.json as it
    is and appends a ``resume`` line: the step, the checkpoint and every setting that differs from
    ``saved``, the config that checkpoint was written with."""
    if saved is None:
        write_resolved_config(run)
        append_event(run.run_dir, "start", step=0, **({"moved_aside": moved_to.name} if moved_to else {}))
        return [f"start over: the old record is in {moved_to}"] if moved_to else []
    step = run.engine.global_steps
    changed = config_changes(saved, run.resolved)
    append_event(run.run_dir, "resume", step=step, checkpoint=str(run.last_saved), changed=changed)
    if not changed:
        return []
    return [f"changed since the checkpoint of step {step:,} (in history.jsonl): {format_changes(changed)}"]


def _tokenizer_name(tokenizer: Any) -> str:
    """A data folder's tokenizer as the start line names it: its name (``bpe:8192``), not its record."""
    if isinstance(tokenizer, dict):
        return str(tokenizer.get("name") or json.dumps(tokenizer))
    return str(tokenizer)


def format_start(run: Any) -> list[str]:
    """The lines a run prints before its first step (a :class:`seqwarm.trainer.loop.Run`)."""
    m = run.resolved["model"]
    d = run.resolved["data"]
    lines = [
        f"run:         {run.run_dir}",
        f"model:       {m['preset']} {m.get('architecture', 'GPT')}, {m['num_params'] / 1e6:.1f}M parameters, "
        f"{m['n_layer']} layers, "
        f"d {m['n_embd']}, {m['n_head']} heads, length {m['seq_length']}, vocab {m['vocab_size']}",
        f"data:        {d['folder']} ({d['train_tokens']:,} train / {d['val_tokens']:,} val tokens, "
        f"tokenizer {_tokenizer_name(d['tokenizer'])})",
        f"device:      {run.device}, {torch.get_num_threads()} threads, world size {run.info.world_size}"
        + (f" ({run.resolved['parallelism']})" if run.resolved["parallelism"] != "none" else ""),
    ]
    p = run.precision_info  # the precision line says where the precision came from
    lines += [
        f"{line} ({p['source']}{', TF32 matmuls' if p['tf32_matmul'] else ''})"
        if line.startswith("precision:")
        else line
        for line in describe(run.choices.recorded(run.cfg))  # the precision and mode it trains in
    ]
    mfu = run.resolved.get("mfu")
    if mfu:  # what the MFU of the console and metrics.jsonl is measured against
        lines.append(f"mfu:         of {mfu['peak_tflops']:g} TFLOP/s per device ({mfu['source']})")
    lines.append(f"resolved config: {run.run_dir / 'config.json'}")
    return lines


def finish_lines(result: TrainResult) -> list[str]:
    """The lines a run prints when it is done."""
    s = result.summary
    steps = f"{s['steps']:,} step{'' if s['steps'] == 1 else 's'}"
    return [
        f"done: {result.stop_reason}",
        f"final full-length val loss {s['final_val_loss']:.4f} (ppl {s['final_val_ppl']:.1f}) after "
        f"{steps}, {s['tokens']:,} tokens, {format_duration(s['wall_time_s'])} "
        f"({s['tokens_per_s'] or 0:,.0f} tok/s)",
        f"results: {result.run_dir}/summary.json, metrics.jsonl, curves.png",
    ]


def run_summary(run: Any, final_val: float, reason: str) -> dict[str, Any]:
    """``RUN/summary.json`` of a finished :class:`seqwarm.trainer.loop.Run`: its final full-length validation,
    clock, wall time, speed, stop reason, curriculum, skipped steps and size."""
    p = run.engine.progress
    wall = run.elapsed()
    return {
        "final_val_loss": final_val,
        "final_val_ppl": math.exp(min(final_val, 50.0)),
        "steps": p.step,
        "tokens": p.tokens,
        "samples": p.samples,
        "wall_time_s": wall,
        "tokens_per_s": p.tokens / wall if wall > 0 else None,
        "stop_reason": reason,
        "curriculum": run.resolved["run"]["curriculum"],
        "skipped_steps": run.engine.skipped_steps,
        "num_params": run.model_cfg.num_params(),
    }
