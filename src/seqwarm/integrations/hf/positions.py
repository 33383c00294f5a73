"""A stage's rotary positions on a Hugging Face model: base θ (ABF), linear interpolation, YaRN.

:func:`set_positions` changes a Transformers rotary model in place at a stage boundary, the way
Transformers itself would have built it from a config with those settings:

1. the config (every distinct one the rotary modules hold: the model's) gets the stage's
   ``rope_parameters`` — ``rope_type`` (``default``, ``linear`` or ``yarn``), ``rope_theta``, the
   scaling's keys and the model's own ``partial_rotary_factor`` — and ``max_position_embeddings`` is raised
   to the stage's length when below it, so a ``save_pretrained`` afterwards describes what the weights
   trained with;
2. each rotary module (``*RotaryEmbedding``: the model's one, or one per attention layer in families that
   keep them there) is built again by its own class from that config, and its buffers (``inv_freq``,
   ``original_inv_freq``: copied in place, keeping their device and dtype) and plain attributes
   (``attention_scaling``, ``rope_type``, ...) copied onto the module in use;
3. checks, or nothing changes: the new frequencies and attention factor equal those of
   :func:`seqwarm.curriculum.rope.rope_frequencies` (seqwarm's reading of the same settings, which its
   own GPT applies); and no other module of the model depends on the rotary settings — a model class is
   built twice on the meta device, from the old and the new config, and any attribute outside the rotary
   modules that differs (DeepSeek's attention scale folds YaRN's ``mscale_all_dim`` in) is refused, since
   it would not be updated.

A module that looks rotary (``Rotary`` in its class name, or an ``inv_freq``) but lacks that protocol, a
model whose own ``rope_type`` is not ``default`` (a stage would replace its scaling) or whose
``rope_parameters`` differ per layer type is refused with :class:`~seqwarm.util.errors.UserError`: the
run stops rather than train a stage at the old positions. A ``rope_theta`` of None keeps the model's own θ
(the config's before the first change), a ``rope_scaling`` of None means none.

Importing this module registers :func:`positions_hook` with the curriculum
(:func:`seqwarm.curriculum.positions.register_positions_hook`), so
:class:`~seqwarm.curriculum.engine.CurriculumEngine` sets the stages' positions on a Transformers model.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from seqwarm.curriculum.positions import PositionSetter, register_positions_hook
from seqwarm.curriculum.rope import rope_frequencies
from seqwarm.curriculum.stages import SCALING_KEYS, StageConfig, sets_positions
from seqwarm.util.errors import UserError

__all__ = [
    "check_positions",
    "hf_rope_parameters",
    "positions_hook",
    "positions_setter",
    "rotary_modules",
    "set_positions",
    "stage_setter",
]

_TYPES = ("default", "linear", "yarn")
_YARN_KEYS = SCALING_KEYS["yarn"][2:]  # past "type" and "factor"
_OWN = "_seqwarm_own_rope"  # on each rotary module: the config's rope_parameters before the first change
_SCALARS = (bool, int, float, str, type(None))


def hf_rope_parameters(
    rope_theta: float | None, rope_scaling: Mapping[str, Any] | None, own: Mapping[str, Any]
) -> dict[str, Any]:
    """Transformers' ``rope_parameters`` for a stage's settings; ``own``: the model's own (its θ when
    ``rope_theta`` is None, and its ``partial_rotary_factor``)."""
    theta = float(own["rope_theta"]) if rope_theta is None else float(rope_theta)
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if own.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = own["partial_rotary_factor"]
    if rope_scaling:
        kind = rope_scaling.get("type", rope_scaling.get("rope_type"))
        if kind not in ("linear", "yarn"):
            raise UserError(f"rope_scaling type {kind!r} cannot be set on a Hugging Face model (linear, yarn)")
        out["rope_type"], out["factor"] = kind, float(rope_scaling["factor"])
        if kind == "yarn":
            out.update({k: rope_scaling[k] for k in _YARN_KEYS if rope_scaling.get(k) is not None})
    return out


def _looks_rotary(module: nn.Module) -> bool:
    return "rotary" in type(module).__name__.lower() or hasattr(module, "inv_freq")


def _recognised(module: nn.Module) -> bool:
    params = getattr(getattr(module, "config", None), "rope_parameters", None)
    return (
        isinstance(getattr(module, "inv_freq", None), torch.Tensor)
        and isinstance(getattr(module, "original_inv_freq", None), torch.Tensor)
        and isinstance(getattr(module, "attention_scaling", None), (int, float))
        and isinstance(getattr(module, "rope_type", None), str)
        and isinstance(params, Mapping)
        and "rope_theta" in params
        and callable(getattr(module, "compute_default_rope_parameters", None))
    )


def rotary_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The Transformers rotary modules of ``model`` (name, module); UserError for a rotary-looking module
    without their protocol (a stage's positions could not be set on it)."""
    found = []
    for name, module in model.named_modules():
        if not _looks_rotary(module):
            continue
        if not _recognised(module):
            raise UserError(
                f"{type(module).__name__} ({name or 'the model'}) is a rotary module seqwarm cannot set a stage's "
                "rope_theta / rope_scaling on (it has no inv_freq / attention_scaling / rope_parameters of "
                "Transformers' rotary embeddings); give stages with lengths only"
            )
        found.append((name, module))
    return found


