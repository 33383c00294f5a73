"""DeepSpeed: ZeRO-2, ZeRO-3 (with stages too) and a 2-stage pipeline on 2 CPU processes (gloo) under torchrun, the
DeepSpeedCurriculum helper (the docs example, run as written), the config hand-off, and the message
when DeepSpeed is missing.

Every torchrun run grows the length 16 -> 64 (the loop itself fails if ranks disagree on a step's
length); each step trains 8 global sequences at that length (2 data-parallel ranks x micro 2 x
accumulation 2, or 1 x 2 x 4 for the pipeline). Resuming from a DeepSpeed checkpoint reproduces the
uninterrupted run's losses exactly (ZeRO-2 here, the pipeline in test_pipeline_runs.py). DeepSpeed's C++
ops are never built: seqwarm hands it torch's AdamW and skips its CPU shared-memory collective.

The slow, end-to-end part; the fast tests are in tests/integrations/test_deepspeed.py.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import FAST_TRAIN_FLAGS, run_torchrun, small_config, train_rows
from seqwarm.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
HAVE_DS = importlib.util.find_spec("deepspeed") is not None
needs_ds = pytest.mark.skipif(
    not HAVE_DS,
    reason="deepspeed is not installed (DS_BUILD_OPS=0 pip install 'seqwarm[deepspeed]'; `make setup` does it)",
)
TORCHRUN = [pytest.mark.dist, pytest.mark.deepspeed, pytest.mark.slow, needs_ds]

FAST = [*FAST_TRAIN_FLAGS, "--log-interval", "1", "--eval-interval", "5", "--deepspeed"]


def torchrun(args, nproc=2, module=True):
    target = ["-m", "seqwarm", "train", *FAST] if module else []
    return run_torchrun([*target, *args], nproc)


def ds_json(path: Path, stage: int) -> Path:
    """conftest's small config (8 -> 64 over 6 steps, 6000 tokens, global batch 8, micro 2) + ZeRO."""
    small_config(path, train_tokens=6000, batch=8, micro=2)
    cfg = json.loads(path.read_text())
    cfg["zero_optimization"] = {"stage": stage}
    path.write_text(json.dumps(cfg))
    return path


def check_growing_run(run_dir):
    """Lengths grow to 64; each step's tokens = 8 global sequences x its length; eval at full length."""
    rows = train_rows(run_dir)
    lengths = [r["seqlen"] for r in rows]
    assert lengths[0] == 16 and lengths == sorted(lengths) and lengths[-1] == 64
    prev = 0
    for r in rows:
        assert r["tokens"] - prev == 8 * r["seqlen"]  # world size x per-rank tokens, every step
        prev = r["tokens"]
    assert rows[-1]["tokens"] >= 6000 > rows[-2]["tokens"]
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and {e["seqlen"] for e in evals} == {64}
    return rows


def interrupted_then_resumed(common, tmp_path, rows):
    """Stop at step 6 (a checkpoint), resume to the end: the same losses, step for step."""
    part = tmp_path / "part"
    torchrun([*common, "--out", str(part), "--train-iters", "6"])
    assert [r["step"] for r in train_rows(part)][-1] == 6
    out = torchrun([*common, "--out", str(part), "--resume", "--allow-config-change"])
    assert "resuming at step 6" in out
    resumed = train_rows(part)
    assert [(r["step"], r["seqlen"], r["tokens"]) for r in resumed] == [
        (r["step"], r["seqlen"], r["tokens"]) for r in rows
    ]
    assert {r["step"]: r["loss"] for r in resumed} == {r["step"]: r["loss"] for r in rows}


def check_export(run_dir, steps):
    """The end-of-run export is what `seqwarm eval` loads."""
    from seqwarm.evaluation.runs import load_run

    loaded = load_run(run_dir, device="cpu")
    assert loaded.step == steps and loaded.tokens == train_rows(run_dir)[-1]["tokens"]
    return loaded.model


@pytest.fixture(scope="module")
def zero2(tmp_path_factory, byte_data):
    base = tmp_path_factory.mktemp("zero2")
    cfg = ds_json(base / "z2.json", 2)
    common = ["--config", str(cfg), "--data", str(byte_data), "--save-interval", "3"]
    run = base / "ref"
    out = torchrun([*common, "--out", str(run)])
    assert "done: reached the token budget" in out
    return run, common


def torchrun_test(fn):
    """Marks of a test that starts processes: dist, deepspeed, slow, and a skip without deepspeed."""
    for mark in reversed(TORCHRUN):
        fn = mark(fn)
    return fn


