"""Saving and resuming a training run: :class:`TorchCheckpointer` (plain torch, DDP and FSDP2).

The loop (:class:`seqwarm.trainer.loop.Run`) hands a checkpointer its *loop state* — data position, RNG,
resolved config, wall clock, last validation loss — and the checkpointer adds the model, optimizer and
engine state in its own format. A backend with its own checkpoint format (DeepSpeed:
:mod:`seqwarm.integrations.deepspeed.run`) supplies its own checkpointer with the same three methods:
``save(step, loop_state)``, ``load(check) -> (path, state) | None`` and ``finish(progress, config,
last_val)`` (what the end of a run writes besides the last checkpoint).

Payload keys of ``RUN/checkpoints/step_XXXXXXXX.pt``: ``model``, ``engine`` (with ``optimizer``),
``data``, ``rng``, ``config``, ``elapsed_s``, ``last_val`` (and ``format`` / ``step`` from
:func:`seqwarm.trainer.checkpoint.save_checkpoint`). Checkpoints written by earlier versions load unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from seqwarm.trainer.checkpoint import load_latest_for_resume, require_keys, save_checkpoint
from seqwarm.trainer.distributed import DistInfo, barrier
from seqwarm.util.errors import UserError

__all__ = ["Checkpointer", "TorchCheckpointer", "ConfigCheck", "save_due"]

ConfigCheck = Callable[[Any, Mapping[str, Any]], None]
"""``check(path, saved_config)``: raises when a checkpoint's recorded config may not be resumed."""


def save_due(interval: int, step: int, last: bool) -> bool:
    """Whether a checkpoint is written after ``step``: every ``interval`` steps (0: never) before the last
    one (the loop always saves once at the end)."""
    return bool(interval) and step % interval == 0 and not last


class Checkpointer(Protocol):
    """What the loop needs from a checkpoint format."""

    interval: int
    """Save every this many optimizer steps (0: only at the end); :meth:`due` reads it."""

    def due(self, step: int, last: bool) -> bool:
        """Whether to save after ``step`` (``last``: the run ends with it, and saves then anyway)."""

    def save(self, step: int, loop_state: dict[str, Any]) -> Path | None:
        """Write the checkpoint of ``step`` (every rank calls it); its path on rank 0."""

    def load(self, check: ConfigCheck) -> tuple[Any, dict[str, Any]] | None:
        """Load the latest checkpoint into the model, optimizer and engine; return (path, loop state),
        or None when there is none. ``check`` is called before anything is loaded where the format allows."""

    def finish(self, progress, config: dict[str, Any], last_val: float | None) -> None:
        """Called on every rank after the last save."""


def _shard_like(full: Any, like: Any) -> Any:
    """``full`` cut to this rank's shard of the DTensor ``like`` (no communication: every rank holds
    ``full``); anything else unchanged."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor) and hasattr(full, "shape") and tuple(full.shape) == tuple(like.shape):
        return distribute_tensor(full.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return full


def load_full_state_locally(model, optimizer, model_state: dict, optim_state: dict) -> None:
    """Load a full (unsharded) model + optimizer state into an FSDP2 model, each rank cutting its own
    shards from the copy it read, with no collective at all.

    ``set_state_dict(full_state_dict=True)`` instead scatters every tensor from rank 0 (one collective
    per tensor, issued before FSDP2's lazy initialisation at the first forward); on CPU/gloo that path
    intermittently left a rank with corrupted weights (a validation loss of 8.8 right after resume, and
    a SIGABRT at teardown). Every rank reads the checkpoint anyway, so the data is local already.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    current = model.state_dict()
    local_model = {k: _shard_like(v, current.get(k)) for k, v in model_state.items()}
    params = dict(model.named_parameters())
    local_optim = {"param_groups": optim_state["param_groups"],
                   "state": {fqn: {k: _shard_like(v, params.get(fqn)) if getattr(v, "dim", lambda: 0)() else v
                                   for k, v in entry.items()}
                             for fqn, entry in optim_state["state"].items()}}
    set_state_dict(model, optimizer, model_state_dict=local_model, optim_state_dict=local_optim,
                   options=StateDictOptions(full_state_dict=False))


class TorchCheckpointer:
    """One ``torch.save`` file per checkpoint on rank 0, the newest ``keep`` kept (0: all)."""

    def __init__(self, folder: Path, model, optimizer, engine, *, info: DistInfo, keep: int, fsdp: bool = False,
                 interval: int = 0):
        self.folder, self.model, self.optimizer, self.engine = Path(folder), model, optimizer, engine
        self.info, self.keep, self.fsdp, self.interval = info, keep, fsdp, interval

    def due(self, step: int, last: bool) -> bool:
        return save_due(self.interval, step, last)

    def full_state(self) -> tuple[dict, dict]:
        """Model and optimizer state as full (unsharded) tensors; a collective under FSDP2."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            return get_state_dict(self.model, self.optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict(), self.optimizer.state_dict()

    def save(self, step: int, loop_state: dict[str, Any]) -> Path | None:
        model_state, optim_state = self.full_state()  # every rank takes part (FSDP2 gathers)
        if not self.info.is_main:
            barrier(self.info)
            return None
        engine_state = self.engine.state_dict(include_optimizer=False)
        engine_state["optimizer"] = optim_state
        payload = {"model": model_state, "engine": engine_state, **loop_state}
        path = save_checkpoint(self.folder, step, payload, keep=self.keep)
        barrier(self.info)
        return path

    def load(self, check: ConfigCheck) -> tuple[Any, dict[str, Any]] | None:
        # CheckpointError when there are some but none loads; rank 0 moves unloadable newer ones aside
        found = load_latest_for_resume(self.folder, move_aside=self.info.is_main)
        if found is None:
            return None
        path, state = found
        if not state.get("deepspeed"):
            require_keys(path, state, {"model": dict, "engine": dict, "data": dict, "rng": dict, "config": dict})
            require_keys(path, state["engine"], {"optimizer": dict})
        if state.get("deepspeed"):  # a model export of a --deepspeed run: its state is in checkpoints/deepspeed
            raise UserError(f"{self.folder.parent} was trained with --deepspeed; resume it with --deepspeed")
        check(path, state["config"])
        engine_state = dict(state["engine"])
        optim_state = engine_state.pop("optimizer")
        try:
            if self.fsdp:
                load_full_state_locally(self.model, self.optimizer, state["model"], optim_state)
            else:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(optim_state)
        except (RuntimeError, KeyError, ValueError) as err:  # shapes or parameter names differ
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise UserError(f"{path} does not fit this run's model or optimizer ({first}); resume with the "
                            "settings it was written with") from None
        self.engine.load_state_dict(engine_state)
        return path, state

    def finish(self, progress, config: dict[str, Any], last_val: float | None) -> None:
        """Nothing: the last checkpoint is the model ``seqwarm eval`` reads."""
