"""``seqwarm train --model hf:PATH``: a Hugging Face causal LM from a local ``config.json``, whole recipe.

``PATH`` is a ``config.json`` (or a folder holding one): the model is
``AutoModelForCausalLM.from_config`` of it, with fresh weights (nothing is downloaded). The run is
seqwarm's own loop (:class:`seqwarm.trainer.loop.Run` on a :class:`~seqwarm.curriculum.engine.CurriculumEngine`):
token budget, token-clock LR, full-length evaluation, checkpoints and exact resume, as for the GPT
presets. Differences the model imposes:

- batches are HF-style (``labels = input_ids``; the model shifts): ``label_style="hf"``;
- the curriculum cuts the batch (truncate or reshape): HF models ignore ``curriculum_seqlen``, so
  ``curriculum_mode: inject`` is refused;
- the model's config sets the architecture: ``--rotary`` and ``--fsdp`` (which shards seqwarm's GPT
  blocks) are refused, and ``--deepspeed`` is not wired for it (use ``CurriculumTrainer`` with
  ``TrainingArguments(deepspeed=...)``).

Checkpoints hold the HF model's own state dict (``model.save_pretrained``-compatible keys).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from seqwarm.config import RunConfig
from seqwarm.integrations.hf.trainer import require_transformers
from seqwarm.trainer.backends import Built, TorchEngineBuilder
from seqwarm.trainer.distributed import DistInfo, wrap_model
from seqwarm.trainer.optim import build_optimizer
from seqwarm.util.errors import UserError

__all__ = ["HF_PREFIX", "HFEngineBuilder", "HFModelConfig", "CausalLMLoss", "hf_model_path", "hf_seq_length"]

HF_PREFIX = "hf:"
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")


def hf_model_path(model: str) -> Path | None:
    """The config path of ``--model hf:PATH`` (None for a GPT preset name)."""
    return Path(model[len(HF_PREFIX) :]) if model.startswith(HF_PREFIX) else None


def _read(path: Path) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"--model hf:{path}: cannot read a Hugging Face config.json ({err})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise UserError(
            f'--model hf:{path}: {file} has no "model_type"; give a Transformers config.json '
            "(e.g. GPT2Config(...).save_pretrained(folder))"
        )
    return raw


def hf_seq_length(path: Path) -> int | None:
    """The model's context length from its config.json (``max_position_embeddings`` / ``n_positions``)."""
    raw = _read(path)
    return next((int(raw[k]) for k in _POSITION_KEYS if isinstance(raw.get(k), int)), None)


def _hf_config(raw: dict[str, Any]):
    transformers = require_transformers("--model hf:PATH")
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    return transformers.AutoConfig.for_model(raw["model_type"], **fields)


@dataclass(frozen=True)
class HFModelConfig:
    """The Hugging Face model of a run (recorded in the run's config.json under "model")."""

    path: str
    """The config.json it was built from."""
    architecture: str
    """The ``AutoModelForCausalLM`` class, e.g. ``GPT2LMHeadModel``, ``LlamaForCausalLM``."""
    seq_length: int
    """The length trained and evaluated at (the run's full length)."""
    vocab_size: int
    n_layer: int
    n_embd: int
    n_head: int
    total_params: int
    """Parameters (tied ones once)."""
    label_style: str = "hf"
    """HF models shift labels themselves: batches carry ``labels = input_ids``."""

    @classmethod
    def from_path(cls, path: str | Path, *, vocab_size: int, seq_length: int) -> HFModelConfig:
        """Read ``path`` and check it against the data's vocabulary and the run's length."""
        path = Path(path)
        raw = _read(path)
        config = _hf_config(raw)
        if config.vocab_size < vocab_size:
            raise UserError(
                f"--model hf:{path}: vocab_size {config.vocab_size} is smaller than the data's "
                f'vocabulary ({vocab_size}); set "vocab_size" to at least {vocab_size} in config.json'
            )
        positions = getattr(config, "max_position_embeddings", None)
        if isinstance(positions, int) and positions < seq_length:
            raise UserError(
                f"--model hf:{path}: max_position_embeddings {positions} < the run's sequence length "
                f"{seq_length}; lower --seq-length / max_difficulty or raise it in config.json"
            )
        transformers = require_transformers("--model hf:PATH")
        with torch.device("meta"):  # shapes only: the parameter count and class without allocating
            meta = transformers.AutoModelForCausalLM.from_config(config)
        return cls(
            path=str(path),
            architecture=type(meta).__name__,
            seq_length=seq_length,
            vocab_size=config.vocab_size,
            n_layer=config.num_hidden_layers,
            n_embd=config.hidden_size,
            n_head=config.num_attention_heads,
            total_params=sum(p.numel() for p in meta.parameters()),
        )

    def num_params(self) -> int:
        return self.total_params

    def build(self) -> nn.Module:
        transformers = require_transformers("--model hf:PATH")
        return transformers.AutoModelForCausalLM.from_config(_hf_config(_read(Path(self.path))))


class CausalLMLoss(nn.Module):
    """The HF model as seqwarm's loop calls a model: ``loss = model(**batch)`` (logits without labels)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ):
        out = self.lm(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=attention_mask)
        return out.logits if labels is None else out.loss


class HFEngineBuilder(TorchEngineBuilder):
    """A Hugging Face causal LM on one device or under DDP, driven by a CurriculumEngine."""

    def build(self, model_cfg: HFModelConfig, cfg: RunConfig, info: DistInfo, device: torch.device) -> Built:
        from seqwarm.curriculum.engine import CurriculumEngine

        if self.fsdp:
            raise UserError(
                "--fsdp shards seqwarm's GPT blocks; an hf: model trains under DDP (torchrun without "
                "--fsdp), or with CurriculumTrainer and FSDP/DeepSpeed"
            )
        if cfg.curriculum is not None and cfg.curriculum.mode == "inject":
            raise UserError(
                f"curriculum mode 'inject': {model_cfg.architecture} takes **kwargs and ignores "
                "curriculum_seqlen (it would train at full length); use curriculum_mode 'truncate' or "
                "'reshape'"
            )
        if cfg.document_masking or cfg.curriculum is not None and cfg.curriculum.mode == "window":
            what = "--document-masking" if cfg.document_masking else "curriculum_mode 'window'"
            raise UserError(
                f"{what} with --model hf:: seqwarm builds per-document attention only in its own GPT; a "
                "Hugging Face model would attend across the whole row (its padding-free attention needs "
                "flash-attention on a GPU). Use a GPT preset (--model tiny, ...), or curriculum_mode "
                "'truncate' / 'reshape' without document masking"
            )
        lm = model_cfg.build().to(device)
        wrapped = wrap_model(CausalLMLoss(lm), info, False, device)
        optimizer = build_optimizer(lm, cfg)
        return Built(
            lm,
            optimizer,
            CurriculumEngine(wrapped, optimizer, cfg, layout="dense"),
            "ddp" if info.enabled else "none",
            label_style="hf",
        )
