"""The optimizer a run's config asks for (DeepSpeed's optimizer block, built as a torch optimizer)."""

from __future__ import annotations

import torch

from seqwarm.config import RunConfig
from seqwarm.util.errors import UserError

__all__ = ["build_optimizer"]


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


def _fused(params: list[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` when every parameter is a plain CUDA tensor: one kernel for the whole update
    (FSDP2's DTensors and CPU parameters keep the default foreach implementation)."""
    fused = bool(params) and all(type(p) in (torch.Tensor, torch.nn.Parameter) and p.is_cuda for p in params)
    return {"fused": True} if fused else {}
