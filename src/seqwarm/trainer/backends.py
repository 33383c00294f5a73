"""How a run's model, optimizer and engine are built, what a run decides before it builds them, and what
the loop needs of the engine it drives.

An :class:`EngineBuilder` is the backend component :class:`seqwarm.trainer.loop.Run` calls: the torch one here
(one device, DDP or FSDP2, driven by a :class:`~seqwarm.curriculum.engine.CurriculumEngine`), DeepSpeed's in
:mod:`seqwarm.integrations.deepspeed.run`, Hugging Face models' in :mod:`seqwarm.integrations.hf.run`. The
engine it builds is an :class:`Engine` (a :class:`PipelineEngine` when a step's micro-batches are trained in
one call). :func:`decide` makes the run's :class:`RunChoices` (its precision and curriculum mode), once,
before anything is built; they are handed to what needs them and never written into the config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from seqwarm.config import RunConfig, resolve_precision
from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.engine import bf16_supported
from seqwarm.curriculum.modes import resolve_mode
from seqwarm.trainer.checkpoint import Checkpointer, TorchCheckpointer
from seqwarm.trainer.distributed import DistInfo, wrap_model
from seqwarm.trainer.optim import build_optimizer
from seqwarm.util.errors import UserError

__all__ = [
    "Built",
    "Engine",
    "EngineBuilder",
    "PipelineEngine",
    "RunChoices",
    "TorchEngineBuilder",
    "curriculum_mode",
    "decide",
]


# -- what a run decides before anything is built ------------------------------------------------------
@dataclass(frozen=True)
class RunChoices:
    """What a run decides once, before its model is built, and hands to what needs it (the memory check,
    the builder and its engine, the feed, the record). Never written into the config."""

    precision: str
    """fp32 | bf16 | fp16: the config's, else the resumed run's, else the device's."""
    precision_source: str
    """Where the precision came from: ``config``, ``resumed run`` or ``default on <device>``."""
    mode: str | None
    """How the curriculum length reaches the model: truncate | reshape | window | inject (None: no curriculum)."""

    def recorded(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` as the run trains it, for what the run records and prints (config.json, the start lines):
        the precision and the mode filled in. Nothing reads them back from it."""
        out = replace(cfg, precision=self.precision, precision_named=True)
        if cfg.curriculum is not None and self.mode and cfg.curriculum.mode != self.mode:
            out = replace(out, curriculum=replace(cfg.curriculum, mode=self.mode))
        return out


def curriculum_mode(
    cfg: RunConfig, forward: Callable | None, *, pipeline: bool = False, variable: bool = False
) -> str | None:
    """The curriculum mode of a run whose model has this ``forward`` (None: a pipeline, which passes no
    keyword through its stages): :func:`~seqwarm.curriculum.modes.resolve_mode` on the config's mode, the
    rule every engine applies; None without a curriculum (nor stages). ``variable``: the backend runs
    curriculum mode variable (rows at the step's length from :mod:`seqwarm.data.variable`); a backend that
    does not is refused here (a UserError: exit 2)."""
    cur = cfg.curriculum if cfg.curriculum is not None and cfg.curriculum.enabled else None
    if cur is None and not cfg.stages:
        return None
    if cur is not None and cur.mode == "variable":
        if not variable or pipeline:
            raise UserError(
                "curriculum mode variable trains seqwarm's GPT on the torch backends only (one device, DDP under "
                "torchrun, --fsdp), not on DeepSpeed, a pipeline or an hf: model yet: drop --deepspeed / "
                "--pipeline-stages / the hf: model, or use curriculum mode truncate"
            )
        return "variable"
    return resolve_mode(cur.mode if cur else None, forward, pipeline=pipeline, length_bucket=cfg.length_bucket)


def decide(
    cfg: RunConfig, builder: EngineBuilder, model_cfg, device: torch.device, resumed: str | None = None
) -> RunChoices:
    """The run's :class:`RunChoices`: the precision by :func:`~seqwarm.config.resolve_precision` (the
    config's; else ``resumed``, the precision of the run being resumed; else bf16 on a CUDA device that
    supports it, fp32 elsewhere) and the mode by the builder (:meth:`EngineBuilder.curriculum_mode`)."""
    kind = device.type
    precision = resolve_precision(cfg, kind, bf16_supported(kind), resumed=resumed).precision
    source = "config" if cfg.precision_named else "resumed run" if resumed is not None else f"default on {kind}"
    return RunChoices(precision, source, builder.curriculum_mode(cfg, model_cfg))


def variable_positions(model_cfg, cfg: RunConfig) -> None:
    """Curriculum mode variable: a UserError when the model's positions cannot hold the longest chunk."""
    top, held = cfg.curriculum.max_difficulty if cfg.curriculum else 0, getattr(model_cfg, "seq_length", None)
    if held is not None and held < top:
        kind = "rotary" if getattr(model_cfg, "rotary", False) else "learned"
        raise UserError(
            f"curriculum mode variable: the model holds {held} {kind} positions, fewer than the longest chunk "
            f"max_difficulty {top}; give --seq-length {top} (or lower max_difficulty)"
        )


# -- what the loop drives -----------------------------------------------------------------------------
class Engine(Protocol):
    """What :class:`seqwarm.trainer.loop.Run` (and the evaluator and metrics it hands the engine to) uses of
    an engine: :class:`~seqwarm.curriculum.engine.CurriculumEngine` and DeepSpeed's
    :class:`~seqwarm.integrations.deepspeed.curriculum.DeepSpeedEngineAdapter` satisfy it. Optional, read
    with ``getattr``: ``probe_memory(batch)`` (the trial step) and ``loss_scale`` (fp16)."""

    module: Any
    """The wrapped model (its ``training`` flag)."""

    @property
    def progress(self) -> Progress:
        """The clock: optimizer steps applied, samples and tokens trained (all ranks)."""

    @property
    def current_seqlen(self) -> int | None:
        """The length of the step in flight, or of the last one."""

    @property
    def lr(self) -> float | None:
        """The learning rate of the last applied step."""

    @property
    def grad_norm(self) -> float | None:
        """The gradient norm of the last applied step (None: not measured)."""

    @property
    def skipped_steps(self) -> int:
        """Steps whose update an fp16 overflow skipped."""

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        """The model on a full-length batch (evaluation)."""

    def begin_step(self) -> int | None:
        """Decide the length of the optimizer step about to run, once."""

    def cut(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A raw micro-batch cut to the step's length, on the host, and counted."""

    def run(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The forward of a micro-batch :meth:`cut` made (the loss)."""

    def backward(self, loss: torch.Tensor) -> Any: ...

    def update(self) -> bool:
        """Count a micro-batch; after the step's last: clip, the LR from the clock, the optimizer step
        (True when applied). The step stays open."""

    def end_step(self, applied: bool = True) -> Progress:
        """Close the step: the clock advances by its tokens when ``applied``."""

    def stop_reason(self) -> str | None:
        """Why the run is over at the clock (a budget reached), else None."""


class PipelineEngine(Engine, Protocol):
    """An engine that trains a step's micro-batches in one call (DeepSpeed's pipeline)."""

    def train_batch(self, micro_batches: Sequence[Mapping[str, Any]]) -> tuple[float, bool]:
        """Forward, backward and update over the step's cut micro-batches: the mean loss, and whether the
        update was applied. The step stays open."""


@dataclass
class Built:
    """What an engine builder hands the loop."""

    model: torch.nn.Module
    """The unwrapped GPT (what checkpoints and ``seqwarm eval`` hold)."""
    optimizer: Any
    """The torch optimizer (its Adam moments are logged)."""
    engine: Engine
    """What the loop drives (a :class:`PipelineEngine` with ``whole_steps``)."""
    parallelism: str
    """Recorded in config.json: ``none``, ``ddp``, ``fsdp2``, ``deepspeed-zero2``, ..."""
    resolved: dict[str, Any] = field(default_factory=dict)
    """Extra entries of config.json (the DeepSpeed run records its resolved DeepSpeed config)."""
    whole_steps: bool = False
    """The engine trains a step's micro-batches in one call (:meth:`PipelineEngine.train_batch`)."""
    label_style: str = "megatron"
    """The batches the model takes: ``megatron`` (shifted labels) or ``hf`` (labels = inputs; the model shifts)."""


class EngineBuilder(Protocol):
    """A backend: how the model is built, wrapped and stepped, and how it is checkpointed."""

    def data_parallel(self, info: DistInfo) -> tuple[int, int]:
        """This rank's index among the data-parallel replicas, and their number."""

    def curriculum_mode(self, cfg: RunConfig, model_cfg) -> str | None:
        """The curriculum mode this backend's model trains in (:func:`curriculum_mode` on its forward),
        before anything is built; a mode the backend cannot run is refused here."""

    def build(self, model_cfg, cfg: RunConfig, info: DistInfo, device: torch.device, choices: RunChoices) -> Built:
        """The model, optimizer and engine of the run (called once, after seeding)."""

    def checkpointer(self, built: Built, folder: Path, info: DistInfo, keep: int, interval: int = 0) -> Checkpointer:
        """The checkpointer of what :meth:`build` returned, saving every ``interval`` steps."""


class TorchEngineBuilder:
    """The GPT on one device, under DDP, or sharded with FSDP2, driven by a CurriculumEngine."""

    def __init__(self, fsdp: bool = False, compile: bool = False):
        self.fsdp = fsdp
        self.compile = compile

    def data_parallel(self, info: DistInfo) -> tuple[int, int]:
        return info.rank, info.world_size

    def curriculum_mode(self, cfg: RunConfig, model_cfg) -> str | None:
        from seqwarm.trainer.model import GPT

        return curriculum_mode(cfg, GPT.forward, variable=True)

    def build(self, model_cfg, cfg: RunConfig, info: DistInfo, device: torch.device, choices: RunChoices) -> Built:
        from seqwarm.curriculum.engine import CurriculumEngine
        from seqwarm.trainer.model import GPT

        model = GPT(model_cfg).to(device)  # the unwrapped model (sharded in place by FSDP2)
        if self.compile:  # in place (the state dict keeps its keys), before DDP / FSDP2 wrap it
            for module in model.blocks if self.fsdp else [model]:
                module.compile()
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(choices.precision)
        wrapped = wrap_model(model, info, self.fsdp, device, param_dtype=half if device.type == "cuda" else None)
        optimizer = build_optimizer(model, cfg)  # after sharding: FSDP2 params are DTensors
        parallelism = "fsdp2" if self.fsdp else ("ddp" if info.enabled else "none")
        mode = choices.mode
        if mode == "variable":  # rows come at the step's length (seqwarm.data.variable): nothing to cut
            variable_positions(model_cfg, cfg)
            cfg = replace(cfg, curriculum=None)  # the engine passes each batch as it is, counting B x L tokens
            mode = None  # (SequenceLengthWarmup's mode "variable" is the sampler of a loop of one's own)
        engine = CurriculumEngine(  # seqwarm's windows: dense rows
            wrapped, optimizer, cfg, layout="dense", mode=mode, precision=choices.precision
        )
        return Built(model, optimizer, engine, parallelism, resolved={"compile": self.compile})

    def checkpointer(
        self, built: Built, folder: Path, info: DistInfo, keep: int, interval: int = 0
    ) -> TorchCheckpointer:
        return TorchCheckpointer(
            folder, built.model, built.optimizer, built.engine, info=info, keep=keep, interval=interval, fsdp=self.fsdp
        )
