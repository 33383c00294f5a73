"""Hugging Face Transformers integration: the token-clock LR scheduler and ``CurriculumTrainer``.

- :class:`~seqwarm.curriculum.lr_scheduler.CurriculumLRScheduler` (defined in the curriculum, which a
  plain loop imports; re-exported here under its old name): the token-clock LR as a real torch
  ``LRScheduler``, which the Trainer steps.
- ``CurriculumTrainer`` (built on first access: ``transformers`` is imported only then): a
  ``transformers.Trainer`` whose every micro-batch of an optimizer step is cut to the schedule's
  length for that step. It hooks ``get_batch_samples``, where the Trainer draws all micro-batches of
  an optimizer step before counting ``num_items_in_batch``: the cut happens there, so the loss
  normalisation counts the tokens really trained; the step's LR is set there too. The step ends at
  ``on_step_end`` (not applied when Accelerate skipped it on an fp16 overflow); the budget
  (``train_tokens`` ...) stops training there.

Hugging Face causal LMs shift labels themselves: they need ``labels = input_ids`` batches
(:func:`seqwarm.data.dataset.build_batch` with ``label_style="hf"``). ``CurriculumTrainer`` switches
a seqwarm :class:`~seqwarm.data.dataset.TokenWindows` dataset to that style for a
``PreTrainedModel``; a plain loop passes ``label_style="hf"`` itself (:func:`label_style_for`).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from seqwarm.config import RunConfig
from seqwarm.curriculum.clock import Progress, advance, tokens_per_step
from seqwarm.curriculum.lr import lr_at
from seqwarm.curriculum.lr_scheduler import CurriculumLRScheduler
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.curriculum.stages import stage_at
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.data.dataset import TokenWindows
from seqwarm.integrations.hf.arguments import (
    curriculum_config_for,
    lr_settings_for,
    raw_config,
    trainer_deepspeed_config,
)
from seqwarm.integrations.hf.positions import stage_setter
from seqwarm.util.errors import MissingDependencyError, UserError

__all__ = [
    "CurriculumLRScheduler",
    "CurriculumTrainer",
    "label_style_for",
    "require_transformers",
    "trainer_deepspeed_config",
    "curriculum_config_for",
    "with_curriculum",
]

logger = logging.getLogger(__name__)

CurriculumTrainer: type  # built by the module's __getattr__ on first access (it imports transformers)


def require_transformers(purpose: str = "seqwarm's Hugging Face integration"):
    """``import transformers``, or :class:`~seqwarm.util.errors.MissingDependencyError` naming the extra."""
    try:
        import transformers
    except ImportError as err:
        if err.name in (None, "transformers") or (err.name or "").startswith("transformers."):
            raise MissingDependencyError("transformers", "hf", purpose) from None
        raise
    return transformers


def label_style_for(model: Any) -> str:
    """``"hf"`` for a ``transformers.PreTrainedModel`` (it shifts labels itself), else ``"megatron"``."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return "megatron"
    inner = getattr(model, "module", model)
    return "hf" if isinstance(inner, PreTrainedModel) or isinstance(model, PreTrainedModel) else "megatron"


# -- the DeepSpeed config ---------------------------------------------------------------------------


def _hand_deepspeed_config(args: Any) -> None:
    """Give the Trainer's DeepSpeed plugin the config without seqwarm's keys (rebuilt the way
    ``Trainer`` rebuilds it between hyper-parameter trials)."""
    if not getattr(args, "deepspeed", None):
        return
    raw = raw_config(args.deepspeed)
    ds = trainer_deepspeed_config(raw)
    if ds == raw:
        return
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    args.deepspeed = ds
    args.hf_deepspeed_config = HfTrainerDeepSpeedConfig(ds)
    args.hf_deepspeed_config.trainer_config_process(args)
    args.deepspeed_plugin = DeepSpeedPlugin(hf_ds_config=args.hf_deepspeed_config)


# -- the Trainer ------------------------------------------------------------------------------------


def _budget_note(cfg: RunConfig, steps: int) -> str | None:
    """When the Trainer's ``steps`` and the config's token budget do not end the run together: which ends
    it, and the LR then (tokens as planned at full batches: padding makes the real count smaller)."""
    budget, cur = cfg.train_tokens, cfg.curriculum
    if budget is None or cfg.full_length is None or steps <= 0 or steps > 10_000_000:
        return None
    progress, length = Progress(), cur.min_difficulty if cur is not None else cfg.full_length
    for step in range(1, steps + 1):
        if cur is not None and length < cur.max_difficulty:  # the scheduler's rule, as make_plan follows it
            length = difficulty_at(step, cur)
        progress = advance(progress, cfg.train_batch_size, tokens_per_step(cfg, length), cfg.lr)
        if progress.tokens >= budget:
            if step == steps:
                return None
            lr = lr_at(progress, cfg.lr)
            return (
                f"train_tokens = {budget:,} ends the run at step {step} (at most: padding takes longer), before "
                f"the Trainer's {steps} steps: the LR is then {lr:.3g} ({lr / cfg.lr.lr:.0%} of its peak)"
            )
    lr = lr_at(progress, cfg.lr)
    return (
        f"the Trainer stops after {steps} steps (max_steps / num_train_epochs), before train_tokens = "
        f"{budget:,} (about {progress.tokens:,} tokens by then): the LR is then {lr:.3g} "
        f"({lr / cfg.lr.lr:.0%} of its peak)"
    )


