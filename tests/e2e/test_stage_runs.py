"""Stages in seqwarm's own loop (issue #36): the length and the rotary positions change at each boundary,
each stage's windows are read at its length (above seq_length: the run's windows are 32 tokens, the stages
48 and 64), the tokens per step are kept, the change is recorded, and a resume inside a stage continues
exactly."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import small_config
from seqwarm.trainer.metrics import read_metrics

STAGES = [
    {"start_tokens": 1200, "length": 48, "rope_theta": 40000.0},
    {"start_tokens": 2500, "length": 64, "rope_scaling": {"type": "yarn", "factor": 2.0}},
]


def _config(tmp_path, stages=STAGES):
    # the warmup ends at 32, the windows' length (--seq-length); the stages go to 64 (the rotary model's length)
    return small_config(tmp_path / "stages.json", total_step=4, train_tokens=4500, seq=32, stages=stages)


def _run(tmp_path, byte_data, name, **opts):
    from helpers import tiny_run

    return tiny_run(tmp_path / name, byte_data, _config(tmp_path), model={"rotary": True}, **opts)


def _rows(run, kind):
    return [r for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == kind]


@pytest.mark.slow
def test_stages_change_length_and_positions_and_resume_exactly(tmp_path, byte_data, one_thread):
    whole = _run(tmp_path, byte_data, "whole", save_interval=2, keep_checkpoints=0)
    whole.feed.threaded = True  # as on CUDA: a batch read ahead from the old windows is given back at a stage
    whole.train()
    train = _rows(whole, "train")
    stages = _rows(whole, "stage")
    assert [(r["stage"], r["seqlen"], r["reason"]) for r in stages] == [(1, 48, "begins"), (2, 64, "begins")]
    for row, stage in zip(stages, STAGES):
        before = next(t for t in train if t["step"] == row["step"] - 1)
        assert before["tokens"] >= stage["start_tokens"]  # the first step whose clock reached it
        assert next(t for t in train if t["step"] == row["step"] - 2)["tokens"] < stage["start_tokens"]
    assert stages[1]["rope_theta"] == 40000.0 and stages[1]["rope_scaling"]["type"] == "yarn"
    lengths = {t["step"]: t["seqlen"] for t in train}
    assert max(v for k, v in lengths.items() if k < stages[0]["step"]) == 32
    assert {v for k, v in lengths.items() if stages[0]["step"] <= k < stages[1]["step"]} == {48}
    assert {v for k, v in lengths.items() if k >= stages[1]["step"]} == {64}
    assert whole.model.positions["rope_scaling"]["original_max_position_embeddings"] == 48
    # each stage reads windows of its length: the micro-batch's 4 x 32 tokens kept (2 rows of 64), or as near as
    # whole rows allow (2 rows of 48); every step trains 2 micro-batches
    assert [r["micro_batch_size"] for r in stages] == [2, 2]
    steps = {t["step"]: t["tokens"] for t in train}
    trained = {k: v - steps.get(k - 1, 0) for k, v in steps.items()}
    assert {trained[k] for k in steps if k < stages[0]["step"] and lengths[k] == 32} == {2 * 4 * 32}
    assert {trained[k] for k in steps if stages[0]["step"] <= k < stages[1]["step"]} == {2 * 2 * 48}
    assert {trained[k] for k in steps if k >= stages[1]["step"]} == {2 * 2 * 64}
    assert whole.stages.source.shape == (64, 2) and whole.batches.state_dict()["length"] == 64
    assert whole.feed.state_dict()["source"]["seq_length"] == 64  # the data's own windows, not cut ones
    expected = [t["loss"] for t in train]

    # killed inside the second stage: its last checkpoint is after the stage began
    cut = tmp_path / "cut"
    shutil.copytree(whole.run_dir, cut)
    keep = max(s for s in range(2, len(train), 2) if s >= stages[1]["step"] and s < len(train) - 1)
    for path in (cut / "checkpoints").glob("step_*.pt"):
        if int(path.stem.split("_")[1]) > keep:
            path.unlink()
    resumed = _run(tmp_path, byte_data, "cut", save_interval=2, keep_checkpoints=0, resume=True)
    assert resumed.resume() and resumed.engine.global_steps == keep
    resumed.train()
    assert [t["loss"] for t in _rows(resumed, "train")] == expected
    again = _rows(resumed, "stage")
    assert again[-1]["reason"] == "resumed" and again[-1]["step"] == keep + 1 and again[-1]["stage"] == 2
    assert resumed.stages.source.shape == (64, 2)  # the checkpoint's data position was the stage's windows


@pytest.mark.parametrize("spec, message", [({"model": "tiny"}, "learned positions")])
def test_what_stages_do_not_train_yet_is_refused(tmp_path, spec, message):
    from seqwarm.run.spec import RunSpec, resolve_config
    from seqwarm.util.problems import ConfigError

    with pytest.raises(ConfigError, match=message):
        resolve_config(RunSpec(config=_config(tmp_path), **spec))
    assert resolve_config(RunSpec(config=_config(tmp_path), model="tiny", rotary=True)).stages


@pytest.mark.slow
def test_a_run_across_a_theta_and_a_yarn_stage_validates_at_both_lengths_and_exports_its_positions(
    tmp_path, byte_data, one_thread
):
    """Validation at both lengths, and `seqwarm export` of a run that ended in the YaRN stage: the
    Transformers config holds the final θ and YaRN settings and the last stage's length; the exported model
    computes the trained model's logits."""
    transformers = pytest.importorskip("transformers")
    import torch

    from seqwarm.cli import main
    from seqwarm.trainer.evaluator import evaluate
    from seqwarm.trainer.trackers import scalars

    run = _run(tmp_path, byte_data, "run", save_interval=100, keep_checkpoints=0, eval_interval=4)
    run.train()
    # every evaluation also measures the loss at the pretraining length (32), before the stages too
    evals = _rows(run, "eval")
    assert len(evals) >= 3 and all(r["pretrain_seqlen"] == 32 and r["seqlen"] == 64 for r in evals)
    # inside the stage of length 48 (between the two), also at its length; in the first rows of its micro-batch
    begins = [r["step"] for r in _rows(run, "stage")]
    inside = [r for r in evals if begins[0] <= r["step"] < begins[1]]
    assert inside and all(r["stage_seqlen"] == 48 and r["val_loss_stage"] > 0 for r in inside)
    assert ("val/loss_stage", inside[0]["val_loss_stage"], inside[0]["step"]) in list(scalars(inside[0]))
    assert not any("stage_seqlen" in r for r in evals if r not in inside)
    assert run.evaluator.micro_batch_size == 2  # validation at 64 in the rows of the stage of length 64
    ev = run.evaluator
    at_32 = evaluate(run.engine, ev.data, 32, ev.micro_batch_size, None, ev.device, num_windows=ev.num_windows)
    assert evals[-1]["val_loss_pretrain"] == pytest.approx(at_32, rel=1e-6) != evals[-1]["val_loss"]
    assert ("val/loss_pretrain", evals[-1]["val_loss_pretrain"], evals[-1]["step"]) in list(scalars(evals[-1]))
    assert main(["export", str(run.run_dir), "--hf", str(tmp_path / "hf")]) == 0
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    rope = saved.get("rope_parameters") or {**saved["rope_scaling"], "rope_theta": saved["rope_theta"]}
    assert rope["rope_theta"] == 40000.0 and rope["rope_type"] == "yarn" and rope["factor"] == 2.0
    assert rope["original_max_position_embeddings"] == 48 and saved["max_position_embeddings"] == 64
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(0))
    model = run.model.eval()
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4


