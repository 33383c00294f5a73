"""The run folder of ``seqwarm train``: created and locked by rank 0 for the whole run, checked on every rank.

:func:`prepare_run_dir` refuses a folder that holds a run unless ``--resume`` is given (a run killed
before its first checkpoint resumes from step 0), and an ``--out`` that is a file or in use by another
run; the :class:`RunFolder` it returns releases the lock when the run ends and removes the folder again
when this run created it and left nothing in it (bad input found late). ``--resume auto`` also starts a
run in a folder that holds none. A run whose checkpoints are gone (a deleted ``checkpoints/``, a link to
an unmounted disk) although the folder shows it wrote some (:func:`seqwarm.trainer.history.checkpoint_evidence`)
is never started again by ``--resume``: only ``--start-over`` does, after moving the old record into
``RUN/previous-N/``.

One run per folder: an advisory lock on ``RUN/.seqwarm.lock`` while a run (or a resume) uses it
(:class:`RunLock`, :func:`run_lock`; ``compare`` and ``tune`` take it too). The lock is
``flock(LOCK_EX | LOCK_NB)`` on a file inside the run folder that holds the holder's pid. The kernel drops
the lock when its process dies, however it dies (SIGKILL included), so a lock left by a killed run is
recovered by the next run without anyone deleting anything. A second run on a folder in use gets a
:class:`RunLocked` naming the holder's pid. The file is removed when the lock is released; because another
process may have opened it just before, a process that got the lock checks that the file it locked is
still the one at the path (else it locks again), so two holders can never coexist. Within one process the
lock is re-entrant (``compare`` / ``tune`` hold it around a run they start), and the file is removed when
the outermost holder releases it. Advisory only: it keeps seqwarm runs apart, not other programs; on file
systems without ``flock`` (some network mounts) taking it fails with an OSError, which seqwarm reports as
such.

The lock needs nothing heavy, so torch (and the modules that import it) is imported only when
:func:`prepare_run_dir` runs: ``compare``, ``tune`` and the CLI import this module without torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from seqwarm.trainer.history import checkpoint_evidence, move_aside
from seqwarm.util.errors import UserError
from seqwarm.util.lock import readers_path, release_shared, share_lock, take_lock

if TYPE_CHECKING:  # seqwarm.trainer.distributed imports torch: only when a run prepares its folder
    from seqwarm.trainer.distributed import DistInfo

__all__ = ["LOCK_FILE", "RunLocked", "RunLock", "run_lock", "RUN_MARKERS", "RunFolder", "prepare_run_dir"]

logger = logging.getLogger(__name__)

LOCK_FILE = ".seqwarm.lock"


class RunLocked(UserError):
    """Another live process holds the run folder's lock."""


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
        fd = take_lock(
            self.path,
            lambda pid: RunLocked(
                f"{self.folder} is in use by another seqwarm run (pid {pid}); "
                "wait for it to finish, stop it, or choose another --out"
            ),
        )
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


# -- the run folder ---------------------------------------------------------------------------------
RUN_MARKERS = ("config.json", "metrics.jsonl")
"""Files the start of every run writes: a folder with one of them and no checkpoint is a run killed
before its first checkpoint, which ``--resume`` starts again from step 0."""


@dataclass
class RunFolder:
    """The run folder, locked by rank 0 for the run; :meth:`close` releases it (and removes the folder
    when this run created it and left nothing in it, e.g. after bad input)."""

    path: Path
    """The run folder (``--out``)."""
    lock: RunLock | None
    """The lock rank 0 holds (None on the other ranks)."""
    created: bool
    """Whether this run created the folder (then :meth:`close` removes it when it stayed empty)."""
    holds_run: bool = False
    """Whether the folder held a run (a ``--resume auto`` on a folder without one starts a new run)."""
    moved_to: Path | None = None
    """Where ``--start-over`` moved the old record (rank 0)."""
    data_lock: tuple[Path, int] | None = None
    """The readers lock rank 0 holds on the data folder (:meth:`hold_data`)."""

    def hold_data(self, data_dir: Path) -> None:
        """Rank 0: hold ``data_dir``'s readers lock (shared) until :meth:`close`, so ``seqwarm prepare
        --force`` refuses to replace the data under this run (:mod:`seqwarm.data.outdir`). Where it cannot be
        written (read-only data), nothing can replace the data either: the run goes on without it."""
        if self.lock is None or self.data_lock is not None:
            return
        path = readers_path(data_dir)
        try:
            self.data_lock = path, share_lock(path, f"seqwarm train, run folder {self.path.absolute()}")
        except OSError as err:
            logger.debug("no readers lock on %s: %s", data_dir, err)

    def close(self) -> None:
        if self.data_lock is not None:
            release_shared(*self.data_lock)
            self.data_lock = None
        if self.lock is not None:
            self.lock.release()
        if self.created:
            try:
                self.path.rmdir()  # only when empty
            except OSError:
                pass


