"""DeepSpeed integration: give DeepSpeed back the curriculum it removed, for ZeRO and pipeline engines.

DeepSpeed 0.19 dropped the legacy ``curriculum_learning`` block: its engine no longer advances a
sequence-length schedule nor passes ``curriculum_seqlen`` to the model, and a config that still holds
the block is refused. :class:`DeepSpeedCurriculum` does that job next to any DeepSpeed engine, plus
the Megatron-side recipe: tokens counted after the cut and summed over data-parallel ranks, the
token-based learning rate set on the optimizer before every optimizer step, and the pipeline's
``reset_activation_shape()`` whenever the length changes::

    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(cfg))
    curriculum = DeepSpeedCurriculum(engine, cfg)
    for batch in loader:                        # full-length micro-batches
        loss = engine(**curriculum.cut(batch))  # the first micro-batch of a step decides its length
        engine.backward(loss)
        curriculum.step()                       # engine.step(); at a boundary the LR first, the clock after

``seqwarm train --deepspeed`` (:mod:`seqwarm.integrations.deepspeed.run`) is built on the same class;
the GPT pipeline is in :mod:`seqwarm.integrations.deepspeed.pipeline`. The curriculum itself is a
:class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` (``curriculum.slw``), as in
:class:`~seqwarm.curriculum.engine.CurriculumEngine`; this class adds DeepSpeed's side (batch-size checks, the LR
before ``engine.step()`` and whether DeepSpeed applied the step, pipeline activation shapes). No
module outside ``integrations/`` imports this one, and it imports ``deepspeed`` only when a function
needs it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from seqwarm.config import RunConfig
from seqwarm.curriculum.inputs import check_state_format, set_lr
from seqwarm.curriculum.positions import ModelPositions
from seqwarm.curriculum.run import as_run_config
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.integrations.deepspeed.engine_config import build_deepspeed_optimizer, deepspeed_config, skip_cpu_shm_comm
from seqwarm.integrations.hf import positions as _hf_positions  # noqa: F401 (registers the Transformers hook)
from seqwarm.util.errors import MissingDependencyError, UserError

__all__ = [
    "DeepSpeedCurriculum",
    "DeepSpeedEngineAdapter",
    "deepspeed_config",
    "require_deepspeed",
    "build_deepspeed_optimizer",
    "is_pipeline_engine",
    "skip_cpu_shm_comm",
    "DEEPSPEED_VERSION",
]

logger = logging.getLogger(__name__)

DEEPSPEED_VERSION = "0.19.8"
"""The DeepSpeed release the integration is tested with (``pip install 'seqwarm[deepspeed]'``)."""
STATE_FORMAT = "seqwarm.deepspeed_curriculum/1"


def require_deepspeed(purpose: str = "seqwarm train --deepspeed"):
    """``import deepspeed``, or :class:`~seqwarm.util.errors.MissingDependencyError` naming the extra."""
    try:
        import deepspeed
    except ImportError as err:
        if err.name in (None, "deepspeed"):
            raise MissingDependencyError("deepspeed", "deepspeed", purpose) from None
        raise UserError(
            f"deepspeed is installed but does not import ({err}); reinstall it with "
            f"DS_BUILD_OPS=0 pip install 'seqwarm[deepspeed]'"
        ) from err
    return deepspeed


def is_pipeline_engine(engine: Any) -> bool:
    """True for DeepSpeed's ``PipelineEngine`` (it trains whole steps with ``train_batch``)."""
    return callable(getattr(engine, "train_batch", None)) and callable(getattr(engine, "reset_activation_shape", None))


