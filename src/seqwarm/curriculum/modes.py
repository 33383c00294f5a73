"""How the curriculum length reaches the model: the mode, chosen from (or checked against) its forward.

``truncate`` and ``reshape`` cut the batch before the model sees it; ``inject`` passes
``curriculum_seqlen=L`` to a forward that cuts its inputs itself (DeepSpeed's legacy contract, which
Megatron-DeepSpeed's GPT follows). :func:`resolve_mode` picks or checks the mode from the forward's
signature; :func:`output_length` reads the length a model actually ran at, so that an injected length
the model ignored is caught (:meth:`seqwarm.curriculum.warmup.SequenceLengthWarmup.check_output`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from seqwarm.curriculum.schedule import CURRICULUM_MODES

__all__ = ["forward_name", "output_length", "resolve_mode"]


def forward_name(forward: Callable) -> str:
    owner = getattr(forward, "__self__", None)
    return f"{type(owner).__name__}.forward" if owner is not None else getattr(forward, "__qualname__", "forward")


def resolve_mode(
    mode: str | None, forward: Callable | None, *, pipeline: bool = False, inject_via_kwargs: bool = False
) -> str:
    """The mode that delivers the length: ``mode`` checked against the model, or chosen (None / "auto").

    auto: inject when ``forward`` has a parameter named ``curriculum_seqlen``, else truncate (also
    without a ``forward``). An explicit inject needs that named parameter: a ``**kwargs`` forward
    (every Hugging Face model) would swallow the keyword and train at full length while the clock
    counts the short length. ``inject_via_kwargs=True`` is the opt-in for a forward that does read
    ``curriculum_seqlen`` from its ``**kwargs`` (DeepSpeed's legacy test models). A pipeline engine
    (``pipeline=True``) cannot pass keyword arguments through its stages: truncate by default.
    """
    if mode == "auto":
        mode = None
    if mode is not None and mode not in CURRICULUM_MODES:
        raise ValueError(f"curriculum mode must be one of {CURRICULUM_MODES} or None (auto), got {mode!r}")
    if pipeline:
        if mode == "inject":
            raise ValueError(
                "a pipeline engine cannot pass curriculum_seqlen through its stages: use mode "
                "'truncate' (the same cut, made on the data) or 'reshape'"
            )
        return mode or "truncate"
    if forward is None:
        if mode == "inject":
            raise ValueError("curriculum mode 'inject' needs the model's forward (forward=model.forward)")
        return mode or "truncate"
    signature = inspect.signature(forward)
    params = signature.parameters
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    takes = "curriculum_seqlen" in params or (inject_via_kwargs and open_kwargs)
    if mode is None:
        return "inject" if takes else "truncate"
    if mode == "inject" and not takes:
        text = f"{forward_name(forward)}{signature}"
        shown = text if len(text) <= 160 else f"{forward_name(forward)}(...)"
        why = (
            " (its **kwargs would swallow the keyword: the model would train at full length while the "
            "clock counts the short one)"
            if open_kwargs
            else ""
        )
        optin = (
            "; if that forward does read curriculum_seqlen from **kwargs, pass inject_via_kwargs=True"
            if open_kwargs and not inject_via_kwargs
            else ""
        )
        raise ValueError(
            f"curriculum mode 'inject' needs a model whose forward takes curriculum_seqlen; {shown} has no such "
            f"parameter{why}. Use mode 'truncate' or 'reshape' (the batch is then cut before the model sees "
            f"it){optin}."
        )
    return mode


def output_length(output: Any, rows: int) -> int | None:
    """The sequence length of a model output: logits ``(B, T, V)`` (a tensor, an object with
    ``.logits`` or a dict with "logits"), per-token values ``(B, T)``, or the first such tensor of a
    tuple; None when the output is only a loss (nothing to read a length from)."""
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    candidates = [logits] if logits is not None else list(output) if isinstance(output, (tuple, list)) else [output]
    for t in candidates:
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == rows:
            return int(t.shape[1])
    return None
