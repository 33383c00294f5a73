"""``seqwarm train --model hf:PATH``: a Hugging Face causal LM from a local ``config.json``, whole recipe.

``PATH`` is a ``config.json`` (or a folder holding one): the model is
``AutoModelForCausalLM.from_config`` of it, with fresh weights (nothing is downloaded). The run is
seqwarm's own loop (:class:`seqwarm.trainer.loop.Run` on a :class:`~seqwarm.curriculum.engine.CurriculumEngine`):
token budget, token-clock LR, full-length evaluation, checkpoints and exact resume, as for the GPT
presets. Differences the model imposes:

- batches are HF-style (``labels = input_ids``; the model shifts): ``label_style="hf"``;
- the curriculum cuts the batch (truncate or reshape) or splits its rows (window): HF models ignore
  ``curriculum_seqlen``, so ``curriculum_mode: inject`` is refused;
- document masking and the window mode reach the model as ``position_ids`` restarting at each document
  or fragment (the padding-free convention, :mod:`seqwarm.integrations.hf.blocks`), after a probe row
  shows the model really attends inside them (``sdpa``, ``eager``, ``flex_attention``; flash-attention
  as one row);
- the model's config sets the architecture: ``--rotary`` and ``--fsdp`` (which shards seqwarm's GPT
  blocks) are refused, and ``--deepspeed`` is not wired for it (use ``CurriculumTrainer`` with
  ``TrainingArguments(deepspeed=...)``);
- stages with ``rope_theta`` / ``rope_scaling`` are set on the model's rotary embeddings by the engine
  (:mod:`seqwarm.integrations.hf.positions`, whose hook it finds); a model without them is refused.

Checkpoints hold the HF model's own state dict (``model.save_pretrained``-compatible keys).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from seqwarm.config import RunConfig
from seqwarm.curriculum.positions import register_positions_hook
from seqwarm.integrations.hf.blocks import attn_implementation, block_forward, check_block_attention
from seqwarm.integrations.hf.positions import positions_hook
from seqwarm.integrations.hf.trainer import require_transformers
from seqwarm.trainer.backends import Built, RunChoices, TorchEngineBuilder, curriculum_mode
from seqwarm.trainer.distributed import DistInfo, wrap_model
from seqwarm.trainer.optim import build_optimizer
from seqwarm.util.errors import UserError

__all__ = ["HF_PREFIX", "HFEngineBuilder", "HFModelConfig", "CausalLMLoss", "hf_model_path", "hf_seq_length"]

logger = logging.getLogger(__name__)

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
                f"{seq_length} (its longest stage's, with stages); lower --seq-length / max_difficulty / the "
                "stage's length, or raise it in config.json"
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
    """The HF model as seqwarm's loop calls a model: ``loss = model(**batch)`` (logits without labels).

    ``document_ids`` ``(B, S)`` (document masking, the window mode): attention stays inside each run of
    equal ids, passed to the model as restarting ``position_ids``
    (:func:`~seqwarm.integrations.hf.blocks.block_forward`; the batch's own ``position_ids`` restart at the
    same places and are not needed)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ):
        if document_ids is not None:
            if attention_mask is not None:  # transformers reads blocks from position_ids only without a mask
                raise ValueError("document_ids with an attention_mask: HF models take blocks as position_ids alone")
            loss, logits = block_forward(self.lm, input_ids, labels, document_ids)
            return logits if labels is None else loss
        out = self.lm(input_ids=input_ids, labels=labels, position_ids=position_ids, attention_mask=attention_mask)
        return out.logits if labels is None else out.loss


class HFEngineBuilder(TorchEngineBuilder):
    """A Hugging Face causal LM on one device or under DDP, driven by a CurriculumEngine."""

    def curriculum_mode(self, cfg: RunConfig, model_cfg: HFModelConfig) -> str | None:
        if cfg.curriculum is not None and cfg.curriculum.mode == "inject":
            raise UserError(
                f"curriculum mode 'inject': {model_cfg.architecture} takes **kwargs and ignores "
                "curriculum_seqlen (it would train at full length); use curriculum_mode 'truncate', "
                "'reshape' or 'window'"
            )
        return curriculum_mode(cfg, CausalLMLoss.forward)

    def build(
        self, model_cfg: HFModelConfig, cfg: RunConfig, info: DistInfo, device: torch.device, choices: RunChoices
    ) -> Built:
        from seqwarm.curriculum.engine import CurriculumEngine

        if self.fsdp:
            raise UserError(
                "--fsdp shards seqwarm's GPT blocks; an hf: model trains under DDP (torchrun without "
                "--fsdp), or with CurriculumTrainer and FSDP/DeepSpeed"
            )
        lm = model_cfg.build().to(device)
        window = choices.mode == "window"
        if cfg.document_masking or window:
            what = "--document-masking" if cfg.document_masking else "curriculum_mode 'window'"
            check_block_attention(lm, what, model_cfg.architecture)  # never train across documents unseen
            if info.is_main:  # where this differs from Transformers' own padding-free collator, said once
                logger.info(
                    "%s on %s (%s): blocks passed as position_ids restarting at each %s, use_cache=False; "
                    "as seqwarm's GPT, a document's last token still predicts the next one's first token "
                    "(DataCollatorWithFlattening would mask that label)",
                    what,
                    model_cfg.architecture,
                    attn_implementation(lm),
                    {(True, False): "document", (False, True): "window fragment"}.get(
                        (cfg.document_masking, window), "document and window fragment"
                    ),
                )
        register_positions_hook(positions_hook)  # the engine sets a stage's rope settings through it
        wrapped = wrap_model(CausalLMLoss(lm), info, False, device)
        optimizer = build_optimizer(lm, cfg)
        return Built(
            lm,
            optimizer,
            CurriculumEngine(wrapped, optimizer, cfg, layout="dense", mode=choices.mode, precision=choices.precision),
            "ddp" if info.enabled else "none",
            label_style="hf",
        )
