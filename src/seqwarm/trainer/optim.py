"""The optimizer a run's config asks for (DeepSpeed's optimizer block, built as a torch optimizer)."""

from __future__ import annotations

from typing import Any

import torch

from seqwarm.config import RunConfig
from seqwarm.util.errors import UserError

__all__ = ["build_optimizer", "apply_optimizer_settings"]


def build_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """Adam/AdamW/SGD from the config; no weight decay on biases, LayerNorms (1-D tensors)."""
    opt = cfg.optimizer
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    lr = cfg.lr.lr
    if opt.type == "SGD":
        return torch.optim.SGD(groups, lr=lr, momentum=float(opt.params.get("momentum", 0.0)))
    # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
    if opt.type == "Adam" and opt.params.get("adam_w_mode", True) is False:
        return torch.optim.Adam(groups, lr=lr, betas=opt.betas, eps=opt.eps, **_fused(decay + no_decay))
    if opt.type not in ("Adam", "AdamW"):
        raise UserError(
            f"optimizer.type {opt.type!r} runs only under DeepSpeed; seqwarm's own engine builds Adam, AdamW or SGD"
        )
    return torch.optim.AdamW(groups, lr=lr, betas=opt.betas, eps=opt.eps, **_fused(decay + no_decay))


def apply_optimizer_settings(optimizer: Any, cfg: RunConfig) -> None:
    """Set the config's weight decay, betas and eps on an optimizer :func:`build_optimizer` made, after a
    checkpoint's state was loaded into it (``load_state_dict`` brings back the old values): a resume that
    changes them (``--allow-config-change``) trains with the new ones. Other optimizers are left alone."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(optimizer, torch.optim.Optimizer) or not groups or len(groups) != 2:
        return
    opt = cfg.optimizer
    groups[0]["weight_decay"] = opt.weight_decay  # the second group (1-D tensors) never decays
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(opt.betas)
        if "eps" in group:
            group["eps"] = opt.eps


def _fused(params: list[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` when every parameter is a plain CUDA tensor: one kernel for the whole update
    (FSDP2's DTensors and CPU parameters keep the default foreach implementation)."""
    fused = bool(params) and all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_cuda for p in params)
    return {"fused": True} if fused else {}
