"""torch.distributed set-up for ``seqwarm train`` under torchrun: init, DDP / FSDP2 wrapping, helpers.

Nothing here is a distribution layer of its own: DDP and FSDP2 (``fully_shard``) do the work. The
backend is nccl on GPU and gloo on CPU. The curriculum, batch shaping and schedules never import this
module: every rank computes the same length from the same clock.

A rank that dies, raises or stalls must not hang the others. Every collective waits at most
``--dist-timeout-s`` seconds (:data:`DEFAULT_DIST_TIMEOUT_S`; ``init_process_group``'s ``timeout``); a
rank that raises leaves its error in torchrun's store (:func:`note_failure`); a rank whose collective
fails (a peer gone, or the timeout) asks the store which ranks are still there and raises
:class:`RankFailed`, naming the rank that failed (:func:`rank_failure`). torchrun then ends the rest.
``SEQWARM_FAULT=RANK:STEP:ACTION`` (exit, raise or sleep) makes one rank fail before step STEP + 1, for
the tests of this (:func:`injected_fault`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from seqwarm.util.errors import SeqwarmError, UserError

logger = logging.getLogger(__name__)

DEFAULT_DIST_TIMEOUT_S = 600.0
"""How long a collective waits for the other ranks before it fails (``--dist-timeout-s``): long enough
for the slowest checkpoint save or evaluation that one rank does while the others wait."""

ANSWER_WAIT_S = 5.0
"""After a failed collective, how long a rank waits for the other survivors to say they are alive."""

EXIT_RANK_FAILED = 1
"""The exit code of a rank whose peer died, raised or stalled (torchrun itself then exits 1)."""

_KEY = "seqwarm/rank/"


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> DistInfo:
    """Join the process group torchrun describes in the environment (a no-op for one process); a
    collective waits at most ``timeout_s`` seconds (None: :data:`DEFAULT_DIST_TIMEOUT_S`)."""
    # grow segments instead of caching fixed blocks: a growing sequence length fragments the cache
    # (set before the first CUDA allocation; the user's own setting wins)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if not launched_by_torchrun():
        return DistInfo()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    if world == 1:
        return DistInfo(rank, 1, local)
    use_cuda = torch.cuda.is_available() and device != "cpu"
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        timeout = timedelta(seconds=DEFAULT_DIST_TIMEOUT_S if timeout_s is None else float(timeout_s))
        dist.init_process_group(backend=backend, timeout=timeout)
    return DistInfo(rank, world, local, backend)


def device_for(info: DistInfo, requested: str) -> torch.device:
    """The device of this rank: cuda:LOCAL_RANK under torchrun on GPUs, else what was asked."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", info.local_rank)
        return torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise UserError(f"--device {requested!r} is not a device (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {requested} asked for, but this torch build sees no CUDA device")
        if info.enabled and device.index is None:
            device = torch.device("cuda", info.local_rank)
    return device


def wrap_model(
    model: nn.Module, info: DistInfo, fsdp: bool, device: torch.device, param_dtype: torch.dtype | None = None
) -> nn.Module:
    """DDP, or FSDP2 with one ``fully_shard`` per transformer block plus the root.

    ``param_dtype`` (FSDP2; the run's autocast dtype): gather parameters in it and reduce gradients in
    fp32 (a ``MixedPrecisionPolicy``): half the all-gather bytes, full-precision gradient sums.
    """
    if fsdp:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            raise UserError("--fsdp needs torch >= 2.6 (torch.distributed.fsdp.fully_shard)") from None
        if not info.enabled:
            raise UserError("--fsdp shards the model across ranks: launch with torchrun --nproc_per_node N (N >= 2)")
        policy = (
            {}
            if param_dtype is None
            else {"mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)}
        )
        for block in getattr(model, "blocks", []):
            fully_shard(block, **policy)
        fully_shard(model, **policy)
        return model
    if not info.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    # gradients live in the all-reduce buckets: no copy in or out, and one gradient-sized buffer less
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)


