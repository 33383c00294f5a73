"""The checks of a run spec that concern the model and the backends: the GPT's size flags (``--n-layer``,
``--n-head``, ``--n-embd``) against the preset, the Megatron model flags (``--rotary-percent``,
``--init-method-std``), and the option combinations no backend runs (:func:`check_spec`, called before any
process group is set up)."""

from __future__ import annotations

import os
from typing import Any

from seqwarm.config.defaults import PRESETS
from seqwarm.run.spec import RunSpec
from seqwarm.util.errors import UserError

__all__ = ["SIZE_FLAGS", "size_overrides", "model_size", "model_overrides", "size_problems", "check_spec"]

SIZE_FLAGS = ("n_layer", "n_head", "n_embd")
"""RunSpec fields that override the size of the --model preset."""


def size_overrides(spec: RunSpec) -> dict[str, int]:
    """The model sizes given by --n-layer / --n-head / --n-embd (the others come from the preset)."""
    return {k: int(getattr(spec, k)) for k in SIZE_FLAGS if getattr(spec, k) is not None}


def model_size(spec: RunSpec) -> dict[str, int]:
    """Layers, heads and width of the GPT ``spec`` trains (preset, then the size flags)."""
    preset = PRESETS[spec.model]
    return {**{k: preset[k] for k in SIZE_FLAGS}, **size_overrides(spec)}


def model_overrides(spec: RunSpec) -> dict[str, Any]:
    """The GPT's fields the flags set over its preset: the sizes, ``rotary_percent``, ``init_std``."""
    out: dict[str, Any] = dict(size_overrides(spec))
    if spec.rotary_percent != 1.0:
        out["rotary_percent"] = spec.rotary_percent
    if spec.init_method_std is not None:
        out["init_std"] = spec.init_method_std
    return out


def size_problems(spec: RunSpec) -> None:
    """UserError listing every bad --n-layer / --n-head / --n-embd (each >= 1; heads divide the width)."""
    given = size_overrides(spec)
    bad = [f"--{k.replace('_', '-')} {v}: must be >= 1" for k, v in given.items() if v < 1]
    size = model_size(spec)
    if not bad and size["n_embd"] % size["n_head"]:
        bad.append(
            f"--n-embd {size['n_embd']} is not a multiple of --n-head {size['n_head']} (each head gets "
            "n_embd / n_head channels); choose e.g. --n-embd "
            f"{size['n_head'] * max(1, round(size['n_embd'] / size['n_head']))}"
        )
    if spec.rotary_percent != 1.0:
        head = size["n_embd"] // size["n_head"] if not bad else 0
        rot = int(head * spec.rotary_percent) if 0 < spec.rotary_percent <= 1 else -1
        if not spec.rotary:
            bad.append(
                f"--rotary-percent {spec.rotary_percent}: only rotary embeddings rotate; add --rotary "
                "(--use-rotary-position-embeddings) or drop --rotary-percent"
            )
        elif head and (rot < 2 or rot % 2):
            bad.append(
                f"--rotary-percent {spec.rotary_percent} rotates {max(rot, 0)} of the {head} channels of a head: it "
                "must be in (0, 1] and rotate an even number of at least 2 (Megatron: int(head x percent))"
            )
    if spec.init_method_std is not None and not spec.init_method_std > 0:
        bad.append(f"--init-method-std {spec.init_method_std}: must be > 0 (Megatron's default: 0.02)")
    if bad:
        raise UserError("; ".join(bad))


def check_spec(spec: RunSpec) -> None:
    """Refuse option combinations no backend runs (before any process group is set up)."""
    if spec.model.startswith("hf:"):
        bad = [
            flag
            for flag, on in (
                ("--rotary", spec.rotary),
                ("--rotary-percent", spec.rotary_percent != 1.0),
                ("--init-method-std", spec.init_method_std is not None),
                ("--fsdp", spec.fsdp),
                ("--deepspeed", spec.deepspeed),
            )
            if on
        ]
        bad += [f"--{k.replace('_', '-')}" for k in size_overrides(spec)]
        if bad:
            raise UserError(
                f"--model {spec.model}: {', '.join(bad)} cannot be combined with a Hugging Face model "
                "(its config.json sets the architecture; for DeepSpeed or FSDP use "
                "seqwarm.integrations.hf.trainer.CurriculumTrainer)"
            )
    elif spec.model not in PRESETS:
        raise UserError(
            f"--model {spec.model!r}: choose one of {', '.join(PRESETS)}, or hf:PATH (a local Hugging Face config.json)"
        )
    else:
        size_problems(spec)
    if spec.pipeline_stages and not spec.deepspeed:
        raise UserError("--pipeline-stages needs --deepspeed (the pipeline is DeepSpeed's PipelineEngine)")
    if spec.deepspeed and spec.fsdp:
        raise UserError(
            "--deepspeed and --fsdp both shard the model: choose one (ZeRO-3 in the DeepSpeed config "
            "is the DeepSpeed counterpart of --fsdp)"
        )
    env_rank = os.environ.get("LOCAL_RANK")
    if spec.local_rank is not None and env_rank is not None and int(env_rank) != spec.local_rank:
        raise UserError(
            f"--local_rank={spec.local_rank} but the launcher set LOCAL_RANK={env_rank}: launch with "
            "deepspeed or torchrun, which set both alike"
        )
    if spec.deepspeed:
        from seqwarm.integrations.deepspeed.curriculum import require_deepspeed

        require_deepspeed()
