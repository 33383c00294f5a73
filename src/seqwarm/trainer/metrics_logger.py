"""What a training run reports: metrics rows, the console line, the progress bar, summary.json, curves.

:class:`MetricsLogger` is the loop's one reporting component. On rank 0 it appends train and eval rows
to ``RUN/metrics.jsonl`` (and the trackers: TensorBoard, W&B, CSV), prints one line per log interval (through the progress bar
when one is shown) and at the end writes ``RUN/summary.json`` atomically — the marker of a finished run
— and draws ``RUN/curves.png``. On the other ranks every method does nothing.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from seqwarm.trainer.metrics import MetricsWriter, console_line
from seqwarm.trainer.plots import plot_run
from seqwarm.trainer.trackers import TrackerConfig
from seqwarm.util.atomic import write_json

__all__ = ["MetricsLogger", "adam_stats"]

logger = logging.getLogger(__name__)


def adam_stats(optimizer) -> dict[str, float]:
    """l1 norm and max of Adam's second moment (the stability signal the paper's authors logged)."""
    import torch

    vs = [s["exp_avg_sq"] for s in optimizer.state.values() if "exp_avg_sq" in s]
    if not vs:
        return {}
    plain = all(type(v) is torch.Tensor and v.device == vs[0].device for v in vs)
    if plain and hasattr(torch, "_foreach_max"):  # foreach kernels, one host transfer (not one per tensor)
        l1, top = torch.stack([torch.stack(torch._foreach_norm(vs, 1)).sum(),
                               torch.stack(torch._foreach_max(vs)).max()]).tolist()
    else:  # FSDP2 DTensors, mixed devices or torch < 2.6
        l1 = float(sum(v.abs().sum() for v in vs))
        top = float(max(v.max() for v in vs))
    return {"adam_v_l1": l1, "adam_v_max": top}


class MetricsLogger:
    """Rows, console and progress bar of one run (rank 0 only)."""

    def __init__(self, run_dir: Path, *, budget_tokens: int | None, is_main: bool, log_interval: int,
                 progress_bar: bool = True, tensorboard: bool = True, trackers: TrackerConfig | None = None):
        self.run_dir, self.budget_tokens, self.is_main = Path(run_dir), budget_tokens, is_main
        self.log_interval, self.progress_bar, self.tensorboard = max(1, log_interval), progress_bar, tensorboard
        self.trackers = trackers
        self._closing: MetricsWriter | None = None
        self.writer: MetricsWriter | None = None
        self.bar = None
        self._window_tokens, self._window_time, self._losses = 0, 0.0, []

    def open(self, tokens_so_far: int) -> None:
        if not self.is_main:
            return
        self.writer = MetricsWriter(self.run_dir, tensorboard=self.tensorboard, trackers=self.trackers)
        self.bar = self._progress_bar(tokens_so_far)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:  # the trackers stay open until finish() gives them the summary
            self.writer.close_file()
            self._closing = self.writer
        self.bar = self.writer = None

    def _progress_bar(self, tokens_so_far: int):
        if not self.progress_bar:
            return None
        try:
            from tqdm import tqdm
        except ImportError:
            return None
        total = self.budget_tokens or None
        return tqdm(total=total, unit="tok", unit_scale=True, dynamic_ncols=True, disable=None, leave=False,
                    initial=tokens_so_far if total else 0, file=sys.stderr, desc="train")

    # -- the loop's calls ---------------------------------------------------------------------------
    def step(self, tokens_after: int, step_tokens: int, loss: float, seconds: float) -> None:
        """One optimizer step done: add it to the current log window and move the bar."""
        self._window_tokens += step_tokens
        self._window_time += seconds
        self._losses.append(loss)
        if self.bar is not None:
            amount = step_tokens
            if self.budget_tokens:  # the bar never runs past the budget
                amount = min(step_tokens, max(0, self.budget_tokens - (tokens_after - step_tokens)))
            self.bar.update(amount)

    def due(self, step: int, last: bool) -> bool:
        """Whether this step gets a train row (every log interval, the first and the last step)."""
        return step % self.log_interval == 0 or last or step == 1

    def train_row(self, head: dict[str, Any], tail: dict[str, Any], last_val: float | None) -> dict[str, Any]:
        """Write the train row closing the current window: ``head`` (step, tokens, samples, seqlen, lr),
        the window's mean loss and tokens/s, then ``tail`` (grad norm, elapsed time, Adam statistics)."""
        tps = self._window_tokens / max(self._window_time, 1e-9)
        row = {"kind": "train", **head, "loss": sum(self._losses) / len(self._losses), "tokens_per_s": tps, **tail}
        if self.writer is not None:
            self.writer.write(row)
            self._console(row, tps, last_val)
        self._window_tokens, self._window_time, self._losses = 0, 0.0, []
        return row

    def eval_row(self, row: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(row)

    def _console(self, row: dict[str, Any], tps: float, last_val: float | None) -> None:
        eta = None
        if self.budget_tokens and tps > 0:
            eta = max(0, self.budget_tokens - row["tokens"]) / tps
        line = console_line(row, self.budget_tokens, last_val, eta)
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def finish(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (atomically: compare and tune read it as "this run finished") and curves."""
        if not self.is_main:
            return
        write_json(self.run_dir / "summary.json", summary)
        if self._closing is not None:  # W&B's run summary
            self._closing.close_trackers(summary)
            self._closing = None
        try:
            plot_run(self.run_dir)
        except Exception as err:  # noqa: BLE001 - a plot must never fail a finished run
            logger.warning("could not draw curves.png: %s", err)
