"""seqwarm: sequence-length curriculum learning (sequence length warmup) for GPT pretraining.

The public API; see README.md. ``SequenceLengthWarmup`` is the curriculum for any loop,
``CurriculumEngine`` adds DeepSpeed's engine duties (accumulation, clipping, the token-clock LR),
``RunSpec`` / ``run_training`` are ``seqwarm train`` as a function. The integrations are reachable from
here too (``seqwarm.DeepSpeedCurriculum``, ``seqwarm.CurriculumTrainer``); ``set_lr`` and
``CurriculumLRScheduler`` put the token-clock LR on a plain loop's optimizer. Names that need torch (or
DeepSpeed, Transformers) are imported on first use, so that ``import seqwarm`` and the config/plan tools
stay fast. Names of the 0.1 API that moved still work for a release, with a ``DeprecationWarning`` naming
the replacement (``_DEPRECATED``; CHANGELOG.md lists them).
"""

from __future__ import annotations

import importlib
import warnings
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
    "set_lr": "seqwarm.curriculum.inputs",
    "CurriculumLRScheduler": "seqwarm.curriculum.lr_scheduler",
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


_DEPRECATED = {
    # 0.1 names of the facade, each still reachable for a release: name -> (its module now, what to use
    # instead); removed in 0.3
    "stop_reason": (
        "seqwarm.curriculum.clock",
        "seqwarm.curriculum.clock.stop_reason (or SequenceLengthWarmup.stop_reason())",
    ),
    "advance": ("seqwarm.curriculum.clock", "seqwarm.curriculum.clock.advance"),
    "should_stop": ("seqwarm.curriculum.clock", "seqwarm.curriculum.clock.should_stop"),
    "tokens_per_step": ("seqwarm.curriculum.clock", "seqwarm.curriculum.clock.tokens_per_step"),
    "count_tokens": ("seqwarm.curriculum.batch", "seqwarm.curriculum.batch.count_tokens"),
    "CurriculumConfig": ("seqwarm.curriculum.schedule", "seqwarm.config.CurriculumConfig"),
    "FP16Config": ("seqwarm.curriculum.loss_scale", "seqwarm.config.FP16Config"),
    "OptimizerConfig": ("seqwarm.config.run", "seqwarm.config.OptimizerConfig"),
    "Plan": ("seqwarm.curriculum.plan", "seqwarm.curriculum.plan.Plan"),
    "SeqwarmError": ("seqwarm.util.errors", "seqwarm.util.errors.SeqwarmError"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name == "CurriculumEngine":  # its hook for Transformers models' rotary positions (a stage's)
            importlib.import_module("seqwarm.integrations.hf.positions")
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _DEPRECATED:
        module, instead = _DEPRECATED[name]
        warnings.warn(f"seqwarm.{name} is deprecated; use {instead}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'seqwarm' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy ones too (deprecated names are left out)."""
    return sorted(set(globals()) | set(__all__))
