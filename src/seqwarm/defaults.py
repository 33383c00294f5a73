"""The main job's defaults: a tiny GPT on the embedded public-domain corpus, on CPU, in minutes.

The recipe is SPEC §7's CPU-scale setting: 4 layers, d 256 (5.3M parameters), a byte-level BPE of
8192 trained on the corpus, length 256, 16 sequences per step, AdamW (0.9, 0.95), weight decay 0.1,
clipping 1.0, LR warmup ~2% of the steps by iterations then cosine decay by tokens to 0.1x the peak,
fixed_linear 8 -> 256 (step 8) over ~30% of the steps. ``examples/tiny_cpu.json`` is this config.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_TOKENIZER = "bpe:8192"

_DEFAULT_TRAIN_CONFIG: dict[str, Any] = {
    # Only the global batch: the micro-batch follows from the world size (16 on one process, 8 on two).
    "train_batch_size": 16,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
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


def default_train_config() -> dict[str, Any]:
    """A fresh copy of the default run's config (DeepSpeed JSON plus a seqwarm block)."""
    return copy.deepcopy(_DEFAULT_TRAIN_CONFIG)


def cache_dir() -> Path:
    """Where the embedded corpus is prepared once: $SEQWARM_CACHE, else $XDG_CACHE_HOME/seqwarm."""
    if os.environ.get("SEQWARM_CACHE"):
        return Path(os.environ["SEQWARM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "seqwarm"


def default_data_dir(tokenizer: str = DEFAULT_TOKENIZER) -> Path:
    """The embedded corpus prepared with ``tokenizer`` (prepared on first use, then reused)."""
    from seqwarm import __version__
    from seqwarm.data import prepare_dataset

    folder = cache_dir() / f"embedded-{tokenizer.replace(':', '')}-v{__version__}"
    if (folder / "meta.json").exists():
        return folder
    logger.info("preparing the embedded public-domain corpus with %s into %s (once)", tokenizer, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    prepare_dataset(folder, None, tokenizer=tokenizer, force=True)
    return folder
