"""`seqwarm plan` takes train's arguments and plans the run `seqwarm train` does with them."""

import json
from pathlib import Path

from conftest import FAST_TRAIN_FLAGS, train_rows
from seqwarm.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def plan_json(argv, capsys) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "--json prints one line"
    return json.loads(out)


def test_plan_is_the_run_train_does_for_the_same_arguments(tmp_path, byte_data, capsys, one_thread):
    """No config: the built-in recipe, scaled to the budget, batch and length as train scales it (here its
    130-step curriculum becomes 10 steps); every step's length and tokens are the ones train logs."""
    argv = ["--train-tokens", "6k", "--seq-length", "64", "--global-batch-size", "4"]
    plan = plan_json(argv, capsys)
    assert "--train-tokens 6k and --global-batch-size 4 and --seq-length 64" in plan["recipe"]
    assert "total_curriculum_step 130 -> 10" in plan["recipe"]
    out = tmp_path / "run"
    common = ["--data", str(byte_data), "--out", str(out), "--log-interval", "1", "--eval-interval", "0"]
    assert main(["train", *argv, *common, *FAST_TRAIN_FLAGS, "--save-interval", "0"]) == 0
    assert plan["recipe"] in capsys.readouterr().out  # train says it scaled the recipe, and why
    rows = train_rows(out)
    assert len(rows) == plan["total_steps"] and rows[-1]["tokens"] == plan["total_tokens"]
    by_step = {r["step"]: r for r in rows}
    for point in plan["points"]:  # the steps where the length changes, and the last
        assert (by_step[point["step"]]["seqlen"], by_step[point["step"]]["tokens"]) == (
            point["seqlen"],
            point["tokens"],
        )
    changes = [r["step"] for i, r in enumerate(rows) if i == 0 or r["seqlen"] != rows[i - 1]["seqlen"]]
    assert changes == [p["step"] for p in plan["points"]][: len(changes)] and len(changes) > 3


def test_the_budget_scales_the_recipe_and_plan_says_so(capsys):
    """The issue's case: `--train-tokens 200k` trains T = 22 starting at 16; plan shows that run."""
    assert main(["plan", "--train-tokens", "200k"]) == 0
    out = capsys.readouterr().out
    assert "recipe:      the built-in recipe, scaled to --train-tokens 200k: total_curriculum_step 130 -> 22" in out
    assert "seqlen 16 -> 256 tokens linearly over 22 steps" in out
    # a config file is never scaled, and nothing is said
    assert main(["plan", str(EXAMPLES / "tiny_cpu.json"), "--train-tokens", "200k"]) == 0
    assert "recipe:" not in capsys.readouterr().out
    # CONFIG and --config are one argument
    assert main(["plan", "--config", str(EXAMPLES / "tiny_cpu.json"), "--train-tokens", "200k"]) == 0
    assert "over 130 steps" in capsys.readouterr().out
    assert main(["plan", str(EXAMPLES / "tiny_cpu.json"), "--config", str(EXAMPLES / "ds_config_gpt2.json")]) == 2
    assert "two configs; give one" in capsys.readouterr().err


def test_plan_without_a_budget_warns_only_of_what_is_real(capsys):
    """No config and no --train-tokens: the recipe as written, no warning. A config without a budget is
    planned to the end of its curriculum, with train's refusal, not 'the curriculum takes 100%'."""
    plan = plan_json([], capsys)
    assert plan["total_steps"] == 358 and plan["curriculum_end_step"] == 130 and plan["recipe"] is None
    assert main(["plan"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["plan", str(EXAMPLES / "ds_config_gpt2.json")]) == 0
    err = capsys.readouterr().err
    assert "takes 100%" not in err
    assert "warning: train refuses this run: train_tokens = null: no budget" in err


def test_plan_prints_the_shapes_and_compiles_and_a_missing_warmup(capsys):
    """The shapes line (the reshape mode's many shapes thinned to the first and last), the compile count
    with its reason, and 'none' instead of 'LR warmup ends: step 0' without a warmup."""
    flags = ["--train-tokens", "200k", "--lr-warmup-iters", "0"]
    assert main(["plan", *flags, "--curriculum-mode", "reshape"]) == 0
    out = capsys.readouterr().out
    shapes = next(line for line in out.splitlines() if line.startswith("shapes:"))
    plan = plan_json([*flags, "--curriculum-mode", "reshape"], capsys)
    first, last = plan["shapes"][0], plan["shapes"][-1]
    assert f"{len(plan['shapes'])} training micro-batch shapes" in shapes and len(plan["shapes"]) > 8
    assert f" {first[0]}x{first[1]}, " in shapes and f", {last[0]}x{last[1]};" in shapes and "..." in shapes
    assert f"validation {plan['val_shape'][0]}x{plan['val_shape'][1]}" in shapes
    assert f"compiles with --compile:   {plan['compiles']}  (" in out and "no_grad" in out
    assert "LR warmup:                 none" in out and "LR warmup ends:            step 0" not in out
    window = plan_json([*flags, "--curriculum-mode", "window"], capsys)
    assert len(window["shapes"]) == 1 and window["shapes"][0] == window["val_shape"]
    bucket = plan_json([*flags, "--length-bucket", "64"], capsys)
    assert [c for _, c in bucket["shapes"]] == [64, 128, 192, 256]
