"""What a training run reports: ``metrics.jsonl`` rows, the console line, the progress bar, summary.json, curves.

:class:`MetricsLogger` is the loop's one reporting component. On rank 0 it appends train and eval rows to
``RUN/metrics.jsonl`` through a :class:`MetricsWriter` (which mirrors them to the trackers of
:mod:`seqwarm.trainer.trackers`: TensorBoard, W&B, CSV), prints one :func:`console_line` per log interval
(through the progress bar when one is shown) and at the end writes ``RUN/summary.json`` atomically — the
marker of a finished run — and has ``RUN/curves.png`` drawn (by the function the loop hands it,
:func:`seqwarm.trainer.plots.plot_run`, which reads the rows back with :func:`read_metrics`). On the other
ranks every method does nothing. :func:`adam_stats` gives the Adam second-moment statistics of a train row;
:func:`format_results` the console lines of an evaluation result.

Rows in ``metrics.jsonl`` carry ``kind`` = ``train`` (step, tokens, samples, seqlen, lr, loss at the current
length, tokens_per_s, model_tflops and mfu when the device's peak is known, grad_norm, elapsed_s, ...) or
``eval`` (step, tokens, val_loss, val_ppl at full length; with stages also val_loss_pretrain at
pretrain_seqlen). :func:`read_metrics` ignores a torn last line and skips, with a warning naming it, a line
that is not a row; :func:`truncate_metrics` drops the rows a resume writes again (and refuses a file with such
a line), and a resumed logger writes each (kind, step) row once. Tracker tags are namespaced
(``train/loss``, ``curriculum/seqlen``, ``progress/tokens``) and repeated under Megatron-DeepSpeed's names
(:data:`seqwarm.trainer.trackers.MEGATRON_TAGS`).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from seqwarm.trainer.eta import EtaEstimator
from seqwarm.trainer.trackers import TrackerConfig, open_trackers, optimizer_states, tracker_config  # noqa: F401
from seqwarm.util.atomic import write_error, write_json, write_text
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

__all__ = [
    "metrics_rows",
    "read_metrics",
    "truncate_metrics",
    "MetricsWriter",
    "format_duration",
    "console_line",
    "format_results",
    "MetricsLogger",
    "adam_stats",
    "optimizer_states",
    "step_point",
    "POINT_KEYS",
]

logger = logging.getLogger(__name__)


def _row_problem(row: Any) -> str | None:
    """Why a parsed line of metrics.jsonl is not a row (None: it is one)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if not isinstance(row.get("kind"), str):
        return f"its kind is {row.get('kind')!r}, not a string"
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return f"its step is {step!r}, not a whole number"
    return None


