"""The training windows of a run with stages: read at each stage's length (issue #36).

Before the first stage the windows are the run's (``--seq-length``, ``micro_batch_size`` rows, cut to the
warmup's length). From a stage on, :class:`StageBatches` reads a new source of windows of the stage's
length, with the stage's rows per micro-batch
(:func:`~seqwarm.curriculum.plan_stages.stage_micro_rows`: the micro-batch's tokens kept, unless the stage
gives its own ``micro_batch_size``), so a stage may be longer than ``--seq-length``. A stage with the same
length as the windows in use goes on with them (in its rows). A new length starts a pass of its own over the
training split (the same seed, the order of windows of its length).

Its position — the length and rows of the source in use, and that source's own position — is what a
checkpoint saves (:meth:`StageBatches.state_dict`), so a run killed inside a stage resumes the stage's
windows where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["StageBatches"]


class StageBatches:
    """A batch source (``next_batch``, ``state_dict``, ``load_state_dict``) whose windows change length at
    a stage: ``make(length, rows)`` builds the source of windows of ``length`` tokens, ``rows`` per
    micro-batch (``data.train_batches`` with the run's seed, rank and labels); ``length`` and ``rows`` are
    the run's, before the first stage."""

    def __init__(self, make: Callable[[int, int], Any], length: int, rows: int):
        self.make = make
        self.base = (int(length), int(rows))
        self.shape = self.base
        """``(length, rows)`` of the source in use."""
        self.source = make(*self.base)

    @property
    def windows(self) -> Any:
        """The windows of the source in use."""
        return self.source.windows

    def switch(self, length: int, rows: int) -> bool:
        """Read windows of ``length`` tokens, ``rows`` per micro-batch, from the start of a new pass (False:
        the source in use already reads them, and goes on). Windows of the length in use in other rows (a
        stage's own ``micro_batch_size``, a resume with another micro-batch) go on with the pass in use."""
        shape = (int(length), int(rows))
        if shape == self.shape:
            return False
        source = self.make(*shape)
        if shape[0] == self.shape[0]:  # the position counts windows, not micro-batches: it carries over
            source.load_state_dict(self.source.state_dict())
        self.source, self.shape = source, shape
        return True

    def next_batch(self) -> dict[str, Any]:
        return self.source.next_batch()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        length, rows = self.shape
        return {"length": length, "rows": rows, "source": self.source.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position; a position without ``source`` (a checkpoint written
        when the windows were always the run's) is the run's windows'."""
        if "source" not in state:
            self.switch(*self.base)
            self.source.load_state_dict(dict(state))
            return
        self.switch(int(state["length"]), int(state["rows"]))
        self.source.load_state_dict(state["source"])