def barrier(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def gather_floats(values: list[float], info: DistInfo, device: torch.device) -> list[list[float]]:
    """Every rank's ``values`` (one list per rank; just ``[values]`` for one process)."""
    if not info.enabled:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


# -- a rank that fails ----------------------------------------------------------------------------------
class RankFailed(SeqwarmError):
    """A collective failed because another rank died, raised or stalled; the message names it."""

    exit_code = EXIT_RANK_FAILED


_COLLECTIVE = re.compile(
    r"gloo|nccl|connection (closed|reset) by peer|broken pipe|timed out|timeout|socket|ProcessGroup", re.I
)


def collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed (a peer gone, the timeout), not an error of this rank."""
    if isinstance(exc, getattr(dist, "DistError", ())) and not isinstance(exc, getattr(dist, "DistStoreError", ())):
        return True
    return isinstance(exc, RuntimeError) and bool(_COLLECTIVE.search(str(exc)))


def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no group, or a torch without it: the message names no rank
        return None


def note_failure(info: DistInfo, exc: BaseException) -> None:
    """Leave this rank's error in the store, for the message of the ranks it leaves behind (best effort)."""
    store = _store() if info.enabled else None
    if store is not None:
        try:
            store.set(f"{_KEY}{info.rank}", f"raised {type(exc).__name__}: {exc}"[:300])
        except Exception:
            pass


def rank_failure(info: DistInfo, exc: BaseException, step: int | None = None) -> RankFailed:
    """The error of a rank whose collective failed: it says it is alive in the store, waits up to
    :data:`ANSWER_WAIT_S` for the others, and names each rank that raised (with its error) or never
    answered (it died or stalled)."""
    others = [r for r in range(info.world_size) if r != info.rank]
    said: dict[int, str] = {}
    store = _store()
    if store is not None:
        try:
            store.set(f"{_KEY}{info.rank}", "alive")
            deadline = time.monotonic() + ANSWER_WAIT_S
            while True:
                for r in others:
                    if r not in said and store.check([f"{_KEY}{r}"]):
                        said[r] = store.get(f"{_KEY}{r}").decode(errors="replace")
                if len(said) == len(others) or any(v != "alive" for v in said.values()):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        except Exception:  # the store went with the failed rank: say what is known
            pass
    failed = [f"rank {r} {v}" for r, v in said.items() if v != "alive"]
    if not failed:
        silent = [str(r) for r in others if r not in said]
        failed = [f"rank {', '.join(silent)} did not answer (died or stalled)"] if silent else []
    who = "; ".join(failed) or "another rank failed"
    at = f" at step {step + 1:,}" if step is not None else ""
    first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    return RankFailed(
        f"rank {info.rank}: a collective{at} failed: {who} ({first}). The run stops; its newest checkpoint is "
        "whole: fix the cause and continue with --resume (a stalled collective fails after --dist-timeout-s)"
    )


def injected_fault(info: DistInfo, step: int) -> None:
    """The test hook ``SEQWARM_FAULT=RANK:STEP:ACTION``: on rank RANK, before step STEP + 1, ``exit``
    (die without a word), ``raise`` (a RuntimeError) or ``sleep`` (stall for an hour; a SIGTERM, which
    torchrun sends the survivors of a failed job, ends the stalled rank at once, where the run's graceful
    stop would wait for a step that never comes and torchrun would kill it 30 s later)."""
    spec = os.environ.get("SEQWARM_FAULT")
    if not spec:
        return
    rank, at, action = spec.split(":")
    if int(rank) != info.rank or int(at) != step:
        return
    if action == "exit":
        os._exit(9)
    if action == "raise":
        raise RuntimeError(f"SEQWARM_FAULT: rank {info.rank} raised before step {step + 1}")
    if action == "sleep":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
        time.sleep(3600)


def mean_over_ranks(
    losses: list[float], steps: list[int], lengths: list[int], info: DistInfo, device: torch.device
) -> list[float]:
    """Each step's loss averaged over the ranks (one gather for all of them); every rank must have trained
    each step at the same curriculum length (RuntimeError naming the step otherwise)."""
    n = len(losses)
    per_rank = gather_floats([*losses, *map(float, lengths)], info, device)
    for i, step in enumerate(steps):
        seen = {int(r[n + i]) for r in per_rank}
        if len(seen) != 1:
            raise RuntimeError(f"ranks disagree on the curriculum length at step {step}: {sorted(seen)}")
    return [sum(r[i] for r in per_rank) / len(per_rank) for i in range(n)]
