"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half.

Every file seqwarm writes for others to read — configs, summaries, reports, metadata, checkpoints,
figures — goes through here: the content is written to a temporary file in the same folder (same file
system, so the rename is atomic), flushed to disk, then renamed over the target. A failure removes the
temporary file and leaves the previous target untouched; a failure of the file system (disk full,
read-only, permission denied, file too large) is a :class:`WriteError` naming the path and the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqwarm.util.errors import UserError

__all__ = ["atomic_path", "write_text", "write_json", "TMP_MARK", "WriteError", "os_error_in", "write_error"]

TMP_MARK = ".tmp-"
"""Part of every temporary file's name (``.NAME.tmp-PID-XXXXXXXX``), so leftovers can be recognised."""


class WriteError(UserError):
    """A file could not be written because of the file system; the message names the path and why."""


def os_error_in(err: BaseException) -> OSError | None:
    """The OSError behind ``err`` (itself, or what it was raised from or during), else None. Writers such
    as ``torch.save`` report a failed write as a RuntimeError raised while handling the OSError."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def write_error(path: str | os.PathLike, err: BaseException, what: str = "") -> WriteError:
    """The WriteError of a failed write of ``path`` (``err`` holds an OSError)."""
    cause = os_error_in(err) or err
    reason = getattr(cause, "strerror", None) or str(cause)
    final = Path(path)
    kept = f"the previous {final.name} is untouched" if final.exists() else f"{final.name} was not written"
    return WriteError(
        f"cannot write {what or final} ({reason}); {kept}. Free some space, or make {final.parent} writable"
    )


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
    tmp = final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        if durable:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, final)
        if durable:
            _fsync_dir(final.parent)
    except Exception as err:
        if os_error_in(err) is None:
            raise
        raise write_error(final, err) from err
    finally:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
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
