"""How the curriculum length reaches the model: the mode, chosen from (or checked against) its forward.

``truncate`` and ``reshape`` cut the batch before the model sees it; ``window`` keeps it at full length
and makes the length the attention span (fragments of L tokens, told apart by per-token
``document_ids`` the model's forward must take); ``inject`` passes
``curriculum_seqlen=L`` to a forward that cuts its inputs itself (DeepSpeed's legacy contract, which
Megatron-DeepSpeed's GPT follows). :func:`resolve_mode` picks or checks the mode from the forward's
signature; :func:`output_length` reads the length a model actually ran at, so that an injected length
the model ignored is caught (:meth:`seqwarm.curriculum.warmup.SequenceLengthWarmup.check_output`).
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from seqwarm.curriculum.schedule import CURRICULUM_MODES

__all__ = ["forward_name", "output_length", "resolve_mode", "wrapped_forward"]

logger = logging.getLogger(__name__)

WRAPPED_ATTRS = ("module", "model", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
"""Where wrappers keep the module they wrap (DDP, DeepSpeed and Megatron's Float16Module: ``module``;
``torch.compile``: ``_orig_mod``; FSDP1 and activation checkpointing: theirs)."""


def _passes_through(forward: Callable) -> bool:
    """Whether ``forward`` is ``forward(*inputs, **kwargs)``: a wrapper's, which names no parameter."""
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return False
    kinds = [p.kind for p in params]
    return inspect.Parameter.VAR_KEYWORD in kinds and all(
        k in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for k in kinds
    )


def wrapped_forward(forward: Callable) -> Callable:
    """The forward a chain of ``forward(*inputs, **kwargs)`` wrappers hands its arguments to: the wrapped
    module is found under one of :data:`WRAPPED_ATTRS`, or is the wrapper's only child; ``forward`` itself
    when it names its parameters or no wrapped module is found."""
    for _ in range(16):  # wrappers of wrappers, never a cycle
        owner = getattr(forward, "__self__", None)
        if not isinstance(owner, torch.nn.Module) or not _passes_through(forward):
            return forward
        inner = next(
            (m for m in (getattr(owner, a, None) for a in WRAPPED_ATTRS) if isinstance(m, torch.nn.Module)), None
        )
        if inner is None:
            children = list(owner.children())
            inner = children[0] if len(children) == 1 else None
        if inner is None or inner is owner:
            return forward
        forward = inner.forward
    return forward


def forward_name(forward: Callable) -> str:
    owner = getattr(forward, "__self__", None)
    return f"{type(owner).__name__}.forward" if owner is not None else getattr(forward, "__qualname__", "forward")


