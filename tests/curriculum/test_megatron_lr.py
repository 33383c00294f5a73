"""The Megatron LR rule against Megatron-DeepSpeed's own scheduler, step for step.

``tests/data/megatron_lr_table.json`` was recorded by ``tests/data/make_megatron_lr_table.py`` from
Megatron-DeepSpeed's ``megatron/optimizer_param_scheduler.py`` (its ``OptimizerParamScheduler``, driven as
``megatron/training.py``'s DeepSpeed path drives it). Each config's flags go through ``load_config`` as a
Megatron command line would give them; the clock is replayed with ``advance`` and ``lr_at`` (what every
seqwarm engine calls) and every step's LR must equal the recorded one.
"""

import json
import math
from pathlib import Path

import pytest

from seqwarm.config import load_config
from seqwarm.curriculum.clock import Progress, advance
from seqwarm.curriculum.lr import LRConfig, lr_at

TABLE = json.loads((Path(__file__).resolve().parents[1] / "data" / "megatron_lr_table.json").read_text())
CONFIGS = {c["name"]: c for c in TABLE["configs"]}
RAN = sorted(name for name, c in CONFIGS.items() if "error" not in c)

# Megatron's argparse dests -> seqwarm settings (the same names, but the global batch)
SETTING = {"global_batch_size": "train_batch_size"}


def megatron_command_line(flags: dict) -> dict:
    """The overrides a Megatron-DeepSpeed command line with ``flags`` gives (one rank, no accumulation)."""
    out = {SETTING.get(k, k): v for k, v in flags.items()}
    out["train_micro_batch_size_per_gpu"] = flags["global_batch_size"]
    return out


def replay(lr_cfg: LRConfig, steps):
    p, lrs = Progress(), []
    for _, samples, tokens, _ in steps:
        p = advance(p, samples, tokens, lr_cfg)
        lrs.append(lr_at(p, lr_cfg))
    return p, lrs


def test_the_table_covers_every_style_unit_and_budget():
    flags = [c["flags"] for c in CONFIGS.values() if "error" not in c]
    styles = {f.get("lr_decay_style", "linear") for f in flags}
    assert styles == {"linear", "cosine", "inverse-square-root", "constant"}
    for key in ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_tokens", "lr_decay_iters", "lr_decay_samples"):
        assert any(key in f for f in flags), key
    assert any("lr_decay_tokens" in f for f in flags) and any("train_tokens" in f for f in flags)
    assert any("train_iters" in f for f in flags) and any("train_samples" in f for f in flags)
    assert TABLE["source"] == "megatron/optimizer_param_scheduler.py" and TABLE["commit"]


@pytest.mark.parametrize("name", RAN)
def test_every_step_trains_at_megatrons_lr(name):
    config = CONFIGS[name]
    cfg = load_config(
        {"train_batch_size": config["flags"]["global_batch_size"]}, overrides=megatron_command_line(config["flags"])
    )
    assert cfg.lr.rule == "megatron"  # the command line is Megatron's: its rule, without being asked
    _, lrs = replay(cfg.lr, config["steps"])
    expected = [row[3] for row in config["steps"]]
    for step, (got, want) in enumerate(zip(lrs, expected), start=1):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-18), f"{name}: step {step}: {got} != Megatron's {want}"


def test_a_resumed_clock_continues_megatrons_schedule():
    config = CONFIGS["iters_cosine_decay_tokens"]
    cfg = load_config({"train_batch_size": 8}, overrides=megatron_command_line(config["flags"]))
    steps = config["steps"]
    mid, _ = replay(cfg.lr, steps[:10])
    p = Progress.from_dict(json.loads(json.dumps(mid.to_dict())))  # through a checkpoint
    for _, samples, tokens, want in steps[10:]:
        p = advance(p, samples, tokens, cfg.lr)
        assert lr_at(p, cfg.lr) == pytest.approx(want, rel=1e-12)


def test_seqwarms_own_rule_is_one_step_ahead_and_unchanged():
    """The issue's example: step 1 trains at 0 under Megatron's rule, at lr / warmup under seqwarm's."""
    config = CONFIGS["iters_train_tokens_budget_cosine"]
    flags = megatron_command_line(config["flags"])
    megatron = load_config({"train_batch_size": 8}, overrides=flags).lr
    seqwarm = load_config({"train_batch_size": 8}, overrides={**flags, "megatron": False}).lr
    assert (megatron.rule, seqwarm.rule) == ("megatron", "seqwarm")
    assert replay(megatron, config["steps"])[1][:3] == [0.0, 3e-4, 6e-4]
    assert replay(seqwarm, config["steps"])[1][:2] == [3e-4, 6e-4]
    # Megatron decays over --train-iters although --train-tokens is set; seqwarm's rule over the tokens
    assert (megatron.decay_iters, megatron.decay_tokens) == (40, None)
    assert (seqwarm.decay_tokens, seqwarm.decay_iters) == (10**6, None)


def seqlen(step: int) -> int:  # the table's curriculum (its description)
    return min(64, 8 * (1 + (step - 1) // 3))


def test_where_megatron_crashes_the_documented_fixes_run():
    # warmup of 20 samples with batches of 8: Megatron's `==` never records the decay start and crashes at
    # step 3; seqwarm records it when the warmup is passed (step 4's scheduler has seen 24 samples)
    config = CONFIGS["crash_warmup_samples_not_whole_batches"]
    assert config["error"].startswith("TypeError") and "step 3" in config["error"]
    cfg = load_config({"train_batch_size": 8}, overrides=megatron_command_line(config["flags"]))
    steps = [[n, 8, 8 * seqlen(n), None] for n in range(1, 41)]
    clock, lrs = replay(cfg.lr, steps)
    assert lrs[:2] == pytest.approx([row[3] for row in config["steps"]], rel=1e-12)  # where Megatron ran
    assert lrs[2] == pytest.approx(6e-4 * 16 / 20)  # step 3: 16 samples seen, still warming up
    tokens_before = [sum(8 * seqlen(k) for k in range(1, n)) for n in range(1, 42)]
    start = tokens_before[2]  # step 4's scheduler read the tokens of steps 1..2
    assert clock.warmup_end_tokens == start
    for n in range(4, 41):
        ratio = min((tokens_before[n - 2] - start) / (10_000 - start), 1.0)
        assert lrs[n - 1] == pytest.approx(1e-5 + 0.5 * (math.cos(math.pi * ratio) + 1) * (6e-4 - 1e-5), rel=1e-12)
    # a token decay without warmup: Megatron subtracts None at once; seqwarm decays from 0 tokens
    config = CONFIGS["crash_decay_tokens_without_warmup"]
    assert config["error"].startswith("TypeError") and "step 1" in config["error"]
    cfg = load_config({"train_batch_size": 8}, overrides=megatron_command_line(config["flags"]))
    _, lrs = replay(cfg.lr, [[n, 8, 8 * seqlen(n), None] for n in range(1, 21)])
    for n, got in enumerate(lrs, start=1):
        seen = tokens_before[max(n - 2, 0)]
        want = 1e-5 if seen > 5_000 else 1e-5 + (1 - seen / 5_000) * (6e-4 - 1e-5)
        assert got == pytest.approx(want, rel=1e-12)
