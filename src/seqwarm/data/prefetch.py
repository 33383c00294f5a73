"""Training micro-batches on the device: cut to what the step needs, one batch ahead on CUDA.

:class:`DeviceFeed` sits between a batch source (:class:`~seqwarm.data.dataset.TrainBatches`, a
Megatron blend: anything with ``next_batch``, ``state_dict``, ``load_state_dict``) and the loop:

- a *plan* (``plan(index, ahead) -> (columns, droppable)``, the loop's, from
  :meth:`seqwarm.core.CurriculumCore.feed_plan`) says how many leading columns of micro-batch
  ``index`` the step will use and which keys may be left out when trivial — a ``loss_mask`` of ones,
  ``position_ids`` that are ``arange`` per row (the model's defaults, bit for bit). Only that part is
  pinned and copied: at length 64 of 1024, a sixteenth of the bytes, and no mask or positions at all;
- on CUDA a background thread reads the next micro-batch, cuts it, copies it into pinned memory and
  sends it with ``non_blocking=True`` on a side stream while the current one trains; the consumer's
  stream waits for that copy (an event), never the host. The plan of micro-batch ``index`` is then made
  on the caller's thread when micro-batch ``index - 1`` is handed out (``ahead=True``);
- on the CPU (or with ``threaded=False``) there is no thread and no copy: the batch is cut (views) and
  handed out when asked for (``ahead=False``).

The order of batches is the source's. :meth:`DeviceFeed.state_dict` is the source's position before
the first batch not yet handed out (a batch fetched ahead is not lost in a checkpoint), and
:meth:`DeviceFeed.close` (after a run, or when it raised) stops the thread and rewinds the source to
that position. An exception in the thread is raised by the :meth:`DeviceFeed.next_batch` that wanted
its batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from seqwarm.batch import truncate_batch

__all__ = ["DeviceFeed", "Plan", "is_trivial", "lean_batch"]

Plan = Callable[[int, bool], tuple[int | None, Iterable[str]]]
"""``plan(index, ahead) -> (columns, droppable)``: micro-batch ``index`` (0 = the first the feed hands out)
cut to its first ``columns`` columns (None: all of them), the ``droppable`` keys left out when trivial;
``ahead``: asked when micro-batch ``index - 1`` was handed out, before it trained."""

_STOP = object()


def is_trivial(key: str, value: Any) -> bool:
    """Whether ``value`` is what a model assumes without it: ``loss_mask`` all ones, ``position_ids``
    ``arange`` in every row. (A host-side check of the batch; other keys are never trivial.)"""
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        return False
    if key == "loss_mask":
        return bool((value == 1).all())
    if key == "position_ids":
        return torch.equal(value, torch.arange(value.shape[1], dtype=value.dtype).expand_as(value))
    return False


def lean_batch(batch: Mapping[str, Any], columns: int | None = None, droppable: Iterable[str] = ()) -> dict[str, Any]:
    """``batch`` cut to its first ``columns`` columns (:func:`~seqwarm.batch.truncate_batch`: views), without
    the ``droppable`` keys that are trivial (:func:`is_trivial`)."""
    out = truncate_batch(batch, columns) if columns is not None else dict(batch)
    for key in droppable:
        if is_trivial(key, out.get(key)):
            del out[key]
    return out


class DeviceFeed:
    """Micro-batches from ``batches`` on ``device``, cut by ``plan`` (see the module docstring).

    ``threaded``: fetch and copy one batch ahead on a background thread (default: on CUDA only).
    """

    def __init__(self, batches: Any, device: torch.device | str, *, plan: Plan | None = None,
                 threaded: bool | None = None):
        self.batches = batches
        self.device = torch.device(device)
        self.plan = plan
        self.threaded = self.device.type == "cuda" if threaded is None else bool(threaded)
        self._index = 0  # micro-batches handed out since the feed (re)started
        self._thread: threading.Thread | None = None
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._pending: dict[str, Any] | None = None  # the source's position before the batch in flight
        self._stream = None

    # -- what one micro-batch becomes -------------------------------------------------------------
    def _plan(self, index: int, ahead: bool) -> tuple[int | None, tuple[str, ...]]:
        if self.plan is None:
            return None, ()
        columns, droppable = self.plan(index, ahead)
        return columns, tuple(droppable)

    def _move(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """The (cut) host batch on the device, and the CUDA event its copy ends with (None off CUDA):
        through pinned memory, on the feed's side stream when it has one."""
        if self.device.type != "cuda":
            return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}, None
        out = {}
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    pinned = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    pinned.copy_(value)  # one host copy: the cut columns only, contiguous
                    value = pinned.to(self.device, non_blocking=True)
                out[key] = value
            event = torch.cuda.Event()
            event.record()
        return out, event

    def _fetch(self, columns: int | None, droppable: tuple[str, ...]) -> tuple[dict[str, Any], Any]:
        return self._move(lean_batch(self.batches.next_batch(), columns, droppable))

    def _received(self, moved: tuple[dict[str, Any], Any]) -> dict[str, Any]:
        """A batch copied on the side stream, made safe to use on the current stream."""
        batch, event = moved
        if event is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    value.record_stream(stream)  # its memory is not reused before this stream is done with it
        return batch

    # -- the thread -------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            request = self._requests.get()
            if request is _STOP:
                return
            try:
                result = (self._fetch(*request), None)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
                self._results.put((None, err))
                return
            self._results.put(result)

    def _submit(self, index: int, ahead: bool) -> None:
        """Ask the (idle) thread for micro-batch ``index``; the source's position is read first."""
        plan = self._plan(index, ahead)
        self._pending = self.batches.state_dict()
        self._requests.put(plan)

    def _start(self) -> None:
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        self._requests, self._results = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._work, name="seqwarm-prefetch", daemon=True)
        self._thread.start()

    def _take(self) -> tuple[dict[str, Any], Any]:
        """The batch in flight and its copy's event (raising what the thread raised)."""
        moved, err = self._results.get()
        self._pending = None
        if err is not None:
            self._stop()
            raise err
        return moved

    # -- the consumer -----------------------------------------------------------------------------
    def next_batch(self) -> dict[str, Any]:
        """The next micro-batch on the device, cut by the plan."""
        if not self.threaded:
            batch = self._fetch(*self._plan(self._index, False))
            self._index += 1
            return self._received(batch)
        if self._thread is None:
            self._start()
            self._submit(self._index, False)
        moved = self._take()
        self._index += 1
        self._submit(self._index, True)  # fetched and copied while this one trains
        return self._received(moved)

    def state_dict(self) -> dict[str, Any]:
        """The source's position before the first micro-batch not handed out yet."""
        return dict(self._pending) if self._pending is not None else self.batches.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Drop what is in flight and continue the source from ``state``."""
        self.close()
        self.batches.load_state_dict(state)

    def _stop(self) -> None:
        if self._thread is not None:
            self._requests.put(_STOP)
            self._thread.join()
            self._thread = None
        self._index = 0

    def close(self) -> None:
        """Stop the thread and rewind the source to :meth:`state_dict` (a batch fetched ahead is given back)."""
        if self._thread is None:
            self._index = 0
            return
        rewind = self._pending
        try:
            if rewind is not None:
                _, err = self._results.get()  # the thread finishes the batch in flight first
                self._pending = None
                if err is None:
                    self.batches.load_state_dict(rewind)
        finally:
            self._stop()

    def __enter__(self) -> DeviceFeed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
