"""Hugging Face Transformers end to end: tiny GPT-2 and Llama built from configs (nothing downloaded),
in a plain CurriculumEngine loop and under CurriculumTrainer: lengths, LR, tokens, budget, resume."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from helpers import save_tiny_llama, tiny_llama_config  # noqa: E402
from seqwarm.config import load_config  # noqa: E402
from seqwarm.curriculum.clock import Progress, advance  # noqa: E402
from seqwarm.curriculum.engine import CurriculumEngine  # noqa: E402
from seqwarm.curriculum.lr import lr_at  # noqa: E402
from seqwarm.curriculum.schedule import difficulty_at  # noqa: E402
from seqwarm.data.dataset import TokenWindows  # noqa: E402
from seqwarm.integrations.hf.trainer import (  # noqa: E402
    CurriculumLRScheduler,
    CurriculumTrainer,
    curriculum_config_for,
    label_style_for,
    trainer_deepspeed_config,
)
from seqwarm.util.errors import UserError  # noqa: E402

VOCAB, SEQ, MICRO, GAS, STEPS = 64, 64, 2, 2, 8
CURRICULUM = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": SEQ,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8},
}


def raw_config(**seqwarm):
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
        "curriculum_learning": CURRICULUM,
        "seqwarm": {"lr_warmup_iters": 2, "lr_decay_style": "cosine", "lr_decay_iters": STEPS, **seqwarm},
    }


CFG = load_config(raw_config())


def tiny(kind):
    torch.manual_seed(0)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=VOCAB,
                n_positions=SEQ,
                n_embd=16,
                n_layer=1,
                n_head=2,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                loss_type="ForCausalLM",
            )
        )
    return transformers.LlamaForCausalLM(tiny_llama_config(VOCAB, max_position_embeddings=SEQ, loss_type="ForCausalLM"))


def windows(label_style="megatron"):
    tokens = np.random.default_rng(0).integers(0, VOCAB, SEQ * MICRO * GAS * STEPS + 1).astype(np.int64)
    return TokenWindows(tokens, SEQ, label_style=label_style)


def expected_clock():
    """(length, progress) after each optimizer step: rows x length tokens, MICRO x GAS samples."""
    out, progress = [], Progress()
    for step in range(1, STEPS + 1):
        length = difficulty_at(step, CFG.curriculum)
        progress = advance(progress, MICRO * GAS, MICRO * GAS * length, CFG.lr)
        out.append((length, progress))
    return out


def record_lengths(model):
    seen = []
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.append((kw["input_ids"].shape[1], kw["input_ids"], kw["labels"])) if m.training else None,
        with_kwargs=True,
    )
    return seen


# -- the mode ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, name", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM")])
def test_inject_on_an_hf_model_is_refused_naming_the_class(kind, name):
    model = tiny(kind)
    inject = load_config(raw_config(curriculum_mode="inject"))
    with pytest.raises(ValueError, match=rf"{name}\.forward.*has no such parameter \(its \*\*kwargs would swallow"):
        CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), inject)
    assert CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), CFG).mode == "truncate"
    assert label_style_for(model) == "hf" and label_style_for(torch.nn.Linear(2, 2)) == "megatron"


# -- a plain loop -----------------------------------------------------------------------------------


def plain_loop(kind, steps, state=None, start=0):
    model = tiny(kind)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr.lr)
    engine = CurriculumEngine(model, opt, CFG)
    if state is not None:
        model.load_state_dict(state["model"])
        engine.load_state_dict(state["engine"])
    seen, lrs, losses = record_lengths(model), [], []
    data = windows("hf")  # what a plain-loop user passes an HF model: labels = input_ids
    for step in range(start, start + steps):
        total = 0.0
        for micro in range(GAS):
            first = (step * GAS + micro) * MICRO
            out = engine(data.batch(range(first, first + MICRO)))
            engine.backward(out.loss)
            engine.step()
            total += out.loss.item() / GAS
        lrs.append(opt.param_groups[0]["lr"])
        losses.append(total)
    return engine, seen, lrs, losses, {"model": copy.deepcopy(model.state_dict()), "engine": engine.state_dict()}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_plain_loop_lengths_lr_tokens_and_exact_resume(kind):
    clock = expected_clock()
    first = tiny(kind)  # the HF model's own loss on the cut batch, before any update
    engine, seen, lrs, losses, _ = plain_loop(kind, STEPS)
    assert [s[0] for s in seen] == [length for length, _ in clock for _ in range(GAS)]
    assert lrs == [pytest.approx(lr_at(p, CFG.lr), rel=1e-12) for _, p in clock]
    assert engine.progress == clock[-1][1]
    assert engine.progress.tokens == sum(MICRO * GAS * length for length, _ in clock)
    raw = windows().window_array(range(MICRO * GAS))  # the token windows, cut to step 1's length
    cuts = [torch.from_numpy(raw[i * MICRO : (i + 1) * MICRO, : clock[0][0]]) for i in range(GAS)]
    assert all(torch.equal(s[1], x) and torch.equal(s[2], x) for s, x in zip(seen, cuts))  # labels = inputs
    own = [first(input_ids=x, labels=x).loss.item() for x in cuts]  # the HF model's own loss on the cut batch
    assert losses[0] == pytest.approx(sum(own) / GAS, rel=1e-6)
    _, _, _, _, at4 = plain_loop(kind, 4)
    _, _, _, again, _ = plain_loop(kind, 4, state=at4, start=4)
    assert again == losses[4:]


# -- the Trainer ------------------------------------------------------------------------------------


def trainer_for(kind, out, curriculum=None, resume=False, **overrides):
    model = tiny(kind)
    seen = record_lengths(model)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG.lr.lr)
    lrs = []
    opt.register_step_pre_hook(lambda o, a, k: lrs.append(o.param_groups[0]["lr"]))
    args = transformers.TrainingArguments(
        **{
            "output_dir": str(out),
            "per_device_train_batch_size": MICRO,
            "gradient_accumulation_steps": GAS,
            "max_steps": STEPS,
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": 4,
            "report_to": [],
            "use_cpu": True,
            "disable_tqdm": True,
            "seed": 0,
            "dataloader_num_workers": 0,
            **overrides,
        }
    )
    trainer = CurriculumTrainer(
        model=model, args=args, train_dataset=windows(), optimizers=(opt, None), curriculum=curriculum or raw_config()
    )
    return trainer, seen, lrs


def step_logs(trainer):
    return [e for e in trainer.state.log_history if "loss" in e and "curriculum/seqlen" in e]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_trainer_lengths_lr_tokens_logs_and_exact_resume(kind, tmp_path):
    clock = expected_clock()
    first = tiny(kind)
    trainer, seen, lrs = trainer_for(kind, tmp_path)
    assert trainer.train_dataset.label_style == "hf"  # picked for a PreTrainedModel
    trainer.train()
    assert [s[0] for s in seen] == [length for length, _ in clock for _ in range(GAS)]
    assert lrs == [pytest.approx(lr_at(p, CFG.lr), rel=1e-12) for _, p in clock]  # the LR each update used
    logs = step_logs(trainer)
    assert [e["curriculum/seqlen"] for e in logs] == [length for length, _ in clock]
    assert [e["progress/tokens"] for e in logs] == [p.tokens for _, p in clock]
    assert [e["learning_rate"] for e in logs] == [pytest.approx(lr_at(p, CFG.lr), rel=1e-12) for _, p in clock]
    assert trainer.curriculum.progress == clock[-1][1]
    # the loss trained is the HF model's own loss on the cut batch (labels = inputs, the model shifts)
    step1 = [first(input_ids=s[1], labels=s[1]).loss.item() for s in seen[:GAS]]
    assert all(torch.equal(s[1], s[2]) for s in seen)
    assert logs[0]["loss"] == pytest.approx(sum(step1) / GAS, rel=1e-5)
    # resuming from the step-4 checkpoint reproduces steps 5-8 exactly
    again, seen2, _ = trainer_for(kind, tmp_path)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [e["loss"] for e in step_logs(again)[4:]] == [e["loss"] for e in logs[4:]]  # 1-4 come from the checkpoint
    assert [s[0] for s in seen2] == [length for length, _ in clock[4:] for _ in range(GAS)]
    assert again.curriculum.progress == clock[-1][1]


def test_trainer_stops_at_the_token_budget(tmp_path):
    clock = expected_clock()
    budget = clock[2][1].tokens + 1  # reached during step 4
    trainer, seen, _ = trainer_for("gpt2", tmp_path, curriculum=raw_config(train_tokens=budget), save_strategy="no")
    trainer.train()
    assert trainer.state.global_step == 4 and trainer.curriculum.progress == clock[3][1]


# -- the scheduler, the configs ---------------------------------------------------------------------


def test_scheduler_is_an_lr_scheduler_fed_the_clock():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr_scale": 0.5}], lr=1.0)
    sched = CurriculumLRScheduler(opt, CFG)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    p = advance(Progress(), 4, 64, CFG.lr)
    sched.step(p)
    assert sched.get_last_lr() == [lr_at(p, CFG.lr), lr_at(p, CFG.lr) * 0.5]
    sched.step()  # no clock: the last one again (Trainer steps it after the optimizer)
    assert opt.param_groups[1]["lr"] == lr_at(p, CFG.lr) * 0.5
    again = CurriculumLRScheduler(opt, CFG.lr)
    again.load_state_dict(json.loads(json.dumps(sched.state_dict())))
    assert again.progress == p and again.get_last_lr() == sched.get_last_lr()


def test_deepspeed_config_hand_off_and_trainer_batch_sizes():
    raw = {
        **raw_config(),
        "scheduler": {"type": "WarmupLR"},
        "zero_optimization": {"stage": 2},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "data_efficiency": {"data_sampling": {"curriculum_learning": {"enabled": True}, "num_workers": 0}},
    }
    ds = trainer_deepspeed_config(raw)
    assert "curriculum_learning" not in ds and "seqwarm" not in ds and "scheduler" not in ds
    assert ds["zero_optimization"] == {"stage": 2} and ds["train_micro_batch_size_per_gpu"] == "auto"
    assert ds["data_efficiency"] == {"data_sampling": {"num_workers": 0}} and "curriculum_learning" in raw
    args = transformers.TrainingArguments(
        output_dir="unused",
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=GAS,
        report_to=[],
        use_cpu=True,
    )
    cfg = curriculum_config_for(raw, args)  # "auto" batch sizes are the Trainer's
    assert (cfg.micro_batch_size, cfg.gradient_accumulation_steps, cfg.curriculum.max_difficulty) == (MICRO, GAS, SEQ)
    with pytest.raises(UserError, match="gradient_accumulation_steps: curriculum config 4, TrainingArguments 2"):
        curriculum_config_for({**raw_config(), "gradient_accumulation_steps": 4}, args)


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    import seqwarm.integrations.hf.trainer as hf
    from seqwarm.util.errors import MissingDependencyError

    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    monkeypatch.delitem(hf.__dict__, "CurriculumTrainer", raising=False)
    with pytest.raises(MissingDependencyError, match=r"pip install 'seqwarm\[hf\]'"):
        _ = hf.CurriculumTrainer


# -- seqwarm train --model hf:PATH ------------------------------------------------------------------


def _metrics(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def test_seqwarm_train_with_an_hf_config_runs_the_whole_recipe_and_resumes_exactly(tmp_path, byte_data):
    from conftest import small_config
    from seqwarm.cli import main

    folder = save_tiny_llama(tmp_path / "llama")
    cfg = small_config(tmp_path / "c.json", train_tokens=1200, seq=64, batch=4, micro=2)
    common = [
        "train",
        "--config",
        str(cfg),
        "--data",
        str(byte_data),
        "--model",
        f"hf:{folder}",
        "--device",
        "cpu",
        "--eval-iters",
        "1",
        "--log-interval",
        "1",
        "--no-progress",
        "--no-tensorboard",
        "--seed",
        "3",
    ]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*common, "--out", str(full), "--save-interval", "3"]) == 0
    summary = json.loads((full / "summary.json").read_text())
    resolved = json.loads((full / "config.json").read_text())
    assert resolved["model"]["architecture"] == "LlamaForCausalLM" and summary["tokens"] >= 1200
    rows = _metrics(full)
    run_cfg = load_config(str(cfg))
    clock = Progress()
    for r in rows:  # every step: the schedule's length, rows x length tokens, the LR of the clock
        assert r["seqlen"] == difficulty_at(r["step"], run_cfg.curriculum)
        clock = advance(clock, 4, 4 * r["seqlen"], run_cfg.lr)
        assert (r["tokens"], r["lr"]) == (clock.tokens, pytest.approx(lr_at(clock, run_cfg.lr), rel=1e-9))
    # stop after step 3, resume: the same losses as the uninterrupted run
    assert main([*common, "--out", str(cut), "--save-interval", "3", "--train-iters", "3"]) == 0
    assert main([*common, "--out", str(cut), "--save-interval", "3", "--resume", "--allow-config-change"]) == 0
    assert [r["loss"] for r in _metrics(cut)] == [r["loss"] for r in rows]
    assert main([*common, "--out", str(tmp_path / "x"), "--rotary"]) == 2  # the config sets the architecture


def test_a_run_of_an_hf_model_evaluates_and_exports_as_that_model(tmp_path, byte_data, monkeypatch):
    from conftest import small_config
    from seqwarm.cli import main
    from seqwarm.evaluation import load_run, run_paper_evals

    transformers.GPT2Config(
        vocab_size=260, n_positions=64, n_embd=16, n_layer=1, n_head=2, bos_token_id=256, eos_token_id=256
    ).save_pretrained(tmp_path / "gpt")
    cfg = small_config(tmp_path / "c.json", train_tokens=800, seq=64, batch=4, micro=2)
    lambada = tmp_path / "lambada_test.jsonl"
    lambada.write_text(
        "".join(json.dumps({"text": f"the model learns short context first number {i}"}) + "\n" for i in range(4))
    )
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # the model path is recorded as given: relative to here
    assert (
        main(
            [
                "train",
                "--config",
                str(cfg),
                "--data",
                str(byte_data),
                "--model",
                "hf:../gpt",
                "--device",
                "cpu",
                "--eval-iters",
                "1",
                "--no-progress",
                "--no-tensorboard",
                "--save-interval",
                "2",
                "--eval-lambada",
                str(lambada),
                "--out",
                "runs/run",
            ]
        )
        == 0
    )
    run = tmp_path / "work" / "runs" / "run"
    recorded = json.loads((run / "eval.json").read_text())
    assert [v["lambada"]["num_examples"] for v in recorded.values()] == [4]  # the paper eval after training
    (tmp_path / "elsewhere" / "here").mkdir(parents=True)
    transformers.GPT2Config(vocab_size=260, n_positions=64, n_embd=8, n_layer=1, n_head=2).save_pretrained(
        tmp_path / "elsewhere" / "gpt"
    )  # another ../gpt, seen from here: not the run's
    monkeypatch.chdir(tmp_path / "elsewhere" / "here")  # the run's ../gpt: from the folder it was started in
    loaded = load_run(run)
    assert loaded.is_hf and type(loaded.model).__name__ == "GPT2LMHeadModel" and loaded.seq_length == 64
    val = run_paper_evals(run, val=True, val_windows=4, progress=False, write=False)["val"]
    assert val["seq_length"] == 64 and val["num_windows"] == 4 and 0 < val["loss"] < 10
    assert main(["export", str(run), "--hf", str(tmp_path / "out")]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.arange(20)[None] % 256
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, loaded.model.eval()(ids).logits)
    # the model's config.json gone: a clear error, not a traceback
    (tmp_path / "gpt" / "config.json").unlink()
    assert main(["eval", str(run), "--val"]) == 2


def test_the_trainer_sets_each_stages_positions_where_it_begins_and_again_after_a_resume(tmp_path):
    """A θ stage from step 6 (the warmup's first step at 64) and a YaRN stage from step 7: every training
    forward runs at the positions of its step's stage, the rotary module holding what Transformers builds
    from a config with those settings; resumed from step 7, step 8 runs at the YaRN positions again."""
    clock = expected_clock()
    theta, yarn = 500000.0, {"type": "yarn", "factor": 2.0}
    stages = [
        {"start_tokens": clock[4][1].tokens, "length": SEQ, "rope_theta": theta},
        {"start_tokens": clock[5][1].tokens, "length": SEQ, "rope_scaling": yarn},
    ]
    rope = {
        "rope_theta": theta,
        "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": SEQ},
    }
    expected = {}
    for name, settings in (("base", {}), ("theta", {"rope_theta": theta}), ("yarn", rope)):
        built = transformers.LlamaForCausalLM(tiny_llama_config(VOCAB, max_position_embeddings=SEQ, **settings))
        expected[name] = (built.model.rotary_emb.inv_freq, built.model.rotary_emb.attention_scaling)

    def positions_seen(trainer):
        seen = []
        rotary = trainer.model.model.rotary_emb
        rotary.register_forward_pre_hook(
            lambda m, a: seen.append((m.inv_freq.clone(), m.attention_scaling)) if trainer.model.training else None
        )
        return seen

    def named(seen):
        return [next(k for k, (f, a) in expected.items() if torch.equal(f, s[0]) and a == s[1]) for s in seen]

    trainer, _, _ = trainer_for("llama", tmp_path, curriculum=raw_config(stages=stages), save_steps=7)
    seen = positions_seen(trainer)
    trainer.train()
    assert named(seen) == ["base"] * 5 * GAS + ["theta"] * GAS + ["yarn"] * 2 * GAS
    saved = trainer.model.config.rope_parameters  # what a save_pretrained writes: the YaRN stage's
    assert saved.items() >= {"rope_type": "yarn", "rope_theta": theta, **rope["rope_scaling"]}.items()
    again, _, _ = trainer_for("llama", tmp_path, curriculum=raw_config(stages=stages), save_steps=7)
    seen = positions_seen(again)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-7"))
    assert named(seen) == ["yarn"] * GAS
    # and already when training begins, after the checkpoint is loaded (an evaluation then sees them)
    ended, _, _ = trainer_for("llama", tmp_path, curriculum=raw_config(stages=stages), max_steps=7)
    at_begin = []

    class Watch(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            at_begin.append((model.model.rotary_emb.inv_freq.clone(), model.model.rotary_emb.attention_scaling))

    ended.add_callback(Watch())
    ended.train(resume_from_checkpoint=str(tmp_path / "checkpoint-7"))  # nothing left to train
    assert named(at_begin) == ["yarn"]


def test_the_trainer_refuses_rope_stages_on_a_model_without_rotary_positions(tmp_path):
    """GPT-2 learns its positions: a stage with rope_theta would train its length at the old positions, so it
    is refused before anything trains."""
    top = CURRICULUM["max_difficulty"]
    stage = {"start_tokens": 10**6, "length": top, "rope_theta": 500000.0}
    with pytest.raises(UserError, match="CurriculumTrainer: GPT2LMHeadModel has no rotary embedding"):
        trainer_for("gpt2", tmp_path, curriculum=raw_config(stages=[stage]))