def _clock_scheduler(scheduler: Any) -> Any:
    """The :class:`CurriculumLRScheduler` inside Accelerate's and DeepSpeed's scheduler wrappers."""
    while not isinstance(scheduler, CurriculumLRScheduler) and hasattr(scheduler, "scheduler"):
        scheduler = scheduler.scheduler
    return scheduler


_CLASSES: dict[type, type] = {}


def with_curriculum(trainer_class: type) -> type:
    """A subclass of ``trainer_class`` (``transformers.Trainer`` or any subclass of it, e.g. TRL's
    ``SFTTrainer``) with the curriculum of :class:`CurriculumTrainer`: its constructor takes the same
    ``curriculum=`` and ``inject_via_kwargs=`` keywords. ``CurriculumTrainer`` is
    ``with_curriculum(transformers.Trainer)``."""
    transformers = require_transformers("with_curriculum")
    if not (isinstance(trainer_class, type) and issubclass(trainer_class, transformers.Trainer)):
        raise TypeError(f"with_curriculum needs a transformers.Trainer subclass, got {trainer_class!r}")
    if trainer_class not in _CLASSES:
        _CLASSES[trainer_class] = _build_trainer_class(trainer_class)
    return _CLASSES[trainer_class]


def _build_trainer_class(base: type) -> type:
    transformers = require_transformers("CurriculumTrainer")

    class _CurriculumCallback(transformers.TrainerCallback):
        """End the step (applied unless Accelerate skipped it on an fp16 overflow), and stop at the budget."""

        def __init__(self, trainer: Any):
            self.trainer = weakref.proxy(trainer)  # the trainer holds its callbacks: no reference cycle

        def on_train_begin(self, args, state, control, **kwargs):
            self.trainer._positions_at_clock()  # a resume's state is loaded by now

        def on_step_end(self, args, state, control, **kwargs):
            slw = self.trainer.curriculum
            if slw.step_open:
                slw.end_step(applied=not self.trainer.accelerator.optimizer_step_was_skipped)
            if slw.done:
                control.should_training_stop = True
                if args.save_strategy != "no":
                    control.should_save = True
            return control

    class CurriculumTrainer(base):
        """``transformers.Trainer`` with seqwarm's sequence-length curriculum, token clock and LR.

        ``curriculum``: a DeepSpeed JSON path or dict (read with :func:`~seqwarm.config.load_config`;
        batch keys and optimizer values missing or ``"auto"`` are the Trainer's, values set in both must
        agree) or a :class:`RunConfig` (used as it is); default: the ``deepspeed=`` config of the
        ``TrainingArguments``. The LR runs on seqwarm's token clock: the config's schedule, or where it
        sets none the Trainer's ``learning_rate`` / ``warmup_steps`` / ``lr_scheduler_type``
        (:mod:`seqwarm.integrations.hf.arguments`). The optimizer is the Trainer's (DeepSpeed's with an
        ``optimizer`` block). Batches may be dense, padded on either side, or padding-free
        (:mod:`~seqwarm.curriculum.layouts`): every sequence keeps its first L real tokens, and only real
        tokens are counted. Every other argument is ``Trainer``'s. ``self.curriculum`` is the
        :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup` (clock, length, mode).
        """

        def __init__(self, *args: Any, curriculum: Any = None, inject_via_kwargs: bool = False, **kwargs: Any):
            targs = kwargs.get("args", args[1] if len(args) > 1 else None)
            model = kwargs.get("model", args[0] if args else None)
            if targs is None or model is None:
                raise UserError("CurriculumTrainer needs model= and args= (TrainingArguments)")
            if curriculum is None:
                curriculum = targs.deepspeed
                if not curriculum:
                    raise UserError("CurriculumTrainer needs curriculum= (a DeepSpeed JSON path or dict)")
            optimizers = kwargs.get("optimizers", (None, None))
            if optimizers[1] is not None and not isinstance(optimizers[1], CurriculumLRScheduler):
                raise UserError(
                    "CurriculumTrainer sets the learning rate from seqwarm's token clock: pass "
                    "optimizers=(optimizer, None), not an LR scheduler"
                )
            if label_style_for(model) == "hf":  # HF causal LMs shift labels: give them labels = input_ids
                for key in ("train_dataset", "eval_dataset"):
                    if isinstance(kwargs.get(key), TokenWindows):
                        kwargs[key] = kwargs[key].with_label_style("hf")
                    elif isinstance(kwargs.get(key), dict):
                        kwargs[key] = {
                            k: v.with_label_style("hf") if isinstance(v, TokenWindows) else v
                            for k, v in kwargs[key].items()
                        }
            self._curriculum_source = curriculum
            self.curriculum_config = curriculum_config_for(curriculum, targs)
            _hand_deepspeed_config(targs)
            # seqwarm's windows are packed rows (their EOD position resets are not padding-free sequences)
            layout = "dense" if isinstance(kwargs.get("train_dataset"), TokenWindows) else "auto"
            super().__init__(*args, **kwargs)
            self.curriculum = SequenceLengthWarmup.from_config(
                self.curriculum_config, self.model.forward, inject_via_kwargs=inject_via_kwargs, layout=layout
            )
            # a stage's rope_theta / rope_scaling, set on the model where its first step begins (UserError now
            # for a model they cannot be set on)
            self._set_positions = stage_setter(self.model, self.curriculum.stages.stages, "CurriculumTrainer")
            self._lr_said = False
            self.add_callback(_CurriculumCallback(self))
            # Trainer normalises by labels[..., 1:] only for models whose class name maps to the causal
            # LM loss; GPT2LMHeadModel does not, so it divides by labels that have no target: the loss
            # shrinks by (L - 1) / L, a factor that changes with the curriculum length. Every causal LM
            # shifts its labels: count them the same way.
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            if (
                getattr(self, "_loss_shifts_labels", None) is False
                and type(self.model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
                and not getattr(getattr(self.model, "config", None), "is_encoder_decoder", False)
            ):
                self._loss_shifts_labels = True

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None):
            if self.lr_scheduler is None:
                self._schedule_for(num_training_steps)
                self.lr_scheduler = CurriculumLRScheduler(optimizer or self.optimizer, self.curriculum)
                self._created_lr_scheduler = True
            return self.lr_scheduler

        def _schedule_for(self, num_training_steps: int) -> None:
            """The LR schedule for a run of ``num_training_steps`` (the Trainer's where the config sets
            none), said once at the start with what ends the run when steps and token budget differ."""
            source, slw = self._curriculum_source, self.curriculum
            if not isinstance(source, RunConfig):
                cfg = curriculum_config_for(source, self.args, num_training_steps)
                slw.lr_config, self.curriculum_config = cfg.lr, cfg
                slw.lr = lr_at(slw.progress, cfg.lr)
                note = lr_settings_for(raw_config(source), self.args, num_training_steps)[1]
            else:
                note = None
            budget = _budget_note(self.curriculum_config, num_training_steps)
            if not self._lr_said and self.args.process_index == 0:
                self._lr_said = True
                for line in (note, budget):
                    if line:
                        logger.warning("seqwarm: %s", line)

        def get_batch_samples(self, epoch_iterator, num_batches, device):
            """All micro-batches of one optimizer step, cut to its length (before the Trainer counts
            their label tokens); the step's LR is set from them."""
            batches, num_items = super().get_batch_samples(self._cut_step(epoch_iterator), num_batches, device)
            if batches:
                _clock_scheduler(self.lr_scheduler).step(self.curriculum.step_progress())
            return batches, num_items

        def _cut_step(self, batches):
            """Each batch cut; the first one drawn begins the step (an exhausted iterator begins none)."""
            slw = self.curriculum
            for batch in batches:
                if not slw.step_open:
                    slw.begin_step()
                    if slw.stage_changed and slw.stage is not None:  # also at the first step of a resume
                        self._stage_begins(slw)
                yield slw.cut(batch)

        def _positions_at_clock(self) -> None:
            """The positions of the stage the clock is in (after a resume, as the engine's load_state_dict),
            so that an evaluation before the next step already uses them."""
            found = stage_at(self.curriculum.progress.tokens, self.curriculum.stages.stages)
            if found is not None and self._set_positions is not None:
                self._set_positions(found[1].positions(), found[1].length)

        def _stage_begins(self, slw: SequenceLengthWarmup) -> None:
            """The stage's positions on the model (the same on every rank: from the same clock), said once."""
            if self._set_positions is not None:
                self._set_positions(slw.positions, slw.stage.length)
            if self.args.process_index == 0:
                step = slw.progress.step + 1
                logger.info("seqwarm: step %d: stage %d, %s", step, slw.stages.index + 1, slw.stage.describe())

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if self.curriculum.mode != "inject" or not model.training:
                return super().compute_loss(
                    model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
                )
            length, tokens = inputs.get("curriculum_seqlen"), inputs.get("input_ids")
            loss, outputs = super().compute_loss(
                model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
            )
            if length is not None and isinstance(tokens, torch.Tensor):  # the model ran at that length
                self.curriculum.check_output(outputs, (tokens.shape[0], min(length, tokens.shape[1])))
            return (loss, outputs) if return_outputs else loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            """Every log (so every reporting callback) also gets ``curriculum/seqlen`` and ``progress/tokens``."""
            core = self.curriculum
            summary = "train_runtime" in logs  # the end-of-training summary: about the run, not a step
            if core.trained_length is not None and not summary:
                logs = {**logs, "curriculum/seqlen": core.trained_length, "progress/tokens": core.progress.tokens}
            super().log(logs, start_time)

    CurriculumTrainer.__module__ = __name__
    return CurriculumTrainer


def __getattr__(name: str) -> Any:
    if name == "CurriculumTrainer":  # transformers is imported here, on first use, not with the module
        cls = with_curriculum(require_transformers("CurriculumTrainer").Trainer)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
