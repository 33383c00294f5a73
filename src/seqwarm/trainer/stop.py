"""A graceful stop: what the loop does when a cluster (or a person) asks a run to end before its budget.

SIGTERM (what SLURM and Kubernetes send before they kill a job), SIGINT (Ctrl-C), SIGUSR1 (SLURM's
``--signal=USR1@SECONDS`` warning) and SIGHUP (a lost terminal) only *request* a stop: a
:class:`StopRequest` records it, and :class:`seqwarm.trainer.loop.Run` ends at the next step boundary,
after the optimizer step (and any evaluation or checkpoint save) that was under way, saves a checkpoint and
raises :class:`RunStopped` (exit code :data:`EXIT_STOPPED`). A wall-clock limit
(``--exit-duration-in-mins``, Megatron's flag) takes the same path. Under torchrun every rank learns of the
request at the same step: :meth:`StopRequest.agreed` is one tiny all-reduce per step, on a gloo group (a
CPU tensor: no wait for the GPU's queue).

A second signal stops at once: the handler raises :class:`StopNow` (a ``KeyboardInterrupt``) wherever the
main thread is; every file seqwarm writes is written to a temporary name and renamed, so nothing is left
half-written. The same signal again within :data:`REPEAT_WINDOW_S` counts as the first one, because a
launcher forwards the signal a terminal (or SLURM) already sent to its workers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from seqwarm.trainer.distributed import DistInfo, injected_fault
from seqwarm.util.errors import SeqwarmError

__all__ = ["EXIT_STOPPED", "REPEAT_WINDOW_S", "STOP_SIGNALS", "TIME_UP", "RunStopped", "StopNow", "StopRequest"]

EXIT_STOPPED = 75
"""The exit code of a run stopped early on request with its checkpoint written (sysexits' EX_TEMPFAIL:
"try again later"): run the same command with ``--resume`` to continue it."""

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP") if hasattr(signal, name)
)
"""The signals that ask a run to stop gracefully (those this platform has)."""

TIME_UP = 1000
"""The stop code of the wall-clock limit (above every signal's number)."""

REPEAT_WINDOW_S = 2.0
"""The same signal again within this many seconds is the first request, forwarded (torchrun passes the
Ctrl-C a terminal sent to the whole process group on to its workers a second time)."""


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class RunStopped(SeqwarmError):
    """The run stopped early on request (a signal, the wall-clock limit) after writing its checkpoint."""

    exit_code = EXIT_STOPPED

    def __init__(self, reason: str, progress: Any, checkpoint: Any = None):
        self.reason, self.step, self.tokens = reason, progress.step, progress.tokens
        self.checkpoint = checkpoint if progress.step else None  # nothing is saved before the first step
        self.resume_command: str | None = None
        """The command that continues the run (set by :func:`seqwarm.run.training.run_training`)."""
        self.quiet = False
        """True on every rank but rank 0, which alone says it."""
        super().__init__(reason)

    def __str__(self) -> str:
        kept = (
            f"checkpoint {self.checkpoint}"
            if self.checkpoint
            else "no checkpoint (nothing was trained yet: --resume starts the run from step 0)"
        )
        how = f": {self.resume_command}" if self.resume_command else " (the same command with --resume)"
        return (
            f"stopped early ({self.reason}) after step {self.step:,} ({self.tokens:,} tokens); {kept}. "
            f"Exit code {EXIT_STOPPED}; continue with{how}"
        )


class StopNow(KeyboardInterrupt):
    """A second stop signal: the run ends at once, without finishing its step. ``exit_code``: 128 + the
    signal's number, as a shell reports a process a signal ended; ``kept``: what the run folder holds."""

    def __init__(self, signum: int = signal.SIGINT, kept: str = ""):
        super().__init__(signum, kept)
        self.signum, self.kept, self.exit_code = signum, kept, 128 + int(signum)

    def __str__(self) -> str:
        said = f"interrupted by {signal_name(self.signum)} again: stopped at once, without a checkpoint of this step"
        return f"{said}; {self.kept}" if self.kept else said


class StopRequest:
    """Whether the run was asked to stop early, and why: a stop signal (once :meth:`install` put the
    handlers in place) or ``minutes`` of wall-clock since this object was made (None: no limit)."""

    def __init__(self, minutes: float | None = None, *, clock=time.monotonic):
        self.exit_duration_s = None if minutes is None else 60.0 * float(minutes)
        self.clock = clock
        self.started = clock()
        self.signum: int | None = None
        self.signalled_at = 0.0
        self._previous: dict[int, Any] = {}
        self._depth = 0
        self._group: Any = None

    # -- the signals --------------------------------------------------------------------------------
    def handle(self, signum: int, frame: Any = None) -> None:
        """The signal handler: the first signal asks for a stop; another one (not a repeat of the first
        within :data:`REPEAT_WINDOW_S`) raises :class:`StopNow`."""
        now = self.clock()
        if self.signum is None:
            self.signum, self.signalled_at = signum, now
            if os.environ.get("RANK", "0") == "0":  # os.write: print() may be in the middle of a write
                said = f"seqwarm: {signal_name(signum)}: finishing the step, then a checkpoint (again: stop at once)"
                with contextlib.suppress(OSError):
                    os.write(2, (said + "\n").encode())
        elif signum != self.signum or now - self.signalled_at > REPEAT_WINDOW_S:
            self._put_back()  # a third signal takes the handler found before (the default action)
            raise StopNow(signum)

    def install(self) -> None:
        """Put the handlers in place (nested calls are counted; only the main thread can take signals)."""
        self._depth += 1
        if self._depth > 1 or threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self.handle)

    def restore(self) -> None:
        """Undo the matching :meth:`install` (the outermost one puts back the handlers found)."""
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self._put_back()

    def _put_back(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    # -- the decision -------------------------------------------------------------------------------
    def code(self) -> int:
        """Why this process should stop, as a number: 0 no stop, a signal's number, or :data:`TIME_UP`."""
        if self.signum is not None:
            return int(self.signum)
        if self.exit_duration_s is not None and self.clock() - self.started >= self.exit_duration_s:
            return TIME_UP
        return 0

    def reason(self, code: int | None = None) -> str | None:
        """The words for :meth:`code` (None: no stop)."""
        code = self.code() if code is None else code
        if code == TIME_UP:
            return f"--exit-duration-in-mins {self.exit_duration_s / 60:g} reached"  # type: ignore[operator]
        return signal_name(code) if code else None

    def agreed(self, info: DistInfo, step: int | None = None) -> str | None:
        """Why every rank stops now, or None: the same answer on every rank (call it on all of them, at the
        same point of every step; ``step``: the steps taken, for the test hook
        :func:`~seqwarm.trainer.distributed.injected_fault`). A rank that was not signalled itself stops
        with the others."""
        if step is not None:
            injected_fault(info, step)
        code = self.code()
        if info.enabled and dist.is_initialized():  # the largest code of any rank
            if self._group is None:  # a CPU group beside nccl: the flag never waits for the GPU
                self._group = dist.new_group(backend="gloo") if info.backend == "nccl" else dist.group.WORLD
            flag = torch.tensor([code], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            code = int(flag.item())
        return self.reason(code)
