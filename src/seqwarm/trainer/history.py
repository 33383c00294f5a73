"""The run folder's append-only record of its sessions, ``RUN/history.jsonl``, and what a folder holds.

``config.json`` is what the run was started with: a resume never rewrites it. Everything that happens to
the run afterwards is one line appended to ``history.jsonl`` (rank 0 writes it; each line flushed and
synced):

- ``{"event": "start", "step": 0, ...}``: a new run in the folder;
- ``{"event": "checkpoint", "step": N}``: a checkpoint of step N was written;
- ``{"event": "resume", "step": N, "checkpoint": PATH, "changed": {"lr.lr": [OLD, NEW], ...}}``: the run
  continued from the checkpoint of step N, with every setting that differs from the one that checkpoint
  was written with (dotted keys of config.json's sections, old and new value);
- ``{"event": "start_over", "moved_to": "previous-1", ...}``: ``--start-over`` moved the old record aside.

:func:`checkpoint_evidence` says what proves that a folder's run wrote checkpoints (summary.json, a
``checkpoint`` line, metrics past the first save): ``--resume`` never restarts such a run from step 0
when its checkpoints are gone. :func:`move_aside` keeps an old record whole in ``RUN/previous-N/``.
Light: no torch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from seqwarm.trainer.metrics import metrics_rows
from seqwarm.util.atomic import write_error

__all__ = ["HISTORY_FILE", "PREVIOUS", "append_event", "read_history", "checkpoint_evidence", "move_aside"]

HISTORY_FILE = "history.jsonl"
PREVIOUS = "previous-"
"""Prefix of the folders ``--start-over`` moves an old record into (``RUN/previous-1``, ...)."""


def append_event(run_dir: str | os.PathLike, event: str, **fields: Any) -> None:
    """Append one line ``{"event": event, "time": ..., **fields}`` to ``RUN/history.jsonl`` (synced)."""
    path = Path(run_dir) / HISTORY_FILE
    row = {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise write_error(path, err, "a line of history.jsonl") from err


def read_history(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The events of ``RUN/history.jsonl`` (lines that are not events are left out)."""
    path = Path(run_dir) / HISTORY_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("event"), str):
            events.append(row)
    return events


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def checkpoint_evidence(run_dir: str | os.PathLike) -> list[str]:
    """What in ``run_dir`` shows that its run wrote checkpoints (empty: nothing does, e.g. a run killed
    before its first one): summary.json, a ``checkpoint`` event, or — in a folder written before
    history.jsonl — a metrics row past the first save its config.json records."""
    run_dir = Path(run_dir)
    found = []
    summary = _json(run_dir / "summary.json")
    if (run_dir / "summary.json").exists():
        steps = _int(summary.get("steps")) if isinstance(summary, dict) else None
        found.append("summary.json (a finished run" + (f", {steps:,} steps)" if steps is not None else ")"))
    saved = [s for e in read_history(run_dir) if e["event"] == "checkpoint" and (s := _int(e.get("step"))) is not None]
    if saved:
        found.append(f"history.jsonl (checkpoints written up to step {max(saved):,})")
    rows, _ = metrics_rows(run_dir / "metrics.jsonl")
    last = max((s for r in rows if (s := _int(r.get("step"))) is not None), default=0)
    if rows and last > 0:
        config = _json(run_dir / "config.json")
        options = config.get("options") if isinstance(config, dict) else None
        interval = _int(options.get("save_interval")) if isinstance(options, dict) else None
        legacy = not (run_dir / HISTORY_FILE).exists() and interval and last > interval
        if found or legacy:  # rows past a save: the checkpoint of that save was written before them
            found.append(f"metrics.jsonl ({len(rows):,} rows, to step {last:,})")
    return found


def move_aside(run_dir: str | os.PathLike, keep: tuple[str, ...] = ()) -> Path | None:
    """Move everything in ``run_dir`` but ``keep`` and earlier ``previous-N`` folders into a new
    ``RUN/previous-N/`` (links moved as links); its path, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    names = sorted(p.name for p in run_dir.iterdir() if p.name not in keep and not p.name.startswith(PREVIOUS))
    if not names:
        return None
    taken = [int(n) for p in run_dir.glob(PREVIOUS + "*") if (n := p.name[len(PREVIOUS) :]).isdigit()]
    target = run_dir / f"{PREVIOUS}{max(taken, default=0) + 1}"
    try:
        target.mkdir()
        for name in names:
            os.replace(run_dir / name, target / name)
    except OSError as err:
        raise write_error(target, err, "the old record of the run") from err
    return target