@pytest.mark.slow
def test_seqwarm_train_of_an_hf_llama_sets_each_stages_positions_and_eval_and_export_use_the_last(
    tmp_path, byte_data, one_thread, monkeypatch
):
    """`seqwarm train --model hf:` across the θ stage and the YaRN stage: every training forward runs at the
    positions of its step's stage (the rotary module holding what Transformers builds from a config with
    those settings), the stage rows record them, and `seqwarm eval` / `export` use the last stage's."""
    transformers = pytest.importorskip("transformers")
    import torch

    from helpers import save_tiny_llama, tiny_llama_config
    from seqwarm.cli import main
    from seqwarm.evaluation import load_run
    from seqwarm.integrations.hf.run import HFModelConfig

    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 48}
    expected = {}
    for name, rope in (
        ("base", {}),
        ("theta", {"rope_theta": 40000.0}),
        ("yarn", {"rope_theta": 40000.0, "rope_scaling": dict(yarn)}),  # copies: Transformers edits them
    ):
        rotary = transformers.LlamaForCausalLM(tiny_llama_config(260, **rope)).model.rotary_emb
        expected[name] = (rotary.inv_freq, rotary.attention_scaling)
    seen = []
    build = HFModelConfig.build

    def build_and_watch(self):  # the run's model, each training forward's positions recorded
        model = build(self)
        model.model.rotary_emb.register_forward_pre_hook(
            lambda m, a: seen.append((m.inv_freq.clone(), m.attention_scaling)) if model.training else None
        )
        return model

    monkeypatch.setattr(HFModelConfig, "build", build_and_watch)
    folder, run = save_tiny_llama(tmp_path / "llama"), tmp_path / "run"
    args = ["--data", str(byte_data), "--model", f"hf:{folder}", "--device", "cpu", "--eval-iters", "1"]
    args += ["--no-progress", "--no-tensorboard", "--save-interval", "100", "--out", str(run)]
    assert main(["train", "--config", str(_config(tmp_path)), *args]) == 0
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] in ("stage", "train")]
    stages = [r for r in rows if r["kind"] == "stage"]
    assert [(r["stage"], r["seqlen"], r["reason"], r["rope_theta"]) for r in stages] == [
        (1, 48, "begins", 40000.0),
        (2, 64, "begins", 40000.0),
    ]
    scaling = stages[1]["rope_scaling"]
    assert (scaling["type"], scaling["factor"], scaling["original_max_position_embeddings"]) == ("yarn", 2.0, 48)
    steps = max(r["step"] for r in rows if r["kind"] == "train")
    named = [next(k for k, (f, a) in expected.items() if torch.equal(f, s[0]) and a == s[1]) for s in seen]
    gas = 2  # small_config: 8 rows a step, 4 a micro-batch
    assert (
        named[-(steps - stages[0]["step"] + 1) * gas :]
        == ["theta"] * (stages[1]["step"] - stages[0]["step"]) * gas + ["yarn"] * (steps - stages[1]["step"] + 1) * gas
    )
    assert set(named[: -(steps - stages[0]["step"] + 1) * gas]) == {"base"}  # the warmup (and the trial step)

    loaded = load_run(run)  # the checkpoint's stage set on the rebuilt model
    reference = transformers.LlamaForCausalLM(tiny_llama_config(260, rope_theta=40000.0, rope_scaling=dict(yarn)))
    reference.load_state_dict(loaded.model.state_dict())
    ids = torch.randint(0, 257, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(loaded.model(ids).logits, reference.eval()(ids).logits, rtol=1e-6, atol=1e-6)
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["rope_parameters"].items() >= {"rope_theta": 40000.0, **yarn}.items()
    assert saved["max_position_embeddings"] == 64
    # GPT-2 learns its positions: the rope stages stop the run before its first step, exit 2
    monkeypatch.undo()
    transformers.GPT2Config(vocab_size=260, n_positions=64, n_embd=16, n_layer=1, n_head=2).save_pretrained(
        tmp_path / "gpt2"
    )
    args[args.index(f"hf:{folder}")] = f"hf:{tmp_path / 'gpt2'}"
    args[args.index(str(run))] = str(tmp_path / "gpt2-run")
    assert main(["train", "--config", str(_config(tmp_path)), *args]) == 2
    assert not (tmp_path / "gpt2-run" / "metrics.jsonl").exists() or not read_metrics(
        tmp_path / "gpt2-run" / "metrics.jsonl"
    )


def test_a_stage_longer_than_a_learned_position_model_holds_is_refused_with_exit_2(tmp_path, capsys):
    """Length-only stages above --seq-length: a rotary model holds them; learned positions have seq_length
    rows only, so `seqwarm train` (and `plan`) refuse before anything is built."""
    from seqwarm.cli import main
    from seqwarm.run.spec import RunSpec, resolve_config

    path = _config(tmp_path, [{"start_tokens": 1200, "length": 64}])
    assert main(["plan", str(path), "--model", "tiny"]) == 2
    assert "a length above seq_length 32 on a model with learned positions" in capsys.readouterr().err
    assert main(["train", "--config", str(path), "--model", "tiny", "--out", str(tmp_path / "run")]) == 2
    assert "add --rotary" in capsys.readouterr().err and not (tmp_path / "run" / "checkpoints").exists()
    assert resolve_config(RunSpec(config=path, model="tiny", rotary=True)).stages[0].length == 64
    within = _config(tmp_path, [{"start_tokens": 1200, "length": 32}])  # a stage the positions hold: trains
    assert resolve_config(RunSpec(config=within, model="tiny")).stages[0].length == 32


def test_a_run_whose_model_cannot_hold_the_longest_stage_stops_before_training(tmp_path, byte_data):
    """The loop's own guard (a Run built from Python, where no spec was checked): the model's seq_length 64
    cannot hold a stage of 128, whatever its positions."""
    from helpers import tiny_run
    from seqwarm.util.errors import UserError

    path = _config(tmp_path, [{"start_tokens": 1200, "length": 128}])
    with pytest.raises(UserError, match="a stage trains at length 128, longer than the model holds"):
        tiny_run(tmp_path / "run", byte_data, path, model={"rotary": True})


@pytest.mark.slow
@pytest.mark.parametrize("how", ["window", "document_masking"])
def test_stages_train_in_window_mode_and_with_document_masking(tmp_path, byte_data, one_thread, how):
    """Window mode (the attention span grows inside rows of --seq-length; a stage's rows are read at its length,
    one span per row) and document masking (attention inside each document; a stage's windows carry their
    document ids) inside stages: the stages begin, their batches are the stage's windows, the tokens per step
    are the micro-batch's."""
    import math

    path = small_config(tmp_path / "c.json", total_step=4, train_tokens=4500, seq=32, stages=STAGES)
    cfg = json.loads(path.read_text())
    if how == "window":
        cfg["seqwarm"]["curriculum_mode"] = "window"
    else:
        cfg["seqwarm"]["document_masking"] = True
    path.write_text(json.dumps(cfg))
    from helpers import tiny_run

    run = tiny_run(tmp_path / "run", byte_data, path, model={"rotary": True})
    assert (run.choices.mode == "window") == (how == "window")
    run.train()
    stages = _rows(run, "stage")
    assert [(r["stage"], r["seqlen"], r["micro_batch_size"]) for r in stages] == [(1, 48, 2), (2, 64, 2)]
    train = _rows(run, "train")
    assert all(math.isfinite(t["loss"]) for t in train)
    tokens = {t["step"]: t["tokens"] for t in train}
    assert {tokens[k] - tokens[k - 1] for k in tokens if k > stages[1]["step"]} == {2 * 2 * 64}
    if how == "window":  # before the stages every step trains whole rows of 32, whatever the span
        assert {tokens[k] - tokens.get(k - 1, 0) for k in tokens if k < stages[0]["step"]} == {2 * 4 * 32}
    batches = [run.batches.next_batch() for _ in range(20)]
    assert {b["input_ids"].shape for b in batches} == {(2, 64)}
    if how == "document_masking":  # the stage's windows restart positions after each end of document
        assert run.cfg.document_masking
        ends = [(b, r, c) for b in batches for r, c in (b["input_ids"] == run.data.eod_id).nonzero().tolist() if c < 63]
        assert ends
        for b, r, c in ends:
            assert b["position_ids"][r, c + 1] == 0 and b["document_ids"][r, c + 1] != b["document_ids"][r, c]


def test_an_hf_model_whose_positions_cannot_hold_the_longest_stage_is_refused_before_training(
    tmp_path, byte_data, capsys
):
    """`--model hf:` with a length-only stage above the model's max_position_embeddings (GPT-2's learned
    table of 48 rows, a stage of 64): exit 2 naming the stage, before anything is built."""
    transformers = pytest.importorskip("transformers")
    from seqwarm.cli import main

    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(vocab_size=260, n_positions=48, n_embd=16, n_layer=1, n_head=2).save_pretrained(gpt2)
    path = _config(tmp_path, [{"start_tokens": 1200, "length": 64}])
    args = ["--config", str(path), "--data", str(byte_data), "--model", f"hf:{gpt2}", "--out", str(tmp_path / "r")]
    assert main(["train", *args, "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "max_position_embeddings 48 < the run's sequence length 64 (its longest stage's" in err
    assert not (tmp_path / "r" / "checkpoints").exists()
