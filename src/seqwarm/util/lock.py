"""An advisory ``flock`` on a lock file that names its holder: the one way run folders and prepared
data folders are kept to one writer. The kernel drops the lock of a killed process, so nothing needs
cleaning; a holder may remove the file on release, so a lock taken on a file that was just removed is
taken again on the new one."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["lock_holder", "take_lock"]


def lock_holder(path: Path) -> str:
    """The pid written in the lock file ``path`` (``unknown`` when it cannot be read)."""
    try:
        return path.read_text(encoding="ascii", errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


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
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the holder released and removed the file between our open and flock: again
