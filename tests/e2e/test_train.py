"""`seqwarm train` end to end on CPU: budget, growing length, full-length eval, resume, bad input.

The slow, end-to-end part; the fast tests are in tests/trainer/test_loop.py.
"""

import json
import subprocess
import sys

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm import load_config, make_plan
from seqwarm.cli import main
from seqwarm.trainer.metrics import read_metrics

FAST = [*FAST_TRAIN_FLAGS, "--log-interval", "1"]


def train(args, capsys=None):
    code = main(["train", *FAST, *args])
    return code


@pytest.mark.slow
def test_end_to_end_run(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json")
    out = tmp_path / "run"
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(out),
                "--eval-interval",
                "4",
                "--save-interval",
                "5",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "step 1 | seqlen 16 |" in printed and "final full-length val loss" in printed
    rows = read_metrics(out / "metrics.jsonl")
    train_rows = [r for r in rows if r["kind"] == "train"]
    evals = [r for r in rows if r["kind"] == "eval"]
    # the budget rule: stop after the first step reaching train_tokens, as planned
    plan = make_plan(load_config(cfg))
    assert train_rows[-1]["step"] == plan.total_steps
    assert train_rows[-1]["tokens"] >= 6000 > train_rows[-2]["tokens"]
    assert [r["tokens"] for r in train_rows] == [p for p in _plan_tokens(cfg)]
    # growing length, then full length
    lengths = [r["seqlen"] for r in train_rows]
    assert lengths[0] == 16 and lengths == sorted(lengths) and lengths[-1] == 64
    # eval rows at full length, every 4 steps and at the end
    assert {r["seqlen"] for r in evals} == {64}
    assert [r["step"] for r in evals][:2] == [4, 8] and evals[-1]["step"] == train_rows[-1]["step"]
    for key in ("step", "tokens", "seqlen", "lr", "loss", "tokens_per_s"):
        assert key in train_rows[0]
    assert "val_ppl" in evals[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == train_rows[-1]["tokens"] and summary["final_val_loss"] == evals[-1]["val_loss"]
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["world_size"] == 1 and "torch" in resolved["versions"]
    assert resolved["run"]["curriculum"]["max_difficulty"] == 64
    # the mode the run used (auto: the GPT's forward takes curriculum_seqlen), not the config's null
    assert resolved["run"]["curriculum"]["mode"] == summary["curriculum"]["mode"] == "inject"
    assert "block; mode: inject)" in printed
    assert (out / "curves.png").stat().st_size > 10_000
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts[-1] == f"step_{plan.total_steps:08d}.pt"


def _plan_tokens(cfg):
    plan = make_plan(load_config(cfg), keep_series=True)
    return plan.cum_tokens


@pytest.mark.slow
def test_no_curriculum_baseline_is_full_length(tmp_path, byte_data):
    cfg = small_config(tmp_path / "c.json", train_tokens=2000)
    out = tmp_path / "base"
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out), "--no-curriculum"]) == 0
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert {r["seqlen"] for r in rows} == {64}
    assert rows[-1]["tokens"] == 8 * 64 * len(rows)


def _run_cli(args, env=None):
    cmd = [sys.executable, "-m", "seqwarm", "train", *FAST, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}


@pytest.mark.slow
def test_resume_refuses_changed_config(tmp_path, byte_data, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=1500)
    out = tmp_path / "run"
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out)]) == 0
    import torch

    ckpt = sorted((out / "checkpoints").glob("step_*.pt"))[-1]
    state = torch.load(ckpt, weights_only=False)
    assert state["config"]["run"]["curriculum"]["mode"] == "inject"
    state["config"]["run"]["curriculum"]["mode"] = None  # as written before the resolved mode was recorded
    torch.save(state, ckpt)
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out), "--resume"]) == 0
    changed = small_config(tmp_path / "c2.json", train_tokens=3000, total_step=3)
    capsys.readouterr()
    assert train(["--config", str(changed), "--data", str(byte_data), "--out", str(out), "--resume"]) == 2
    assert "different" in capsys.readouterr().err
    assert (
        train(
            ["--config", str(changed), "--data", str(byte_data), "--out", str(out), "--resume", "--allow-config-change"]
        )
        == 0
    )


