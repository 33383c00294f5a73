"""Deprecated: ``seqwarm.core``, the 0.1 module of the curriculum object, kept for one release (removed in 0.3).

Its names moved into :mod:`seqwarm.curriculum` in 0.2; each still works from here, with a
``DeprecationWarning`` naming where it lives now. Nothing in seqwarm imports this module.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_MOVED = {
    # name: (the module it lives in now, the name to use instead)
    "SequenceLengthWarmup": ("seqwarm.curriculum.warmup", "seqwarm.SequenceLengthWarmup"),
    "Limits": ("seqwarm.curriculum.warmup", "seqwarm.curriculum.warmup.Limits"),
    "as_run_config": ("seqwarm.curriculum.run", "seqwarm.curriculum.run.as_run_config"),
    "check_state_format": ("seqwarm.curriculum.inputs", "seqwarm.curriculum.inputs.check_state_format"),
    "set_lr": ("seqwarm.curriculum.inputs", "seqwarm.set_lr"),
    "output_length": ("seqwarm.curriculum.modes", "seqwarm.curriculum.modes.output_length"),
    "resolve_mode": ("seqwarm.curriculum.modes", "seqwarm.curriculum.modes.resolve_mode"),
}

__all__ = sorted(_MOVED)


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'seqwarm.core' has no attribute {name!r}")
    module, instead = _MOVED[name]
    warnings.warn(f"seqwarm.core is deprecated; use {instead}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
