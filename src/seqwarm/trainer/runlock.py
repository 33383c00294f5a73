"""One run per folder: an advisory lock on ``RUN/.seqwarm.lock`` while a run (or a resume) uses it.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on a file inside the run folder that holds the holder's pid.
The kernel drops the lock when its process dies, however it dies (SIGKILL included), so a lock left by
a killed run is recovered by the next run without anyone deleting anything. A second run on a folder in
use gets a :class:`RunLocked` naming the holder's pid. The file is removed when the lock is released;
because another process may have opened it just before, a process that got the lock checks that the
file it locked is still the one at the path (else it locks again), so two holders can never coexist.

Within one process the lock is re-entrant (``compare`` / ``tune`` hold it around a run they start), and
the file is removed when the outermost holder releases it.

Advisory only: it keeps seqwarm runs apart, not other programs; on file systems without ``flock``
(some network mounts) taking it fails with an OSError, which seqwarm reports as such.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from seqwarm.util.errors import UserError

__all__ = ["LOCK_FILE", "RunLocked", "RunLock", "run_lock"]

LOCK_FILE = ".seqwarm.lock"


class RunLocked(UserError):
    """Another live process holds the run folder's lock."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "unknown"
    return text or "unknown"


_HELD: dict[str, tuple[int, int]] = {}
"""Locks this process holds: lock file path -> (file descriptor, number of holders)."""


class RunLock:
    """The lock on one run folder; :meth:`acquire` / :meth:`release` (or :func:`run_lock`)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise RunLocked naming the holder's pid (the folder must exist)."""
        key = str(self.path.resolve())
        if key in _HELD:  # this process holds it already
            fd, count = _HELD[key]
            _HELD[key] = (fd, count + 1)
            self._fd = fd
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLocked(f"{self.folder} is in use by another seqwarm run (pid {_holder(self.path)}); "
                                "wait for it to finish, stop it, or choose another --out") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released and removed the file between our open and flock: again
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD[key] = (fd, 1)

    def release(self) -> None:
        if self._fd is None:
            return
        key = str(self.path.resolve())
        fd, count = _HELD.pop(key, (self._fd, 1))
        if count > 1:
            _HELD[key] = (fd, count - 1)
            self._fd = None
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still held, so nobody locks a file that is going away unnoticed
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike) -> Iterator[RunLock]:
    """Hold the lock of ``folder`` for the block."""
    lock = RunLock(folder)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
