"""The checked run config: :class:`RunConfig` and the DeepSpeed optimizer block it holds.

Build it with :func:`seqwarm.config.load_config`; the curriculum's, the LR schedule's and the precision's
parts are their owners' configs (:class:`~seqwarm.curriculum.schedule.CurriculumConfig`,
:class:`~seqwarm.curriculum.lr.LRConfig`, :class:`~seqwarm.curriculum.loss_scale.FP16Config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seqwarm.curriculum.clock import COUNT_TOKENS_BY
from seqwarm.curriculum.loss_scale import DEFAULT_CUDA_PRECISION, PRECISIONS, FP16Config, resolve_precision
from seqwarm.curriculum.lr import LRConfig
from seqwarm.curriculum.schedule import CurriculumConfig
from seqwarm.curriculum.stages import RopeScaling, StageConfig

# the precision rule and the fp16 block live with the loss scaler, the token-counting choices with the clock;
# they keep their names here
__all__ = [
    "COUNT_TOKENS_BY",
    "DEFAULT_CUDA_PRECISION",
    "PRECISIONS",
    "FP16Config",
    "OptimizerConfig",
    "RunConfig",
    "resolve_precision",
]


@dataclass(frozen=True)
class OptimizerConfig:
    """DeepSpeed's optimizer block; seqwarm's own engine builds Adam, AdamW and SGD."""

    type: str = "AdamW"
    """The optimizer's name, as DeepSpeed spells it."""
    lr: float = 6e-4
    """The block's learning rate: the peak unless an ``lr`` setting overrides it."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam's betas."""
    eps: float = 1e-8
    """Adam's epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (biases and norms get none)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """All of the block's params, as given (for DeepSpeed)."""


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs to know, checked. Build it with :func:`seqwarm.config.load_config`."""

    train_batch_size: int
    """Global batch in sequences (micro batch x gradient accumulation x world size)."""
    micro_batch_size: int
    """Sequences per micro-batch on each process."""
    gradient_accumulation_steps: int
    """Micro-batches per optimizer step on each process."""
    world_size: int = 1
    """Data-parallel processes."""
    seq_length: int | None = None
    """The model's full sequence length (defaults to the curriculum's max_difficulty)."""
    gradient_clipping: float = 0.0
    """Clip the global gradient norm to this (0: off)."""
    precision: str = "fp32"
    """One of :data:`PRECISIONS`."""
    precision_named: bool = field(default=True, compare=False)
    """False when the config named no precision (no fp16/bf16 block enabled, no ``precision`` setting):
    then the device decides (:func:`~seqwarm.curriculum.loss_scale.resolve_precision`: bf16 autocast on
    CUDA, fp32 elsewhere)."""
    fp16: FP16Config = field(default_factory=FP16Config)
    """Loss scaling, used when the precision is fp16."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer block."""
    lr: LRConfig = field(default_factory=LRConfig)
    """The learning-rate schedule."""
    curriculum: CurriculumConfig | None = None
    """The sequence-length curriculum (None: every step at full length)."""
    train_tokens: int | None = None
    """Token budget: stop after the first step at which the trained tokens reach it."""
    train_iters: int | None = None
    """Cap on optimizer steps."""
    train_samples: int | None = None
    """Cap on samples (full-length sequences drawn)."""
    count_tokens_by: str = "shape"
    """Count trained tokens by the shaped batch's shape or by its loss_mask (:data:`COUNT_TOKENS_BY`)."""
    compile: bool = False
    """torch.compile seqwarm's GPT (``seqwarm.compile`` / ``--compile``); the numbers stay eager's up to kernel
    rounding."""
    document_masking: bool = False
    """Attention inside each document (documents end at EOD) and positions restarting at each, in training
    and validation (``seqwarm.document_masking`` / ``--document-masking``); seqwarm's GPT, or an ``hf:``
    model through restarting ``position_ids`` (:mod:`seqwarm.integrations.hf.blocks`)."""
    length_bucket: int | None = None
    """Cut each batch to the curriculum length rounded up to a multiple of this, with the loss masked past
    the length (``seqwarm.length_bucket`` / ``--length-bucket``; None: cut to the length itself). The same
    loss and gradients, at most ``ceil(seq_length / length_bucket)`` shapes; truncate mode only."""
    peak_tflops: float | None = None
    """The device's peak TFLOP/s for the model FLOPs utilisation a run logs (``seqwarm.peak_tflops`` /
    ``--peak-tflops``; None: known for a few CUDA devices only, :mod:`seqwarm.trainer.flops`)."""
    stages: tuple[StageConfig, ...] = ()
    """The length schedule after the warmup (``seqwarm.stages`` / ``--stages``): each stage's start in
    tokens, length and rotary position settings, checked (:mod:`seqwarm.curriculum.stages`)."""
    variable_curriculum: str = "schedule"
    """Curriculum mode variable (docs/VARIABLE.md): which bucket length each step draws (``seqwarm.variable_curriculum``
    / ``--variable-curriculum``): ``schedule`` (the curriculum block's schedule caps the length), ``natural``,
    ``grow_p2`` (``variable_cycles`` cycles short to long) or ``linear`` (the cap grows over the budget's steps)."""
    variable_cycles: int = 8
    """Grow-P2's cycles per epoch (``seqwarm.variable_cycles`` / ``--variable-cycles``)."""
    rampup_batch_size: Any = None
    """Megatron's batch-size ramp, kept only to refuse it next to a curriculum."""
    deepspeed: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """The config for DeepSpeed: the input without the curriculum and seqwarm blocks."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Advice found while checking (never an error)."""
    source: str | None = field(default=None, compare=False)
    """The file it was read from (None for a dict)."""

    @property
    def full_length(self) -> int | None:
        if self.seq_length is not None:
            return self.seq_length
        return self.curriculum.max_difficulty if self.curriculum else None

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["warnings"] = list(self.warnings)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunConfig:
        """The config :meth:`to_dict` gave, also after a JSON round trip (a run folder's
        ``config.json`` → ``run``); keys it does not know are left out. Not checked again."""
        names = {f.name for f in dataclasses.fields(cls)}
        vals = {k: v for k, v in d.items() if k in names}
        optimizer = dict(vals.get("optimizer") or {})
        if "betas" in optimizer:
            optimizer["betas"] = tuple(optimizer["betas"])
        vals["fp16"] = FP16Config(**(vals.get("fp16") or {}))
        vals["optimizer"] = OptimizerConfig(**optimizer)
        vals["lr"] = LRConfig(**(vals.get("lr") or {}))
        vals["curriculum"] = CurriculumConfig(**vals["curriculum"]) if vals.get("curriculum") else None
        vals["warnings"] = tuple(vals.get("warnings") or ())
        vals["stages"] = tuple(
            StageConfig(**{**s, "rope_scaling": RopeScaling(**s["rope_scaling"]) if s.get("rope_scaling") else None})
            for s in vals.get("stages") or ()
        )
        return cls(**vals)