def _missing(ckpts: Path) -> str:
    """What is wrong with a run's ``checkpoints`` folder that holds no checkpoint."""
    if ckpts.is_symlink() and not ckpts.exists():
        return f"{ckpts} is a link to {os.readlink(ckpts)}, which does not exist (a disk not mounted?)"
    return f"{ckpts} holds no checkpoint" if ckpts.is_dir() else f"{ckpts} is missing"


def _folder_problem(run_dir: Path, resume: bool | str, stale_lock: bool, start_over: bool = False) -> str | None:
    """Why the run cannot use ``run_dir`` (None: it can); the same answer on every rank. ``stale_lock``:
    a lock file was there before this run took the lock (a run killed before it wrote config.json)."""
    from seqwarm.trainer.checkpoint import list_checkpoints

    ckpts = run_dir / "checkpoints"
    has_ckpt = bool(list_checkpoints(ckpts)) or (ckpts / "deepspeed" / "latest").is_file()
    entries = [p.name for p in run_dir.iterdir() if p.name != LOCK_FILE] if run_dir.is_dir() else []
    holds_run = has_ckpt or stale_lock or any(name in entries for name in RUN_MARKERS)
    if start_over:  # whatever the folder holds is moved aside first
        return None
    if resume == "auto" and not holds_run:
        if entries:
            return (
                f"--resume auto: {run_dir} holds files but no seqwarm run ({', '.join(sorted(entries)[:5])}); "
                "choose another --out"
            )
        return None
    if resume:
        if not holds_run:
            return (
                f"--resume: {run_dir} has no checkpoint to resume from and holds no run "
                "(drop --resume to start a new run there, or give --resume auto)"
            )
        evidence = [] if has_ckpt else checkpoint_evidence(run_dir)
        if evidence:
            return (
                f"--resume: {_missing(ckpts)}, but {run_dir} holds a run that wrote checkpoints: "
                f"{'; '.join(evidence)}. Put the checkpoints back (mount the disk, restore the folder) and "
                "resume again, or give --start-over instead of --resume to train it again from step 0 "
                f"(what {run_dir} holds is moved into {run_dir}/previous-N/, nothing is deleted)"
            )
    elif entries:
        return (
            f"{run_dir} already holds a run; pass --resume to continue it, --start-over to train it again "
            "from step 0 (its old record moved into RUN/previous-N/), or choose another --out"
        )
    return None


def prepare_run_dir(opts, info: DistInfo | None = None) -> RunFolder:
    """Create and lock the run folder ``opts.out`` on rank 0, then check it on every rank (same answer
    everywhere); ``opts.resume``: continue the run there (``"auto"``: or start one); ``opts.start_over``:
    move what the folder holds into ``RUN/previous-N/`` and start again.

    The caller closes the returned :class:`RunFolder` when the run ends, whatever way it ends."""
    import torch

    from seqwarm.trainer.distributed import DistInfo, barrier, gather_floats

    info = info or DistInfo()
    run_dir = Path(opts.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir} exists and is not a folder; choose a folder for the run")
    folder = RunFolder(run_dir, None, False)
    status, stale_lock = 0.0, (run_dir / LOCK_FILE).exists()
    start_over = getattr(opts, "start_over", False)
    if info.is_main:
        folder.created = not run_dir.exists()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            folder.lock = RunLock(run_dir)
            folder.lock.acquire()
            if start_over:  # the old record is kept whole, not truncated
                folder.moved_to = move_aside(run_dir, keep=(LOCK_FILE,))
        except BaseException as err:
            folder.lock = None
            folder.close()
            if not info.enabled:
                raise
            logger.error("%s", err)
            status = 1.0
    if info.enabled:  # one answer for every rank: no rank may go on alone into a collective
        device = torch.device("cuda", info.local_rank) if info.backend == "nccl" else torch.device("cpu")
        answers = gather_floats([status, float(stale_lock)], info, device)
        if any(r[0] for r in answers):
            folder.close()
            raise UserError(f"{run_dir}: rank 0 could not take the run folder (see its message)")
        stale_lock = bool(answers[0][1])  # rank 0 looked before it took the lock
    problem = _folder_problem(run_dir, opts.resume, stale_lock, start_over)
    folder.holds_run = not start_over and (
        stale_lock or any((run_dir / name).exists() for name in (*RUN_MARKERS, "checkpoints"))
    )
    barrier(info)  # every rank has looked before rank 0 writes anything
    if problem:
        folder.close()
        raise UserError(problem)
    return folder
