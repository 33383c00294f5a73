"""Training micro-batches on the device: read one ahead on CUDA, only what the step trains copied.

:class:`DeviceFeed` sits between a batch source (:class:`~seqwarm.data.dataset.TrainBatches`, a
Megatron blend: anything with ``next_batch``, ``state_dict``, ``load_state_dict``) and the loop, which
draws each raw micro-batch, cuts it on the host and hands the cut to the feed's copy:

- :meth:`DeviceFeed.draw` is the next full-length micro-batch on the host. On CUDA a background thread
  reads the one after it from the source while this one trains (the cut needs the step's length, which
  is decided when the step begins, so the thread reads raw batches only);
- :meth:`DeviceFeed.to_device` copies a micro-batch the loop cut already (the engine's one cut,
  :meth:`seqwarm.curriculum.warmup.SequenceLengthWarmup.cut`), so only the columns the step trains are
  pinned and copied — at length 64 of 1024, a sixteenth of the bytes. With ``drop_trivial`` (a model
  whose defaults they are, bit for bit) a ``loss_mask`` of ones and ``position_ids`` that are ``arange``
  per row are left out first. On CUDA the cut part is copied into pinned memory and sent with
  ``non_blocking=True`` on a side stream, and the consumer's stream waits for that copy (an event), never
  the host; on the CPU nothing more is copied (the cut already made its contiguous copy).

The feed never calls back into the curriculum. The order of batches is the source's.
:meth:`DeviceFeed.state_dict` is the source's position before the first batch not yet drawn (a batch
read ahead is not lost in a checkpoint), and :meth:`DeviceFeed.close` (after a run, or when it raised)
stops the thread and rewinds the source to that position. An exception in the thread is raised by the
:meth:`DeviceFeed.draw` that wanted its batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["DeviceFeed", "is_trivial", "lean_batch"]

_STOP = object()

TRIVIAL_KEYS = ("loss_mask", "position_ids")
"""Keys a model may assume when they are left out: a loss mask of ones, positions ``arange`` per row."""


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


def lean_batch(batch: Mapping[str, Any], droppable: Iterable[str] = TRIVIAL_KEYS) -> dict[str, Any]:
    """``batch`` without the ``droppable`` keys that are trivial (:func:`is_trivial`); a new dict."""
    out = dict(batch)
    for key in droppable:
        if is_trivial(key, out.get(key)):
            del out[key]
    return out


class DeviceFeed:
    """Micro-batches from ``batches``, drawn raw (:meth:`draw`) and, once the loop cut them, put on
    ``device`` (:meth:`to_device`; see the module docstring). ``drop_trivial``: leave out a trivial
    ``loss_mask`` / ``position_ids`` before the copy (True), or only the trivial ones of these keys (a
    tuple). ``threaded``: read one batch ahead on a background thread (default: on CUDA only).
    """

    def __init__(
        self,
        batches: Any,
        device: torch.device | str,
        *,
        drop_trivial: bool | tuple[str, ...] = False,
        threaded: bool | None = None,
    ):
        self.batches = batches
        self.device = torch.device(device)
        self.drop_trivial = drop_trivial
        self.threaded = self.device.type == "cuda" if threaded is None else bool(threaded)
        self._thread: threading.Thread | None = None
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._pending: dict[str, Any] | None = None  # the source's position before the batch in flight
        self._stream = None

    # -- what one micro-batch becomes -------------------------------------------------------------
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
                result = (self.batches.next_batch(), None)
            except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
                self._results.put((None, err))
                return
            self._results.put(result)

    def _submit(self) -> None:
        """Ask the (idle) thread for the next micro-batch; the source's position is read first."""
        self._pending = self.batches.state_dict()
        self._requests.put(True)

    def _start(self) -> None:
        if self.device.type == "cuda" and self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        self._requests, self._results = queue.Queue(), queue.Queue()
        self._thread = threading.Thread(target=self._work, name="seqwarm-prefetch", daemon=True)
        self._thread.start()

    def _take(self) -> dict[str, Any]:
        """The host batch in flight (raising what the thread raised)."""
        batch, err = self._results.get()
        self._pending = None
        if err is not None:
            self._stop()
            raise err
        return batch

    # -- the consumer -----------------------------------------------------------------------------
    def draw(self) -> dict[str, Any]:
        """The next micro-batch as the source gives it: full length, on the host (read ahead on CUDA)."""
        if not self.threaded:
            return self.batches.next_batch()
        if self._thread is None:
            self._start()
            self._submit()
        batch = self._take()
        self._submit()  # read while this one trains
        return batch

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` (a host micro-batch the loop cut already) on the device, ready for the current stream;
        with ``drop_trivial``, without its trivial keys."""
        if self.drop_trivial:
            batch = lean_batch(batch, TRIVIAL_KEYS if self.drop_trivial is True else self.drop_trivial)
        return self._received(self._move(batch))

    def state_dict(self) -> dict[str, Any]:
        """The source's position before the first micro-batch not drawn yet."""
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

    def close(self) -> None:
        """Stop the thread and rewind the source to :meth:`state_dict` (a batch fetched ahead is given back)."""
        if self._thread is None:
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
