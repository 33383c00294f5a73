"""Run by test_lightning.py: Lightning's ``strategy="ddp"`` with two CPU processes (gloo). Lightning starts
the second process by running this script again; each rank writes what it saw to ``OUT/rank<r>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lightning_model import SEQ, TinyLM, loader, trainer

from seqwarm.curriculum.lr import LRConfig
from seqwarm.integrations.lightning import SequenceLengthWarmupCallback

if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    lr = LRConfig(lr=0.1, min_lr=0.01, warmup_tokens=200, decay_style="cosine", decay_tokens=1500)
    cb = SequenceLengthWarmupCallback(min_length=8, max_length=SEQ, steps=6, multiple_of=8, lr=lr)
    model = TinyLM()
    t = trainer(out, [cb], max_steps=6, accumulate_grad_batches=2, strategy="ddp", devices=2)
    t.fit(model, loader(48))
    lengths: dict[int, set[int]] = {}
    for step, shape in model.seen:
        lengths.setdefault(step, set()).add(shape[1])
    report = {
        "world_size": t.world_size,
        "lengths": [sorted(lengths[s]) for s in sorted(lengths)],
        "clock": model.clock,
        "lrs": [lr for _, lr in model.lrs],
        "first_rows": model.first_rows,
    }
    (out / f"rank{t.global_rank}.json").write_text(json.dumps(report))
