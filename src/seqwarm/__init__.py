"""seqwarm: sequence-length curriculum learning (sequence length warmup) for GPT pretraining.

The public API; see README.md. Heavy parts (torch model, engine, data) are imported on first use so
that ``import seqwarm`` and the config/plan tools stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from seqwarm.version import __version__

from seqwarm.budget import Progress, advance, should_stop, stop_reason, tokens_per_step
from seqwarm.config import (
    ConfigError,
    CurriculumConfig,
    FP16Config,
    LRConfig,
    OptimizerConfig,
    RunConfig,
    load_config,
)
from seqwarm.curriculum import CurriculumScheduler, difficulty_at
from seqwarm.errors import SeqwarmError, UserError
from seqwarm.lr_schedule import lr_at
from seqwarm.plan import Plan, make_plan

_LAZY = {
    "truncate_batch": "seqwarm.batch",
    "reshape_batch": "seqwarm.batch",
    "count_tokens": "seqwarm.batch",
    "GPT": "seqwarm.model",
    "GPTConfig": "seqwarm.model",
    "CurriculumEngine": "seqwarm.engine",
    "SequenceLengthWarmup": "seqwarm.core",
    "RunSpec": "seqwarm.runner",
    "run_training": "seqwarm.runner",
}

__all__ = [
    "__version__", "ConfigError", "CurriculumConfig", "CurriculumScheduler", "FP16Config", "LRConfig",
    "OptimizerConfig", "Plan", "Progress", "RunConfig", "SeqwarmError", "UserError", "advance",
    "difficulty_at", "load_config", "lr_at", "make_plan", "should_stop", "stop_reason", "tokens_per_step",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'seqwarm' has no attribute {name!r}")
