"""The run folder of ``seqwarm train``: created and locked by rank 0 for the whole run, checked on every rank.

:func:`prepare_run_dir` refuses a folder that holds a run unless ``--resume`` is given (a run killed
before its first checkpoint resumes from step 0), and an ``--out`` that is a file or in use by another
run (:mod:`seqwarm.trainer.runlock`); the :class:`RunFolder` it returns releases the lock when the run ends and
removes the folder again when this run created it and left nothing in it (bad input found late).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from seqwarm.trainer.checkpoint import list_checkpoints
from seqwarm.trainer.distributed import DistInfo, barrier, gather_floats
from seqwarm.trainer.runlock import LOCK_FILE, RunLock
from seqwarm.util.errors import UserError

__all__ = ["RUN_MARKERS", "RunFolder", "prepare_run_dir"]

logger = logging.getLogger(__name__)


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

    def close(self) -> None:
        if self.lock is not None:
            self.lock.release()
        if self.created:
            try:
                self.path.rmdir()  # only when empty
            except OSError:
                pass


def _folder_problem(run_dir: Path, resume: bool, stale_lock: bool) -> str | None:
    """Why the run cannot use ``run_dir`` (None: it can); the same answer on every rank. ``stale_lock``:
    a lock file was there before this run took the lock (a run killed before it wrote config.json)."""
    ckpts = run_dir / "checkpoints"
    has_ckpt = bool(list_checkpoints(ckpts)) or (ckpts / "deepspeed" / "latest").is_file()
    entries = [p.name for p in run_dir.iterdir() if p.name != LOCK_FILE] if run_dir.is_dir() else []
    if resume:
        if not has_ckpt and not stale_lock and not any(name in entries for name in RUN_MARKERS):
            return (f"--resume: {run_dir} has no checkpoint to resume from and holds no run "
                    "(drop --resume to start a new run there)")
    elif entries:
        return f"{run_dir} already holds a run; pass --resume to continue it or choose another --out"
    return None


def prepare_run_dir(opts, info: DistInfo | None = None) -> RunFolder:
    """Create and lock the run folder ``opts.out`` on rank 0, then check it on every rank (same answer
    everywhere); ``opts.resume``: continue the run there.

    The caller closes the returned :class:`RunFolder` when the run ends, whatever way it ends."""
    info = info or DistInfo()
    run_dir = Path(opts.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--out {run_dir} exists and is not a folder; choose a folder for the run")
    folder = RunFolder(run_dir, None, False)
    status, stale_lock = 0.0, (run_dir / LOCK_FILE).exists()
    if info.is_main:
        folder.created = not run_dir.exists()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            folder.lock = RunLock(run_dir)
            folder.lock.acquire()
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
    problem = _folder_problem(run_dir, opts.resume, stale_lock)
    barrier(info)  # every rank has looked before rank 0 writes anything
    if problem:
        folder.close()
        raise UserError(problem)
    return folder
