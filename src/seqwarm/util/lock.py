"""An advisory ``flock`` on a lock file that names its holder: the one way run folders and prepared
data folders are kept to one writer. The kernel drops the lock of a killed process, so nothing needs
cleaning; a holder may remove the file on release, so a lock taken on a file that was just removed is
taken again on the new one.

Readers of a folder (training runs reading a prepared data folder) hold the same kind of file *shared*
(:func:`share_lock`): any number of them at once, each adding a line ``PID NOTE`` that names it; a writer
that takes it exclusively (:func:`take_lock`) gets it only when no live reader holds it, and a reader
waits while a writer holds it (the seconds of a swap). :func:`live_readers` names the readers holding it;
:func:`release_shared`: the last one out removes the file."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["live_readers", "lock_holder", "pid_alive", "readers_path", "release_shared", "share_lock", "take_lock"]


def lock_holder(path: Path) -> str:
    """The pid written in the lock file ``path`` (``unknown`` when it cannot be read)."""
    try:
        return path.read_text(encoding="ascii", errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def _same_file(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def take_lock(path: Path, busy: Callable[[str], Exception], *, wait: bool = False) -> int:
    """Lock ``path`` (created if needed) and write this process's pid into it; returns the open file
    descriptor, which holds the lock until closed. Held by another process: raise ``busy(holder's pid)``,
    or with ``wait`` block until it is free."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise busy(lock_holder(path)) from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(path, fd):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the holder released and removed the file between our open and flock: again


def readers_path(folder: str | os.PathLike) -> Path:
    """The lock file the readers of ``folder`` share: ``.NAME.readers`` beside it, named after the folder
    its path leads to (a link and its target share one)."""
    real = Path(folder).resolve()
    return real.parent / f".{real.name}.readers"


def share_lock(path: Path, note: str) -> int:
    """Hold ``path`` (created if needed) shared, as one of its readers, and add the line ``PID NOTE``
    naming this one; returns the open file descriptor, which holds it until :func:`release_shared`. Waits
    while a writer holds it exclusively."""
    line = f"{os.getpid()} {note}".replace("\n", " ") + "\n"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _same_file(path, fd):
                os.write(fd, line.encode("utf-8", "backslashreplace"))  # one short append: never interleaved
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the last holder removed the file between our open and flock: again


def release_shared(path: Path, fd: int) -> None:
    """Release a :func:`share_lock`; the last reader out removes the file (so nothing is left beside the
    folder)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # granted only when no other process holds it
    except BlockingIOError:
        pass
    else:
        if _same_file(path, fd):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (someone else's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def live_readers(path: Path) -> list[str]:
    """The ``PID NOTE`` lines of the readers named in ``path`` whose process is alive on this machine
    (lines of readers killed without releasing, whose lock the kernel dropped, are left out)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        pid = line.split(" ", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)) and line not in out:
            out.append(line)
    return out
