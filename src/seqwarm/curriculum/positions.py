"""Who sets a stage's rotary positions on a model: the setters :class:`~seqwarm.curriculum.engine.CurriculumEngine`
calls at the step a stage begins (and after a load inside one).

A setter is a callable ``setter(positions, length)``: ``positions`` is a stage's
``{"rope_theta": ..., "rope_scaling": {...} | None}`` (:meth:`~seqwarm.curriculum.stages.StageConfig.positions`),
``length`` the stage's length. :func:`position_setters` finds them in a model: every module with a
``set_positions(rope_theta, rope_scaling)`` method whose ``config.rotary`` is true (seqwarm's rotary GPT),
then what the registered hooks give. A hook (:func:`register_positions_hook`) is how a framework layer
above the curriculum teaches it other models without the curriculum importing that framework: the
Hugging Face integration registers one for Transformers' rotary models when
:mod:`seqwarm.integrations.hf.positions` is imported (``from seqwarm import CurriculumEngine`` imports it).
A hook, called with the model and the run's stages, returns a setter for a model it knows, None for one it
does not, and raises :class:`~seqwarm.util.errors.UserError` for a model it knows but cannot set a stage's
positions on (a rotary module it does not recognise), before anything trains. Imports no torch.

:class:`ModelPositions` is the wiring a framework integration adds next to its curriculum
(:class:`~seqwarm.integrations.deepspeed.curriculum.DeepSpeedCurriculum`, the Lightning callback): the
setters found once (or a :class:`~seqwarm.util.errors.UserError` when the stages set positions and nothing
can), applied at the step a stage begins and after a checkpoint load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seqwarm.curriculum.stages import StageConfig, refuse_positions, sets_positions, stage_at

__all__ = ["ModelPositions", "PositionSetter", "PositionsHook", "position_setters", "register_positions_hook"]

NO_SETTER = "no set_positions, no positions hook; for Hugging Face models: import seqwarm.integrations.hf.positions"

PositionSetter = Callable[[Mapping[str, Any], "int | None"], None]
PositionsHook = Callable[[Any, Sequence[StageConfig]], "PositionSetter | None"]

_HOOKS: list[PositionsHook] = []


def register_positions_hook(hook: PositionsHook) -> None:
    """Ask ``hook(model)`` for a setter of every model without its own ``set_positions`` (once per hook)."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)


def _own(module: Any) -> PositionSetter:
    def setter(positions: Mapping[str, Any], length: int | None = None) -> None:
        module.set_positions(positions["rope_theta"], positions["rope_scaling"])

    return setter


def position_setters(model: Any, stages: Sequence[StageConfig] = ()) -> list[PositionSetter]:
    """The setters of ``model`` (an ``nn.Module``, wrappers included): its modules' own ``set_positions``
    (seqwarm's rotary GPT), else the first registered hook's (``hook(model, stages)``, which may check each
    of ``stages`` now); empty when nothing can set its positions."""
    own = [
        _own(m)
        for m in model.modules()
        if callable(getattr(m, "set_positions", None)) and getattr(getattr(m, "config", None), "rotary", False)
    ]
    if own:
        return own
    for hook in _HOOKS:
        setter = hook(model, stages)
        if setter is not None:
            return [setter]
    return []


class ModelPositions:
    """The stages' rotary positions set on ``model`` for the curriculum ``slw`` (a
    :class:`~seqwarm.curriculum.warmup.SequenceLengthWarmup`): :meth:`begun` after each ``slw.begin_step()``,
    :meth:`loaded` after ``slw.load_state_dict``. Built when the stages set positions: every stage is checked
    on the model now (:func:`position_setters`), and a model nothing can set them on is a UserError naming
    ``who``. Stages with lengths only need nothing (no setter is looked for)."""

    def __init__(self, model: Any, slw: Any, who: str):
        self.slw = slw
        stages = slw.stages.stages
        self.setters = position_setters(model, stages) if sets_positions(stages) else []
        if not self.setters:
            refuse_positions(stages, f"{who} ({NO_SETTER})")

    def set(self, positions: Mapping[str, Any] | None, length: int | None) -> None:
        """``positions`` (a stage's; None: nothing to set) on the model."""
        if positions is not None:
            for setter in self.setters:
                setter(positions, length)

    def begun(self) -> None:
        """After ``slw.begin_step()``: the stage's positions when it begins with this step (or it is the first
        step after a load inside one)."""
        slw = self.slw
        if self.setters and slw.stage_changed and slw.stage is not None:
            self.set(slw.positions, slw.stage.length)

    def loaded(self) -> None:
        """After a checkpoint load: the positions of the stage the clock is in (the tables are not saved), so
        an evaluation before the next step uses them."""
        found = stage_at(self.slw.progress.tokens, self.slw.stages.stages) if self.setters else None
        if found is not None:
            self.set(found[1].positions(), found[1].length)