@pytest.mark.slow
def test_nano_preset_with_size_flags_end_to_end(tmp_path, byte_data):
    cfg = small_config(tmp_path / "c.json", train_tokens=600)
    out = tmp_path / "r"
    assert (
        main(
            [
                "train",
                *FAST,
                "--model",
                "nano",
                "--n-layer",
                "1",
                "--n-embd",
                "32",
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["preset"], model["n_layer"], model["n_head"], model["n_embd"]) == ("nano", 1, 2, 32)


@pytest.mark.slow
def test_train_runs_paper_evals_at_the_end(tmp_path, byte_data, capsys):
    wiki = tmp_path / "wiki.test.raw"
    wiki.write_text(" = Title = \n The model learns short context first , then long context @-@ later . \n" * 4)
    lam = tmp_path / "lambada.jsonl"
    lam.write_text('{"text": "the curriculum grows the sequence length"}\n{"text": "short context first"}\n')
    cfg = small_config(tmp_path / "c.json", train_tokens=1500)
    out = tmp_path / "run"
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(out),
                "--eval-wikitext",
                str(wiki),
                "--eval-lambada",
                str(lam),
            ]
        )
        == 0
    )
    results = json.loads((out / "eval.json").read_text())
    (entry,) = results.values()
    assert entry["wikitext"]["num_original_words"] > 0 and entry["lambada"]["num_examples"] == 2
    # a missing eval file is refused before any training happens
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(tmp_path / "r2"),
                "--eval-lambada",
                str(tmp_path / "missing.jsonl"),
            ]
        )
        == 2
    )
    assert not (tmp_path / "r2" / "checkpoints").exists()


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path, byte_data, capsys, monkeypatch):
    import torch

    from seqwarm.curriculum.engine import CurriculumEngine
    from seqwarm.trainer.model import GPT

    real_forward, real_probe = GPT.forward, CurriculumEngine.probe_memory
    calls = {"n": 0, "probing": False}

    def probe(self, batch):  # the memory probe's forwards before step 1 are not training steps
        calls["probing"] = True
        try:
            return real_probe(self, batch)
        finally:
            calls["probing"] = False

    def poisoned(self, *args, **kwargs):
        loss = real_forward(self, *args, **kwargs)
        if self.training and not calls["probing"]:
            calls["n"] += 1
            if calls["n"] > 8:  # micro-batches 9+ = optimizer step 5 (accumulation 2)
                return loss * torch.tensor(float("nan"))
        return loss

    monkeypatch.setattr(GPT, "forward", poisoned)
    monkeypatch.setattr(CurriculumEngine, "probe_memory", probe)
    cfg = small_config(tmp_path / "c.json")
    out = tmp_path / "run"
    code = train(["--config", str(cfg), "--data", str(byte_data), "--out", str(out), "--save-interval", "2"])
    err = capsys.readouterr().err
    assert code == 3
    assert "at step 5" in err and "Traceback" not in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "step_00000004.pt"


def _fp16_config(path, **fp16):
    cfg = json.loads(small_config(path).read_text())
    cfg["fp16"] = {"enabled": True, **fp16}
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.slow
def test_fp16_skipped_steps_do_not_repeat_eval_log_or_save(tmp_path, byte_data, capsys):
    # 2**90 overflows fp32 gradients: the first steps are skipped until the scale has halved enough
    cfg = _fp16_config(tmp_path / "c.json", initial_scale_power=90, hysteresis=1)
    out = tmp_path / "run"
    assert (
        train(
            [
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--out",
                str(out),
                "--eval-interval",
                "2",
                "--save-interval",
                "2",
                "--train-iters",
                "4",
            ]
        )
        == 0
    )
    rows = read_metrics(out / "metrics.jsonl")
    train_steps = [r["step"] for r in rows if r["kind"] == "train"]
    eval_steps = [r["step"] for r in rows if r["kind"] == "eval"]
    assert train_steps == [1, 2, 3, 4] and eval_steps == [2, 4]
    assert json.loads((out / "summary.json").read_text())["skipped_steps"] >= 1
    assert not (out / "checkpoints" / "step_00000000.pt").exists()


