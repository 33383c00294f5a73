"""The main job's defaults: a tiny GPT on the embedded public-domain corpus, on CPU, in minutes.

The recipe is the CPU-scale setting: 4 layers, d 256 (5.3M parameters), a byte-level BPE of
8192 trained on the corpus, length 256, 16 sequences per step, AdamW (0.9, 0.95), weight decay 0.1,
clipping 1.0, LR warmup ~2% of the steps by iterations then cosine decay by tokens to 0.1x the peak,
fixed_linear 8 -> 256 (step 8) over ~30% of the steps. ``examples/tiny_cpu.json`` is this config.

``PRESETS`` are the GPT sizes ``--model`` chooses from (:meth:`seqwarm.trainer.model.GPTConfig.preset`), here
so that the CLI can list them without importing torch.

Pure data: the embedded corpus this recipe trains on is prepared by
:func:`seqwarm.data.embedded_data_dir`, not here.
"""

from __future__ import annotations

import copy
from typing import Any

DEFAULT_TOKENIZER = "bpe:8192"
"""The tokenizer of the default recipe and of ``seqwarm prepare`` (a byte-level BPE of 8192 tokens)."""

VOCAB_MULTIPLE = 64
"""A preset's embedding / LM-head rows are the vocabulary rounded up to this (50257 -> 50304): tensor-core
shapes for the largest matmul of a small GPT. The padded rows get no probability and are not exported."""

PRESETS: dict[str, dict[str, int]] = {
    # CPU demo model: ~5.3M parameters.
    "tiny": dict(vocab_size=8192, seq_length=256, n_layer=4, n_head=4, n_embd=256, vocab_multiple=VOCAB_MULTIPLE),
    # For science on CPU (sweeps, many seeds): ~0.6M parameters, most of them the embedding, so hundreds
    # of optimizer steps at a large batch fit on 2 cores.
    "nano": dict(vocab_size=8192, seq_length=256, n_layer=2, n_head=2, n_embd=64, vocab_multiple=VOCAB_MULTIPLE),
    "gpt2-124m": dict(
        vocab_size=50257, seq_length=1024, n_layer=12, n_head=12, n_embd=768, vocab_multiple=VOCAB_MULTIPLE
    ),
    "gpt2-350m": dict(
        vocab_size=50257, seq_length=1024, n_layer=24, n_head=16, n_embd=1024, vocab_multiple=VOCAB_MULTIPLE
    ),
    "gpt2-774m": dict(
        vocab_size=50257, seq_length=1024, n_layer=36, n_head=20, n_embd=1280, vocab_multiple=VOCAB_MULTIPLE
    ),
    "gpt2-1.5b": dict(
        vocab_size=50257, seq_length=1024, n_layer=48, n_head=25, n_embd=1600, vocab_multiple=VOCAB_MULTIPLE
    ),
}
"""GPT sizes by name: vocabulary, full length, layers, heads, width (GPT-2 sizes as in the GPT-2 paper),
and the multiple the vocabulary is padded to."""

_DEFAULT_TRAIN_CONFIG: dict[str, Any] = {
    # Only the global batch: the micro-batch follows from the world size (16 on one process, 8 on two).
    "train_batch_size": 16,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "gradient_clipping": 1.0,
    "curriculum_learning": {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 8,
        "max_difficulty": 256,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 130, "difficulty_step": 8},
    },
    "seqwarm": {
        "seq_length": 256,
        "train_tokens": 1_200_000,
        "lr_warmup_iters": 8,
        "lr_decay_style": "cosine",
        "min_lr": 0.0001,
    },
}


CURRICULUM_FRACTION = 130 / (1_200_000 / (16 * 256))
"""The recipe's curriculum length over its step count at full length (130 of ~293 steps)."""


def default_train_config(
    seq_length: int | None = None, *, train_tokens: int | None = None, train_batch_size: int | None = None
) -> dict[str, Any]:
    """A fresh copy of the default run's config (DeepSpeed JSON plus a seqwarm block).

    With ``seq_length`` L (the user's ``--seq-length``, or the model preset's length) the recipe follows
    it: full length and ``max_difficulty`` L, and ``total_curriculum_step`` scaled so the curriculum
    keeps its share of the run — the recipe's 130 steps per 1.2M tokens at batch 16 and length 256,
    i.e. ``0.44 x train_tokens / (global batch x L)`` (``train_tokens`` / ``train_batch_size``: the
    user's, else the recipe's). L = 256 with the recipe's budget and batch gives the recipe unchanged.
    """
    cfg = copy.deepcopy(_DEFAULT_TRAIN_CONFIG)
    if seq_length is None:
        return cfg
    length = int(seq_length)
    tokens = int(train_tokens or cfg["seqwarm"]["train_tokens"])
    batch = int(train_batch_size or cfg["train_batch_size"])
    cl = cfg["curriculum_learning"]
    cl["min_difficulty"] = min(cl["min_difficulty"], length)
    cl["max_difficulty"] = length
    cl["schedule_config"]["difficulty_step"] = 8 if length >= 8 else 1
    cl["schedule_config"]["total_curriculum_step"] = max(1, round(CURRICULUM_FRACTION * tokens / (batch * length)))
    cfg["seqwarm"]["seq_length"] = length
    return cfg
