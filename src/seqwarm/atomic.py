"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half.

Every file seqwarm writes for others to read — configs, summaries, reports, metadata, checkpoints,
figures — goes through here: the content is written to a temporary file in the same folder (same file
system, so the rename is atomic), flushed to disk, then renamed over the target. A failure removes the
temporary file and leaves the previous target untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_text", "write_json", "TMP_MARK"]

TMP_MARK = ".tmp-"
"""Part of every temporary file's name (``.NAME.tmp-PID-XXXXXXXX``), so leftovers can be recognised."""


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened or synced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without error it replaces ``path``.

    For writers that take a path or open it themselves (``torch.save``, ``savefig``)::

        with atomic_path(run_dir / "curves.png") as tmp:
            fig.savefig(tmp, format="png")

    ``durable``: fsync the file and its folder, so the new content survives a power cut too.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, final)
        if durable:
            _fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text(path: str | os.PathLike, text: str, *, durable: bool = True) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _default(obj: Any) -> Any:
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    return str(obj)  # Paths, dtypes, ...


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, durable: bool = True) -> Path:
    """Write ``obj`` as JSON (with a final newline) to ``path`` atomically; non-JSON values become strings."""
    return write_text(path, json.dumps(obj, indent=indent, default=_default) + "\n", durable=durable)
