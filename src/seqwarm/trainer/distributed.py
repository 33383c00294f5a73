"""torch.distributed set-up for ``seqwarm train`` under torchrun: init, DDP / FSDP2 wrapping, helpers.

Nothing here is a distribution layer of its own: DDP and FSDP2 (``fully_shard``) do the work. The
backend is nccl on GPU and gloo on CPU. The curriculum, batch shaping and schedules never import this
module: every rank computes the same length from the same clock.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from seqwarm.util.errors import UserError

logger = logging.getLogger(__name__)


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


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group torchrun describes in the environment (a no-op for one process)."""
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
        dist.init_process_group(backend=backend)
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
