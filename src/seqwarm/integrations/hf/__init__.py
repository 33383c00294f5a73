"""Hugging Face Transformers integration: ``trainer`` (``CurriculumTrainer``, a ``transformers.Trainer``
whose micro-batches are cut to the curriculum length, and ``CurriculumLRScheduler``, the token-clock LR
scheduler) and ``run`` (``seqwarm train --model hf:PATH``).

The public names of :mod:`seqwarm.integrations.hf.trainer` are re-exported here and imported on first
access: importing this package imports neither torch nor transformers (``CurriculumTrainer`` imports
transformers only when it is first used).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "curriculum_config_for": "arguments",
    "lr_settings_for": "arguments",
    "with_curriculum": "trainer",
    "CurriculumLRScheduler": "trainer",
    "CurriculumTrainer": "trainer",
    "label_style_for": "trainer",
    "require_transformers": "trainer",
    "trainer_deepspeed_config": "arguments",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