@pytest.mark.slow
def test_endless_fp16_overflow_stops_the_run(tmp_path, byte_data, capsys, monkeypatch):
    import torch

    from seqwarm.trainer.model import GPT

    class InfGrad(torch.autograd.Function):  # finite loss, infinite gradients
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * float("inf")

    real_forward = GPT.forward
    monkeypatch.setattr(GPT, "forward", lambda self, *a, **k: InfGrad.apply(real_forward(self, *a, **k)))
    cfg = _fp16_config(tmp_path / "c.json")
    assert train(["--config", str(cfg), "--data", str(byte_data), "--out", str(tmp_path / "run")]) == 3
    err = capsys.readouterr().err
    assert "overflowed 50 steps in a row at step 1" in err and "Traceback" not in err


def _tiny_run(tmp_path, byte_data, name, builder=None, config=None, model=None, **opts):
    from helpers import tiny_run

    config = config or small_config(tmp_path / "c.json", train_tokens=3000)
    return tiny_run(tmp_path / name, byte_data, config, builder=builder, model=model, **opts)


@pytest.mark.slow
def test_the_memory_probe_leaves_the_run_bit_identical(tmp_path, byte_data):
    """The trial full-length step before the first step (an OOM in the first minute) changes no number
    (beyond float rounding)."""
    losses = {}
    for probe in (False, True):
        run = _tiny_run(tmp_path, byte_data, f"probe-{probe}", memory_probe=probe)
        calls = []
        real = run.engine.probe_memory
        run.engine.probe_memory = lambda batch, calls=calls, real=real: (
            calls.append(batch["input_ids"].shape),
            real(batch),
        )
        run.train()
        assert calls == ([(4, 64)] * 2 if probe else [])  # the largest micro-batch at the full length (+ timed)
        losses[probe] = [r["loss"] for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    # equal up to float rounding: a busy CPU may split a reduction over fewer threads (seen once at 2e-7);
    # a probe that drew from the RNG or left gradients behind moves the losses by far more
    assert losses[True] == pytest.approx(losses[False], rel=1e-6, abs=0) and len(losses[True]) > 3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inject", "window"])
def test_a_compiled_run_through_eight_lengths_traces_the_planned_graphs(tmp_path, byte_data, monkeypatch, mode):
    """--compile through the loop: 8 curriculum lengths and the full-length eval trace the graphs `seqwarm
    plan` counts (Dynamo's limit is 8 recompiles; with dynamic=False a longer curriculum would fall back to
    eager). Inject: the planned 3 (the cut hands the model contiguous tensors, so reaching the full length
    does not retrace on a CPU either); window: one training graph at every length + eval. Dynamo traces with its eager
    backend here: the graphs are Dynamo's either way, and inductor's code generation for them takes
    minutes on a cold 2-core machine."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from seqwarm.trainer.backends import TorchEngineBuilder

    compile_ = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile_(self, **{**kw, "backend": "eager"}))
    torch._dynamo.reset()
    counters.clear()
    tokens = 2400 if mode == "inject" else 8 * 8 * 64  # window trains the full 8 x 64 tokens at every step
    cfg = small_config(tmp_path / "eight.json", total_step=8, train_tokens=tokens, seq=64, curriculum_mode=mode)
    run = _tiny_run(tmp_path, byte_data, "compiled", builder=TorchEngineBuilder(compile=True), config=cfg)
    run.train()
    lengths = {r["seqlen"] for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"}
    compiles = counters["frames"]["ok"]
    assert len(lengths) == 8
    assert counters["frames"]["ok"] == counters["frames"]["total"]  # nothing fell back to eager
    planned = make_plan(load_config(cfg)).compiles
    assert compiles == planned, (planned, dict(counters["frames"]), dict(counters["recompiles"]))
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_run_from_before_vocab_padding_resumes_with_its_vocabulary(tmp_path, byte_data):
    """New runs pad the embedding to a multiple of 64; a checkpoint written before keeps its shapes."""
    from seqwarm.trainer.record import write_resolved_config

    old = _tiny_run(tmp_path, byte_data, "old", model={"vocab_multiple": 1})
    assert old.data.vocab_size % 64  # the byte vocabulary is not a multiple of 64: padding would show
    old.resolved["model"].pop("vocab_multiple")  # what a run folder from before the padding records
    write_resolved_config(old)
    old.train()
    new = _tiny_run(tmp_path, byte_data, "old", resume=True)
    assert new.resume()  # same model (no config change refused), weights of the old shapes loaded
    assert new.model.wte.weight.shape[0] == new.data.vocab_size
    fresh = _tiny_run(tmp_path, byte_data, "fresh")
    assert fresh.model.wte.weight.shape[0] == -(-fresh.data.vocab_size // 64) * 64


@pytest.mark.slow
def test_the_loop_reads_the_loss_only_at_log_rows(tmp_path, byte_data):
    """One host read per log row (not per step), and the rows' window means are unchanged."""
    from seqwarm.trainer.loop import Run

    reads = []
    real = Run._checked_losses

    def counting(self, pending):
        reads.append([e.step for e in pending])
        return real(self, pending)

    rows = {}
    for interval in (1, 4):
        run = _tiny_run(tmp_path, byte_data, f"log{interval}", log_interval=interval)
        run._checked_losses = counting.__get__(run)
        reads.clear()
        run.train()
        rows[interval] = [r for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"]
        assert [steps[-1] for steps in reads] == [r["step"] for r in rows[interval]]  # one read per row
    steps = [r["step"] for r in rows[1]]
    assert reads[1] == steps[1:4] and len(steps) > 5
    losses = {r["step"]: r["loss"] for r in rows[1]}
    for before, row in zip(rows[4], rows[4][1:]):  # a row's loss: the mean over its window of steps
        window = [losses[s] for s in range(before["step"] + 1, row["step"] + 1)]
        assert row["loss"] == sum(window) / len(window)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["truncate", "reshape", None])  # None: auto, which injects into the GPT
def test_a_run_decides_the_length_once_per_step_and_cuts_each_micro_batch_once(
    tmp_path, byte_data, monkeypatch, mode, caplog, recwarn
):
    import seqwarm.curriculum.warmup
    from seqwarm.curriculum.schedule import CurriculumScheduler

    calls = {"schedule": 0, "cut": 0, "model_cut": 0}
    update = CurriculumScheduler.update_difficulty
    monkeypatch.setattr(
        CurriculumScheduler,
        "update_difficulty",
        lambda self, step: (calls.__setitem__("schedule", calls["schedule"] + 1), update(self, step))[1],
    )
    for name in ("truncate_batch", "reshape_batch"):
        op = getattr(seqwarm.curriculum.warmup, name)
        monkeypatch.setattr(
            seqwarm.curriculum.warmup, name, lambda *a, _op=op: (calls.__setitem__("cut", calls["cut"] + 1), _op(*a))[1]
        )
    run = _tiny_run(
        tmp_path,
        byte_data,
        f"run-{mode}",
        config=small_config(tmp_path / "c.json", train_tokens=3000, **({"curriculum_mode": mode} if mode else {})),
    )
    real = run.model.forward

    def forward(*args, **kwargs):  # what the model is handed: already at the step's length
        if run.model.training:
            calls["model_cut"] += kwargs["input_ids"].shape[1] == run.engine.current_seqlen
        return real(*args, **kwargs)

    monkeypatch.setattr(run.model, "forward", forward)
    caplog.set_level("INFO", logger="seqwarm")
    result = run.train()
    steps = result.steps
    assert steps > 5 and run.cfg.gradient_accumulation_steps == 2
    assert calls["schedule"] == steps  # once per optimizer step
    assert calls["cut"] == 2 * steps  # once per micro-batch (inject: trimmed once on the host)
    assert calls["model_cut"] == 2 * steps
    # inject: the batch is cut to the length before the copy, so there is nothing to warn about
    said = [str(w.message) for w in recwarn] + [r.getMessage() for r in caplog.records]
    assert not any("returned only a loss" in m for m in said), said
