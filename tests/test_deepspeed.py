"""DeepSpeed: ZeRO-2, ZeRO-3 and a 2-stage pipeline on 2 CPU processes (gloo) under torchrun, the
DeepSpeedCurriculum helper (the docs example, run as written), the config hand-off, and the message
when DeepSpeed is missing.

Every torchrun run grows the length 16 -> 64 (the loop itself fails if ranks disagree on a step's
length); each step trains 8 global sequences at that length (2 data-parallel ranks x micro 2 x
accumulation 2, or 1 x 2 x 4 for the pipeline). Resuming from a DeepSpeed checkpoint reproduces the
uninterrupted run's losses exactly. DeepSpeed's C++ ops are never built: seqwarm hands it torch's
AdamW and skips its CPU shared-memory collective.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqwarm import load_config
from seqwarm.cli import main
from seqwarm.errors import MissingDependencyError, UserError
from seqwarm.integrations.deepspeed import DeepSpeedCurriculum, deepspeed_config, require_deepspeed
from seqwarm.lr_schedule import lr_at
from seqwarm.metrics import read_metrics

from conftest import FAST_TRAIN_FLAGS, run_torchrun, small_config, train_rows

ROOT = Path(__file__).resolve().parents[1]
HAVE_DS = importlib.util.find_spec("deepspeed") is not None
needs_ds = pytest.mark.skipif(not HAVE_DS, reason="deepspeed is not installed "
                              "(DS_BUILD_OPS=0 pip install 'seqwarm[deepspeed]'; `make setup` does it)")
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
    assert [(r["step"], r["seqlen"], r["tokens"]) for r in resumed] == [(r["step"], r["seqlen"], r["tokens"]) for r in rows]
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
def test_two_stage_pipeline_grows_length_and_resumes_exactly(zero2, tmp_path, byte_data):
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
    interrupted_then_resumed(common, tmp_path, rows)


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
    runner.write_text("import runpy, sys\nimport deepspeed\n"
                      "from seqwarm.integrations.deepspeed import skip_cpu_shm_comm\n"
                      "skip_cpu_shm_comm(deepspeed)\n"
                      f"sys.argv = [{str(script)!r}, {str(tmp_path / 'ckpt')!r}]\n"
                      f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    out = torchrun([str(runner)], module=False)
    rows = [tuple(float(x) for x in m) for m in
            re.findall(r"^step (\d+) seqlen (\d+) tokens (\d+) lr ([\d.]+)$", out, flags=re.M)]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [int(r[1]) for r in rows] == [16, 32, 48, 64, 64, 64]
    prev = 0
    for _, seqlen, tokens, _ in rows:
        assert tokens - prev == 8 * seqlen  # 2 ranks x micro 2 x accumulation 2
        prev = tokens
    assert rows[0][3] == pytest.approx(5e-4) and rows[1][3] == pytest.approx(1e-3, rel=1e-3)
    assert (tmp_path / "ckpt" / "latest").is_file()


# -- without processes ----------------------------------------------------------------------------------


def test_missing_deepspeed_names_the_extra(monkeypatch, tmp_path, byte_data, capsys):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now fails
    with pytest.raises(MissingDependencyError) as info:
        require_deepspeed()
    assert info.value.extra == "deepspeed"
    cfg = small_config(tmp_path / "c.json")
    code = main(["train", "--deepspeed", "--config", str(cfg), "--data", str(byte_data), "--out",
                 str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "deepspeed is not installed" in err and "pip install 'seqwarm[deepspeed]'" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, fragment", [
    (["--pipeline-stages", "2"], "--pipeline-stages needs --deepspeed"),
    (["--deepspeed", "--fsdp"], "choose one"),
])
def test_bad_flag_combinations_exit_2(tmp_path, capsys, flags, fragment):
    code = main(["train", *flags, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err


def test_deepspeed_config_hand_off():
    cfg = load_config(ROOT / "examples" / "ds_zero2.json", world_size=8)
    ds = deepspeed_config(cfg)
    assert not {"curriculum_learning", "seqwarm", "optimizer", "scheduler"} & set(ds)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (512, 16, 4)
    assert ds["bf16"] == {"enabled": True} and ds["gradient_clipping"] == 1.0
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["overlap_comm"] is True
    # --precision wins over the file; the world size changes the accumulation, not the global batch
    fp32 = deepspeed_config(load_config(ROOT / "examples" / "ds_zero2.json", world_size=2,
                                        overrides={"precision": "fp32"}))
    assert fp32["bf16"] == {"enabled": False} and fp32["gradient_accumulation_steps"] == 16
    with pytest.raises(UserError, match="stage 0 or 1"):
        deepspeed_config(cfg, pipeline=True)
    raw = json.loads((ROOT / "examples" / "ds_zero2.json").read_text())
    raw["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}
    assert deepspeed_config(load_config(raw, world_size=8))["zero_allow_untested_optimizer"] is True


# -- DeepSpeedCurriculum against a stand-in engine (the clock's rules, without DeepSpeed) -------------


class FakeEngine:
    """The part of DeepSpeed's engine DeepSpeedCurriculum touches; ``overflow`` makes the next step skip."""

    def __init__(self, gas=2, dp=2, pipeline=False):
        self.module = torch.nn.Linear(2, 2)  # forward(input): no curriculum_seqlen -> truncate
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=1.0)
        self.dp_world_size, self.gas, self.micro, self.global_steps = dp, gas, 0, 0
        self.overflow, self.applied, self.resets = False, True, 0
        if pipeline:
            self.train_batch = lambda it: None
            self.reset_activation_shape = self._reset

    def _reset(self):
        self.resets += 1

    def train_micro_batch_size_per_gpu(self):
        return 2

    def gradient_accumulation_steps(self):
        return self.gas

    def is_gradient_accumulation_boundary(self):
        return (self.micro + 1) % self.gas == 0

    def step(self):
        if self.is_gradient_accumulation_boundary():
            self.applied = not self.overflow
            self.global_steps += 1
        self.micro += 1

    def was_step_applied(self):
        return self.applied


