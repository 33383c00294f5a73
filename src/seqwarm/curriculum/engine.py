"""CurriculumEngine: DeepSpeed's curriculum wiring (advance the schedule, inject/shape) for any loop.

DeepSpeed's engine advanced the sequence-length curriculum and passed ``curriculum_seqlen=L`` to the
model on every training forward; DeepSpeed 0.19 removed that. This engine restores it around a plain
``nn.Module`` and optimizer, and also runs the rest of an optimizer step the way DeepSpeed did:
gradient accumulation, clipping, the learning rate (a pure function of the clock), fp16 loss scaling
(:class:`~seqwarm.curriculum.loss_scale.LossScaler`).

    loss = engine(batch)          # or engine(**batch), or engine(input_ids, labels, ...) in inject mode
    engine.backward(loss)         # scales by 1/gradient_accumulation_steps (x loss scale for fp16)
    engine.step()                 # acts only at gradient-accumulation boundaries

The curriculum itself (the length decided once per optimizer step, the one cut per micro-batch, the
token clock) is a :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` (``engine.slw``). A loop that cuts its
micro-batches itself, before they reach the device (seqwarm's own), calls ``engine.begin_step()``,
``engine.cut(batch)`` per micro-batch and ``engine.run(cut_batch)`` instead of ``engine(batch)``.

Decisions (see docs/ENGINE.md): tokens are counted from the shaped shapes (or loss_mask sums);
samples are full-length sequences drawn from the data; fp16 overflow-skipped steps do not advance
the clock or the curriculum; ``state_dict()`` holds the engine state and the optimizer, not the model.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.inputs import check_state_format, set_lr
from seqwarm.curriculum.loss_scale import LossScaler, resolve_precision
from seqwarm.curriculum.positions import position_setters
from seqwarm.curriculum.run import EngineSettings, as_run_config
from seqwarm.curriculum.stages import refuse_positions, sets_positions, stage_at
from seqwarm.curriculum.warmup import SequenceLengthWarmup

__all__ = ["CurriculumEngine", "bf16_supported"]

STATE_FORMAT = "seqwarm.engine/1"
_NO_SETTER = "no set_positions, no positions hook; for Hugging Face models: import seqwarm.integrations.hf.positions"


def _unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel / FSDP(1) / torch.compile wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and type(model).__name__ in (
            "DistributedDataParallel",
            "DataParallel",
            "FullyShardedDataParallel",
        ):
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


def bf16_supported(device_type: str) -> bool:
    """Whether bf16 autocast is fast on this device type (Ampere or later on CUDA)."""
    if device_type != "cuda":
        return True
    try:
        return bool(torch.cuda.is_bf16_supported())
    except (RuntimeError, AssertionError):  # no driver: the device decides nothing
        return False


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class CurriculumEngine:
    """Advance the curriculum, deliver its length to the model, and step the optimizer.

    ``config``: a :class:`~seqwarm.config.RunConfig` (what it reads:
    :class:`~seqwarm.curriculum.run.EngineSettings`), or a DeepSpeed-style dict / JSON path (read with
    :func:`~seqwarm.config.load_config`). The engine owns the learning rate: every optimizer step it sets
    each param group's ``lr`` to ``lr_at(clock) * group.get("lr_scale", 1.0)``.
    The curriculum itself (mode, length per step, token counts, clock) is a
    :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup`, ``engine.slw``. ``process_group``: where
    ``count_tokens_by: loss_mask`` counts are summed (None: the default group; pass the data-parallel group when the
    default group also spans model-parallel ranks). ``mode``: the curriculum mode (None: the config's, else
    chosen from the model's forward). ``precision``: the precision to train in (None: the config's, else the
    device's: :func:`~seqwarm.config.resolve_precision`). ``inject_via_kwargs``: inject ``curriculum_seqlen`` into a
    forward that reads it from ``**kwargs`` (DeepSpeed's legacy test models); without it only a
    forward with a parameter named ``curriculum_seqlen`` is injected into. In inject mode every
    training output is checked against the length (a model that ignores it is an error). ``layout``: how
    the batches hold their sequences (:mod:`~seqwarm.curriculum.layouts`; default: read from each batch).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Any,
        *,
        process_group: Any = None,
        inject_via_kwargs: bool = False,
        layout: str = "auto",
        mode: str | None = None,
        precision: str | None = None,
    ):
        self.module = model
        self.optimizer = optimizer
        param = next(model.parameters(), None)
        device_type = param.device.type if param is not None else "cpu"
        cfg: EngineSettings = as_run_config(config, _world_size())
        self.config = cfg
        if precision is None:  # a config that names no precision trains in bf16 on CUDA (the device decides)
            self.config = cfg = resolve_precision(cfg, device_type, bf16_supported(device_type))
        self.precision: str = precision or cfg.precision
        forward = _unwrap(model).forward
        self._signature = inspect.signature(forward)
        self._input_places: dict[tuple, dict[str, int | str]] = {}  # call shape -> where the tokens are
        self.slw = SequenceLengthWarmup.from_config(
            cfg, forward, mode=mode, process_group=process_group, inject_via_kwargs=inject_via_kwargs, layout=layout
        )
        self.scheduler = self.slw.scheduler
        self.mode = self.slw.mode
        # who sets a stage's rotary positions (seqwarm's GPT: set_positions; a registered hook: HF models)
        stages = self.slw.stages.stages
        self._rotary = position_setters(model, stages) if sets_positions(stages) else []
        if not self._rotary:
            refuse_positions(self.slw.stages.stages, f"CurriculumEngine ({_NO_SETTER})")
        self.gradient_accumulation_steps = int(cfg.gradient_accumulation_steps)
        self.micro_steps = 0
        self._grad_norm: torch.Tensor | None = None
        self.loss_scaler = LossScaler(cfg.fp16) if self.precision == "fp16" else None
        self._autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        self._device_type: str | None = None
        # a torch.compile'd model (in place, or some of its blocks) gets the sequence dimension of the
        # shaped batch marked dynamic: one graph for every curriculum length instead of one per length
        # (with dynamic=False Dynamo would hit its recompile limit and fall back to eager)
        self._mark_dynamic = any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())

    # -- setup ------------------------------------------------------------------------------------
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
                    RuntimeWarning,
                    stacklevel=3,
                )
        if self._autocast_dtype is torch.float16 and self._device_type != "cuda":
            return contextlib.nullcontext()
        return torch.autocast(self._device_type, dtype=self._autocast_dtype)

    def _gradient_sync(self) -> contextlib.AbstractContextManager:
        """Reduce gradients across ranks only on the boundary micro-batch: one all-reduce per optimizer step.

        DDP decides in its forward whether the coming backward all-reduces (``no_sync`` around the
        forward is enough); FSDP2 reads ``set_requires_gradient_sync`` in its backward hooks.
        """
        boundary = self.is_gradient_accumulation_boundary()
        set_sync = getattr(self.module, "set_requires_gradient_sync", None)  # FSDP2 (fully_shard)
        if callable(set_sync):
            set_sync(boundary)
        elif not boundary and callable(getattr(self.module, "no_sync", None)):  # DDP
            return self.module.no_sync()
        return contextlib.nullcontext()

    # -- the DeepSpeed-like surface ---------------------------------------------------------------
    # the clock and the curriculum are the SequenceLengthWarmup's
    progress = property(lambda self: self.slw.progress, doc="Steps, samples and tokens trained (all ranks).")
    lr = property(lambda self: self.slw.lr, doc="The learning rate of the last applied step.")
    current_seqlen = property(lambda self: self.slw.current_seqlen, doc="This step's curriculum length.")
    skipped_steps = property(lambda self: self.slw.skipped_steps, doc="Steps skipped on an fp16 overflow.")

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
        return self.stop_reason() is not None

    def stop_reason(self) -> str | None:
        """Why training is over at the clock (a budget reached), else None."""
        return self.slw.stop_reason()

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

    def begin_step(self) -> int | None:
        """Decide the length of the optimizer step about to run (once); None without a curriculum.
        :meth:`forward` and :meth:`cut` begin a step themselves when none is in flight."""
        length = self.slw.begin_step()
        if self.slw.stage_changed:  # a stage begins (or the first step after a load inside one)
            self._set_positions(self.slw.positions, self.slw.stage.length if self.slw.stage else None)
        return length

    def _set_positions(self, positions: Mapping[str, Any] | None, length: int | None) -> None:
        """A stage's rotary settings on the model (every rank computes the same from the same clock)."""
        if positions is not None:
            for setter in self._rotary:
                setter(positions, length)

    def cut(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A training micro-batch cut to the step's length (in inject mode: its first L columns, with
        ``curriculum_seqlen`` added), counted: :meth:`~seqwarm.curriculum.warmup.SequenceLengthWarmup.cut` with
        ``trim=True``, for a loop that cuts on the host before the copy. Hand the result to :meth:`run`."""
        if not self.slw.step_open:
            self.begin_step()
        return self.slw.cut(batch, trim=True)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model; in training, on the micro-batch cut to the current curriculum length (a lone dict
        is a batch). Cut here: pass full-length batches (a batch cut already goes to :meth:`run`)."""
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping):
            args, kwargs = (), dict(args[0])
        if not self.module.training:
            return self._call(args, kwargs)
        if not self.slw.step_open:
            self.begin_step()
        if self.mode in ("truncate", "reshape", "window"):
            if args:
                raise ValueError(
                    f"curriculum mode {self.mode!r} shapes a dict batch: call engine(batch) or "
                    "engine(**batch), not positional tensors (or use mode 'inject' with a model whose "
                    "forward takes curriculum_seqlen)"
                )
            kwargs = self.slw.cut(kwargs)
        else:  # inject, or no curriculum: the model gets the batch as it is (+ curriculum_seqlen)
            tokens, mask, labels = self._inputs(args, kwargs)
            seqlen = self.slw.record(tokens.shape[0], tokens.shape[1], mask, labels=labels)
            if seqlen is not None:
                kwargs["curriculum_seqlen"] = seqlen
        return self._call(args, kwargs)

    def run(self, batch: Mapping[str, Any]) -> Any:
        """Run the model on a micro-batch :meth:`cut` already made (in training; not cut or counted again)."""
        return self._call((), dict(batch))

    def _call(self, args: tuple, kwargs: dict) -> Any:
        if not self.module.training:
            with self._autocast():
                return self.module(*args, **kwargs)
        if self._mark_dynamic:
            for value in (*args, *kwargs.values()):
                if isinstance(value, torch.Tensor) and value.dim() >= 2:
                    torch._dynamo.maybe_mark_dynamic(value, 1)
        with self._autocast(), self._gradient_sync():
            out = self.module(*args, **kwargs)
        self.slw.check_output(out)  # inject mode: the model really ran at the length it was given
        return out

    def probe_memory(self, batch: Mapping[str, torch.Tensor]) -> None:
        """One forward + backward on ``batch`` as given (no curriculum shaping), then drop the gradients.

        Run before the first step at the full length and the largest micro-batch, so a run that does
        not fit fails in its first minute, not at the step where the curriculum reaches full length.
        The clock, the curriculum, the accumulation position and the optimizer are untouched; the
        caller restores the RNG (dropout draws from it).
        """
        set_sync = getattr(self.module, "set_requires_gradient_sync", None)
        if callable(set_sync):  # FSDP2: reduce now, so no unsharded gradient is left to accumulate
            set_sync(True)
        was_training = self.module.training
        self.module.train()
        with self._autocast():
            loss = self.module(**batch)
        loss.backward()
        self.optimizer.zero_grad(set_to_none=True)
        self.module.train(was_training)

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
        """Count a micro-step; at an accumulation boundary clip, set the LR, step and advance the clock
        (:meth:`update`, then :meth:`end_step`).

        Returns True when the parameters were updated (False off a boundary or on an fp16 overflow).
        """
        applied = self.update()
        if self.micro_steps % self.gradient_accumulation_steps == 0:
            self.end_step(applied)
        return applied

    def end_step(self, applied: bool = True) -> Progress:
        """Close the optimizer step in flight (``slw.end_step``): the clock advances by its tokens when
        ``applied``; after an fp16 overflow skip (False) nothing moves."""
        return self.slw.end_step(applied=applied)

    def update(self) -> bool:
        """:meth:`step` without ending the step: count a micro-step; at an accumulation boundary clip, set
        the LR from the clock and step the optimizer (on an fp16 overflow drop the gradients instead). A
        loop that ends its steps itself (seqwarm's) calls :meth:`end_step` after it. True when updated."""
        self.micro_steps += 1
        if self.micro_steps % self.gradient_accumulation_steps:
            return False
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        grads = [p.grad for p in params]
        clip = float(self.config.gradient_clipping or 0.0)
        if self.loss_scaler is not None:
            inv_scale = 1.0 / self.loss_scaler.scale
            norm = _total_norm(grads)
            overflow = not bool(torch.isfinite(norm))
            self.loss_scaler.update(overflow)
            if overflow:  # skip: the clock, the curriculum and the LR stay where they are
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
        set_lr(self.optimizer, self.slw.step_lr())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True

    # -- internals --------------------------------------------------------------------------------
    def _inputs(self, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The token tensor (B, S), the loss mask and the labels (or None) among the forward's arguments."""
        shape = (len(args), tuple(kwargs))
        where = self._input_places.get(shape)
        if where is None:
            where = self._places(*shape)
            if len(self._input_places) < 64:  # a loop calls the forward the same way every micro-batch
                self._input_places[shape] = where
        named = {name: args[place] if isinstance(place, int) else kwargs[place] for name, place in where.items()}
        tokens = named.get("input_ids")
        if not isinstance(tokens, torch.Tensor):
            tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim() == 2]
            tokens = tensors[0] if tensors else None
        if tokens is None or tokens.dim() != 2:
            raise ValueError(
                "the engine could not find the input tokens: pass a 2-D (batch, seq) tensor "
                "as input_ids (or as the first tensor argument)"
            )
        mask, labels = named.get("loss_mask"), named.get("labels")
        return (
            tokens,
            mask if isinstance(mask, torch.Tensor) else None,
            labels if isinstance(labels, torch.Tensor) else None,
        )

    def _places(self, n_args: int, keys: tuple) -> dict[str, int | str]:
        """Where ``input_ids``, ``loss_mask`` and ``labels`` are in a call with ``n_args`` positional arguments
        and these keyword names: a positional index or a keyword name. The signature binds positions to names
        alike for every call of one shape, so this is worked out once per shape, on stand-ins."""
        named: dict[str, int | str] = {key: key for key in keys}
        with contextlib.suppress(TypeError):  # arguments the signature rejects fail in the model
            params = self._signature.parameters
            bound = self._signature.bind_partial(*range(n_args), **{key: key for key in keys})
            for name, value in bound.arguments.items():
                if params[name].kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                elif params[name].kind is not inspect.Parameter.VAR_POSITIONAL:
                    named[name] = value
        return {name: named[name] for name in ("input_ids", "loss_mask", "labels") if name in named}

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self, include_optimizer: bool = True) -> dict[str, Any]:
        """Engine state (clock, scheduler, accumulation position, loss scaler) + the optimizer.

        The model is not included: save ``model.state_dict()`` next to it. Pass
        ``include_optimizer=False`` when the optimizer is checkpointed by other means (FSDP/DCP).
        Save at an accumulation boundary: gradients of a half-accumulated step are in no state dict.
        """
        state = {
            "format": STATE_FORMAT,
            **self.slw.state_dict(),
            "micro_steps": self.micro_steps,
            "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler else None,
        }
        if include_optimizer:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_state_format(state, STATE_FORMAT, "CurriculumEngine")
        self.slw.load_state_dict(state)
        self.micro_steps = int(state["micro_steps"])
        if not self.slw.step_open:  # saved between steps: a resume may change the accumulation steps
            self.micro_steps -= self.micro_steps % self.gradient_accumulation_steps
        if self.loss_scaler is not None and state.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(state["loss_scaler"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        # The rotary tables are not saved: set the stage's positions now, so an evaluation before the next
        # step (a run resumed at its budget) uses them. The stage of the clock's tokens is the one the last
        # step trained in, unless a stage starts inside that step (one that never trained).
        found = stage_at(self.slw.progress.tokens, self.slw.stages.stages)
        if found is not None:
            self._set_positions(found[1].positions(), found[1].length)

    def __repr__(self) -> str:
        return (
            f"CurriculumEngine(mode={self.mode}, step={self.progress.step}, "
            f"tokens={self.progress.tokens}, seqlen={self.current_seqlen}, lr={self.lr:.3g})"
        )
