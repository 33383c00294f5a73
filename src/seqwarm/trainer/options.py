"""How a run is driven, apart from what it trains: :class:`RunOptions`, what :class:`seqwarm.trainer.loop.Run`
reads besides the recipe (a :class:`~seqwarm.config.RunConfig`). The run layer makes one from its spec
(:func:`seqwarm.run.training.run_options`) and says which of its options the run records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """The options :class:`seqwarm.trainer.loop.Run` reads (see :class:`seqwarm.run.spec.RunSpec` for each one's
    meaning; no defaults here: the run layer's are the only ones)."""

    out: Path
    """The run folder."""
    model_name: str
    """The model as the command named it (a preset, or ``hf:PATH``), recorded under ``model``."""
    seed: int
    device: str
    resume: bool | str
    allow_config_change: bool
    eval_interval: int
    eval_iters: int
    save_interval: int
    keep_checkpoints: int
    log_interval: int
    progress_bar: bool
    tensorboard: bool
    tensorboard_dir: Path | None
    tensorboard_log_interval: int
    log_optimizer_states_to_tensorboard: bool
    wandb_project: str | None
    wandb_run_name: str | None
    exit_duration_in_mins: float | None
    recorded: Mapping[str, Any] = field(default_factory=dict)
    """What ``RUN/config.json`` records under ``options`` (the command's options, as the run layer names them)."""
