"""Checkpoints: the file format, loading it safely, and the checkpointers the loop saves and resumes through.

The format. Everything a resume needs is one ``torch.save`` file per checkpoint,
``RUN/checkpoints/step_XXXXXXXX.pt``, named by step, the last few kept. A checkpoint is written to a
temporary name in the same folder, flushed to disk, then renamed into place
(:func:`seqwarm.util.atomic.atomic_path`), so a crash (even SIGKILL) mid-write never leaves a file under a
checkpoint name that does not load. :func:`load_newest` skips files that fail to load and falls back to
the previous one; :func:`load_latest_for_resume` moves such files aside.

Loading never runs code from the file: ``torch.load(weights_only=True)`` accepts tensors and plain
Python values only, so everything a checkpoint holds is one of those (the numpy RNG state is stored as
a tensor). Checkpoints written before this rule hold the numpy state as a ``uint32`` array; those load
through a narrow allow-list (numpy's array rebuild for unsigned 32-bit arrays, torch's version string)
and nothing else. Any other file — foreign, damaged or crafted — is a :class:`CheckpointError`.

The checkpointer. The loop (:class:`seqwarm.trainer.loop.Run`) hands a :class:`Checkpointer` its *loop
state* — data position, RNG, resolved config, wall clock, last validation loss — and the checkpointer
adds the model, optimizer and engine state in its own format. :class:`TorchCheckpointer` (plain torch,
DDP and FSDP2) writes the files above with payload keys ``model``, ``engine`` (with ``optimizer``),
``data``, ``rng``, ``config``, ``elapsed_s``, ``last_val`` (and ``format`` / ``step`` from
:func:`save_checkpoint`); checkpoints written by earlier versions load unchanged. A backend with its own
checkpoint format (DeepSpeed: :mod:`seqwarm.integrations.deepspeed.run`) supplies its own checkpointer
with the same methods: ``due(step, last)`` (:func:`save_due`), ``save(step, loop_state)``,
``load(check) -> (path, state) | None`` and ``finish(progress, config, last_val)`` (what the end of a
run writes besides the last checkpoint).
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from seqwarm.trainer.distributed import DistInfo, barrier
from seqwarm.util.atomic import TMP_MARK, atomic_path
from seqwarm.util.errors import UserError

__all__ = [
    "FORMAT",
    "CheckpointError",
    "first_nonfinite",
    "checkpoint_path",
    "list_checkpoints",
    "rng_state",
    "set_rng_state",
    "save_checkpoint",
    "load_checkpoint",
    "require_keys",
    "load_newest",
    "load_latest_for_resume",
    "Checkpointer",
    "TorchCheckpointer",
    "ConfigCheck",
    "save_due",
    "load_full_state_locally",
]

logger = logging.getLogger(__name__)

FORMAT = "seqwarm.checkpoint/1"
_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the files named like checkpoints, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


class CheckpointError(UserError):
    """A file under a checkpoint name that is not a loadable seqwarm checkpoint (the message says why)."""


def rng_state() -> dict[str, Any]:
    """The RNG states as tensors and plain values (what ``weights_only`` loading accepts)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state(saved: Any) -> tuple:
    """``np.random.set_state``'s tuple from a checkpoint's (keys as a tensor, or as an array in old files)."""
    kind, keys, pos, has_gauss, gauss = saved
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    if str(kind) != "MT19937" or keys.shape != (624,):
        raise ValueError(f"expected MT19937 with 624 keys, got {kind!r} with shape {keys.shape}")
    return str(kind), keys.astype(np.uint32), int(pos), int(has_gauss), float(gauss)


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(_numpy_state(state["numpy"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(folder: Path, step: int, payload: dict[str, Any], keep: int = 3) -> Path:
    """Write ``payload`` as the checkpoint of ``step`` atomically; delete all but the newest ``keep``."""
    final = checkpoint_path(folder, step)
    with atomic_path(final) as tmp:  # fsync the file, rename, fsync the folder
        with open(tmp, "wb") as fh:  # a file object: a failed write surfaces as the OSError behind it
            torch.save({"format": FORMAT, "step": step, **payload}, fh)
    if keep > 0:
        for _, old in list_checkpoints(folder)[:-keep]:
            if old != final:  # never the one just written, whatever other step numbers lie about
                old.unlink(missing_ok=True)
    for stale in folder.glob(f".step_*.pt{TMP_MARK}*"):  # left by a run killed mid-write
        stale.unlink(missing_ok=True)
    return final


def _legacy_globals() -> list:
    """What checkpoints of earlier versions hold besides tensors: numpy's uint32 RNG keys, torch's version."""
    from torch.torch_version import TorchVersion

    reconstruct = (getattr(np, "_core", None) or np.core).multiarray._reconstruct
    return [
        reconstruct,
        (reconstruct, "numpy.core.multiarray._reconstruct"),  # numpy 1 pickles name it so
        np.ndarray,
        np.dtype,
        type(np.dtype(np.uint32)),
        TorchVersion,
    ]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    refused = re.search(r"GLOBAL ([\w.]+)", text)
    if refused:  # torch's message is a page long (and suggests weights_only=False): name what it refused
        return f"it asks to run {refused.group(1)}, which a checkpoint never needs (refused, not run)"
    if "Weights only load failed" in text:
        return "it holds objects that are not tensors or plain values (refused, not run)"
    return (text.splitlines() or [type(err).__name__])[0][:300]


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, loaded without running any code from it; CheckpointError otherwise."""
    try:
        with torch.serialization.safe_globals(_legacy_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path}: cannot read it ({err.strerror or err})") from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure: not a file we wrote
        raise CheckpointError(f"checkpoint {path} does not load: {_first_line(err)}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a seqwarm checkpoint (no format {FORMAT!r} in it)")
    rng = state.get("rng")
    if rng is not None:
        try:
            _numpy_state(rng["numpy"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path}: its RNG state is malformed ({err})") from None
    return state


def require_keys(path: Path, state: dict[str, Any], keys: dict[str, type]) -> None:
    """CheckpointError unless ``state`` has each key with a value of its type (a checkpoint of another
    program, or of a run that cannot be resumed)."""
    wrong = [k for k, kind in keys.items() if not isinstance(state.get(k), kind)]
    if wrong:
        raise CheckpointError(
            f"checkpoint {path} lacks {', '.join(wrong)} (or holds the wrong kind of value "
            "there): not a checkpoint seqwarm wrote for this"
        )


def _newest_loadable(folder: Path) -> tuple[tuple[Path, dict[str, Any]] | None, list[tuple[Path, str]]]:
    """The newest checkpoint that loads (or None), and the newer ones that did not, with why."""
    failures = []
    for _, path in reversed(list_checkpoints(folder)):
        try:
            return (path, load_checkpoint(path)), failures
        except CheckpointError as err:
            failures.append((path, str(err)))
    return None, failures


def _none_loads(folder: Path, failures: list[tuple[Path, str]], fix: str) -> CheckpointError:
    lines = "\n".join(f"  {why}" for _, why in failures)
    return CheckpointError(f"none of the checkpoints in {folder} loads:\n{lines}\n{fix}")


def load_newest(folder: Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint that loads; CheckpointError naming every file and why when none does."""
    found, failures = _newest_loadable(folder)
    if found is None:
        raise _none_loads(folder, failures, "Point at another run, or restore the files from a copy")
    for _, why in failures:
        logger.warning("skipping checkpoint: %s", why)
    return found


def load_latest_for_resume(folder: Path, move_aside: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, for a resume: None when there is none at all; CheckpointError
    naming every file and why when there are some but none loads. Newer files that do not load are
    renamed ``step_XXXXXXXX.pt.unloadable`` (kept for inspection, out of the rotation, which would
    otherwise delete the fresh checkpoints because the broken ones carry higher step numbers); only
    where ``move_aside`` (rank 0: the others read the same files)."""
    found, failures = _newest_loadable(folder)
    if found is None:
        if failures:
            raise _none_loads(
                folder,
                failures,
                "--resume never starts over silently: move them away (or "
                "restore them from a copy) and pass --resume again to start from step 0",
            )
        return None
    for bad, why in failures if move_aside else ():
        aside = bad.with_name(bad.name + ".unloadable")
        os.replace(bad, aside)
        logger.warning("%s; moved aside to %s, resuming from %s", why, aside.name, found[0].name)
    return found


# -- the checkpointer: what the loop saves and resumes through ------------------------------------
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
    local_optim = {
        "param_groups": optim_state["param_groups"],
        "state": {
            fqn: {k: _shard_like(v, params.get(fqn)) if getattr(v, "dim", lambda: 0)() else v for k, v in entry.items()}
            for fqn, entry in optim_state["state"].items()
        },
    }
    set_state_dict(
        model,
        optimizer,
        model_state_dict=local_model,
        optim_state_dict=local_optim,
        options=StateDictOptions(full_state_dict=False),
    )


class TorchCheckpointer:
    """One ``torch.save`` file per checkpoint on rank 0, the newest ``keep`` kept (0: all)."""

    def __init__(
        self,
        folder: Path,
        model,
        optimizer,
        engine,
        *,
        info: DistInfo,
        keep: int,
        fsdp: bool = False,
        interval: int = 0,
    ):
        self.folder, self.model, self.optimizer, self.engine = Path(folder), model, optimizer, engine
        self.info, self.keep, self.fsdp, self.interval = info, keep, fsdp, interval

    def due(self, step: int, last: bool) -> bool:
        return save_due(self.interval, step, last)

    def full_state(self) -> tuple[dict, dict]:
        """Model and optimizer state as full (unsharded) tensors; a collective under FSDP2."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            return get_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
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
            raise UserError(
                f"{path} does not fit this run's model or optimizer ({_first_line(err)}); resume with the "
                "settings it was written with"
            ) from None
        self.engine.load_state_dict(engine_state)
        return path, state

    def finish(self, progress, config: dict[str, Any], last_val: float | None) -> None:
        """Nothing: the last checkpoint is the model ``seqwarm eval`` reads."""


def first_nonfinite(model: torch.nn.Module, optimizer: Any) -> str | None:
    """This rank's first model parameter (in ``named_parameters`` order), then optimizer state tensor, that
    holds a NaN or inf, as ``"parameter NAME"`` / ``"optimizer state KEY"``; None when all are finite.

    The checks of all tensors on one device are stacked there and read back at once: one host read per
    device (the old loop synced once per tensor at every save). Not ``torch._foreach_norm``: the norm of a
    large but finite fp16 tensor overflows to inf. FSDP2's sharded tensors are checked in this rank's part.
    """
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    for name, param in model.named_parameters():
        names.append(f"parameter {name}")
        tensors.append(param.to_local() if hasattr(param, "to_local") else param)
    optim_state = optimizer.state if isinstance(optimizer, torch.optim.Optimizer) else {}
    for state in optim_state.values():
        for key, value in state.items() if isinstance(state, dict) else ():
            local = value.to_local() if hasattr(value, "to_local") else value
            if isinstance(local, torch.Tensor):
                names.append(f"optimizer state {key}")
                tensors.append(local)
    on_device: dict[torch.device, list[int]] = {}
    for i, tensor in enumerate(tensors):
        if tensor.numel():
            on_device.setdefault(tensor.device, []).append(i)
    first = None
    with torch.no_grad():
        for indices in on_device.values():
            finite = torch.stack([torch.isfinite(tensors[i]).all() for i in indices]).tolist()  # the one read
            hit = next((i for i, ok in zip(indices, finite) if not ok), None)
            if hit is not None and (first is None or hit < first):
                first = hit
    return None if first is None else names[first]
