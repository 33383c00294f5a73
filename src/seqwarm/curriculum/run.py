"""What the curriculum reads of a run's config, and where a DeepSpeed config is read from.

The curriculum is one layer below :mod:`seqwarm.config` and imports nothing from it. It reads a whole run
config in a few places only, by duck typing: :meth:`SequenceLengthWarmup.from_config
<seqwarm.curriculum.warmup.SequenceLengthWarmup.from_config>` reads :class:`WarmupSettings`,
:class:`~seqwarm.curriculum.engine.CurriculumEngine` reads :class:`EngineSettings` and
:func:`~seqwarm.curriculum.plan.make_plan` reads :class:`PlanSettings`. A
:class:`~seqwarm.config.RunConfig` has all of them; so may anything else.

The entry points that take a DeepSpeed-style dict or JSON path (``SequenceLengthWarmup.from_deepspeed``,
``CurriculumEngine(model, optimizer, config)``, ``DeepSpeedCurriculum``) need the reader of that dialect,
which lives above, in :mod:`seqwarm.config`. The dependency is inverted: ``seqwarm.config`` hands its
``load_config`` to :func:`register_reader` when it is imported, and :func:`as_run_config` calls whatever
was registered. Importing any ``seqwarm.*`` module runs the package's ``__init__`` first, which imports
``seqwarm.config``, so the reader is always there. This module imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from seqwarm.curriculum.clock import Budget
from seqwarm.curriculum.loss_scale import FP16Config
from seqwarm.curriculum.lr import LRConfig
from seqwarm.curriculum.schedule import CurriculumConfig

__all__ = ["EngineSettings", "PlanSettings", "WarmupSettings", "as_run_config", "register_reader"]


@runtime_checkable
class WarmupSettings(Budget, Protocol):
    """What :meth:`~seqwarm.curriculum.warmup.SequenceLengthWarmup.from_config` reads of a run config (with
    its budget, :class:`~seqwarm.curriculum.clock.Budget`)."""

    @property
    def curriculum(self) -> CurriculumConfig | None: ...
    @property
    def length_bucket(self) -> int | None: ...
    @property
    def count_tokens_by(self) -> str: ...
    @property
    def lr(self) -> LRConfig: ...
    @property
    def world_size(self) -> int: ...


class EngineSettings(WarmupSettings, Protocol):
    """What :class:`~seqwarm.curriculum.engine.CurriculumEngine` reads besides: the step's duties and the
    precision (:func:`~seqwarm.curriculum.loss_scale.resolve_precision` reads ``precision`` and
    ``precision_named``)."""

    @property
    def gradient_accumulation_steps(self) -> int: ...
    @property
    def gradient_clipping(self) -> float: ...
    @property
    def precision(self) -> str: ...
    @property
    def precision_named(self) -> bool: ...
    @property
    def fp16(self) -> FP16Config: ...


class PlanSettings(Budget, Protocol):
    """What :func:`~seqwarm.curriculum.plan.make_plan` reads of a run config (with
    :func:`~seqwarm.curriculum.clock.tokens_per_step`)."""

    @property
    def full_length(self) -> int | None: ...
    @property
    def curriculum(self) -> CurriculumConfig | None: ...
    @property
    def lr(self) -> LRConfig: ...
    @property
    def train_batch_size(self) -> int: ...
    @property
    def micro_batch_size(self) -> int: ...
    @property
    def gradient_accumulation_steps(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def length_bucket(self) -> int | None: ...
    @property
    def document_masking(self) -> bool: ...
    @property
    def rampup_batch_size(self) -> Any: ...
    @property
    def warnings(self) -> tuple[str, ...]: ...
    @property
    def stages(self) -> tuple[Any, ...]:
        """The checked stages after the warmup (:class:`~seqwarm.curriculum.stages.StageConfig`), or ()."""


Reader = Callable[..., Any]
"""``read(source, world_size=n)``: a checked run config from a DeepSpeed-style dict or JSON path."""
_reader: Reader | None = None


def register_reader(read: Reader) -> None:
    """Make ``read`` the reader of DeepSpeed configs (:mod:`seqwarm.config` registers ``load_config``)."""
    global _reader
    _reader = read


def as_run_config(config: Any, world_size: int) -> Any:
    """``config`` itself when it is a run config (anything with :class:`WarmupSettings`' attributes, e.g. a
    :class:`~seqwarm.config.RunConfig`), else a DeepSpeed-style dict / JSON path read and checked by the
    registered reader (``seqwarm.config.load_config``) for ``world_size`` data-parallel ranks."""
    if isinstance(config, (Mapping, str, os.PathLike)):
        if _reader is None:  # only when seqwarm's package __init__ did not run, which Python does not allow
            raise RuntimeError("no DeepSpeed config reader is registered: import seqwarm.config first")
        return _reader(config, world_size=world_size)
    if isinstance(config, WarmupSettings):
        return config
    raise TypeError(f"config must be a RunConfig, a dict or a path, got {type(config).__name__}")