def _own_parameters(module: nn.Module) -> dict[str, Any]:
    """The config's rope_parameters before seqwarm first changed them (recorded on the module then)."""
    own = getattr(module, _OWN, None)
    if own is None:
        own = copy.deepcopy(dict(module.config.rope_parameters))
        kind = own.get("rope_type", own.get("type", "default"))
        if kind != "default":
            raise UserError(
                f"{type(module).__name__}: the model's config already has rope_type {kind!r}; stages set the "
                "positions of plain RoPE (a stage without rope_scaling would drop it): start from a config "
                "without rope scaling (its rope_theta), and give the scaling as a stage"
            )
        setattr(module, _OWN, own)
    return own


def _scalars(module: nn.Module) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items() if isinstance(v, _SCALARS) and k != "training"}


def _other_dependents(model: nn.Module, old: Any, new: Any) -> list[str]:
    """Attributes outside the rotary modules that the Transformers model holding config ``new`` has
    differently when built from ``old`` (both built on the meta device: shapes only, nothing allocated)."""
    from transformers import PreTrainedModel

    top = next((m for m in model.modules() if isinstance(m, PreTrainedModel) and m.config is new), None)
    if top is None:
        return []
    with torch.device("meta"):
        before, after = type(top)(copy.deepcopy(old)), type(top)(copy.deepcopy(new))
    other = dict(after.named_modules())
    out = []
    for name, module in before.named_modules():
        if _looks_rotary(module) or name not in other:
            continue
        was, now = _scalars(module), _scalars(other[name])
        out += [f"{name or type(top).__name__}.{k}" for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]
    return out


def set_positions(
    model: nn.Module,
    rope_theta: float | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    *,
    max_position_embeddings: int | None = None,
) -> dict[str, Any]:
    """Set a stage's rotary settings on a Transformers model in place (see the module); the
    ``rope_parameters`` now in its config. ``max_position_embeddings``: the stage's length (the config's is
    raised to it, never lowered). UserError for a model seqwarm cannot change this way."""
    return _apply(model, rope_theta, rope_scaling, max_position_embeddings, commit=True)


def check_positions(model: nn.Module, rope_theta: float | None = None, rope_scaling: Any = None) -> dict[str, Any]:
    """What :func:`set_positions` would set (its UserError when it cannot), the model left as it is."""
    return _apply(model, rope_theta, rope_scaling, None, commit=False)