def metrics_rows(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics.jsonl and a description (``FILE line N: why``) of each line that is not a row.
    A torn last line (a run killed while writing it) is left out without a word."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return [], []
    rows, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue
            problems.append(f"{path} line {number}: not JSON")
            continue
        why = _row_problem(row)
        if why:
            problems.append(f"{path} line {number}: {why}")
        else:
            rows.append(row)
    return rows, problems


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a torn last line from a killed run is ignored; a line that is not a
    row is skipped with a warning naming it)."""
    rows, problems = metrics_rows(path)
    for problem in problems:
        logger.warning("skipped %s", problem)
    return rows


def truncate_metrics(path: Path, step: int) -> None:
    """Keep the rows up to ``step`` (on resume, rows after the checkpoint will be written again).
    UserError naming the line when a line other than a torn last one is not a row: the resume would
    drop it, so the user decides."""
    rows, problems = metrics_rows(path)
    if problems:
        raise UserError(
            f"{problems[0]}{f' (and {len(problems) - 1} more lines)' if len(problems) > 1 else ''}: a resume "
            "rewrites metrics.jsonl and would drop it; fix or delete that line (each line is one JSON object "
            'with a "kind" and a whole-number "step"), then resume again'
        )
    write_text(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))


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

    def write(self, row: Mapping[str, Any], tracked: Mapping[str, Any] | None = None) -> None:
        """Append ``row`` to metrics.jsonl and give the trackers ``tracked`` (default: the row)."""
        try:
            self._fh.write(json.dumps(row) + "\n")
        except OSError as err:  # a torn last row is dropped by read_metrics and by the resume's truncation
            raise write_error(self.path, err, "a row of metrics.jsonl") from err
        self.point(row if tracked is None else tracked)

    def point(self, row: Mapping[str, Any]) -> None:
        """Give the trackers ``row`` only (a per-step point: not a row of metrics.jsonl)."""
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


def console_line(row: Mapping[str, Any], budget_tokens: int | None, val_loss: float | None, eta_s: float | None) -> str:
    """``step 420 | seqlen 256 | tokens 12.3M/2.0B | loss 3.91 | val 4.02 | lr 3.0e-4 | 85k tok/s | eta 41m``
    (``| mfu 41.2%`` before the eta when the row has one)."""
    budget = f"/{human_count(budget_tokens)}" if budget_tokens else ""
    val = f"{val_loss:.3f}" if val_loss is not None else "-"
    return (
        f"step {row['step']} | seqlen {row['seqlen']} | tokens {human_count(row['tokens'])}{budget} | "
        f"loss {row['loss']:.3f} | val {val} | lr {row['lr']:.2e} | "
        f"{human_count(round(row['tokens_per_s']))} tok/s | "
        + (f"mfu {100 * row['mfu']:.1f}% | " if "mfu" in row else "")
        + f"eta {format_duration(eta_s)}"
    )


def format_results(result: dict) -> list[str]:
    """The console lines of a :func:`~seqwarm.evaluation.run_paper_evals` result, one per section
    (``seqwarm eval``, and ``seqwarm train --eval-wikitext/--eval-lambada``)."""
    tokens = f", {result['tokens']:,} tokens" if result.get("tokens") is not None else ""
    lines = [f"checkpoint: {result['checkpoint']} (step {result['step']:,}{tokens})"]
    if "wikitext" in result:
        w = result["wikitext"]
        lines.append(
            f"wikitext:   ppl {w['ppl']:.3f} | adjusted ppl {w['adjusted_ppl']:.3f} | loss {w['loss']:.4f} | "
            f"{w['num_tokenized_tokens']:,} tokens, {w['num_original_words']:,} original words | "
            f"{w['num_windows']:,} windows of {w['seq_length']}, stride {w['overlapping_eval']}"
        )
    if "lambada" in result:
        lam = result["lambada"]
        lines.append(
            f"lambada:    accuracy {100 * lam['accuracy']:.2f}% ({lam['num_correct']:,}/{lam['num_examples']:,}, "
            f"{'strict' if lam['strict'] else 'non-strict'}) | target loss {lam['loss']:.4f}"
        )
    if "val" in result:
        v = result["val"]
        lines.append(
            f"val:        loss {v['loss']:.4f} | ppl {v['ppl']:.3f} | {v['num_windows']:,} windows of "
            f"{v['seq_length']} ({v['num_tokens']:,} tokens)"
            + (", document masking" if v.get("document_masking") else "")
        )
    return lines


# -- the loop's logger -----------------------------------------------------------------------------
def adam_stats(optimizer) -> dict[str, float]:
    """l1 norm and max of Adam's second moment (the stability signal the paper's authors logged)."""
    import torch

    vs = [s["exp_avg_sq"] for s in optimizer.state.values() if "exp_avg_sq" in s]
    if not vs:
        return {}
    plain = all(type(v) is torch.Tensor and v.device == vs[0].device for v in vs)
    if plain and hasattr(torch, "_foreach_max"):  # foreach kernels, one host transfer (not one per tensor)
        l1, top = torch.stack(
            [torch.stack(torch._foreach_norm(vs, 1)).sum(), torch.stack(torch._foreach_max(vs)).max()]
        ).tolist()
    else:  # FSDP2 DTensors, mixed devices or torch < 2.6
        l1 = float(sum(v.abs().sum() for v in vs))
        top = float(max(v.max() for v in vs))
    return {"adam_v_l1": l1, "adam_v_max": top}


def step_point(
    interval: int, engine, progress, cfg, seconds: float, states: Callable[[], dict[str, float]] | None
) -> dict[str, Any] | None:
    """Step ``progress.step``'s point for the trackers when one is due (every ``interval`` steps), but its
    loss, which the loop reads with the others at the next log row (no host read at every step);
    ``states`` (on every rank: sharded optimizer states reduce together) adds the optimizer's."""
    if not interval or progress.step % interval:
        return None
    point = {
        "step": progress.step,
        "samples": progress.samples,
        "tokens": progress.tokens,
        "seqlen": engine.current_seqlen,
        "lr": engine.lr,
        "batch_size": cfg.train_batch_size,
        "loss_scale": float(getattr(engine, "loss_scale", 1.0)),
        "iteration_time": seconds,
    }
    return {**point, **states()} if states is not None else point


POINT_KEYS = ("tokens", "samples", "seqlen", "lr", "loss", "batch_size", "loss_scale", "iteration_time")
"""What a per-step point (a row of kind ``step``) carries besides its step; the ``--log-interval`` row then
gives the trackers only what the points do not (grad norm, tokens/s, Adam statistics)."""