def resolve_mode(
    mode: str | None,
    forward: Callable | None,
    *,
    pipeline: bool = False,
    inject_via_kwargs: bool = False,
    length_bucket: int | None = None,
) -> str:
    """The mode that delivers the length: ``mode`` checked against the model, or chosen (None / "auto").

    auto: inject when ``forward`` has a parameter named ``curriculum_seqlen``, else truncate (also
    without a ``forward``). A ``forward(*inputs, **kwargs)`` wrapper (DDP, Megatron's Float16Module, your
    own) is looked through to the forward it wraps (:func:`wrapped_forward`), as DeepSpeed passed the
    keyword through it; when nothing is found behind it, the choice of truncate is logged with the opt-in.
    An explicit inject needs that named parameter: a ``**kwargs`` forward
    (every Hugging Face model) would swallow the keyword and train at full length while the clock
    counts the short length. ``inject_via_kwargs=True`` is the opt-in for a forward that does read
    ``curriculum_seqlen`` from its ``**kwargs`` (DeepSpeed's legacy test models). A pipeline engine
    (``pipeline=True``) cannot pass keyword arguments through its stages: truncate by default. With a
    ``length_bucket`` auto is truncate (the cut is made on the data, into buckets; never injected).
    """
    if mode == "auto":
        mode = None
    if length_bucket is not None and mode is None:
        mode = "truncate"
    if mode is not None and mode not in CURRICULUM_MODES:
        raise ValueError(f"curriculum mode must be one of {CURRICULUM_MODES} or None (auto), got {mode!r}")
    if mode == "variable":  # its rows come at their length from the data: nothing here may cut them
        raise ValueError(
            "curriculum mode 'variable' takes its rows at the step's length from a VariableLengthSampler "
            "(docs/VARIABLE.md), not by cutting full-length batches: build SequenceLengthWarmup without a "
            "curriculum for it (the clock, the LR and the budget), or train with `seqwarm train`"
        )
    if pipeline:
        if mode == "window":
            raise ValueError(
                "a pipeline engine cannot pass document_ids through its stages, so curriculum mode 'window' "
                "(attention inside fragments of the length) cannot run on one: use mode 'truncate' or 'reshape'"
            )
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
    outer, forward = forward, wrapped_forward(forward)
    signature = inspect.signature(forward)
    params = signature.parameters
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    takes = "curriculum_seqlen" in params or (inject_via_kwargs and open_kwargs)
    if mode is None:
        if not takes and _passes_through(forward):
            logger.warning(
                "%s(*inputs, **kwargs) names no parameter and wraps no module seqwarm can find: the batch is cut "
                "before it (truncate). If the model behind it reads curriculum_seqlen, pass "
                "inject_via_kwargs=True (or mode='inject' on a forward that names it)",
                forward_name(outer),
            )
        return "inject" if takes else "truncate"
    if mode == "window" and "document_ids" not in params:
        raise ValueError(
            f"curriculum mode 'window' keeps the batch at full length and tells the model where each "
            f"fragment of the length starts through document_ids (B, S); {forward_name(forward)} has no "
            "document_ids parameter, so it would attend across the whole row. Use mode 'truncate' or "
            "'reshape', or a model whose forward takes document_ids (seqwarm's GPT)"
        )
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


def check_injected_output(output: Any, rows: int, length: int, model_name: str) -> str | None:
    """After an injected forward of ``rows`` rows given ``curriculum_seqlen=length``: ValueError when the
    output has another length (the model ignored the keyword: it trained at another length than the
    clock counts); the message to give when the output has no sequence dimension (a loss only: it cannot
    be checked); None when it is at the length."""
    got = output_length(output, rows)
    if got is None:
        return (
            f"{model_name} returned only a loss: seqwarm cannot check that it trains at the curriculum_seqlen "
            f"it is given ({length}); make sure its forward cuts its inputs to it, or use curriculum mode 'truncate'"
        )
    if got != length:
        raise ValueError(
            f"{model_name} was given curriculum_seqlen={length} but returned outputs of length {got}: it "
            f"ignores the keyword, so it trained at {got} while the clock counts {length}. Use curriculum mode "
            "'truncate' or 'reshape' (seqwarm cuts the batch itself)"
        )
    return None


class OutputCheck:
    """``SequenceLengthWarmup.check_output``'s state: the model's name, whether its forward names
    ``curriculum_seqlen``, and whether an output it cannot check was said already (once)."""

    def __init__(self, forward: Callable | None):
        self.model_name = forward_name(forward).removesuffix(".forward") if forward is not None else "the model"
        # a forward that names curriculum_seqlen declares it reads it; one reached via **kwargs does not
        self.declares = forward is not None and "curriculum_seqlen" in inspect.signature(forward).parameters
        self.warned = False

    def __call__(self, output: Any, rows: int, length: int) -> None:
        unchecked = check_injected_output(output, rows, length, self.model_name)
        if unchecked and not self.warned:
            self.warned = True
            if self.declares:  # its signature names the keyword: say it, quietly
                logger.info(unchecked)
            else:  # reached through **kwargs (inject_via_kwargs): nothing vouches for it
                warnings.warn(unchecked, stacklevel=4)