@torchrun_test
def test_zero2_grows_length_counts_tokens_and_resumes_exactly(zero2, tmp_path):
    run, common = zero2
    rows = check_growing_run(run)
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["parallelism"] == "deepspeed-zero2" and resolved["world_size"] == 2
    handed = resolved["deepspeed"]  # what deepspeed.initialize got
    assert handed["zero_optimization"] == {"stage": 2} and handed["gradient_accumulation_steps"] == 2
    assert not {"curriculum_learning", "seqwarm", "optimizer", "scheduler"} & set(handed)
    ds_dir = run / "checkpoints" / "deepspeed"
    tags = sorted(p.name for p in ds_dir.iterdir() if p.is_dir())
    last = rows[-1]["step"]
    assert tags == [f"step_{s:08d}" for s in (9, 12, last)]  # --keep-checkpoints 3
    assert (ds_dir / "latest").read_text().strip() == f"step_{last:08d}"
    check_export(run, last)
    interrupted_then_resumed(common, tmp_path, rows)


@torchrun_test
def test_zero3_matches_zero2(zero2, tmp_path, byte_data):
    ref_run, _ = zero2
    cfg = ds_json(tmp_path / "z3.json", 3)
    run = tmp_path / "zero3"
    torchrun(["--config", str(cfg), "--data", str(byte_data), "--save-interval", "0", "--out", str(run)])
    rows, ref = check_growing_run(run), train_rows(ref_run)
    assert json.loads((run / "config.json").read_text())["parallelism"] == "deepspeed-zero3"
    assert [(r["seqlen"], r["tokens"], r["lr"]) for r in rows] == [(r["seqlen"], r["tokens"], r["lr"]) for r in ref]
    for a, b in zip(rows, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
    model = check_export(run, rows[-1]["step"])  # gathered from the ZeRO-3 partitions
    ref_model = check_export(ref_run, ref[-1]["step"])
    for (name, p), (_, q) in zip(model.state_dict().items(), ref_model.state_dict().items()):
        assert torch.allclose(p, q, atol=1e-3), name


@torchrun_test
def test_two_stage_pipeline_grows_length_and_matches_zero2(zero2, tmp_path, byte_data):
    ref_run, _ = zero2
    cfg = ds_json(tmp_path / "z1.json", 1)
    common = ["--config", str(cfg), "--data", str(byte_data), "--save-interval", "3", "--pipeline-stages", "2"]
    run = tmp_path / "pipe"
    torchrun([*common, "--out", str(run)])
    rows = check_growing_run(run)  # the length changes 5 times: reset_activation_shape() each time
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["parallelism"] == "deepspeed-pipeline2-zero1"
    assert resolved["world_size"] == 1 and resolved["run"]["gradient_accumulation_steps"] == 4
    # the same model, data order and recipe as ZeRO-2 over 2 data-parallel ranks
    ref = train_rows(ref_run)
    assert [(r["seqlen"], r["tokens"]) for r in rows] == [(r["seqlen"], r["tokens"]) for r in ref]
    for a, b in zip(rows, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
    check_export(run, rows[-1]["step"])  # gathered from both stages
    # a pipeline run stopped mid-curriculum resumes to the uninterrupted run's losses exactly: in
    # test_pipeline_runs.py (test_truncate_with_accumulation_evaluates_every_length_and_resumes_exactly)


def doc_example() -> str:
    doc = (ROOT / "docs" / "DISTRIBUTED.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "own_loop.py" in b]
    assert len(blocks) == 1
    return blocks[0]


@torchrun_test
def test_own_loop_example_in_the_docs_runs(tmp_path):
    script = tmp_path / "own_loop.py"
    script.write_text(doc_example())
    runner = tmp_path / "runner.py"  # CPU only: skip DeepSpeed's C++ shm collective, then run the example
    runner.write_text(
        "import runpy, sys\nimport deepspeed\n"
        "from seqwarm.integrations.deepspeed.curriculum import skip_cpu_shm_comm\n"
        "skip_cpu_shm_comm(deepspeed)\n"
        f"sys.argv = [{str(script)!r}, {str(tmp_path / 'ckpt')!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    out = torchrun([str(runner)], module=False)
    rows = [
        tuple(float(x) for x in m)
        for m in re.findall(r"^step (\d+) seqlen (\d+) tokens (\d+) lr ([\d.]+)$", out, flags=re.M)
    ]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [int(r[1]) for r in rows] == [16, 32, 48, 64, 64, 64]
    prev = 0
    for _, seqlen, tokens, _ in rows:
        assert tokens - prev == 8 * seqlen  # 2 ranks x micro 2 x accumulation 2
        prev = tokens
    assert rows[0][3] == pytest.approx(5e-4) and rows[1][3] == pytest.approx(1e-3, rel=1e-3)
    assert (tmp_path / "ckpt" / "latest").is_file()


STAGES = [
    {"start_tokens": 1200, "length": 48, "rope_theta": 40000.0},
    {"start_tokens": 2500, "length": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}},
]


def stages_json(path: Path, zero: int | None) -> Path:
    """The warmup 8 -> 32 over 4 steps, then a θ stage at 48 and a YaRN stage at 64 (4500 tokens in all);
    global batch 8, micro 2; ZeRO ``zero`` (None: no DeepSpeed block)."""
    small_config(path, total_step=4, train_tokens=4500, batch=8, micro=2)
    cfg = json.loads(path.read_text())
    cfg["curriculum_learning"]["max_difficulty"] = 32
    cfg["seqwarm"]["stages"] = STAGES
    if zero is not None:
        cfg["zero_optimization"] = {"stage": zero}
    path.write_text(json.dumps(cfg))
    return path


@torchrun_test
def test_zero3_trains_a_theta_and_a_yarn_stage_on_every_rank_like_ddp_and_resumes_inside_a_stage(tmp_path, byte_data):
    """Stages under ZeRO-3 (partitioned parameters; the rotary tables are buffers, set whole on each rank):
    the stage rows, the same losses as DDP over the same 2 ranks (a rank left at the old positions would
    change the mean), an exact resume inside the YaRN stage, and the export carrying the last stage."""
    common = ["--data", str(byte_data), "--rotary", "--save-interval", "3"]
    ds = ["--config", str(stages_json(tmp_path / "z3.json", 3)), *common]
    run = tmp_path / "zero3"
    torchrun([*ds, "--out", str(run)])
    rows = train_rows(run)
    stages = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "stage"]
    assert [(r["stage"], r["seqlen"], r["reason"]) for r in stages] == [(1, 48, "begins"), (2, 64, "begins")]
    for row, stage in zip(stages, STAGES):  # the first step whose clock reached start_tokens
        assert rows[row["step"] - 2]["tokens"] >= stage["start_tokens"] > rows[row["step"] - 3]["tokens"]
    assert stages[1]["rope_theta"] == 40000.0 and stages[1]["rope_scaling"]["type"] == "yarn"
    assert {r["seqlen"] for r in rows if r["step"] >= stages[1]["step"]} == {64}

    ddp = tmp_path / "ddp"  # the torch backend over the same ranks, data and recipe
    run_torchrun(
        ["-m", "seqwarm", "train", *FAST_TRAIN_FLAGS, "--log-interval", "1", "--eval-interval", "5"]
        + ["--config", str(stages_json(tmp_path / "ddp.json", None)), *common, "--out", str(ddp)],
        2,
    )
    ref = train_rows(ddp)
    assert [(r["seqlen"], r["tokens"]) for r in rows] == [(r["seqlen"], r["tokens"]) for r in ref]
    for a, b in zip(rows, ref):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), a["step"]  # ~1e-6 apart

    part = tmp_path / "part"  # stopped inside the YaRN stage, resumed: the same losses, step for step
    inside = stages[1]["step"] + 1
    torchrun([*ds, "--out", str(part), "--train-iters", str(inside)])
    out = torchrun([*ds, "--out", str(part), "--resume", "--allow-config-change"])
    assert f"resuming at step {inside}" in out
    assert {r["step"]: r["loss"] for r in train_rows(part)} == {r["step"]: r["loss"] for r in rows}
    again = [r for r in read_metrics(part / "metrics.jsonl") if r["kind"] == "stage"]
    assert (again[-1]["step"], again[-1]["stage"], again[-1]["reason"]) == (inside + 1, 2, "resumed")

    model = check_export(run, rows[-1]["step"])  # gathered from the partitions, the YaRN stage set on it
    assert model.positions == {"rope_theta": 40000.0, "rope_scaling": stages[1]["rope_scaling"]}


@torchrun_test
def test_a_two_stage_pipeline_trains_stages_with_lengths_only(tmp_path, byte_data):
    """The pipeline (learned positions) takes stages that change the length only: a reset of the activation
    shapes at each, as in the warmup. Rope stages are refused there (--rotary is)."""
    cfg = stages_json(tmp_path / "z1.json", 1)
    raw = json.loads(cfg.read_text())
    raw["seqwarm"]["stages"] = [{k: v for k, v in s.items() if k in ("start_tokens", "length")} for s in STAGES]
    cfg.write_text(json.dumps(raw))
    run = tmp_path / "pipe"
    args = ["--config", str(cfg), "--data", str(byte_data), "--pipeline-stages", "2", "--save-interval", "0"]
    torchrun([*args, "--out", str(run)])
    rows = train_rows(run)
    stages = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "stage"]
    assert [(r["stage"], r["seqlen"], r["rope_theta"], r["rope_scaling"]) for r in stages] == [
        (1, 48, None, None),
        (2, 64, None, None),
    ]
    lengths = {r["step"]: r["seqlen"] for r in rows}
    assert {lengths[s] for s in lengths if stages[0]["step"] <= s < stages[1]["step"]} == {48}
    assert {lengths[s] for s in lengths if s >= stages[1]["step"]} == {64} and rows[-1]["tokens"] >= 4500
