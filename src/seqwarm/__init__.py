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

from seqwarm.config import ConfigError, LRConfig, RunConfig, load_config
from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.lr import lr_at
from seqwarm.curriculum.plan import make_plan
from seqwarm.curriculum.schedule import CurriculumScheduler, difficulty_at
from seqwarm.util.errors import UserError
from seqwarm.util.version import __version__

_LAZY = {
    "SequenceLengthWarmup": "seqwarm.curriculum.warmup",
    "CurriculumEngine": "seqwarm.curriculum.engine",
    "truncate_batch": "seqwarm.curriculum.batch",
    "reshape_batch": "seqwarm.curriculum.batch",
    "GPT": "seqwarm.trainer.model",
    "GPTConfig": "seqwarm.trainer.model",
    "RunSpec": "seqwarm.run.spec",
    "run_training": "seqwarm.run.training",
    "DeepSpeedCurriculum": "seqwarm.integrations.deepspeed.curriculum",
    "CurriculumTrainer": "seqwarm.integrations.hf.trainer",
}

__all__ = [
    "__version__",
    "ConfigError",
    "CurriculumScheduler",
    "LRConfig",
    "Progress",
    "RunConfig",
    "UserError",
    "difficulty_at",
    "load_config",
    "lr_at",
    "make_plan",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqwarm' has no attribute {name!r}")
