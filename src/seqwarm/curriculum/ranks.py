"""A step's counts over the data-parallel ranks: the one place the curriculum meets ``torch.distributed``.

Shape counts are the same on every rank (every rank cuts to the same length), so they are multiplied by
the world size; counts read from tensors (loss masks, real tokens of padded batches) differ between ranks
and are summed exactly with one ``all_reduce`` per optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["global_counts"]


def _nccl(group: Any) -> bool:
    """Whether ``group``'s collectives need CUDA tensors (NCCL)."""
    try:
        return "nccl" in str(torch.distributed.get_backend(group))
    except (RuntimeError, ValueError):  # no such group: the caller's all_reduce says what is wrong
        return False


def global_counts(samples: int, tokens: int | torch.Tensor, world_size: int | None, group: Any) -> tuple[int, int]:
    """``(samples, tokens)`` of one rank's step, over all ranks. ``world_size``: the data-parallel ranks
    (None: the size of ``group``, the default group, or 1 without torch.distributed). A tensor count is
    summed over ``group`` when torch.distributed is initialised (a copy: the rank's own count is kept)."""
    dist = torch.distributed
    live = dist.is_available() and dist.is_initialized()
    world = world_size
    if world is None:
        world = dist.get_world_size(group) if live else 1
    if isinstance(tokens, torch.Tensor):
        if world > 1 and live:
            if tokens.device.type == "cpu" and _nccl(group):  # counted on the host
                tokens = tokens.to(torch.device("cuda", torch.cuda.current_device()))
            else:  # all_reduce works in place: the rank's own count must survive more cuts
                tokens = tokens.clone()
            dist.all_reduce(tokens, group=group)
            return samples * world, int(tokens.item())
        tokens = int(tokens.item())
    return samples * world, tokens * world
