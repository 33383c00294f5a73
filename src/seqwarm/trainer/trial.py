"""The trial step before a run's first step: one forward + backward at the full length and the largest
micro-batch, so a run that does not fit fails in its first minute (not at the step where the curriculum
reaches full length), and the ETA knows what a long step costs from step 1.

It draws no data and restores the RNG, so the run trains the same numbers with or without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from seqwarm.trainer.checkpoint import rng_state, set_rng_state
from seqwarm.util.errors import UserError

__all__ = ["trial_step"]


def trial_step(
    probe: Callable[[dict[str, Any]], None],
    *,
    length: int,
    micro: int,
    vocab_size: int,
    device: torch.device,
    step: int,
) -> float:
    """Run ``probe`` (the engine's ``probe_memory``) twice on random tokens ``(micro, length)``: the first
    pays the start-up (allocations, first calls), the second is timed. Returns its seconds. An OOM is a
    :class:`UserError` saying what to lower (``step``: the step the run was about to train)."""
    ids = torch.randint(0, vocab_size, (micro, length), generator=torch.Generator().manual_seed(0)).to(device)
    saved = rng_state()
    try:
        probe({"input_ids": ids, "labels": ids})
        t0 = time.perf_counter()
        probe({"input_ids": ids, "labels": ids})
        if device.type == "cuda":  # its kernels done, for its time
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0
    except torch.cuda.OutOfMemoryError:
        raise UserError(
            f"out of GPU memory on a trial step at the full length {length} with micro-batch {micro} "
            f"(before step {step}): lower train_micro_batch_size_per_gpu (raise gradient_accumulation_steps to "
            "keep the global batch), train in bf16 (--precision bf16), shard with --fsdp, or choose a smaller --model"
        ) from None
    finally:
        set_rng_state(saved)
