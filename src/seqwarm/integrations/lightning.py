"""PyTorch Lightning integration: ``SequenceLengthWarmupCallback``, the curriculum in one line.

::

    trainer = lightning.pytorch.Trainer(
        callbacks=[SequenceLengthWarmupCallback(min_length=64, max_length=1024, steps=2000)],
        accumulate_grad_batches=4,
    )

The callback holds a :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` built from the same keywords
(``callback.curriculum``) and calls it from Lightning's hooks, in the order of one optimizer step:

- ``on_train_batch_start``: the first micro-batch of an optimizer step begins the step (the length is
  decided there, once, for all ``accumulate_grad_batches`` micro-batches); every micro-batch is cut. No
  callback hook can hand ``training_step`` another batch object, but ``training_step`` receives the very
  object this hook gets: the cut replaces the contents of that dict in place (after the copy to the
  device; the cut copies the kept columns, contiguous, as ``SequenceLengthWarmup.cut`` does).
- ``on_before_optimizer_step`` (after the step's last backward, before ``optimizer.step()``): with
  ``lr=LRConfig(...)``, every param group gets the token-clock LR of this step
  (:func:`~seqwarm.curriculum.inputs.set_lr`).
- ``on_train_batch_end`` of a micro-batch that stepped: the step ends, and the clock moves by the tokens
  cut, summed over the DDP ranks (a step a mixed-precision ``GradScaler`` skipped leaves it where it
  was); ``curriculum/seqlen`` and ``progress/tokens`` go to Lightning's loggers (``pl_module.log``); a
  budget reached (``train_tokens`` ...) stops the Trainer.
- ``state_dict`` / ``load_state_dict``: the curriculum's state, saved in Lightning's checkpoints and
  restored by ``Trainer.fit(ckpt_path=...)``; a resume from a checkpoint without it is refused.
- Stages with ``rope_theta`` / ``rope_scaling``: ``on_fit_start`` (after a checkpoint's state is loaded,
  before the sanity check) finds who sets the positions on the LightningModule — seqwarm's rotary GPT
  (``set_positions``) or a Transformers rotary model inside it (:mod:`seqwarm.integrations.hf.positions`),
  :class:`~seqwarm.curriculum.positions.ModelPositions` — checks every stage on it (a UserError when none
  can be set) and sets the stage the clock is in (a resume); then the first micro-batch of the step a
  stage begins sets its positions, before the forward.

The class is built on first access, and only then is Lightning imported (``lightning.pytorch``, or the
older ``pytorch_lightning`` package where that is the one installed).
"""

from __future__ import annotations

import inspect
from collections.abc import MutableMapping
from typing import Any

import torch

from seqwarm.curriculum.inputs import set_lr
from seqwarm.curriculum.positions import ModelPositions
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.integrations.hf import positions as _hf_positions  # noqa: F401 (registers the Transformers hook)
from seqwarm.util.errors import MissingDependencyError, UserError

__all__ = ["SequenceLengthWarmupCallback", "require_lightning"]

SequenceLengthWarmupCallback: type  # built by the module's __getattr__ on first access (it imports Lightning)

NAME = "SequenceLengthWarmupCallback"


def require_lightning(purpose: str = "seqwarm's Lightning integration") -> Any:
    """``lightning.pytorch`` (or ``pytorch_lightning``), or a MissingDependencyError naming the extra."""
    try:
        import lightning.pytorch as pl
    except ImportError as err:
        if err.name not in (None, "lightning", "lightning.pytorch"):
            raise
        try:
            import pytorch_lightning as pl
        except ImportError as err2:
            if err2.name not in (None, "pytorch_lightning"):
                raise
            raise MissingDependencyError("lightning", "lightning", purpose) from None
    return pl


def _replace_contents(batch: Any, out: Any) -> None:
    """Give ``batch`` (the object ``training_step`` will receive) the contents of its cut ``out``."""
    if isinstance(batch, MutableMapping):
        batch.clear()
        batch.update(out)
    elif isinstance(batch, list):
        batch[:] = out
    else:  # pragma: no cover - refused before the cut
        raise AssertionError(type(batch))


def _check_batch(batch: Any) -> None:
    if not isinstance(batch, MutableMapping):
        raise UserError(
            f"{NAME} cuts each training batch in place before training_step, and needs a dict of tensors "
            f"(input_ids, labels, ...); got a {type(batch).__name__}: return a dict from your Dataset or collate_fn"
        )


