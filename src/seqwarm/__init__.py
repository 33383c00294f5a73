"""seqwarm: sequence-length curriculum learning (sequence length warmup) for GPT pretraining.

The public API; see README.md. ``SequenceLengthWarmup`` is the curriculum for any loop,
``CurriculumEngine`` adds DeepSpeed's engine duties (accumulation, clipping, the token-clock LR),
``RunSpec`` / ``run_training`` are ``seqwarm train`` as a function. The integrations are reachable from
here too (``seqwarm.DeepSpeedCurriculum``, ``seqwarm.CurriculumTrainer``). Names that need torch (or
DeepSpeed, Transformers) are imported on first use, so that ``import seqwarm`` and the config/plan tools
stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from seqwarm.budget import Progress
from seqwarm.config import ConfigError, LRConfig, RunConfig, load_config
from seqwarm.curriculum import CurriculumScheduler, difficulty_at
from seqwarm.errors import UserError
from seqwarm.lr_schedule import lr_at
from seqwarm.plan import make_plan
from seqwarm.version import __version__

_LAZY = {
    "SequenceLengthWarmup": "seqwarm.core",
    "CurriculumEngine": "seqwarm.engine",
    "truncate_batch": "seqwarm.batch",
    "reshape_batch": "seqwarm.batch",
    "GPT": "seqwarm.model",
    "GPTConfig": "seqwarm.model",
    "RunSpec": "seqwarm.runner",
    "run_training": "seqwarm.runner",
    "DeepSpeedCurriculum": "seqwarm.integrations.deepspeed",
    "CurriculumTrainer": "seqwarm.integrations.hf",
}

__all__ = [
    "__version__", "ConfigError", "CurriculumScheduler", "LRConfig", "Progress", "RunConfig", "UserError",
    "difficulty_at", "load_config", "lr_at", "make_plan", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqwarm' has no attribute {name!r}")
