"""`seqwarm train --curriculum-mode variable` end to end (#37): one length per step with the same tokens,
full-length validation, SIGKILL + --resume continuing exactly, a changed resume refused, two DDP ranks."""

import json
import os
import random
import subprocess
import sys
import time

import pytest

from conftest import FAST_TRAIN_FLAGS, ROOT, WORDS, run_torchrun, small_config, train_rows
from seqwarm.cli import main
from seqwarm.trainer.metrics import read_metrics

pytestmark = pytest.mark.slow

SMALL = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--log-interval", "1"]
FAST = [*FAST_TRAIN_FLAGS, *SMALL]
TOKENS_PER_STEP = 8 * 64  # the full-length global batch: 8 sequences of 64


@pytest.fixture(scope="module")
def varied_data(tmp_path_factory):
    """A prepared folder (byte tokenizer) of 300 documents of 10 to 700 tokens: every bucket 8..64 has steps."""
    from seqwarm.data import prepare_dataset

    base = tmp_path_factory.mktemp("varied")
    rng = random.Random(3)
    (base / "corpus").mkdir()
    for i in range(300):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 110)))
        (base / "corpus" / f"doc{i:03d}.txt").write_text(text + ".\n")
    prepare_dataset(base / "prepared", [base / "corpus"], tokenizer="byte", val_fraction=0.1, workers=1, progress=False)
    return base / "prepared"


@pytest.fixture(scope="module")
def long_data(tmp_path_factory):
    """A prepared folder (byte tokenizer) of 40 documents of about 2,000 tokens: nearly every chunk is of 64."""
    from seqwarm.data import prepare_dataset

    base = tmp_path_factory.mktemp("long")
    rng = random.Random(4)
    (base / "corpus").mkdir()
    for i in range(44):
        text = " ".join(rng.choice(WORDS) for _ in range(330))
        (base / "corpus" / f"doc{i:03d}.txt").write_text(text + ".\n")
    prepare_dataset(base / "prepared", [base / "corpus"], tokenizer="byte", val_fraction=0.1, workers=1, progress=False)
    return base / "prepared"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    # curriculum 8 -> 64 (powers of 2); global batch 8 = micro 4 x accumulation 2
    return small_config(
        tmp_path_factory.mktemp("cfg") / "c.json",
        train_tokens=12 * TOKENS_PER_STEP,
        curriculum_mode="variable",
        variable_curriculum="grow_p2",
        variable_cycles=4,
    )


def test_a_variable_run_trains_one_length_per_step_with_the_same_tokens(tmp_path, varied_data, cfg, capsys):
    out = tmp_path / "run"
    args = ["--config", str(cfg), "--data", str(varied_data), "--out", str(out), "--eval-interval", "6"]
    assert main(["train", *FAST, *args]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("variable:"))
    assert "every row one document" in line and "tokens dropped" in line and "curriculum grow_p2 (4 cycles)" in line
    rows = train_rows(out)
    assert len(rows) == 12 and [r["tokens"] for r in rows] == [TOKENS_PER_STEP * (i + 1) for i in range(12)]
    lengths = [r["seqlen"] for r in rows]
    assert set(lengths) <= {8, 16, 32, 64} and len(set(lengths)) >= 3, lengths
    assert all(r["samples"] % 8 == 0 for r in rows)  # rows counted as drawn: 8 x 64 / L a step
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and {e["seqlen"] for e in evals} == {64}  # validation stays at full length
    resolved = json.loads((out / "config.json").read_text())["run"]
    assert resolved["curriculum"]["mode"] == "variable" and resolved["variable_curriculum"] == "grow_p2"


