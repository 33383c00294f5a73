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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seqwarm.curriculum.stages import StageConfig

__all__ = ["PositionSetter", "PositionsHook", "position_setters", "register_positions_hook"]

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
