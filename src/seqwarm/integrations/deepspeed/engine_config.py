"""What DeepSpeed is handed when seqwarm drives it: the ``deepspeed.initialize`` config from a checked run
config (:func:`deepspeed_config`), the optimizer (:func:`build_deepspeed_optimizer`) and the switch for
DeepSpeed's CPU shared-memory op (:func:`skip_cpu_shm_comm`). :mod:`seqwarm.integrations.deepspeed.curriculum`
re-exports all three; this module imports ``deepspeed`` only inside the functions that need it.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from seqwarm.config import RunConfig
from seqwarm.trainer.optim import build_optimizer
from seqwarm.trainer.trackers import TRACKER_BLOCKS
from seqwarm.util.errors import UserError

__all__ = ["build_deepspeed_optimizer", "deepspeed_config", "skip_cpu_shm_comm"]

logger = logging.getLogger(__name__)

# Keys seqwarm owns when it drives DeepSpeed: the optimizer is built by seqwarm (a torch optimizer
# handed to deepspeed.initialize) and the learning rate is a pure function of seqwarm's clock.
_OWNED_KEYS = ("optimizer", "scheduler")


def _zero_stage(ds: Mapping[str, Any]) -> int:
    zero = ds.get("zero_optimization")
    if isinstance(zero, Mapping):
        stage = zero.get("stage", 0)
        return int(stage) if isinstance(stage, (int, float)) and not isinstance(stage, bool) else 0
    return 0


def _offloads_optimizer(ds: Mapping[str, Any]) -> bool:
    zero = ds.get("zero_optimization")
    if not isinstance(zero, Mapping):
        return False
    off = zero.get("offload_optimizer")
    return isinstance(off, Mapping) and off.get("device") in ("cpu", "nvme")


def deepspeed_config(cfg: RunConfig, *, pipeline: bool = False, precision: str | None = None) -> dict[str, Any]:
    """The dict for ``deepspeed.initialize(config=...)`` from a checked :class:`RunConfig`.

    Starts from ``cfg.deepspeed`` (the user's config minus the curriculum and ``seqwarm`` blocks), so
    ZeRO, offload, activation checkpointing, ... pass through untouched (the tensorboard / wandb /
    csv_monitor blocks go to seqwarm's trackers instead, :mod:`seqwarm.trainer.trackers`). seqwarm then sets
    what it resolved itself: the batch sizes (micro batch x accumulation x data-parallel size),
    gradient clipping and precision (``precision``, else the config's: ``--precision`` wins over the file's
    fp16/bf16 blocks). The
    ``optimizer`` and ``scheduler`` blocks are dropped: seqwarm builds the optimizer from the former
    and sets the learning rate from its own clock (the latter's warmup was mapped onto it).
    """
    precision = precision or cfg.precision
    ds = copy.deepcopy(dict(cfg.deepspeed))
    for key in _OWNED_KEYS:
        ds.pop(key, None)
    for key in TRACKER_BLOCKS:  # seqwarm's trackers log them (with Megatron's tags), not DeepSpeed's monitor
        ds.pop(key, None)
    ds["train_batch_size"] = cfg.train_batch_size
    ds["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
    ds["gradient_accumulation_steps"] = cfg.gradient_accumulation_steps
    ds["gradient_clipping"] = float(cfg.gradient_clipping or 0.0)
    for name in ("fp16", "bf16"):
        block = dict(ds.get(name) or {})
        block["enabled"] = precision == name
        if block["enabled"] or name in ds:
            ds[name] = block
    if precision == "fp16":  # seqwarm's view of the fp16 block (loss scaling) is the checked one
        f = cfg.fp16
        ds["fp16"].update(
            loss_scale=f.loss_scale,
            initial_scale_power=f.initial_scale_power,
            loss_scale_window=f.loss_scale_window,
            hysteresis=f.hysteresis,
            consecutive_hysteresis=f.consecutive_hysteresis,
            min_loss_scale=f.min_loss_scale,
        )
    stage = _zero_stage(ds)
    if pipeline and stage > 1:
        raise UserError(
            f"zero_optimization.stage = {stage}: DeepSpeed's pipeline engine supports ZeRO "
            "stage 0 or 1 only; use stage 1 with --pipeline-stages, or drop --pipeline-stages"
        )
    if stage > 0 and cfg.optimizer.type == "SGD":
        ds.setdefault("zero_allow_untested_optimizer", True)  # torch SGD is not on ZeRO's list
    return ds


def build_deepspeed_optimizer(model: torch.nn.Module, cfg: RunConfig, ds_config: Mapping[str, Any]):
    """seqwarm's torch optimizer (:func:`seqwarm.trainer.optim.build_optimizer`), or, when ZeRO offloads the
    optimizer to the CPU and the config does not say ``"zero_force_ds_cpu_optimizer": false``,
    DeepSpeed's ``DeepSpeedCPUAdam`` over the same parameter groups (built on first use by DeepSpeed)."""
    opt = build_optimizer(model, cfg)
    if not _offloads_optimizer(ds_config) or ds_config.get("zero_force_ds_cpu_optimizer") is False:
        return opt
    if not isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        raise UserError(
            "ZeRO-Offload of the optimizer needs Adam/AdamW (DeepSpeedCPUAdam); for another optimizer "
            'add "zero_force_ds_cpu_optimizer": false to the config (slower)'
        )
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
    return DeepSpeedCPUAdam(
        groups,
        lr=cfg.lr.lr,
        betas=cfg.optimizer.betas,
        eps=cfg.optimizer.eps,
        adamw_mode=isinstance(opt, torch.optim.AdamW),
    )


def skip_cpu_shm_comm(deepspeed_module) -> None:
    """On DeepSpeed's CPU accelerator, use plain gloo collectives instead of its shared-memory op.

    That op is C++ compiled on first use (about a minute, once per machine, and a compiler is
    needed); it only speeds up CPU all-reduce. Set ``SEQWARM_DS_SHM_COMM=1`` to keep it.
    """
    if os.environ.get("SEQWARM_DS_SHM_COMM") == "1":
        return
    try:
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() == "cpu":
            deepspeed_module.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except Exception as err:  # noqa: BLE001 - an optimisation switch; never fail a run over it
        logger.debug("could not switch off DeepSpeed's shm comm op: %s", err)