@pytest.mark.parametrize("curriculum, corpus", [("linear", "long_data"), ("grow_p2", "varied_data")])
def test_seqwarm_plan_gives_the_lengths_the_run_trains_step_by_step(
    tmp_path, curriculum, corpus, request, capsys, caplog
):
    # the same command line for both: plan reads the run's settings (tokens per step, seed, curriculum,
    # cycles, linear's steps from the budget) as train reads them
    config = small_config(tmp_path / "c.json", train_tokens=12 * TOKENS_PER_STEP, curriculum_mode="variable")
    argv = [*FAST, "--config", str(config), "--data", str(request.getfixturevalue(corpus)), "--seed", "11"]
    argv += ["--variable-curriculum", curriculum] + (["--variable-cycles", "3"] if curriculum == "grow_p2" else [])
    assert main(["plan", *argv, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [p["step"] for p in plan["points"]] == list(range(1, 13))  # a row per step: each its step's length
    assert all(p["shortest"] == p["longest"] for p in plan["points"])
    planned = [p["longest"] for p in plan["points"]]
    assert len(set(planned)) >= 2, planned
    if curriculum == "linear":  # the cap grows over the budget's 12 steps, from 8 to 64
        assert plan["caps"][0][1] < 64 == plan["caps"][-1][1] and plan["caps"][-1][0] <= 12
        assert all(p["longest"] <= p["cap"] for p in plan["points"])
        # on long documents the cap trains the few short chunks over and over: said in the plan and by train
        assert len([w for w in plan["warnings"] if "over and over" in w]) == 1

    out = tmp_path / "run"
    assert main(["train", *argv, "--out", str(out), "--eval-interval", "0"]) == 0
    assert [r["seqlen"] for r in train_rows(out)] == planned
    # the run prints the plan's bucket table (short form) at its start: each length's steps over the run
    captured = capsys.readouterr()
    for warning in plan["warnings"]:  # the plan's warnings (a cap's repeated chunks among them) at the start
        assert warning in captured.err + caplog.text, warning
    printed = captured.out.splitlines()
    head = next(i for i, line in enumerate(printed) if line.split()[:3] == ["length", "chunks", "share"])
    table = {int(r.split()[0]): r.split() for r in printed[head + 1 : head + 5]}
    assert sorted(table) == [8, 16, 32, 64]
    assert {length: int(row[5]) for length, row in table.items()} == {n: planned.count(n) for n in table}


# -- SIGKILL + --resume -------------------------------------------------------------------------------


def _popen(args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "seqwarm", "train", *FAST, *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _losses(run):
    return {r["step"]: r["loss"] for r in train_rows(run)}


def test_sigkill_and_resume_continue_a_variable_run_exactly_and_a_changed_resume_is_refused(tmp_path, varied_data, cfg):
    common = ["--config", str(cfg), "--data", str(varied_data), "--save-interval", "1", "--eval-interval", "0"]
    ref = tmp_path / "ref"
    proc = _popen([*common, "--out", str(ref)])
    assert proc.wait(timeout=300) == 0, proc.stdout.read().decode()[-2000:]
    expected = _losses(ref)

    run = tmp_path / "killed"
    proc = _popen([*common, "--out", str(run)])
    end = time.time() + 240
    while time.time() < end and proc.poll() is None and not (run / "checkpoints" / "step_00000005.pt").exists():
        time.sleep(0.005)
    proc.kill()  # SIGKILL, somewhere after its fifth checkpoint (inside step 6, 7 or later)
    proc.wait()
    assert not (run / "summary.json").exists(), "it finished before the kill"
    resumed = _popen([*common, "--out", str(run), "--resume"])
    out = resumed.communicate(timeout=300)[0].decode()
    assert resumed.returncode == 0, out[-2000:]
    assert "resuming at step" in out
    assert _losses(run) == expected  # the same lengths, rows and losses as the uninterrupted run

    # another length range or curriculum on resume: refused with the reason, exit 2, no traceback
    part = tmp_path / "part"
    proc = _popen([*common, "--out", str(part), "--train-iters", "3"])
    assert proc.wait(timeout=300) == 0
    changed = _popen(
        [*common, "--out", str(part), "--resume", "--allow-config-change", "--variable-curriculum", "natural"]
    )
    text = changed.communicate(timeout=300)[0].decode()
    assert changed.returncode == 2, text[-2000:]
    assert "a resume cannot change the length range" in text and "curriculum: 'grow_p2'" in text
    assert "Traceback" not in text


# -- two ranks ----------------------------------------------------------------------------------------


@pytest.mark.dist
def test_two_ddp_ranks_train_one_length_each_step_on_different_rows(tmp_path, varied_data, tmp_path_factory):
    """2 ranks x micro 2 x accumulation 2 against 1 process x micro 2 x accumulation 4: the same global
    rows each step only when the ranks split them (the same rows on both would change every loss)."""
    dist_cfg = small_config(
        tmp_path / "c.json", train_tokens=8 * TOKENS_PER_STEP, batch=8, micro=2, curriculum_mode="variable"
    )
    common = ["-m", "seqwarm", "train", *FAST, "--config", str(dist_cfg), "--data", str(varied_data)]
    common += ["--eval-interval", "0"]
    run_torchrun([*common, "--out", str(tmp_path / "two")], nproc=2)  # the loop checks one length per step
    run_torchrun([*common, "--out", str(tmp_path / "one")], nproc=1)
    a, b = train_rows(tmp_path / "two"), train_rows(tmp_path / "one")
    assert json.loads((tmp_path / "two" / "config.json").read_text())["parallelism"] == "ddp"
    assert [r["seqlen"] for r in a] == [r["seqlen"] for r in b] and len({r["seqlen"] for r in a}) > 1
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b] == [TOKENS_PER_STEP * (i + 1) for i in range(8)]
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-5)
    for x, y in zip(a[1:], b[1:]):  # rounding of the all-reduce only (see test_distributed.py)
        assert x["loss"] == pytest.approx(y["loss"], rel=2e-3), f"step {x['step']}"
    run_torchrun([*common, "--fsdp", "--out", str(tmp_path / "fsdp")], nproc=2)  # FSDP2: the same steps
    c = train_rows(tmp_path / "fsdp")
    assert [r["seqlen"] for r in c] == [r["seqlen"] for r in a] and [r["tokens"] for r in c] == [r["tokens"] for r in a]
    assert c[0]["loss"] == pytest.approx(a[0]["loss"], rel=1e-5)
