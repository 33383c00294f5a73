"""CurriculumEngine: DeepSpeed's curriculum wiring (advance the schedule, inject/shape) for any loop.

DeepSpeed's engine advanced the sequence-length curriculum and passed ``curriculum_seqlen=L`` to the
model on every training forward; DeepSpeed 0.19 removed that. This engine restores it around a plain
``nn.Module`` and optimizer, and also runs the rest of an optimizer step the way DeepSpeed did:
gradient accumulation, clipping, the learning rate (a pure function of the clock), fp16 loss scaling.

    loss = engine(batch)          # or engine(**batch), or engine(input_ids, labels, ...) in inject mode
    engine.backward(loss)         # scales by 1/gradient_accumulation_steps (x loss scale for fp16)
    engine.step()                 # acts only at gradient-accumulation boundaries

Decisions (see docs/ENGINE.md): tokens are counted from the shaped shapes (or loss_mask sums);
samples are full-length sequences drawn from the data; fp16 overflow-skipped steps do not advance
the clock or the curriculum; ``state_dict()`` holds the engine state and the optimizer, not the model.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from seqwarm.batch import batch_shape, reshape_batch, truncate_batch
from seqwarm.budget import Progress, advance, should_stop
from seqwarm.config import FP16Config, RunConfig, load_config
from seqwarm.curriculum import CurriculumScheduler
from seqwarm.lr_schedule import lr_at

__all__ = ["CurriculumEngine", "LossScaler"]

logger = logging.getLogger(__name__)

MODES = ("truncate", "reshape", "inject")
STATE_FORMAT = "seqwarm.engine/1"


class LossScaler:
    """fp16 loss scaling with DeepSpeed's semantics (``loss_scale`` 0 = dynamic).

    Dynamic: start at ``2**initial_scale_power``. On an overflow, use up one unit of hysteresis; when
    none is left, halve the scale (never below ``min_loss_scale``). After ``loss_scale_window``
    overflow-free steps since the last overflow, double it and refill the hysteresis (with
    ``consecutive_hysteresis`` the hysteresis is refilled after every overflow-free step instead).
    Static: the scale never changes, but overflowing steps are still skipped.
    """

    def __init__(self, cfg: FP16Config):
        self.dynamic = not cfg.loss_scale
        self.scale = float(2 ** cfg.initial_scale_power) if self.dynamic else float(cfg.loss_scale)
        self.window = int(cfg.loss_scale_window)
        self.hysteresis = int(cfg.hysteresis)
        self.consecutive_hysteresis = bool(cfg.consecutive_hysteresis)
        self.min_scale = float(cfg.min_loss_scale)
        self.hysteresis_left = self.hysteresis
        self.iteration = 0
        self.last_overflow_iteration = -1

    def update(self, overflow: bool) -> None:
        """Record one optimizer step's outcome and adjust the scale."""
        if self.dynamic:
            if overflow:
                if self.hysteresis_left <= 1:
                    if self.scale <= self.min_scale:
                        logger.warning("fp16 gradient overflow at the minimum loss scale %g: the step is "
                                       "skipped again; the run is likely diverging", self.min_scale)
                    self.scale = max(self.scale / 2.0, self.min_scale)
                else:
                    self.hysteresis_left -= 1
                self.last_overflow_iteration = self.iteration
            else:
                if self.consecutive_hysteresis:
                    self.hysteresis_left = self.hysteresis
                if (self.iteration - self.last_overflow_iteration) % self.window == 0:
                    self.hysteresis_left = self.hysteresis
                    self.scale *= 2.0
        self.iteration += 1

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "hysteresis_left": self.hysteresis_left,
                "iteration": self.iteration, "last_overflow_iteration": self.last_overflow_iteration}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.hysteresis_left = int(state["hysteresis_left"])
        self.iteration = int(state["iteration"])
        self.last_overflow_iteration = int(state["last_overflow_iteration"])


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / FSDP(1) / torch.compile wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in (
                "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    if not grads:
        return torch.zeros(())
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _as_run_config(config: Any) -> RunConfig:
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, (Mapping, str, os.PathLike)):
        return load_config(config, world_size=_world_size())
    raise TypeError(f"config must be a RunConfig, a dict or a path, got {type(config).__name__}")


