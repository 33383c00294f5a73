"""DeepSpeed integration: ``curriculum`` (``DeepSpeedCurriculum``, which gives a DeepSpeed ZeRO or pipeline
engine back the sequence-length curriculum), ``engine_config`` (``deepspeed_config``: what
``deepspeed.initialize`` is handed), ``run`` (``seqwarm train --deepspeed``) and ``pipeline`` (seqwarm's GPT
as pipeline stages).

The public names of ``curriculum`` and ``engine_config`` are re-exported here and imported on
first access: importing this package imports neither torch nor deepspeed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_deepspeed_optimizer": "engine_config",
    "deepspeed_config": "engine_config",
    "DEEPSPEED_VERSION": "curriculum",
    "DeepSpeedCurriculum": "curriculum",
    "DeepSpeedEngineAdapter": "curriculum",
    "is_pipeline_engine": "curriculum",
    "require_deepspeed": "curriculum",
    "skip_cpu_shm_comm": "engine_config",
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
