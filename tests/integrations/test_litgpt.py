"""The LitGPT recipe of docs/FRAMEWORKS.md: the curriculum in a Fabric loop on LitGPT's GPT and loss (CPU),
its lengths per optimizer step with gradient accumulation, and an exact resume from ``fabric.save``."""

from __future__ import annotations

import pytest

from helpers import doc_block
from seqwarm.curriculum.warmup import SequenceLengthWarmup

pytest.importorskip("litgpt")


def test_the_litgpt_recipe_trains_at_the_curriculum_length_and_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(doc_block("FRAMEWORKS.md", "test_litgpt.py"), "FRAMEWORKS.md", "exec"), namespace)
    full = namespace["log"]
    ref, want = SequenceLengthWarmup(min_length=16, max_length=128, steps=6), []
    for _ in range(8):  # the same schedule in a bare loop: 2 micro-batches of 4 rows a step
        length = ref.begin_step()
        ref.record(4, 128), ref.record(4, 128)
        want.append((length, ref.end_step().tokens))
    assert [row[:2] for row in full] == want
    assert want[-1][0] == 128 and len({length for length, _ in want}) > 4
    assert len({lr for _, _, lr, _ in full}) == 8  # warmup then cosine on the token clock

    ckpt = tmp_path / "out" / "litgpt-curriculum" / "step-3.ckpt"
    resumed = namespace["pretrain"](str(tmp_path / "resumed"), resume=str(ckpt))
    assert len(resumed) == 5
    assert [row[:3] for row in resumed] == [row[:3] for row in full[3:]]  # lengths, tokens, LR: exactly
    assert [row[3] for row in resumed] == pytest.approx([row[3] for row in full[3:]], rel=1e-6)  # the loss
