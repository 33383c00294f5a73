"""CurriculumTrainer through ``TrainingArguments(deepspeed=...)`` with the JSON users write: an ``optimizer``
block (DeepSpeed builds the optimizer), a ``scheduler`` block (seqwarm's clock runs it), ``"auto"``
values and ZeRO 2, on one CPU process; then ``resume_from_checkpoint`` continues exactly."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import run_torchrun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.deepspeed,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
]

SCRIPT = """
import json, os, sys
import torch, transformers
from seqwarm.integrations.hf.trainer import CurriculumTrainer

out, resume = sys.argv[1], len(sys.argv) > 2
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=2, max_position_embeddings=64))
g = torch.Generator().manual_seed(3)
rows = [torch.randint(1, 64, (32,), generator=g).tolist() for _ in range(48)]
data = [{"input_ids": r, "labels": r} for r in rows]
config = {
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": "auto", "eps": "auto", "weight_decay": "auto",
                                              "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-3, "warmup_num_steps": 2,
                                                 "warmup_type": "linear"}},
    "zero_optimization": {"stage": 2},
    "curriculum_learning": {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
                            "schedule_type": "fixed_linear",
                            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8}},
}
args = transformers.TrainingArguments(
    output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=6, learning_rate=2e-3,
    logging_steps=1, save_strategy="steps", save_steps=3, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    deepspeed=config)
trainer = CurriculumTrainer(model=model, args=args, train_dataset=data)
trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3") if resume else None)
logs = [e for e in trainer.state.log_history if "loss" in e]
print("RESULT", json.dumps({
    "rows": [[e["loss"], e["learning_rate"], e["curriculum/seqlen"], e["progress/tokens"]] for e in logs],
    "optimizer": type(trainer.optimizer.optimizer).__name__,
}))
"""


def run(tmp_path, *extra):
    script = tmp_path / "train_ds.py"
    script.write_text(SCRIPT)
    out = run_torchrun([str(script), str(tmp_path / "run"), *extra], nproc=1)
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])


def test_an_optimizer_and_scheduler_block_train_and_resume(tmp_path):
    first = run(tmp_path)
    rows = first["rows"]
    assert [r[2] for r in rows] == [8, 16, 24, 32, 32, 32]  # the schedule's lengths, every token real
    assert [r[3] for r in rows] == [32, 96, 192, 320, 448, 576]
    assert [r[1] for r in rows] == pytest.approx([1e-3, 2e-3, 2e-3, 2e-3, 2e-3, 2e-3])  # WarmupLR, linear, 2 steps
    again = run(tmp_path, "resume")
    assert again["rows"][3:] == rows[3:]  # steps 4-6 after resuming from step 3: the same, exactly