class MetricsLogger:
    """Rows, console and progress bar of one run (rank 0 only). ``curves(run_dir)`` draws
    ``RUN/curves.png`` at the end (the loop passes :func:`seqwarm.trainer.plots.plot_run`, which reads
    this module's rows, so this module cannot import it; None: no figure)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        budget_tokens: int | None,
        is_main: bool,
        log_interval: int,
        progress_bar: bool = True,
        tensorboard: bool = True,
        trackers: TrackerConfig | None = None,
        curves: Callable[[Path], Any] | None = None,
        point_interval: int = 0,
        peak_tflops: float | None = None,
    ):
        self.point_interval = max(0, point_interval)
        """Trackers get a point every this many steps (Megatron's --tensorboard-log-interval; 0: none, the
        --log-interval rows alone, averaged over their window)."""
        self.run_dir, self.budget_tokens, self.is_main = Path(run_dir), budget_tokens, is_main
        self.peak_tflops = peak_tflops
        """The device's peak TFLOP/s (:mod:`seqwarm.trainer.flops`): train rows then carry model_tflops and mfu."""
        self.log_interval, self.progress_bar, self.tensorboard = max(1, log_interval), progress_bar, tensorboard
        self.trackers, self.curves = trackers, curves
        self._closing: MetricsWriter | None = None
        self.writer: MetricsWriter | None = None
        self.bar = None
        self._window_tokens, self._window_time, self._window_flops, self._losses = 0, 0.0, 0.0, []
        self._written: set[tuple[str, int]] = set()
        self.eta: EtaEstimator | None = None

    def expect(self, total_steps: int, total_tokens: int) -> None:
        """The run's plan: the console's ``eta`` is then the measured cost per step and per token summed
        over the steps and tokens the plan has left (:class:`~seqwarm.trainer.eta.EtaEstimator`)."""
        self.eta = EtaEstimator(total_steps, total_tokens)

    def trial(self, tokens: int, seconds: float) -> None:
        """A timed trial forward + backward at the full length (``tokens`` summed over ranks), before step 1."""
        if self.eta is not None:
            self.eta.trial(tokens, seconds)

    def open(self, tokens_so_far: int) -> None:
        if not self.is_main:
            return
        # a resumed run finds the rows it would write again (the final evaluation of a run stopped before
        # its summary) already there: each (kind, step) row is written once
        self._written = {(r["kind"], r["step"]) for r in metrics_rows(self.run_dir / "metrics.jsonl")[0]}
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
        return tqdm(
            total=total,
            unit="tok",
            unit_scale=True,
            dynamic_ncols=True,
            disable=None,
            leave=False,
            initial=tokens_so_far if total else 0,
            file=sys.stderr,
            desc="train",
        )

    # -- the loop's calls ---------------------------------------------------------------------------
    def step(self, tokens_after: int, step_tokens: int, loss: float, seconds: float, flops: float = 0.0) -> None:
        """One optimizer step done (``flops``: its model FLOPs per device): add it to the log window, move the bar."""
        self._window_tokens += step_tokens
        self._window_flops += flops
        self._window_time += seconds
        self._losses.append(loss)
        if self.eta is not None:
            self.eta.observe(step_tokens, seconds)
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
        row = {"kind": "train", **head, "loss": sum(self._losses) / len(self._losses), "tokens_per_s": tps}
        if self.peak_tflops:  # the model FLOPs of the spans trained, per device, over the window's time
            row["model_tflops"] = self._window_flops / max(self._window_time, 1e-9) / 1e12
            row["mfu"] = row["model_tflops"] / self.peak_tflops
        row.update(tail)
        if self.writer is not None:
            tracked = None
            if self.point_interval:  # the points carry the per-step numbers; the window adds the rest
                tracked = {k: v for k, v in row.items() if k not in POINT_KEYS or k in ("tokens", "samples")}
                tracked["kind"] = "window"
            self._write(row, tracked)
            self._console(row, tps, last_val)
        self._window_tokens, self._window_time, self._window_flops, self._losses = 0, 0.0, 0.0, []
        return row

    def eval_row(self, row: dict[str, Any]) -> None:
        if self.writer is not None:
            self._write(row)

    def _write(self, row: dict[str, Any], tracked: dict[str, Any] | None = None) -> None:
        key = (row["kind"], row["step"])
        if key not in self._written:
            self._written.add(key)
            self.writer.write(row, tracked)  # type: ignore[union-attr]

    def point_due(self, step: int) -> bool:
        """Whether step ``step`` gets a per-step point (rank 0 with trackers; every point_interval steps)."""
        return self.writer is not None and bool(self.point_interval) and step % self.point_interval == 0

    def point(self, row: dict[str, Any]) -> None:
        """A step's point for the trackers: ``step`` and :data:`POINT_KEYS` (kind ``step``), optimizer states."""
        if self.writer is not None and ("step", row["step"]) not in self._written:
            self._written.add(("step", row["step"]))
            self.writer.point({"kind": "step", **row})

    def _console(self, row: dict[str, Any], tps: float, last_val: float | None) -> None:
        eta = None
        if self.eta is not None:
            eta = self.eta.seconds_left(row["step"], row["tokens"])
        elif self.budget_tokens and tps > 0:  # no plan: the window's speed over the tokens left
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
        if self.curves is None:
            return
        try:
            self.curves(self.run_dir)
        except Exception as err:  # noqa: BLE001 - a plot must never fail a finished run
            logger.warning("could not draw curves.png: %s", err)
