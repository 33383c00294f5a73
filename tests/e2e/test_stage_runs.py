"""Stages in seqwarm's own loop (issue #36): the length and the rotary positions change at each boundary,
the change is recorded, and a resume inside a stage continues exactly."""

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


def _config(tmp_path):
    path = small_config(tmp_path / "stages.json", total_step=4, train_tokens=4500)
    cfg = json.loads(path.read_text())
    cfg["curriculum_learning"]["max_difficulty"] = 32  # the warmup ends at 32; the stages go to 64
    cfg["seqwarm"]["stages"] = STAGES
    path.write_text(json.dumps(cfg))
    return path


def _run(tmp_path, byte_data, name, **opts):
    from helpers import tiny_run

    return tiny_run(tmp_path / name, byte_data, _config(tmp_path), model={"rotary": True}, **opts)


def _rows(run, kind):
    return [r for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == kind]


@pytest.mark.slow
def test_stages_change_length_and_positions_and_resume_exactly(tmp_path, byte_data, one_thread):
    whole = _run(tmp_path, byte_data, "whole", save_interval=2, keep_checkpoints=0)
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


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"model": "tiny"}, "learned positions"),
        ({"model": "tiny", "rotary": True, "settings": {"curriculum_mode": "window"}}, "curriculum mode window"),
    ],
)
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
