"""Precision for :class:`~seqwarm.curriculum.engine.CurriculumEngine`: the rule, DeepSpeed's fp16 block, loss scaling.

:func:`resolve_precision` is the one rule for what a run trains in when its config names no precision
(every engine and seqwarm's loop use it); :class:`FP16Config` is DeepSpeed's fp16 block (re-exported by
:mod:`seqwarm.config` under its old names).
:class:`LossScaler` holds the scale the engine multiplies the loss by in ``backward`` and divides the
gradients by in ``step``, and adjusts it from each optimizer step's outcome (overflow or not) the way
DeepSpeed's dynamic loss scaler does: hysteresis, halving on overflow down to ``min_loss_scale``,
doubling after ``loss_scale_window`` clean steps. Its state is part of the engine's ``state_dict``.
It imports no torch: the engine measures the gradients and tells it whether they overflowed.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["DEFAULT_CUDA_PRECISION", "PRECISIONS", "FP16Config", "LossScaler", "resolve_precision"]

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
DEFAULT_CUDA_PRECISION = "bf16"
"""What a CUDA run trains in when its config names no precision (fp32 runs at 4-6% MFU on an H100)."""


@dataclass(frozen=True)
class FP16Config:
    """DeepSpeed's fp16 block (dynamic loss scaling when ``loss_scale`` is 0)."""

    enabled: bool = False
    """True when the run's precision is fp16."""
    loss_scale: float = 0.0
    """A static loss scale, or 0 for dynamic scaling."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at 2 ** this."""
    loss_scale_window: int = 1000
    """Steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated before the scale halves."""
    consecutive_hysteresis: bool = False
    """Whether hysteresis counts only consecutive overflows."""
    min_loss_scale: float = 1.0
    """The scale never drops below this."""


class PrecisionSettings(Protocol):
    """What :func:`resolve_precision` reads of a run config (a frozen dataclass, e.g. a ``RunConfig``)."""

    @property
    def precision(self) -> str: ...
    @property
    def precision_named(self) -> bool: ...


C = TypeVar("C", bound=PrecisionSettings)


def resolve_precision(cfg: C, device_type: str, bf16_supported: bool = True, resumed: str | None = None) -> C:
    """``cfg`` with its precision fixed for a device — the one rule, for every engine and the loop: a
    precision the config named is kept; else the precision of the run being resumed (``resumed``: a
    checkpoint keeps what it was trained in); else bf16 on CUDA (when the device supports it) and fp32
    elsewhere. Pure: the caller says what the device is; ``cfg`` is not changed (a copy is returned: a
    dataclass's by ``dataclasses.replace``, any other settings object's by ``copy.copy``)."""
    if cfg.precision_named:
        return cfg
    if resumed is not None:
        return _with_precision(cfg, resumed)
    return _with_precision(cfg, DEFAULT_CUDA_PRECISION if device_type == "cuda" and bf16_supported else "fp32")


def _with_precision(cfg: C, precision: str) -> C:
    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, precision=precision, precision_named=True)
    out = copy.copy(cfg)  # a settings object that only has the attributes (curriculum.run's Protocols)
    out.precision, out.precision_named = precision, True
    return out


class LossScaler:
    """fp16 loss scaling with DeepSpeed's semantics (``loss_scale`` 0 = dynamic).

    Dynamic: start at ``2**initial_scale_power``. On an overflow, use up one unit of hysteresis; when
    none is left, halve the scale (never below ``min_loss_scale``). After ``loss_scale_window``
    overflow-free steps since the last overflow, double it and refill the hysteresis (with
    ``consecutive_hysteresis`` the hysteresis is refilled after every overflow-free step instead).
    Static: the scale never changes, but overflowing steps are still skipped.
    """

    def __init__(self, cfg: FP16Config):
        self.dynamic = not cfg.loss_scale
        self.scale = float(2**cfg.initial_scale_power) if self.dynamic else float(cfg.loss_scale)
        self.window = int(cfg.loss_scale_window)
        self.hysteresis = int(cfg.hysteresis)
        self.consecutive_hysteresis = bool(cfg.consecutive_hysteresis)
        self.min_scale = float(cfg.min_loss_scale)
        self.hysteresis_left = self.hysteresis
        self.iteration = 0
        self.last_overflow_iteration = -1

    def update(self, overflow: bool) -> None:
        """Record one optimizer step's outcome and adjust the scale."""
        if self.dynamic:
            if overflow:
                if self.hysteresis_left <= 1:
                    if self.scale <= self.min_scale:
                        logger.warning(
                            "fp16 gradient overflow at the minimum loss scale %g: the step is "
                            "skipped again; the run is likely diverging",
                            self.min_scale,
                        )
                    self.scale = max(self.scale / 2.0, self.min_scale)
                else:
                    self.hysteresis_left -= 1
                self.last_overflow_iteration = self.iteration
            else:
                if self.consecutive_hysteresis:
                    self.hysteresis_left = self.hysteresis
                if (self.iteration - self.last_overflow_iteration) % self.window == 0:
                    self.hysteresis_left = self.hysteresis
                    self.scale *= 2.0
        self.iteration += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "hysteresis_left": self.hysteresis_left,
            "iteration": self.iteration,
            "last_overflow_iteration": self.last_overflow_iteration,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.hysteresis_left = int(state["hysteresis_left"])
        self.iteration = int(state["iteration"])
        self.last_overflow_iteration = int(state["last_overflow_iteration"])
