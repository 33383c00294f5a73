"""benchmarks/gpu_paper_pair.py --smoke on CPU, from a plain checkout: the pair's JSON holds what it claims.

The crossings and speedups are recomputed here from the curves in the JSON, with a crossing written out
again (not seqwarm's), so a mislabelled arm, a wrong target or a swapped ratio fails.
"""

import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # trains: a throughput run, tune's probes and both arms


def crossing(xs, ys, target):
    """First x where the polyline through (xs, ys) is at or below target (None: never)."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y)
    return None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pair")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds src/ itself
    env["OMP_NUM_THREADS"] = "1"
    out = tmp / "pair.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_paper_pair.py"),
            "--smoke",
            "--json",
            str(out),
            "--out",
            str(tmp / "runs"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text()), tmp / "runs"


def test_the_pair_is_the_papers_setting(smoke):
    stdout, res, _ = smoke
    s, base, cur = res["settings"], res["arms"]["baseline"], res["arms"]["curriculum"]
    assert "| arm | batch | LR | T |" in stdout and "## curriculum: val loss against tokens and seconds" in stdout
    assert res["torch"] and res["device"] and res["smoke"] is True
    assert cur["global_batch_size"] == 8 * base["global_batch_size"] == 8 * s["batch"]
    assert math.isclose(cur["lr"], 4 * base["lr"]) and math.isclose(base["lr"], s["lr"])
    assert cur["micro_batch_size"] == base["micro_batch_size"] == s["batch"]  # 8x by accumulation
    assert cur["gradient_accumulation_steps"] == 8 * base["gradient_accumulation_steps"] == 8
    assert base["total_curriculum_step"] is None and base["min_difficulty"] is None  # the baseline has none
    assert cur["min_difficulty"] == s["min_difficulty"] and cur["max_difficulty"] == s["seq_length"]
    assert cur["total_curriculum_step"] == s["total_curriculum_step"]
    tune = res["tune"]
    assert s["total_curriculum_step"] == (tune["chosen"] if tune["chosen"] is not None else tune["range"][0])
    assert tune["range"][0] == cur["lr_warmup_iters"]  # tune's low end is the curriculum arm's own warmup
    assert base["lr_warmup_iters"] == s["lr_warmup_iters"]


def test_the_budget_is_the_measured_throughput_times_the_seconds(smoke):
    _, res, _ = smoke
    tp, s = res["throughput"], res["settings"]
    assert math.isclose(tp["tokens_per_s"], tp["tokens"] / tp["seconds"])
    assert s["min_train_tokens"] == 64 * s["batch"] * s["seq_length"]  # the floor: 64 baseline steps
    assert s["train_tokens"] == max(s["min_train_tokens"], int(tp["tokens_per_s"] * s["arm_s"] * s["eval_share"]))
    for arm in res["arms"].values():  # both arms train the same budget (one last step may overshoot it)
        assert s["train_tokens"] <= arm["tokens"] < s["train_tokens"] + arm["global_batch_size"] * s["seq_length"]


def test_curves_targets_and_speedups_add_up(smoke):
    _, res, runs = smoke
    arms = res["arms"]
    for arm in arms.values():
        e = arm["evals"]
        assert len(e["step"]) == len(e["tokens"]) == len(e["elapsed_s"]) == len(e["val_loss"]) >= 2
        assert e["tokens"] == sorted(e["tokens"]) and e["elapsed_s"] == sorted(e["elapsed_s"])
        assert e["step"][-1] == arm["steps"] and e["tokens"][-1] == arm["tokens"]
        assert arm["final_val_loss"] == e["val_loss"][-1]
        assert arm["spikes"] == arm["stability"]["spikes"] >= 0
    assert res["target"] == arms["baseline"]["evals"]["val_loss"][-1]
    for key, x in (("tokens_to_target", "tokens"), ("time_to_target", "elapsed_s")):
        got = res[key]
        want = {n: crossing(a["evals"][x], a["evals"]["val_loss"], res["target"]) for n, a in arms.items()}
        assert got["baseline"] == pytest.approx(want["baseline"]) and want["baseline"] is not None
        if want["curriculum"] is None:
            assert got["curriculum"] is None and got["speedup"] is None and res["reached"] is False
        else:
            assert got["curriculum"] == pytest.approx(want["curriculum"]) and res["reached"] is True
            assert got["speedup"] == pytest.approx(want["baseline"] / want["curriculum"])
    assert res["speedup_tokens"] == res["tokens_to_target"]["speedup"]
    assert res["speedup_time"] == res["time_to_target"]["speedup"]
    # the JSON's curves are the runs' own logged evaluations
    logged = [json.loads(line) for line in (runs / "pair" / "curriculum" / "metrics.jsonl").read_text().splitlines()]
    assert [r["val_loss"] for r in logged if r["kind"] == "eval"] == arms["curriculum"]["evals"]["val_loss"]