class DeepSpeedCurriculum:
    """The sequence-length curriculum, clock and learning rate next to a DeepSpeed engine.

    ``engine``: what ``deepspeed.initialize`` returned (``DeepSpeedEngine`` or ``PipelineEngine``).
    ``config``: a :class:`~seqwarm.config.RunConfig`, or a DeepSpeed-style dict / JSON path (checked
    with :func:`~seqwarm.config.load_config` for the engine's data-parallel size); its batch sizes
    must be the engine's. ``mode``: truncate | reshape | inject (default: the config's, else inject
    when the model's forward has a parameter named ``curriculum_seqlen``, else truncate; pipelines
    cannot inject). ``inject_via_kwargs``: inject into a forward that reads the length from ``**kwargs``.
    ``layout``: how the batches hold their sequences (:mod:`~seqwarm.curriculum.layouts`; default: read
    from each batch).

    Per micro-batch call :meth:`cut` (on every rank, every pipeline stage included), then :meth:`step`
    instead of ``engine.step()``; a pipeline engine: :meth:`cut` every micro-batch of the step, then
    :meth:`train_batch`. The clock, length and LR are ``curriculum.slw``'s. Stages that set
    ``rope_theta`` / ``rope_scaling`` are set on ``engine.module`` at the step each begins (:meth:`begin_step`)
    and in :meth:`load_state_dict` (``curriculum.positions``: :class:`~seqwarm.curriculum.positions.ModelPositions`);
    a module nothing can set them on is a UserError here.
    """

    def __init__(
        self,
        engine: Any,
        config: Any,
        *,
        mode: str | None = None,
        inject_via_kwargs: bool = False,
        layout: str = "auto",
    ):
        self.engine = engine
        self.pipeline = is_pipeline_engine(engine)
        self.dp_world_size = int(getattr(engine, "dp_world_size", 1) or 1)
        self.config = cfg = as_run_config(config, self.dp_world_size)
        if cfg.world_size != self.dp_world_size:
            raise ValueError(
                f"the config was checked for {cfg.world_size} data-parallel ranks but the engine "
                f"has {self.dp_world_size}: load it with world_size={self.dp_world_size}"
            )
        self._check_batch_sizes()
        forward = None if self.pipeline else getattr(engine, "module", engine).forward
        self.slw = SequenceLengthWarmup.from_config(
            cfg,
            forward,
            mode=mode,
            pipeline=self.pipeline,
            process_group=getattr(engine, "data_parallel_group", None),
            inject_via_kwargs=inject_via_kwargs,
            layout=layout,
        )
        # a stage's rotary positions, set on the wrapped model (every rank: the same clock) when it begins and
        # after a load: seqwarm's GPT (set_positions) or a Transformers model (its hook); none: UserError
        self.positions = ModelPositions(getattr(engine, "module", engine), self.slw, "DeepSpeedCurriculum")
        self.scheduler = self.slw.scheduler
        self.mode = self.slw.mode
        if getattr(engine, "lr_scheduler", None) is not None:
            logger.warning(
                "the DeepSpeed engine has an LR scheduler: seqwarm sets the learning rate before "
                "every step, so drop the config's scheduler block"
            )
        self._pipe_shape: tuple[int, int] | None = None
        self._staged: int | None = None  # engine.global_steps when the 0.1 API's before_step() ran

    # -- setup ------------------------------------------------------------------------------------
    def _check_batch_sizes(self) -> None:
        cfg, eng = self.config, self.engine
        theirs = {}
        for name, ours in (
            ("train_micro_batch_size_per_gpu", cfg.micro_batch_size),
            ("gradient_accumulation_steps", cfg.gradient_accumulation_steps),
        ):
            fn = getattr(eng, name, None)
            if callable(fn):
                value = fn()
                if value != ours:
                    theirs[name] = (value, ours)
        if theirs:
            diff = "; ".join(f"{k}: engine {a}, seqwarm {b}" for k, (a, b) in theirs.items())
            raise ValueError(
                f"the engine's batch sizes differ from the seqwarm config's ({diff}): build the "
                "engine with deepspeed_config(run_config)"
            )

    # -- per micro-batch --------------------------------------------------------------------------
    def cut(self, batch: Mapping[str, Any], *, trim: bool = False) -> dict[str, Any]:
        """The micro-batch at this step's length: cut (truncate / reshape) or with ``curriculum_seqlen``
        added (inject; ``trim``: its columns past the length left out too), and counted; the first
        micro-batch of a step decides its length. On a pipeline engine resets the activation shapes when
        the micro-batch's shape changes. Call it for every training micro-batch, on every rank."""
        self._settle()
        if not self.slw.step_open:
            self.begin_step()
        out = self.slw.cut(batch, trim=trim)
        if self.pipeline:
            self.pipe_shape(self.slw.micro_shape)
        return out

    def begin_step(self) -> int | None:
        """Decide the length of the optimizer step about to run (``slw.begin_step()``), and set a stage's
        rotary positions on the model when one begins with it; :meth:`cut` calls it at a step's first
        micro-batch."""
        length = self.slw.begin_step()
        self.positions.begun()
        return length

    def pipe_shape(self, shape: tuple[int, ...] | None) -> None:
        """A pipeline engine's next micro-batch has this (rows, length): its activation shapes are reset
        when they differ from the last one's. DeepSpeed learns the shape of what passes between stages
        from the first micro-batch after a reset and receives every later one into buffers of that shape,
        so call it before each ``eval_batch`` too (a partial last batch has fewer rows);
        :meth:`cut` calls it for training."""
        if self.pipeline and self._pipe_shape != shape:
            self.engine.reset_activation_shape()
            self._pipe_shape = shape

    def check_output(self, output: Any) -> None:
        """In inject mode, after ``engine(**curriculum.cut(batch))``: raise when the model's output is not
        at the length it was given (see :meth:`~seqwarm.curriculum.warmup.SequenceLengthWarmup.check_output`)."""
        self.slw.check_output(output)

    # -- per optimizer step -----------------------------------------------------------------------
    def _applied(self) -> bool:
        return self.engine.was_step_applied() if hasattr(self.engine, "was_step_applied") else True

    def step(self) -> None:
        """``engine.step()``; at a gradient-accumulation boundary the step's learning rate
        (``lr_at(clock including this step) * group.get("lr_scale", 1)``) is set on every param group
        first, and the clock advances after — unless DeepSpeed skipped the step on an fp16 overflow
        (then the clock, the curriculum and the LR stay where they were)."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        applied = self.update()
        if boundary:
            self.slw.end_step(applied=applied)

    def update(self) -> bool:
        """:meth:`step` without closing the curriculum's step (``slw.end_step(applied)`` does): the LR set at
        a boundary, ``engine.step()``. True when a step's parameters were updated."""
        boundary = self.engine.is_gradient_accumulation_boundary()
        if boundary:
            set_lr(self.engine.optimizer, self.slw.step_lr())
        self.engine.step()
        return boundary and self._applied()

    def train_batch(self, micro_batches: Any, *, end: bool = True) -> Any:
        """A pipeline engine's optimizer step over micro-batches :meth:`cut` already made (in DeepSpeed's
        pipeline layout): the LR set, ``engine.train_batch``, the clock advanced (``end=False``: the step
        stays open for ``slw.end_step``). Returns its loss."""
        set_lr(self.engine.optimizer, self.slw.step_lr())
        loss = self.engine.train_batch(iter(micro_batches))
        if end:
            self.slw.end_step(applied=self._applied())
        return loss

    def before_eval(self) -> None:
        """Before a full-length evaluation: a pipeline engine's activation shapes are reset (and again
        at the next training micro-batch; between evaluation batches of another shape, :meth:`pipe_shape`).
        Nothing to do for other engines."""
        if self.pipeline:
            self.engine.reset_activation_shape()
            self._pipe_shape = None

    # -- checkpointing ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Clock, scheduler, LR and step bookkeeping (small; put it in ``client_state``). Save between
        optimizer steps: the model and optimizer are DeepSpeed's to save."""
        self._settle()
        return {"format": STATE_FORMAT, **self.slw.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_state_format(state, STATE_FORMAT, "DeepSpeedCurriculum")
        self.slw.load_state_dict(state)
        self.positions.loaded()  # the rotary tables are not in a checkpoint: the clock's stage set again
        self._pipe_shape = None
        self._staged = None

    def __repr__(self) -> str:
        return f"DeepSpeedCurriculum(pipeline={self.pipeline}, {self.slw!r})"

    # -- the 0.1 API, kept for one release (DeprecationWarning; removed in 0.3) --------------------
    def shape(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Deprecated: :meth:`cut`."""
        _deprecated("DeepSpeedCurriculum.shape(batch)", "DeepSpeedCurriculum.cut(batch)")
        return self.cut(batch)

    @property
    def done(self) -> bool:
        """Deprecated: ``curriculum.slw.done``."""
        _deprecated("DeepSpeedCurriculum.done", "DeepSpeedCurriculum.slw.done")
        self._settle()
        return self.slw.done

    def before_step(self) -> float | None:
        """Deprecated: :meth:`step` (which calls ``engine.step()`` itself). The 0.1 loop called this right
        before ``engine.step()`` (a pipeline: before ``engine.train_batch()``): at a gradient-accumulation
        boundary it sets the step's LR and returns it (None off a boundary); the clock advances once the
        engine has stepped (not when DeepSpeed skipped the step), at the next :meth:`cut`, ``done`` or
        :meth:`state_dict`."""
        _deprecated("DeepSpeedCurriculum.before_step(); engine.step()", "DeepSpeedCurriculum.step()")
        self._settle()
        if not self.pipeline and not self.engine.is_gradient_accumulation_boundary():
            return None
        lr = self.slw.step_lr()
        set_lr(self.engine.optimizer, lr)
        self._staged = int(self.engine.global_steps)
        return lr

    def _settle(self) -> None:
        """End the step a :meth:`before_step` opened, once the engine has taken it."""
        if self._staged is not None and int(self.engine.global_steps) != self._staged:
            self._staged = None
            self.slw.end_step(applied=self._applied())


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)


class DeepSpeedEngineAdapter:
    """A DeepSpeed engine with :class:`~seqwarm.curriculum.engine.CurriculumEngine`'s surface (``begin_step``, ``cut``,
    ``run``, ``backward``, ``update``, ``end_step``, the clock), so that :class:`seqwarm.trainer.loop.Run`'s loop,
    logging and evaluation drive it unchanged (:class:`seqwarm.trainer.backends.Engine`)."""

    def __init__(self, ds_engine: Any, config: RunConfig, *, mode: str | None = None):
        self.module = ds_engine
        self.curriculum = DeepSpeedCurriculum(ds_engine, config, mode=mode, layout="dense")
        self.slw = self.curriculum.slw
        self.config = self.curriculum.config
        self.mode = self.slw.mode

    # the clock: the SequenceLengthWarmup's
    progress = property(lambda self: self.slw.progress)
    global_steps = property(lambda self: self.slw.progress.step)
    current_seqlen = property(lambda self: self.slw.current_seqlen)
    lr = property(lambda self: self.slw.lr)
    skipped_steps = property(lambda self: self.slw.skipped_steps)
    done = property(lambda self: self.slw.done)

    def stop_reason(self) -> str | None:
        return self.slw.stop_reason()

    @property
    def grad_norm(self) -> float | None:
        """DeepSpeed's global gradient norm of the last step (before clipping), when it measured one."""
        norm = self.module.get_global_grad_norm()
        return None if norm is None else float(norm)

    def train(self, mode: bool = True) -> DeepSpeedEngineAdapter:
        self.module.train(mode)  # DeepSpeed's train() sets the wrapped model's mode only:
        self.module.training = mode  # keep the engine's own flag in step (evaluate() reads it)
        return self

    def eval(self) -> DeepSpeedEngineAdapter:
        self.curriculum.before_eval()
        return self.train(False)

    def begin_step(self) -> int | None:
        return self.curriculum.begin_step()

    def cut(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The loop's cut, made on the host before the copy (inject mode: trimmed to the length too)."""
        return self.curriculum.cut(batch, trim=True)

    def run(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The engine's forward on a micro-batch :meth:`cut` already made (checked in inject mode)."""
        out = self.module(**batch)
        if self.module.training:
            self.curriculum.check_output(out)
        return out

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        if not self.module.training:
            return self.module(**batch)
        return self.run(self.cut(batch))

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        self.module.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps
        return loss

    def step(self) -> None:
        self.curriculum.step()

    def _applied(self) -> bool:
        return self.curriculum._applied()  # DeepSpeed skips an update on an fp16 overflow

    def update(self) -> bool:
        """DeepSpeed's ``step()`` (it counts the micro-batch), the LR set first at the step's last micro-batch:
        :meth:`DeepSpeedCurriculum.update`. True when the parameters were updated; the step stays open
        (:meth:`end_step` closes it)."""
        return self.curriculum.update()

    def end_step(self, applied: bool = True) -> Any:
        """Close the step in flight: the clock advances by its tokens when ``applied``."""
        return self.slw.end_step(applied=applied)

    def state_dict(self) -> dict[str, Any]:
        return self.curriculum.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.curriculum.load_state_dict(state)
