"""Run metrics: one console line per log interval, ``metrics.jsonl``, the trackers (:mod:`seqwarm.trainer.trackers`).

Rows in ``metrics.jsonl`` carry ``kind`` = ``train`` (step, tokens, samples, seqlen, lr, loss at the
current length, tokens_per_s, grad_norm, elapsed_s, ...) or ``eval`` (step, tokens, val_loss, val_ppl at
full length). Tracker tags are namespaced (``train/loss``, ``curriculum/seqlen``, ``progress/tokens``) and
repeated under Megatron-DeepSpeed's names (:data:`seqwarm.trainer.trackers.MEGATRON_TAGS`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqwarm.trainer.trackers import TrackerConfig, open_trackers, tracker_config
from seqwarm.util.atomic import write_error, write_text
from seqwarm.util.units import human_count

logger = logging.getLogger(__name__)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a torn last line from a killed run is ignored)."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the rows up to ``step`` (on resume, rows after the checkpoint will be written again)."""
    rows = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


class MetricsWriter:
    """Appends rows to RUN/metrics.jsonl and mirrors their numbers to the run's trackers
    (:mod:`seqwarm.trainer.trackers`: TensorBoard when installed, W&B and CSV when asked for)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, trackers: TrackerConfig | None = None):
        self.path = run_dir / "metrics.jsonl"
        try:
            self._fh = open(self.path, "a", buffering=1)
        except OSError as err:
            raise write_error(self.path, err) from err
        self._trackers = open_trackers(trackers or tracker_config({}, run_dir, tensorboard=tensorboard))

    def write(self, row: Mapping[str, Any]) -> None:
        try:
            self._fh.write(json.dumps(row) + "\n")
        except OSError as err:  # a torn last row is dropped by read_metrics and by the resume's truncation
            raise write_error(self.path, err, "a row of metrics.jsonl") from err
        for tracker in self._trackers:
            tracker.log(row)

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Close the file and the trackers (W&B gets ``summary`` as its run summary)."""
        self.close_file()
        self.close_trackers(summary)

    def close_file(self) -> None:
        """Close metrics.jsonl and flush the trackers, which stay open for :meth:`close_trackers`."""
        if not self._fh.closed:
            self._fh.close()
        for tracker in self._trackers:
            tracker.flush()

    def close_trackers(self, summary: Mapping[str, Any] | None = None) -> None:
        for tracker in self._trackers:
            tracker.close(summary)
        self._trackers = []


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def console_line(row: Mapping[str, Any], budget_tokens: int | None, val_loss: float | None,
                 eta_s: float | None) -> str:
    """``step 420 | seqlen 256 | tokens 12.3M/2.0B | loss 3.91 | val 4.02 | lr 3.0e-4 | 85k tok/s | eta 41m``"""
    budget = f"/{human_count(budget_tokens)}" if budget_tokens else ""
    val = f"{val_loss:.3f}" if val_loss is not None else "-"
    return (f"step {row['step']} | seqlen {row['seqlen']} | tokens {human_count(row['tokens'])}{budget} | "
            f"loss {row['loss']:.3f} | val {val} | lr {row['lr']:.2e} | "
            f"{human_count(round(row['tokens_per_s']))} tok/s | eta {format_duration(eta_s)}")


def format_results(result: dict) -> list[str]:
    """The console lines of a :func:`~seqwarm.evaluation.run_paper_evals` result, one per section
    (``seqwarm eval``, and ``seqwarm train --eval-wikitext/--eval-lambada``)."""
    tokens = f", {result['tokens']:,} tokens" if result.get("tokens") is not None else ""
    lines = [f"checkpoint: {result['checkpoint']} (step {result['step']:,}{tokens})"]
    if "wikitext" in result:
        w = result["wikitext"]
        lines.append(f"wikitext:   ppl {w['ppl']:.3f} | adjusted ppl {w['adjusted_ppl']:.3f} | loss {w['loss']:.4f} | "
                     f"{w['num_tokenized_tokens']:,} tokens, {w['num_original_words']:,} original words | "
                     f"{w['num_windows']:,} windows of {w['seq_length']}, stride {w['overlapping_eval']}")
    if "lambada" in result:
        lam = result["lambada"]
        lines.append(f"lambada:    accuracy {100 * lam['accuracy']:.2f}% ({lam['num_correct']:,}/{lam['num_examples']:,}, "
                     f"{'strict' if lam['strict'] else 'non-strict'}) | target loss {lam['loss']:.4f}")
    if "val" in result:
        v = result["val"]
        lines.append(f"val:        loss {v['loss']:.4f} | ppl {v['ppl']:.3f} | {v['num_windows']:,} windows of "
                     f"{v['seq_length']} ({v['num_tokens']:,} tokens)")
    return lines