class CurriculumEngine:
    """Advance the curriculum, deliver its length to the model, and step the optimizer.

    ``config``: a :class:`~seqwarm.config.RunConfig`, or a DeepSpeed-style dict / JSON path (read
    with :func:`~seqwarm.config.load_config`). The engine owns the learning rate: every optimizer
    step it sets each param group's ``lr`` to ``lr_at(clock) * group.get("lr_scale", 1.0)``.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, config: Any):
        self.module = model
        self.optimizer = optimizer
        self.config = _as_run_config(config)
        cfg = self.config
        cur = cfg.curriculum
        self.scheduler = CurriculumScheduler(cur) if cur is not None and cur.enabled else None
        self._signature = inspect.signature(_unwrap(model).forward)
        self.mode = self._resolve_mode(cur.mode if cur is not None else None) if self.scheduler else None
        if cfg.count_tokens_by not in ("shape", "loss_mask"):
            raise ValueError(f"count_tokens_by must be 'shape' or 'loss_mask', got {cfg.count_tokens_by!r}")
        self.gradient_accumulation_steps = int(cfg.gradient_accumulation_steps)
        self.progress = Progress()
        self.micro_steps = 0
        self.skipped_steps = 0
        self.current_seqlen: int | None = None
        self.lr = lr_at(self.progress, cfg.lr)
        self._grad_norm: torch.Tensor | None = None
        self._step_seqlen: int | None = None
        self._pending_samples = 0
        self._pending_tokens: int | torch.Tensor = 0
        self._checked_length = False
        self.loss_scaler = LossScaler(cfg.fp16) if cfg.precision == "fp16" else None
        self._autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self._device_type: str | None = None

    # -- setup ------------------------------------------------------------------------------------
    def _accepts(self, name: str) -> bool:
        return name in self._signature.parameters

    def _resolve_mode(self, mode: str | None) -> str:
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in self._signature.parameters.values())
        if mode is None:
            return "inject" if self._accepts("curriculum_seqlen") else "truncate"
        if mode not in MODES:
            raise ValueError(f"curriculum mode must be one of {MODES} or None (auto), got {mode!r}")
        if mode == "inject" and not (self._accepts("curriculum_seqlen") or takes_kwargs):
            raise ValueError(
                f"curriculum mode 'inject' needs a model whose forward takes curriculum_seqlen; "
                f"{type(_unwrap(self.module)).__name__}.forward{self._signature} does not. "
                "Use mode 'truncate' or 'reshape' (the engine then cuts the batch itself)."
            )
        return mode

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        if self._device_type is None:
            param = next(self.module.parameters(), None)
            self._device_type = param.device.type if param is not None else "cpu"
            if self._autocast_dtype is torch.float16 and self._device_type != "cuda":
                warnings.warn(
                    f"fp16 on {self._device_type}: computing in fp32 (fp16 autocast is meant for "
                    "CUDA); the loss scaler still runs, so overflow handling is the same",
                    RuntimeWarning, stacklevel=3)
        if self._autocast_dtype is torch.float16 and self._device_type != "cuda":
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=self._autocast_dtype)

    # -- the DeepSpeed-like surface ---------------------------------------------------------------
    @property
    def global_steps(self) -> int:
        """Optimizer updates applied (= ``progress.step``; fp16-skipped steps are not counted)."""
        return self.progress.step

    @property
    def grad_norm(self) -> float | None:
        """Total gradient norm (before clipping) of the last applied step; None when not measured."""
        return None if self._grad_norm is None else float(self._grad_norm)

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.scale if self.loss_scaler else 1.0

    @property
    def done(self) -> bool:
        """Whether a budget (train_tokens / train_iters / train_samples) is reached."""
        return should_stop(self.progress, self.config)

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the next :meth:`step` call will update the parameters."""
        return (self.micro_steps + 1) % self.gradient_accumulation_steps == 0

    def train(self, mode: bool = True) -> CurriculumEngine:
        self.module.train(mode)
        return self

    def eval(self) -> CurriculumEngine:
        return self.train(False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model; in training, at the current curriculum length. A lone dict is a batch."""
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            args, kwargs = (), dict(args[0])
        if not self.module.training:
            with self._autocast():
                return self.module(*args, **kwargs)
        tokens_in, mask_in = self._inputs(args, kwargs)
        seqlen = self._seqlen_for_step(tokens_in) if self.scheduler else None
        if seqlen is None or self.mode == "inject":
            length = tokens_in.shape[1] if seqlen is None else min(seqlen, tokens_in.shape[1])
            self._count(tokens_in.shape[0], tokens_in.shape[0] * length,
                        None if mask_in is None else mask_in[:, :length])
            self.current_seqlen = length if seqlen is None else seqlen
            if seqlen is not None:
                kwargs["curriculum_seqlen"] = seqlen
            with self._autocast():
                return self.module(*args, **kwargs)
        if args:
            raise ValueError(
                f"curriculum mode {self.mode!r} shapes a dict batch: call engine(batch) or "
                "engine(**batch), not positional tensors (or use mode 'inject' with a model whose "
                "forward takes curriculum_seqlen)")
        shape = truncate_batch if self.mode == "truncate" else reshape_batch
        shaped = shape(kwargs, seqlen)
        ref = shaped[batch_shape(kwargs)[0]]  # (rows, L): B rows (truncate) or B*S//L rows (reshape)
        self._count(tokens_in.shape[0], ref.shape[0] * ref.shape[1], shaped.get("loss_mask"))
        self.current_seqlen = seqlen
        with self._autocast():
            return self.module(**shaped)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """``loss.backward()`` on ``loss / gradient_accumulation_steps`` (x the fp16 loss scale).

        Dividing here (as DeepSpeed does) makes the accumulated gradient the mean over micro-batches;
        pass the plain per-micro-batch mean loss. Returns ``loss`` unchanged, for logging.
        """
        scale = 1.0 / self.gradient_accumulation_steps
        if self.loss_scaler is not None:
            scale *= self.loss_scaler.scale
        (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
        return loss

    def step(self) -> bool:
        """Count a micro-step; at an accumulation boundary clip, set the LR, step and advance the clock.

        Returns True when the parameters were updated (False off a boundary or on an fp16 overflow).
        """
        self.micro_steps += 1
        if self.micro_steps % self.gradient_accumulation_steps:
            return False
        samples, tokens = self._take_pending()
        self._step_seqlen = None
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        clip = float(self.config.gradient_clipping or 0.0)
        if self.loss_scaler is not None:
            inv_scale = 1.0 / self.loss_scaler.scale
            norm = _total_norm(grads)
            overflow = not bool(torch.isfinite(norm))
            self.loss_scaler.update(overflow)
            if overflow:  # skip: the clock, the curriculum and the LR stay where they are
                self.skipped_steps += 1
                self.optimizer.zero_grad(set_to_none=True)
                return False
            self._grad_norm = norm * inv_scale
            factor = inv_scale
            if clip > 0:  # unscale and clip in one pass
                factor = inv_scale * torch.clamp(clip / (self._grad_norm + 1e-6), max=1.0)
            if grads:
                torch._foreach_mul_(grads, factor)
        elif clip > 0:
            self._grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        new = advance(self.progress, samples, tokens, self.config.lr)
        lr = lr_at(new, self.config.lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress, self.lr = new, lr
        return True

    # -- internals --------------------------------------------------------------------------------
    def _inputs(self, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The token tensor (B, S) and the loss mask (or None) among the forward's arguments."""
        named = dict(kwargs)
        with contextlib.suppress(TypeError):  # arguments the signature rejects fail in the model
            params = self._signature.parameters
            for name, value in self._signature.bind_partial(*args, **kwargs).arguments.items():
                if params[name].kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                elif params[name].kind is not inspect.Parameter.VAR_POSITIONAL:
                    named[name] = value
        tokens = named.get("input_ids")
        if not isinstance(tokens, torch.Tensor):
            tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim() == 2]
            tokens = tensors[0] if tensors else None
        if tokens is None or tokens.dim() != 2:
            raise ValueError("the engine could not find the input tokens: pass a 2-D (batch, seq) tensor "
                             "as input_ids (or as the first tensor argument)")
        mask = named.get("loss_mask")
        if self.config.count_tokens_by == "loss_mask" and not isinstance(mask, torch.Tensor):
            raise ValueError("count_tokens_by 'loss_mask' needs a loss_mask tensor in every training batch")
        return tokens, mask if isinstance(mask, torch.Tensor) else None

    def _seqlen_for_step(self, tokens: torch.Tensor) -> int:
        if self._step_seqlen is None:  # first micro-batch of this optimizer step
            self._step_seqlen = self.scheduler.update_difficulty(self.global_steps + 1)
        if not self._checked_length:
            self._checked_length = True
            top, full = self.scheduler.block["max_difficulty"], tokens.shape[1]
            if top != full:
                warnings.warn(
                    f"curriculum max_difficulty {top} != the batch's sequence length {full}: the "
                    f"curriculum {'never reaches' if top < full else 'stops growing at'} the full "
                    "length; set max_difficulty to the model's sequence length", stacklevel=4)
        return self._step_seqlen

    def _count(self, samples: int, tokens: int, mask: torch.Tensor | None) -> None:
        self._pending_samples += samples
        if self.config.count_tokens_by == "loss_mask":
            self._pending_tokens = self._pending_tokens + mask.detach().sum(dtype=torch.int64)
        else:
            self._pending_tokens += tokens

    def _take_pending(self) -> tuple[int, int]:
        samples, tokens = self._pending_samples, self._pending_tokens
        self._pending_samples, self._pending_tokens = 0, 0
        world = self.config.world_size
        if isinstance(tokens, torch.Tensor):
            dist = torch.distributed
            if world > 1 and dist.is_available() and dist.is_initialized():
                dist.all_reduce(tokens)  # exact: loss masks differ between ranks
                world_tokens = 1
            else:
                world_tokens = world
            return samples * world, int(tokens.item()) * world_tokens
        return samples * world, tokens * world

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self, include_optimizer: bool = True) -> dict[str, Any]:
        """Engine state (clock, scheduler, accumulation position, loss scaler) + the optimizer.

        The model is not included: save ``model.state_dict()`` next to it. Pass
        ``include_optimizer=False`` when the optimizer is checkpointed by other means (FSDP/DCP).
        Save at an accumulation boundary: gradients of a half-accumulated step are in no state dict.
        """
        pending = self._pending_tokens
        state = {
            "format": STATE_FORMAT,
            "progress": self.progress.to_dict(),
            "micro_steps": self.micro_steps,
            "skipped_steps": self.skipped_steps,
            "lr": self.lr,
            "current_seqlen": self.current_seqlen,
            "step_seqlen": self._step_seqlen,
            "pending_samples": self._pending_samples,
            "pending_tokens": int(pending.item()) if isinstance(pending, torch.Tensor) else pending,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler else None,
        }
        if include_optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a CurriculumEngine state dict (format {state.get('format')!r}, "
                             f"expected {STATE_FORMAT!r})")
        self.progress = Progress.from_dict(state["progress"])
        self.micro_steps = int(state["micro_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.lr = float(state["lr"])
        self.current_seqlen = state["current_seqlen"]
        self._step_seqlen = state["step_seqlen"]
        self._pending_samples = int(state["pending_samples"])
        self._pending_tokens = int(state["pending_tokens"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.loss_scaler is not None and state.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])

    def __repr__(self) -> str:
        return (f"CurriculumEngine(mode={self.mode}, step={self.progress.step}, "
                f"tokens={self.progress.tokens}, seqlen={self.current_seqlen}, lr={self.lr:.3g})")
