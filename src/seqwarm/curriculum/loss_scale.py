"""fp16 loss scaling with DeepSpeed's semantics, for :class:`~seqwarm.curriculum.engine.CurriculumEngine`.

:class:`LossScaler` holds the scale the engine multiplies the loss by in ``backward`` and divides the
gradients by in ``step``, and adjusts it from each optimizer step's outcome (overflow or not) the way
DeepSpeed's dynamic loss scaler does: hysteresis, halving on overflow down to ``min_loss_scale``,
doubling after ``loss_scale_window`` clean steps. Its state is part of the engine's ``state_dict``.
It imports no torch: the engine measures the gradients and tells it whether they overflowed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from seqwarm.config import FP16Config

logger = logging.getLogger(__name__)


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
