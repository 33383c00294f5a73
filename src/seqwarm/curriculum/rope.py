"""Rotary position settings as numbers: the inverse frequencies and the attention factor of one setting.

A stage (:mod:`seqwarm.curriculum.stages`) names its position settings the way Transformers' configs do
(``rope_theta``, ``rope_scaling = {"type": "linear" | "yarn", "factor": ..., ...}``); this module turns
them into what a rotary model applies, in plain Python (no torch, so ``check-config`` and ``plan`` stay
light): :func:`rope_frequencies` gives the ``dim / 2`` inverse frequencies of the rotated channels and the
factor every cos/sin is multiplied by (YaRN's attention temperature; 1 otherwise). A model computes its
angles as ``position * inv_freq`` from them (seqwarm's GPT: :meth:`seqwarm.trainer.model.GPT.set_positions`).

The rules are those of Transformers' ``modeling_rope_utils`` (its ``ROPE_INIT_FUNCTIONS``), which a test
compares with these numbers: base θ gives ``theta ** -(2i / dim)``; linear interpolation divides every
frequency by the factor (the same as dividing the positions); YaRN blends, channel by channel, the
extrapolated frequency (kept) and the interpolated one (divided by the factor) along a linear ramp between
the channels that turn ``beta_fast`` and ``beta_slow`` times over ``original_max_position_embeddings``
positions, and scales attention by ``0.1 * ln(factor) + 1`` unless ``attention_factor`` (or ``mscale`` with
``mscale_all_dim``) says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["rope_frequencies", "yarn_mscale"]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context ``factor`` times longer: ``0.1 * mscale * ln(factor) + 1``
    (1 for a factor up to 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_attention_factor(s: Mapping[str, Any]) -> float:
    given = s.get("attention_factor")
    if given is not None:
        return float(given)
    mscale, all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and all_dim:
        return yarn_mscale(s["factor"], mscale) / yarn_mscale(s["factor"], all_dim)
    return yarn_mscale(s["factor"])


def _correction_dim(rotations: float, dim: int, theta: float, positions: int) -> float:
    """The channel whose frequency turns ``rotations`` times over ``positions`` tokens."""
    return dim * math.log(positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def rope_frequencies(dim: int, theta: float, scaling: Mapping[str, Any] | None = None) -> tuple[list[float], float]:
    """The ``dim // 2`` inverse frequencies of ``dim`` rotated channels at base ``theta`` under ``scaling``
    (None: plain RoPE; a mapping with ``type`` "linear" or "yarn" and Transformers' keys, as
    :class:`~seqwarm.curriculum.stages.RopeScaling.to_dict` gives), and the factor cos and sin are
    multiplied by (1 but for YaRN)."""
    if dim < 2 or dim % 2:
        raise ValueError(f"rotary dim must be an even number >= 2, got {dim}")
    base = [theta ** -(i / dim) for i in range(0, dim, 2)]
    kind = None if scaling is None else scaling.get("type", scaling.get("rope_type"))
    if kind in (None, "default"):
        return base, 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return [f / factor for f in base], 1.0
    if kind != "yarn":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (linear, yarn)")
    original = scaling.get("original_max_position_embeddings")
    if not original:
        raise ValueError("yarn rope_scaling needs original_max_position_embeddings")
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1
    low, high = _correction_dim(fast, dim, theta, original), _correction_dim(slow, dim, theta, original)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    out = []
    for i, f in enumerate(base):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep the frequency, 1: interpolate it
        out.append(f / factor * ramp + f * (1 - ramp))
    return out, _yarn_attention_factor({**scaling, "factor": factor})
