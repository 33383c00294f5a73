"""DeepSpeed: ZeRO-2, ZeRO-3 and a 2-stage pipeline on 2 CPU processes (gloo) under torchrun, the
DeepSpeedCurriculum helper (the docs example, run as written), the config hand-off, and the message
when DeepSpeed is missing.

Every torchrun run grows the length 16 -> 64 (the loop itself fails if ranks disagree on a step's
length); each step trains 8 global sequences at that length (2 data-parallel ranks x micro 2 x
accumulation 2, or 1 x 2 x 4 for the pipeline). Resuming from a DeepSpeed checkpoint reproduces the
uninterrupted run's losses exactly. DeepSpeed's C++ ops are never built: seqwarm hands it torch's
AdamW and skips its CPU shared-memory collective.

The slow, end-to-end tests of this file are in tests/e2e/test_deepspeed_runs.py.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import small_config
from seqwarm import load_config
from seqwarm.cli import main
from seqwarm.curriculum.lr import lr_at
from seqwarm.integrations.deepspeed.curriculum import DeepSpeedCurriculum, deepspeed_config, require_deepspeed
from seqwarm.util.errors import MissingDependencyError, UserError

ROOT = Path(__file__).resolve().parents[2]
HAVE_DS = importlib.util.find_spec("deepspeed") is not None
needs_ds = pytest.mark.skipif(
    not HAVE_DS,
    reason="deepspeed is not installed (DS_BUILD_OPS=0 pip install 'seqwarm[deepspeed]'; `make setup` does it)",
)
TORCHRUN = [pytest.mark.dist, pytest.mark.deepspeed, pytest.mark.slow, needs_ds]


# -- without processes ----------------------------------------------------------------------------------


def test_missing_deepspeed_names_the_extra(monkeypatch, tmp_path, byte_data, capsys):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` now fails
    with pytest.raises(MissingDependencyError) as info:
        require_deepspeed()
    assert info.value.extra == "deepspeed"
    cfg = small_config(tmp_path / "c.json")
    code = main(
        [
            "train",
            "--deepspeed",
            "--config",
            str(cfg),
            "--data",
            str(byte_data),
            "--out",
            str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "deepspeed is not installed" in err and "pip install 'seqwarm[deepspeed]'" in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "flags, fragment",
    [(["--pipeline-stages", "2"], "--pipeline-stages needs --deepspeed"), (["--deepspeed", "--fsdp"], "choose one")],
)
def test_bad_flag_combinations_exit_2(tmp_path, capsys, flags, fragment):
    code = main(["train", *flags, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and "Traceback" not in err


def test_deepspeed_config_hand_off():
    cfg = load_config(ROOT / "examples" / "ds_zero2.json", world_size=8)
    ds = deepspeed_config(cfg)
    assert not {"curriculum_learning", "seqwarm", "optimizer", "scheduler"} & set(ds)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (
        512,
        16,
        4,
    )
    assert ds["bf16"] == {"enabled": True} and ds["gradient_clipping"] == 1.0
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["overlap_comm"] is True
    # --precision wins over the file; the world size changes the accumulation, not the global batch
    fp32 = deepspeed_config(
        load_config(ROOT / "examples" / "ds_zero2.json", world_size=2, overrides={"precision": "fp32"})
    )
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


def test_the_0_1_loop_still_runs_with_deprecation_warnings_naming_the_replacements(tmp_path):
    """The 0.1 README's loop (shape, before_step, engine.step, done) keeps the clock of today's (cut, step),
    fp16 skip included, and each old name warns with the name to use instead."""
    cfg = fake_config(tmp_path, total_step=4, train_iters=3)
    old_engine, new_engine = FakeEngine(), FakeEngine()
    old, new = DeepSpeedCurriculum(old_engine, cfg), DeepSpeedCurriculum(new_engine, cfg)
    steps = 0
    while True:
        with pytest.warns(DeprecationWarning, match=r"DeepSpeedCurriculum\.slw\.done"):
            if old.done:
                break
        old_engine.overflow = new_engine.overflow = steps == 1  # DeepSpeed skips the second update
        for micro in range(2):
            with pytest.warns(DeprecationWarning, match=r"use DeepSpeedCurriculum\.cut\(batch\)"):
                shaped = old.shape(full_batch())
            assert shaped["input_ids"].shape == new.cut(full_batch())["input_ids"].shape
            with pytest.warns(DeprecationWarning, match=r"use DeepSpeedCurriculum\.step\(\)"):
                lr = old.before_step()
            old_engine.step()
            new.step()
            assert (lr is None) == (micro == 0)
            assert old_engine.optimizer.param_groups[0]["lr"] == new_engine.optimizer.param_groups[0]["lr"]
        steps += 1
    assert new.slw.done and steps == 4  # three applied steps and the skipped one
    assert old.slw.progress == new.slw.progress and old.slw.skipped_steps == new.slw.skipped_steps == 1
    assert old.state_dict() == new.state_dict()


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
    old = {
        "format": "seqwarm.deepspeed_curriculum/1",
        "progress": {"step": 2, "samples": 16, "tokens": 272, "warmup_end_tokens": 272},
        "lr": 0.002,
        "current_seqlen": 32,
        "step_seqlen": 32,
        "skipped_steps": 1,
        "pending_samples": 2,
        "pending_tokens": 58,
        "scheduler": {"current_difficulty": 32},
    }
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
    for cur in (writer, reader):  # cur.step() steps its own engine
        for i in range(6):  # the pending micro-batch's step, then two more steps
            if i:
                cur.cut(masked())
            cur.step()
    assert reader.state_dict() == writer.state_dict() and reader.slw.progress.step == 5


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_gpu_benchmark_says_why_it_cannot_run_without_cuda():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


class LengthModel(torch.nn.Module):
    """A GPT-like forward that names curriculum_seqlen (Megatron's GPTModel does) and records it."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 4)
        self.seen = []

    def forward(self, input_ids, labels=None, loss_mask=None, curriculum_seqlen=None):
        self.seen.append(curriculum_seqlen)
        return self.emb(input_ids).mean()


class Float16Module(torch.nn.Module):
    """Megatron's wrapper shape: forward(*inputs, **kwargs) handing everything to self.module."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


class OwnWrapper(torch.nn.Module):
    """A user's wrapper that keeps the model under another name (its only child)."""

    def __init__(self, module):
        super().__init__()
        self.net = module

    def forward(self, *inputs, **kwargs):
        return self.net(*inputs, **kwargs)


@pytest.mark.parametrize("wrap", [Float16Module, OwnWrapper, lambda m: OwnWrapper(Float16Module(m))])
def test_a_wrapped_curriculum_seqlen_model_still_gets_the_length(tmp_path, wrap):
    engine, cfg = FakeEngine(dp=1), fake_config(tmp_path, dp=1)
    model = LengthModel()
    engine.module = wrap(model)
    cur = DeepSpeedCurriculum(engine, cfg)
    assert cur.mode == "inject"  # seen through the wrapper, as DeepSpeed passed the keyword through it
    for _ in range(2):
        shaped = cur.cut(full_batch())
        engine.module(**shaped)
        cur.step()
    assert model.seen == [16, 16]  # the model cuts its inputs itself


def test_a_wrapper_hiding_its_model_says_what_to_set(tmp_path, caplog):
    class TwoChildren(Float16Module):
        def __init__(self, module):
            super().__init__(torch.nn.Identity())
            self.module, self.net, self.other = None, module, torch.nn.Linear(1, 1)

    engine, cfg = FakeEngine(dp=1), fake_config(tmp_path, dp=1)
    engine.module = TwoChildren(LengthModel())
    with caplog.at_level("WARNING"):
        cur = DeepSpeedCurriculum(engine, cfg)
    assert cur.mode == "truncate"
    assert "inject_via_kwargs=True" in caplog.text and "TwoChildren.forward" in caplog.text
    assert DeepSpeedCurriculum(engine, cfg, inject_via_kwargs=True).mode == "inject"


# -- a stage's rotary positions, set on the engine's module --------------------------------------------

ROPE_STAGE = {"start_tokens": 2000, "length": 64, "rope_theta": 500_000.0}


def rotary_module(kind: str) -> torch.nn.Module:
    """seqwarm's rotary GPT or a tiny Transformers Llama, the same weights for a kind."""
    torch.manual_seed(0)
    if kind == "gpt":
        from seqwarm import GPT, GPTConfig

        return GPT(GPTConfig(vocab_size=50, seq_length=64, n_layer=1, n_head=2, n_embd=16, rotary=True))
    transformers = pytest.importorskip("transformers")
    from helpers import tiny_llama_config

    return transformers.LlamaForCausalLM(tiny_llama_config(50))


def rotary_table(module: torch.nn.Module) -> torch.Tensor:
    """The table the module's forward reads its positions from (cos of the GPT, inv_freq of the Llama)."""
    return module.rope_cos.clone() if hasattr(module, "rope_cos") else module.model.rotary_emb.inv_freq.clone()


def on_engine(kind: str) -> FakeEngine:
    engine = FakeEngine(dp=1)
    engine.module = rotary_module(kind)
    engine.optimizer = torch.optim.SGD(engine.module.parameters(), lr=1.0)
    return engine


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_curriculum_sets_a_stages_positions_on_the_engines_module_when_it_begins_and_after_a_load(tmp_path, kind):
    cfg = fake_config(tmp_path, dp=1, stages=[ROPE_STAGE])
    base = rotary_table(rotary_module(kind))
    expected = rotary_module(kind)
    if kind == "gpt":
        expected.set_positions(ROPE_STAGE["rope_theta"], None)
    else:
        from seqwarm.integrations.hf.positions import set_positions

        set_positions(expected, ROPE_STAGE["rope_theta"], None)
    stage = rotary_table(expected)
    assert not torch.equal(base, stage)

    engine = on_engine(kind)
    cur = DeepSpeedCurriculum(engine, cfg)
    while cur.slw.stage is None:  # before the stage: the model's own positions at every step
        assert torch.equal(rotary_table(engine.module), base)
        before = cur.slw.progress.tokens
        cur.cut(full_batch())  # the step's first micro-batch begins it (and a stage with it)
        seen = rotary_table(engine.module)  # what this step's forwards read
        cur.step()
        cur.cut(full_batch())
        cur.step()
    # the first step whose clock reached start_tokens trained at the stage's positions, set at its first cut
    assert before >= ROPE_STAGE["start_tokens"] and torch.equal(seen, stage)
    assert cur.slw.progress.step > 6 and torch.equal(rotary_table(engine.module), stage)

    fresh = on_engine(kind)  # a new process: its own positions until the state is loaded
    again = DeepSpeedCurriculum(fresh, cfg)
    assert torch.equal(rotary_table(fresh.module), base)
    again.load_state_dict(cur.state_dict())  # an evaluation right after a resume already sees the stage's
    assert torch.equal(rotary_table(fresh.module), stage)


def test_rope_stages_on_an_engine_whose_module_nothing_can_set_them_on_are_refused(tmp_path):
    with pytest.raises(UserError, match="DeepSpeedCurriculum .*rope_theta"):
        DeepSpeedCurriculum(FakeEngine(dp=1), fake_config(tmp_path, dp=1, stages=[ROPE_STAGE]))
    length_only = {"start_tokens": 2000, "length": 64}  # nothing to set: any model trains it as asked
    assert DeepSpeedCurriculum(FakeEngine(dp=1), fake_config(tmp_path, dp=1, stages=[length_only])).slw.stages.stages
