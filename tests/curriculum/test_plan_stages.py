"""The stages in the plan (issue #36 item 4): where each begins and what it trains, as the curriculum object
decides it step by step, the tokens at each length, and the schedule's problems (library, plan, check-config)."""

from __future__ import annotations

import json

import pytest
import torch

from seqwarm.cli import main
from seqwarm.config import load_config
from seqwarm.curriculum.plan import make_plan
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.util.problems import ConfigError

STAGES = [
    {"start_tokens": 1000, "length": 64, "rope_theta": 40000.0},
    {"start_tokens": 3000, "length": 128, "rope_scaling": {"type": "yarn", "factor": 2.0}},
]
WARMUP = dict(min_length=8, max_length=32, steps=4, multiple_of=8)


def _config(stages, train_tokens=5000):
    return {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 32,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8},
        },
        "seqwarm": {"seq_length": 128, "train_tokens": train_tokens, "stages": stages},
    }


def test_the_plan_is_the_run_the_warmup_object_trains():
    slw = SequenceLengthWarmup(**WARMUP, stages=STAGES, train_tokens=5000)
    plan = slw.plan(4, micro_batch_size=2, seq_length=128)
    batch = torch.zeros(4, 128, dtype=torch.long)
    begins, lengths = {}, []
    while slw.progress.tokens < 5000:
        length = slw.begin_step()
        if slw.stage_changed:
            begins[slw.stages.index + 1] = (slw.progress.step + 1, slw.progress.tokens)
        lengths.append(length)
        slw.cut(batch)
        slw.end_step()
    assert plan.total_steps == len(lengths) and plan.total_tokens == slw.progress.tokens
    assert [(s.step, s.tokens_before) for s in plan.stages] == [begins[1], begins[2]]
    first, second = plan.stages
    # a loop of its own cuts its rows to the stage's length (seqwarm train reads the stage's windows instead)
    assert first.length == 64 and first.rows_per_step == 4 and first.tokens_per_step == 256
    assert plan.val_shape == (2, 128) and plan.stages[1].rows_per_step == 4
    assert first.rope_theta == 40000.0 and first.rope_scaling is None
    assert second.rope_scaling["type"] == "yarn" and second.rope_scaling["original_max_position_embeddings"] == 64
    assert first.steps == lengths.count(64) and second.steps == lengths.count(128)
    uses = {u.length: (u.steps, u.tokens) for u in plan.lengths}
    assert sum(t for _, t in uses.values()) == plan.total_tokens
    assert uses[128] == (second.steps, second.tokens) and uses[32][0] == lengths.count(32)
    assert list(uses) == [8, 16, 24, 32, 64, 128]  # in order of first use
    assert not plan.warnings and not plan.problems
    assert "1 for validation at the pretraining length 32" in plan.compiles_why  # val_loss_pretrain


def test_a_stage_before_the_warmup_ends_is_an_error_and_one_never_reached_a_warning():
    early = [{"start_tokens": 100, "length": 64}, {"start_tokens": 150, "length": 128}]
    with pytest.raises(ConfigError) as err:  # the library lists every problem
        SequenceLengthWarmup(**WARMUP, stages=early, train_tokens=5000).plan(4, micro_batch_size=2, seq_length=128)
    assert len(err.value.problems) == 2
    assert "stages[0].start_tokens" in str(err.value) and "start it at 192 tokens or later" in str(err.value)
    kept = make_plan(load_config(_config(early)), check=False)
    assert [p.path for p in kept.problems] == ["seqwarm.stages[0].start_tokens", "seqwarm.stages[1].start_tokens"]
    # 192 tokens: before the first step at 32 (steps 1-3 train 4 x (8 + 16 + 24)); a stage from there is fine
    assert not make_plan(load_config(_config([{"start_tokens": 192, "length": 64}]))).problems
    short = make_plan(load_config(_config(STAGES, train_tokens=2000)))
    assert short.stages[1].step is None and short.stages[1].steps == 0
    assert any("stage 2 (from 3k tokens, length 128) never begins" in w for w in short.warnings)


def test_plan_and_check_config_show_the_stages_and_exit_2_on_a_problem(tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_config(STAGES)))
    bad.write_text(json.dumps(_config([{"start_tokens": 100, "length": 64}])))
    assert main(["plan", str(good), "--rotary"]) == 0
    out, err = capsys.readouterr()
    # seqwarm train reads a stage's windows at its length, keeping the micro-batch's 2 x 32 tokens: 1 row of 64
    assert (
        "stage 1:                   step 11, after 1.09k tokens (from 1k): length 64, 2 rows/step (128 tokens)" in out
    )
    assert (
        "stage 2:                   step 26, after 3.01k tokens (from 3k): length 128, 2 rows/step (256 tokens)" in out
    )
    assert "the stage of length 128 trains 1 row per micro-batch, 128 tokens instead of the 64" in err
    assert "rope_theta 40000; yarn (factor 2, original_max_position_embeddings 64" in out
    assert "tokens at each length:" in out and "128: " in out
    assert main(["check-config", str(good)]) == 0
    out = capsys.readouterr().out
    assert "stages:      1. from 1k tokens: length 64, rope_theta 40000" in out
    assert "2. from 3k tokens: length 128, rope_theta 40000, yarn x2" in out
    for command in (["plan", str(bad), "--rotary"], ["check-config", str(bad)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "seqwarm.stages[0].start_tokens = 100" in err and "before the warmup reaches" in err
    plan = json.loads(main(["plan", str(good), "--rotary", "--json"]) == 0 and capsys.readouterr().out)
    assert [s["step"] for s in plan["stages"]] == [11, 26] and plan["problems"] == []


def test_plan_estimates_memory_at_the_longest_stage_without_torch(tmp_path, capsys):
    """`seqwarm plan` of a run with stages: one process's memory at the longest stage (its rows there), the lower
    bound train's check computes from the same sizes — the GPT's parameters counted as the model counts them —
    said to be an estimate, and nothing of torch imported to get it."""
    import subprocess
    import sys

    from seqwarm.trainer.memory import estimate_memory
    from seqwarm.trainer.model import GPT, GPTConfig

    path = tmp_path / "good.json"
    path.write_text(json.dumps(_config(STAGES)))
    code = (
        "import json, sys; from seqwarm.cli import main; "
        f"assert main(['plan', {str(path)!r}, '--rotary', '--model', 'tiny', '--json']) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    memory = json.loads(done.stdout)["memory"]
    assert memory["estimate"] is True and (memory["rows"], memory["length"]) == (1, 128)  # 2 x 32 tokens: 1 row
    model = GPTConfig.preset("tiny", seq_length=128, rotary=True)
    assert memory["params"] == model.num_params() == GPT(model).num_params()
    expected = estimate_memory(
        model.num_params(), vocab_rows=model.padded_vocab_size, n_embd=256, n_layer=4, micro_batch=1, seq_length=128
    )
    assert memory["bytes"] == expected.total
    # a longer last stage with rows of its own: the estimate follows it
    path.write_text(json.dumps(_config([*STAGES, {"start_tokens": 4000, "length": 512, "micro_batch_size": 2}])))
    assert main(["plan", str(path), "--rotary", "--model", "tiny"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("memory (estimate):"))
    assert "for micro-batch 2 x length 512 x vocabulary 8,192" in line and "a lower bound" in line
    assert "before anything is allocated" in line and "the tiny preset's vocabulary" in line