def fake_config(tmp_path, gas=2, dp=2, total_step=6, **seqwarm_extra):
    path = small_config(tmp_path / "fake.json", batch=2 * gas * dp, micro=2, total_step=total_step, **seqwarm_extra)
    return load_config(path, world_size=dp)


def full_batch():
    ids = torch.randint(0, 50, (2, 64))
    return {"input_ids": ids, "labels": ids, "loss_mask": torch.ones(2, 64)}


def test_curriculum_clock_lr_and_fp16_skip(tmp_path):
    engine, cfg = FakeEngine(), fake_config(tmp_path)
    cur = DeepSpeedCurriculum(engine, cfg)
    assert cur.mode == "truncate"
    seen = []
    for step in range(1, 4):
        engine.overflow = step == 2  # DeepSpeed skips the second update
        for micro in range(2):
            shaped = cur.cut(full_batch())
            assert shaped["input_ids"].shape[1] == cur.slw.current_seqlen
            engine.optimizer.param_groups[0]["lr"] = -1.0
            cur.step()
            assert (engine.optimizer.param_groups[0]["lr"] == -1.0) == (micro == 0)  # set at the boundary only
        p = cur.slw.progress
        seen.append((p.step, cur.slw.current_seqlen, p.tokens, cur.slw.skipped_steps))
        assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(p, cfg.lr)) or step == 2
    # the skipped update (step 2, length 24) did not move the clock: step 2 is retried at length 24
    assert seen == [(1, 16, 2 * 2 * 2 * 16, 0), (1, 24, 128, 1), (2, 24, 128 + 8 * 24, 1)]
    state = cur.state_dict()
    again = DeepSpeedCurriculum(FakeEngine(), cfg)
    again.load_state_dict(state)
    assert again.slw.progress == cur.slw.progress and again.scheduler.get_current_difficulty() == 24


def test_curriculum_on_a_pipeline_resets_shapes_only_when_they_change(tmp_path):
    engine, cfg = FakeEngine(gas=2, dp=1, pipeline=True), fake_config(tmp_path, gas=2, dp=1, total_step=2)
    cur = DeepSpeedCurriculum(engine, cfg)
    lengths = []
    for step in range(4):
        micro = [cur.cut(full_batch()) for _ in range(2)]
        cur.train_batch(micro)  # pipelines: always a whole step
        assert cur.slw.progress.step == step + 1
        lengths.append(cur.slw.current_seqlen)
    assert lengths == [32, 64, 64, 64] and engine.resets == 2
    cur.before_eval()
    cur.cut(full_batch())
    assert engine.resets == 4  # before eval, and at the next training micro-batch
    with pytest.raises(ValueError, match="cannot pass curriculum_seqlen"):
        DeepSpeedCurriculum(engine, cfg, mode="inject")


def test_curriculum_counts_loss_mask_tokens_and_checks_batch_sizes(tmp_path):
    engine = FakeEngine(dp=1)
    cfg = fake_config(tmp_path, dp=1, count_tokens_by="loss_mask")
    cur = DeepSpeedCurriculum(engine, cfg)
    for _ in range(2):
        batch = full_batch()
        batch["loss_mask"][:, :4] = 0
        cur.cut(batch)
        cur.step()
    assert cur.slw.progress.tokens == 2 * 2 * (16 - 4)
    with pytest.raises(ValueError, match="batch sizes differ"):
        DeepSpeedCurriculum(FakeEngine(gas=4, dp=1), cfg)


def test_curriculum_state_written_before_the_core_still_loads(tmp_path):
    """A "seqwarm.deepspeed_curriculum/1" dict as DeepSpeedCurriculum wrote it before CurriculumCore (an
    fp16-skipped step, loss-mask counts, half a step pending): written the same today, and it resumes."""
    old = {"format": "seqwarm.deepspeed_curriculum/1",
           "progress": {"step": 2, "samples": 16, "tokens": 272, "warmup_end_tokens": 272}, "lr": 0.002,
           "current_seqlen": 32, "step_seqlen": 32, "skipped_steps": 1, "pending_samples": 2, "pending_tokens": 58,
           "scheduler": {"current_difficulty": 32}}
    engine, cfg = FakeEngine(), fake_config(tmp_path, count_tokens_by="loss_mask")

    def masked():
        batch = full_batch()
        batch["loss_mask"][:, :3] = 0
        return batch

    writer = DeepSpeedCurriculum(engine, cfg)
    for step in range(3):
        engine.overflow = step == 1
        for _ in range(2):
            writer.cut(masked())
            writer.step()
    writer.cut(masked())
    assert writer.state_dict() == old
    reader_engine = FakeEngine()
    reader = DeepSpeedCurriculum(reader_engine, cfg)
    reader.load_state_dict(old)
    reader_engine.micro, reader_engine.global_steps = engine.micro, engine.global_steps  # DeepSpeed's own resume
    for cur, eng in ((writer, engine), (reader, reader_engine)):
        for i in range(6):  # the pending micro-batch's step, then two more steps
            if i:
                cur.cut(masked())
            cur.step()
    assert reader.state_dict() == writer.state_dict() and reader.slw.progress.step == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_gpu_benchmark_says_why_it_cannot_run_without_cuda():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr
