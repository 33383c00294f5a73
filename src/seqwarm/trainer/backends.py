"""How a run's model, optimizer and engine are built, and how one optimizer step is taken.

An :class:`EngineBuilder` is the backend component :class:`seqwarm.trainer.loop.Run` calls: the torch one here
(one device, DDP or FSDP2, driven by a :class:`~seqwarm.curriculum.engine.CurriculumEngine`), DeepSpeed's in
:mod:`seqwarm.integrations.deepspeed.run`, Hugging Face models' in :mod:`seqwarm.integrations.hf.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from seqwarm.config import RunConfig
from seqwarm.trainer.checkpoint import Checkpointer, TorchCheckpointer
from seqwarm.trainer.distributed import DistInfo, wrap_model
from seqwarm.trainer.optim import build_optimizer

__all__ = ["Built", "EngineBuilder", "TorchEngineBuilder", "accumulate_step"]


@dataclass
class Built:
    """What an engine builder hands the loop."""

    model: torch.nn.Module
    """The unwrapped GPT (what checkpoints and ``seqwarm eval`` hold)."""
    optimizer: Any
    """The torch optimizer (its Adam moments are logged)."""
    engine: Any
    """What the loop drives: ``engine(batch) -> loss``, ``backward``, ``step``, ``progress``, ``state_dict``."""
    parallelism: str
    """Recorded in config.json: ``none``, ``ddp``, ``fsdp2``, ``deepspeed-zero2``, ..."""
    resolved: dict[str, Any] = field(default_factory=dict)
    """Extra entries of config.json (the DeepSpeed run records its resolved DeepSpeed config)."""
    train_step: Callable[[Any, Callable[[], dict], int], Any] | None = None
    """``train_step(engine, next_batch, micro_batches) -> mean loss`` of one optimizer step whose length the
    loop decided (``engine.begin_step()``); ``next_batch()`` gives a micro-batch already cut
    (``engine.cut``). A float or a 0-d tensor the loop reads only at log, eval and save steps (None:
    :func:`accumulate_step`)."""
    label_style: str = "megatron"
    """The batches the model takes: ``megatron`` (shifted labels) or ``hf`` (labels = inputs; the model shifts)."""


class EngineBuilder(Protocol):
    """A backend: how the model is built, wrapped and stepped, and how it is checkpointed."""

    def data_parallel(self, info: DistInfo) -> tuple[int, int]:
        """This rank's index among the data-parallel replicas, and their number."""

    def build(self, model_cfg, cfg: RunConfig, info: DistInfo, device: torch.device) -> Built:
        """The model, optimizer and engine of the run (called once, after seeding)."""

    def checkpointer(self, built: Built, folder: Path, info: DistInfo, keep: int, interval: int = 0) -> Checkpointer:
        """The checkpointer of what :meth:`build` returned, saving every ``interval`` steps."""


def accumulate_step(engine, next_batch: Callable[[], dict], micro_batches: int) -> torch.Tensor:
    """One optimizer step of ``micro_batches`` forward/backward passes on micro-batches already cut; this
    rank's mean loss (a 0-d tensor on the device: reading it is a host sync, which the loop does only at
    log rows)."""
    losses = []
    for _ in range(micro_batches):
        loss = engine.run(next_batch())
        engine.backward(loss)
        losses.append(loss.detach())
        engine.step()
    return torch.stack(losses).mean()


class TorchEngineBuilder:
    """The GPT on one device, under DDP, or sharded with FSDP2, driven by a CurriculumEngine."""

    def __init__(self, fsdp: bool = False, compile: bool = False):
        self.fsdp = fsdp
        self.compile = compile

    def data_parallel(self, info: DistInfo) -> tuple[int, int]:
        return info.rank, info.world_size

    def build(self, model_cfg, cfg: RunConfig, info: DistInfo, device: torch.device) -> Built:
        from seqwarm.curriculum.engine import CurriculumEngine
        from seqwarm.trainer.model import GPT

        model = GPT(model_cfg).to(device)  # the unwrapped model (sharded in place by FSDP2)
        if self.compile:  # in place (the state dict keeps its keys), before DDP / FSDP2 wrap it
            for module in model.blocks if self.fsdp else [model]:
                module.compile()
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        wrapped = wrap_model(model, info, self.fsdp, device, param_dtype=half if device.type == "cuda" else None)
        optimizer = build_optimizer(model, cfg)  # after sharding: FSDP2 params are DTensors
        parallelism = "fsdp2" if self.fsdp else ("ddp" if info.enabled else "none")
        engine = CurriculumEngine(wrapped, optimizer, cfg, layout="dense")  # seqwarm's windows: dense rows
        return Built(model, optimizer, engine, parallelism, resolved={"compile": self.compile})

    def checkpointer(
        self, built: Built, folder: Path, info: DistInfo, keep: int, interval: int = 0
    ) -> TorchCheckpointer:
        return TorchCheckpointer(
            folder, built.model, built.optimizer, built.engine, info=info, keep=keep, interval=interval, fsdp=self.fsdp
        )