def _scaler(trainer: Any) -> Any:
    """The mixed-precision GradScaler of the Trainer (None without one: fp32, bf16)."""
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None)


def _build(pl: Any) -> type:
    class SequenceLengthWarmupCallback(pl.Callback):
        """A Lightning ``Callback`` running seqwarm's sequence-length curriculum in ``Trainer.fit``.

        Takes the keywords of :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` (the schedule:
        ``min_length``, ``max_length``, ``steps``, ``multiple_of``, ...; ``mode``, ``count_tokens_by``,
        ``layout``; ``lr=LRConfig(...)``: the optimizer's LR from the token clock; ``train_tokens`` ...:
        stop there). ``self.curriculum`` is that object (length, clock, LR). Training batches must be
        dicts of tensors; validation batches are not cut (full length). Automatic optimization only.
        """

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__()
            self.curriculum = SequenceLengthWarmup(*args, **kwargs)
            self._positions: ModelPositions | None = None  # found on the LightningModule at on_fit_start
            self._stepped = False
            self._scale: float | None = None

        # -- checks at the start ------------------------------------------------------------------
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self._positions = None  # found again: the module may have changed since the last fit
            self._model_positions(pl_module).loaded()  # a resume inside a stage: its positions before any step

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            slw = self.curriculum
            if not pl_module.automatic_optimization:
                raise UserError(
                    f"{NAME} needs automatic optimization; with manual optimization call a "
                    "SequenceLengthWarmup's begin_step / cut / end_step in training_step yourself"
                )
            if slw.lr_config is not None and trainer.lr_scheduler_configs:
                raise UserError(
                    f"{NAME}(lr=...) sets the learning rate from seqwarm's token clock: return no LR scheduler "
                    "from configure_optimizers (or leave out lr= and keep yours)"
                )
            done = slw.progress.step + slw.skipped_steps
            if trainer.global_step != done:
                raise UserError(
                    f"the Trainer is at optimizer step {trainer.global_step} but {NAME}'s curriculum at step "
                    f"{done}: the checkpoint resumed from holds no {NAME} state (saved without this callback?), "
                    "and the length ramp would start again; resume from a checkpoint saved with the callback"
                )

        def _model_positions(self, pl_module: Any) -> ModelPositions:
            """Who sets the stages' positions on ``pl_module`` (every stage checked on it once)."""
            if self._positions is None:
                self._positions = ModelPositions(pl_module, self.curriculum, NAME)
            return self._positions

        # -- one optimizer step -------------------------------------------------------------------
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            _check_batch(batch)
            slw = self.curriculum
            if not slw.step_open:
                slw.begin_step()
                self._model_positions(pl_module).begun()  # a stage begins with this step: its positions first
            _replace_contents(batch, slw.cut(batch))

        def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
            slw = self.curriculum
            if not slw.step_open:
                return
            self._stepped = True
            lr = slw.step_lr()
            if lr is not None:
                set_lr(optimizer, lr)
            scaler = _scaler(trainer)
            self._scale = float(scaler.get_scale()) if scaler is not None else None

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if not self._stepped:
                return  # a micro-batch of gradient accumulation: the step goes on
            self._stepped = False
            scaler, slw = _scaler(trainer), self.curriculum
            applied = self._scale is None or scaler is None or float(scaler.get_scale()) >= self._scale
            slw.end_step(applied=applied)
            if slw.trained_length is not None:
                pl_module.log("curriculum/seqlen", float(slw.trained_length), on_step=True, on_epoch=False)
            # float64: the logger keeps the count exact (float32 would round it past 16M tokens)
            tokens = torch.tensor(slw.progress.tokens, dtype=torch.float64)
            pl_module.log("progress/tokens", tokens, on_step=True, on_epoch=False)
            if slw.done:
                trainer.should_stop = True

        # -- checkpoints --------------------------------------------------------------------------
        def state_dict(self) -> dict[str, Any]:
            return self.curriculum.state_dict()

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.curriculum.load_state_dict(state_dict)

        def __repr__(self) -> str:
            return f"{NAME}({self.curriculum!r})"

    cls = SequenceLengthWarmupCallback
    cls.__module__, cls.__qualname__ = __name__, NAME  # pickled by name (ddp_spawn)
    cls.__init__.__signature__ = inspect.signature(SequenceLengthWarmup.__init__)  # type: ignore[attr-defined]
    return cls


def __getattr__(name: str) -> Any:
    if name == NAME:  # Lightning is imported here, on first use, not with the module
        cls = _build(require_lightning(NAME))
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
