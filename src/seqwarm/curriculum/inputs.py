"""What users hand the curriculum, turned into its parts, and the helpers every engine shares.

:func:`keyword_curriculum` checks ``SequenceLengthWarmup(min_length=..., max_length=..., steps=...)``'s
schedule as DeepSpeed's block (one :class:`~seqwarm.util.problems.ConfigError` naming the keywords);
:func:`set_lr` puts seqwarm's LR on an optimizer; :func:`check_state_format` checks a state dict's tag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from seqwarm.curriculum.run import as_run_config
from seqwarm.curriculum.schedule import CurriculumConfig, validate_curriculum_block
from seqwarm.util.problems import ConfigError, Problem

__all__ = ["SCHEDULES", "as_run_config", "check_state_format", "keyword_curriculum", "set_lr"]
# as_run_config lives in seqwarm.curriculum.run (torch-free); importable from here as before

SCHEDULES = {"linear": "fixed_linear", "root": "fixed_root", "discrete": "fixed_discrete"}
"""The keyword constructor's schedule names -> DeepSpeed's ``schedule_type``."""
_KEYWORD_NAMES = {
    "min_difficulty": "min_length",
    "max_difficulty": "max_length",
    "schedule_config.total_curriculum_step": "steps",
    "schedule_config.difficulty_step": "multiple_of",
    "schedule_config.root_degree": "root_degree",
    "schedule_config.difficulty": "lengths",
    "schedule_config.max_step": "until_steps",
    "schedule_type": "schedule",
}


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every param group gets ``lr * group.get("lr_scale", 1.0)`` (seqwarm owns the learning rate)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def check_state_format(state: Mapping[str, Any], expected: str, owner: str) -> None:
    """Raise ValueError unless ``state["format"]`` is ``expected`` (a state dict of ``owner``)."""
    if state.get("format") != expected:
        raise ValueError(f"not a {owner} state dict (format {state.get('format')!r}, expected {expected!r})")


def keyword_curriculum(
    min_length: Any,
    max_length: Any,
    steps: Any,
    multiple_of: Any,
    schedule: Any,
    root_degree: Any,
    lengths: Any,
    until_steps: Any,
) -> CurriculumConfig:
    """The keyword constructor's schedule, checked like a DeepSpeed block; problems name the keywords."""
    if schedule not in SCHEDULES:
        raise ConfigError(
            [
                Problem(
                    "schedule",
                    schedule,
                    f"must be one of {sorted(SCHEDULES)}",
                    "use 'linear' (recommended), 'root' or 'discrete'",
                )
            ],
            source="SequenceLengthWarmup",
        )
    block: dict[str, Any] = {
        "min_difficulty": min_length,
        "max_difficulty": max_length,
        "schedule_type": SCHEDULES[schedule],
    }
    if schedule == "discrete":
        block["schedule_config"] = {"difficulty": lengths, "max_step": until_steps}
        if isinstance(lengths, (list, tuple)) and lengths and all(isinstance(n, int) for n in lengths):
            block["min_difficulty"] = min(lengths) if min_length is None else min_length  # the lengths' range
            block["max_difficulty"] = max(lengths) if max_length is None else max_length
    else:
        block["schedule_config"] = {
            "total_curriculum_step": steps,
            "difficulty_step": multiple_of,
            **({"root_degree": root_degree} if schedule == "root" else {}),
        }
    block["schedule_config"] = {k: v for k, v in block["schedule_config"].items() if v is not None}
    block = {k: v for k, v in block.items() if v is not None}
    try:
        return validate_curriculum_block(block, path="")
    except ConfigError as err:
        problems = []
        for p in err.problems:
            path = p.path.lstrip(".")
            problems.append(Problem(_KEYWORD_NAMES.get(path, path), p.value, p.rule, p.fix))
        raise ConfigError(problems, source="SequenceLengthWarmup") from None