def _apply(model: nn.Module, rope_theta: Any, rope_scaling: Any, max_positions: Any, commit: bool) -> dict[str, Any]:
    modules = rotary_modules(model)
    if not modules:
        raise UserError(
            f"{type(model).__name__} has no rotary embedding (it learns its positions, or keeps them elsewhere): "
            "a stage's rope_theta / rope_scaling cannot be set on it; give stages with lengths only"
        )
    configs: dict[int, Any] = {}
    for _, module in modules:
        params = module.config.rope_parameters
        if any(isinstance(v, Mapping) for v in params.values()):
            raise UserError(f"{type(module).__name__}: rope_parameters per layer type are not supported by stages")
        configs.setdefault(id(module.config), module.config)
    owns = [_own_parameters(module) for _, module in modules]  # recorded before any change
    olds = {key: copy.deepcopy(cfg) for key, cfg in configs.items()}
    try:
        fresh = []
        for cfg in configs.values():
            own = next(o for o, (_, m) in zip(owns, modules) if m.config is cfg)
            cfg.rope_parameters = hf_rope_parameters(rope_theta, rope_scaling, own)
            known = getattr(cfg, "max_position_embeddings", None)
            if max_positions and isinstance(known, int) and max_positions > known:
                cfg.max_position_embeddings = int(max_positions)
        for _, module in modules:
            try:
                new = type(module)(module.config)  # Transformers' own computation from the new config
            except (ValueError, KeyError, TypeError) as err:
                raise UserError(f"{type(module).__name__} cannot take these positions: {err}") from None
            _check(module, new)
            fresh.append((module, new))
        for key, cfg in configs.items():
            changed = _other_dependents(model, olds[key], cfg)
            if changed:
                raise UserError(
                    f"{type(model).__name__}: {', '.join(changed[:4])} also depend(s) on the rotary settings, which "
                    "seqwarm does not update; this stage's rope_theta / rope_scaling cannot be set on it"
                )
        result = dict(modules[0][1].config.rope_parameters)
    except BaseException:
        commit = False
        raise
    finally:
        for key, cfg in configs.items() if not commit else ():  # nothing changed: the configs as they were
            cfg.rope_parameters = olds[key].rope_parameters
            if hasattr(olds[key], "max_position_embeddings"):
                cfg.max_position_embeddings = olds[key].max_position_embeddings
    with torch.no_grad():
        for module, new in fresh if commit else ():
            for name, buffer in new.named_buffers(recurse=False):
                getattr(module, name).copy_(buffer)  # in place: device and dtype kept, compiled graphs too
            for name, value in _scalars(new).items():
                setattr(module, name, value)
    return result


def _check(module: nn.Module, new: nn.Module) -> None:
    """The rebuilt module has the same buffers as the one in use, and the frequencies and attention factor
    seqwarm's own reading of the settings gives."""
    for name, buffer in new.named_buffers(recurse=False):
        mine = getattr(module, name, None)
        if not isinstance(mine, torch.Tensor) or mine.shape != buffer.shape:
            raise UserError(f"{type(module).__name__}: its {name} does not match a rebuilt one's; not a known layout")
    params = module.config.rope_parameters
    scaling = None if params["rope_type"] == "default" else {**params, "type": params["rope_type"]}
    expected, factor = rope_frequencies(2 * new.inv_freq.numel(), float(params["rope_theta"]), scaling)
    got = new.inv_freq.double().cpu()
    if not torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=0.0) or not math.isclose(
        float(new.attention_scaling), factor, rel_tol=1e-6
    ):
        raise UserError(
            f"{type(module).__name__} computes other rotary frequencies than rope_theta / rope_scaling "
            f"{dict(params)} give (a variant seqwarm does not know); its positions are left as they were"
        )


def positions_setter(model: nn.Module, stages: Sequence[StageConfig] = ()) -> PositionSetter:
    """The setter :class:`~seqwarm.curriculum.engine.CurriculumEngine` calls at a stage: ``setter(positions,
    length)`` sets ``positions`` on ``model`` (:func:`set_positions`). Every stage's positions are checked
    now (:func:`check_positions`): UserError before training when one cannot be set."""
    check_positions(model)  # a model without rotary embeddings, or whose own settings stages cannot replace
    for stage in stages:
        check_positions(model, **stage.positions())

    def setter(positions: Mapping[str, Any], length: int | None = None) -> None:
        set_positions(model, positions["rope_theta"], positions["rope_scaling"], max_position_embeddings=length)

    return setter


def _is_transformers_model(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return any(isinstance(m, PreTrainedModel) for m in model.modules())


def positions_hook(model: nn.Module, stages: Sequence[StageConfig] = ()) -> PositionSetter | None:
    """The curriculum's hook: a setter for a model holding a Transformers model, each of ``stages`` checked
    (None for any other model)."""
    return positions_setter(model, stages) if _is_transformers_model(model) else None


def stage_setter(model: nn.Module, stages: tuple[StageConfig, ...], who: str) -> Callable | None:
    """The setter of ``model`` when ``stages`` set positions (None when they do not); UserError naming
    ``who`` when they cannot be set on it."""
    if not sets_positions(stages):
        return None
    try:
        return positions_setter(model, stages)
    except UserError as err:
        raise UserError(f"{who}: {err}") from None


register_positions_hook(positions_hook)
