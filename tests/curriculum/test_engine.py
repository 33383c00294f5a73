"""CurriculumEngine: DeepSpeed's injection contract, shaping modes, clock, LR, clipping, fp16, resume."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from seqwarm.config import FP16Config, load_config
from seqwarm.curriculum.batch import truncate_batch
from seqwarm.curriculum.clock import Progress
from seqwarm.curriculum.engine import CurriculumEngine
from seqwarm.curriculum.loss_scale import LossScaler
from seqwarm.curriculum.lr import lr_at
from seqwarm.trainer.model import GPT, GPTConfig

VOCAB = 50
DISCRETE = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 1,
    "max_difficulty": 5,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 2, 3, 4, 5], "max_step": [2, 4, 6, 8]},
}
LINEAR = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 2,
    "max_difficulty": 10,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 2},
}


def config(curriculum=LINEAR, gas=1, micro=2, clip=0.0, lr=1e-2, optimizer="SGD", world_size=1, **seqwarm):
    raw = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": optimizer, "params": {"lr": lr}},
    }
    if curriculum is not None:
        raw["curriculum_learning"] = curriculum
    if seqwarm:
        raw["seqwarm"] = seqwarm
    return load_config(raw, world_size=world_size)


class Recorder(nn.Module):
    """DeepSpeed's Curriculum_SimpleModel idea: remember the curriculum_seqlen of every forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)
        self.seen: list = []
        self.shapes: list = []
        self.factor = 1.0

    def forward(self, input_ids, labels=None, loss_mask=None, position_ids=None, curriculum_seqlen=None):
        self.seen.append(curriculum_seqlen)
        if curriculum_seqlen is not None:
            input_ids, labels = input_ids[:, :curriculum_seqlen], labels[:, :curriculum_seqlen]
        self.shapes.append(tuple(input_ids.shape))
        logits = self.head(self.emb(input_ids))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten()) * self.factor


class NoInject(Recorder):
    def forward(self, input_ids, labels=None, loss_mask=None, position_ids=None):
        return super().forward(input_ids, labels, loss_mask, position_ids)


def data(step: int, b: int = 2, s: int = 10) -> dict:
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (b, s + 1), generator=g)
    mask = (torch.rand(b, s, generator=g) > 0.25).float()
    return {
        "input_ids": tokens[:, :-1],
        "labels": tokens[:, 1:],
        "loss_mask": mask,
        "position_ids": torch.arange(s).repeat(b, 1),
    }


def train(engine, steps, start=0, b=2, s=10):
    losses = []
    for i in range(start, start + steps * engine.gradient_accumulation_steps):
        loss = engine(data(i, b, s))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def make(model, cfg, optimizer=None):
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=cfg.lr.lr)
    return CurriculumEngine(model, opt, cfg)


# -- DeepSpeed's expectations ---------------------------------------------------------------------


def test_fixed_discrete_injection_matches_deepspeed():
    """DeepSpeed's test_fixed_discrete ran train_batch_size 2 with no accumulation (micro 2 on one GPU, or
    micro 1 on two), so each forward was one optimizer step, and expected 1,1,2,2,3,3,4,4,5,5 over steps
    1-10: the engine calls update_difficulty(global_steps + 1) before the first forward of a step.
    With gradient accumulation 2 the value is still a function of the *optimizer* step, so steps 1-10 get
    1,1,2,2,3,3,4,4,5,5 and each value reaches both micro-batches of its step (20 forwards)."""
    model = Recorder()
    engine = make(model, config(DISCRETE, gas=2))
    assert engine.mode == "inject"
    train(engine, 10, s=5)
    per_step = [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert model.seen == [v for v in per_step for _ in range(2)]
    assert engine.global_steps == 10


def test_fixed_linear_injection_matches_deepspeed():
    model = Recorder()
    engine = make(model, config(LINEAR, gas=1))
    train(engine, 10)
    assert model.seen == [2, 4, 4, 6, 6, 8, 8, 10, 10, 10]


def test_eval_mode_and_disabled_curriculum_pass_nothing():
    model = Recorder()
    engine = make(model, config(LINEAR))
    engine.eval()
    engine(data(0))
    assert model.seen == [None] and model.shapes == [(2, 10)]
    assert engine.current_seqlen is None and engine.progress == Progress()
    engine.train()
    engine(data(0))
    assert model.seen[-1] == 2
    off = Recorder()
    engine = make(off, config(None))
    assert engine.mode is None
    train(engine, 2)
    assert off.seen == [None, None] and engine.progress.tokens == 40 and engine.current_seqlen == 10


# -- modes -----------------------------------------------------------------------------------------


def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, seq_length=10, n_layer=2, n_head=2, n_embd=16))


def test_inject_truncate_and_hand_truncated_batch_are_identical():
    models = [_gpt() for _ in range(3)]
    e_inject = make(models[0], config(LINEAR, curriculum_mode="inject"))
    e_trunc = make(models[1], config(LINEAR, curriculum_mode="truncate"))
    b = data(0)
    losses = [e_inject(b), e_trunc(**b), models[2](**truncate_batch(b, 2))]
    for loss in losses:
        loss.backward()
    assert torch.equal(losses[0], losses[1]) and torch.equal(losses[0], losses[2])
    for (name, p0), p1, p2 in zip(models[0].named_parameters(), models[1].parameters(), models[2].parameters()):
        assert torch.equal(p0.grad, p1.grad) and torch.equal(p0.grad, p2.grad), name


def test_auto_mode_and_mode_errors():
    assert make(NoInject(), config(LINEAR)).mode == "truncate"
    assert make(Recorder(), config(LINEAR)).mode == "inject"
    with pytest.raises(ValueError, match="needs a model whose forward takes curriculum_seqlen"):
        make(NoInject(), config(LINEAR, curriculum_mode="inject"))
    engine = make(NoInject(), config(LINEAR))
    b = data(0)
    with pytest.raises(ValueError, match="shapes a dict batch"):
        engine(b["input_ids"], b["labels"])


def test_wrapped_model_signature_and_length_warning():
    class DistributedDataParallel(nn.Module):  # stands in for torch's wrapper: forward(*inputs, **kwargs)
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *inputs, **kwargs):
            return self.module(*inputs, **kwargs)

    model = Recorder()
    engine = make(DistributedDataParallel(model), config(LINEAR))
    assert engine.mode == "inject"
    with pytest.warns(UserWarning, match="max_difficulty 10 != the batch's sequence length 12"):
        engine(data(0, s=12))
    assert model.seen == [2]


def test_truncate_mode_shapes_the_batch():
    model = NoInject()
    engine = make(model, config(LINEAR))
    train(engine, 3)
    assert model.shapes == [(2, 2), (2, 4), (2, 4)]
    assert engine.progress.tokens == 2 * (2 + 4 + 4)


def test_reshape_keeps_tokens_and_counts_samples_at_full_length():
    model = NoInject()
    engine = make(model, config(LINEAR, curriculum_mode="reshape"))
    train(engine, 3)  # lengths 2, 4, 4 on a 2 x 10 batch
    assert model.shapes == [(10, 2), (5, 4), (5, 4)]
    assert engine.progress == Progress(step=3, samples=6, tokens=20 + 20 + 20, warmup_end_tokens=0)


def test_positional_inject_call_counts_tokens():
    model = Recorder()
    engine = make(model, config(LINEAR, gas=2))
    b = data(0)
    engine(b["input_ids"], b["labels"])
    engine(input_ids=b["input_ids"], labels=b["labels"])
    assert model.seen == [2, 2]
    engine.backward(torch.zeros((), requires_grad=True))
    engine.step()
    engine.step()
    assert engine.progress.tokens == 2 * 2 * 2 and engine.progress.samples == 4


# -- the clock, LR, clipping, accumulation ---------------------------------------------------------


def test_token_counting_by_loss_mask_and_world_size():
    model = NoInject()
    engine = make(model, config(LINEAR, count_tokens_by="loss_mask"))
    train(engine, 2)
    expected = sum(int(data(i)["loss_mask"][:, :length].sum()) for i, length in enumerate([2, 4]))
    assert engine.progress.tokens == expected
    engine = make(Recorder(), config(LINEAR, world_size=2))
    train(engine, 2)
    assert engine.progress == Progress(step=2, samples=8, tokens=2 * 2 * (2 + 4), warmup_end_tokens=0)
    with pytest.raises(ValueError, match="loss_mask tensor or labels"):  # nothing to count the loss terms by
        make(Recorder(), config(LINEAR, count_tokens_by="loss_mask"))(input_ids=data(0)["input_ids"])


def test_lr_follows_the_clock_including_the_step_and_respects_lr_scale():
    model = Recorder()
    cfg = config(LINEAR, lr=0.1, lr_warmup_iters=4, lr_decay_style="cosine", lr_decay_tokens=200, min_lr=0.01)
    opt = torch.optim.SGD(
        [{"params": [model.emb.weight]}, {"params": list(model.head.parameters()), "lr_scale": 0.5}], lr=123.0
    )
    engine = CurriculumEngine(model, opt, cfg)
    seen = []
    for i in range(8):
        engine.backward(engine(data(i)))
        engine.step()
        expected = lr_at(engine.progress, cfg.lr)
        assert engine.lr == expected
        assert opt.param_groups[0]["lr"] == expected and opt.param_groups[1]["lr"] == 0.5 * expected
        seen.append(expected)
    assert seen[0] == pytest.approx(0.1 / 4) and seen[3] == pytest.approx(0.1)
    assert seen[7] < seen[4]


def test_gradient_clipping_records_norm_and_clips():
    model = Recorder()
    ref = copy.deepcopy(model)
    engine = make(model, config(LINEAR, clip=0.05, lr=1.0))
    before = [p.detach().clone() for p in model.parameters()]
    engine.backward(engine(data(0)))
    engine.step()
    truncate_loss = ref(**truncate_batch(data(0), 2))
    truncate_loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()]))
    assert engine.grad_norm == pytest.approx(norm.item(), rel=1e-5)
    moved = torch.linalg.vector_norm(torch.stack([(p - q).norm() for p, q in zip(model.parameters(), before)]))
    assert moved.item() == pytest.approx(0.05, rel=1e-4)  # SGD lr 1: the step is the clipped gradient


def test_gradient_accumulation_boundary():
    model = Recorder()
    ref = copy.deepcopy(model)
    engine = make(model, config(LINEAR, gas=3, lr=0.5))
    before = [p.detach().clone() for p in model.parameters()]
    results = []
    for i in range(3):
        assert engine.is_gradient_accumulation_boundary() == (i == 2)
        engine.backward(engine(data(i)))
        results.append(engine.step())
        if i < 2:
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
            assert engine.progress.step == 0
    assert results == [False, False, True]
    assert engine.progress == Progress(step=1, samples=6, tokens=12, warmup_end_tokens=0)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    # the update is SGD on the mean of the three micro-batch gradients
    sum(ref(**truncate_batch(data(i), 2)) for i in range(3)).div(3).backward()
    with torch.no_grad():
        for p, q, r in zip(model.parameters(), before, ref.parameters()):
            assert torch.allclose(p, q - 0.5 * r.grad, atol=1e-6)


def test_budget_and_config_from_path(tmp_path: Path):
    raw = {
        "train_batch_size": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "curriculum_learning": LINEAR,
        "seqwarm": {"train_tokens": 30},
    }
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(raw))
    engine = make(Recorder(), load_config(path))
    engine = CurriculumEngine(engine.module, engine.optimizer, str(path))
    steps = 0
    while not engine.done:
        train(engine, 1, start=steps)
        steps += 1
    assert steps == 4 and engine.progress.tokens == 2 * (2 + 4 + 4 + 6)


# -- precision ---------------------------------------------------------------------------------------


def test_bf16_autocast_on_cpu():
    class Logits(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(10, 4)

        def forward(self, input_ids, labels=None):
            return self.lin(input_ids.float())

    engine = make(Logits(), config(None, precision="bf16"))
    out = engine(input_ids=data(0)["input_ids"])
    assert out.dtype == torch.bfloat16


def test_loss_scaler_dynamic_hysteresis_window_and_min():
    s = LossScaler(
        FP16Config(enabled=True, initial_scale_power=4, loss_scale_window=3, hysteresis=2, min_loss_scale=4.0)
    )
    assert s.scale == 16.0
    s.update(True)  # first overflow: uses up hysteresis, keeps the scale
    assert s.scale == 16.0
    s.update(True)  # second: halves
    assert s.scale == 8.0
    s.update(False)
    s.update(False)
    assert s.scale == 8.0
    s.update(False)  # 3 clean steps since the last overflow: doubles, hysteresis refilled
    assert s.scale == 16.0
    s.update(True)
    assert s.scale == 16.0
    for _ in range(4):
        s.update(True)
    assert s.scale == 4.0  # floored at min_loss_scale
    static = LossScaler(FP16Config(enabled=True, loss_scale=128.0))
    static.update(True)
    assert static.scale == 128.0 and not static.dynamic
    consecutive = LossScaler(FP16Config(enabled=True, hysteresis=2, consecutive_hysteresis=True))
    consecutive.update(True)
    consecutive.update(False)  # refills the hysteresis at once
    consecutive.update(True)
    assert consecutive.scale == 2.0**16


def test_fp16_overflow_skips_without_advancing_clock_or_curriculum():
    model = Recorder()
    cfg = config(LINEAR, gas=2, precision="fp16").replace(
        fp16=FP16Config(enabled=True, initial_scale_power=3, hysteresis=1)
    )
    engine = make(model, cfg)
    with pytest.warns(RuntimeWarning, match="fp16 on cpu"):
        train(engine, 1)
    assert engine.loss_scale == 8.0 and engine.progress.step == 1
    clock, before = engine.progress, [p.detach().clone() for p in model.parameters()]
    model.factor = float("inf")  # every gradient of this step overflows
    train(engine, 1, start=2)
    assert engine.skipped_steps == 1 and engine.loss_scale == 4.0
    assert engine.progress == clock and engine.global_steps == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    model.factor = 1.0
    train(engine, 1, start=4)
    # step 2 retried with step 2's length (4), not step 3's
    assert model.seen == [2, 2, 4, 4, 4, 4]
    assert engine.progress.step == 2 and engine.progress.tokens == 2 * 2 * 2 + 2 * 2 * 4


def test_fp16_backward_scales_by_loss_scale_over_accumulation():
    model = Recorder()
    ref = copy.deepcopy(model)
    cfg = config(LINEAR, gas=2, precision="fp16").replace(fp16=FP16Config(enabled=True, initial_scale_power=5))
    engine = make(model, cfg)
    with pytest.warns(RuntimeWarning):
        engine.backward(engine(data(0)))
    ref(**truncate_batch(data(0), 2)).backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, r.grad * 32 / 2, rtol=1e-5)


# -- checkpointing -------------------------------------------------------------------------------------


def test_state_dict_round_trip_continues_identically():
    def fresh():
        model = _gpt()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, CurriculumEngine(
            model,
            opt,
            config(LINEAR, gas=2, clip=1.0, lr=1e-3, lr_warmup_iters=3, lr_decay_tokens=400, lr_decay_style="cosine"),
        )

    model_a, engine_a = fresh()
    train(engine_a, 3)
    saved = copy.deepcopy({"model": model_a.state_dict(), "engine": engine_a.state_dict()})
    assert set(saved["engine"]) >= {"progress", "scheduler", "micro_steps", "optimizer", "loss_scaler"}
    losses_a = train(engine_a, 4, start=6)

    model_b, engine_b = fresh()
    model_b.load_state_dict(saved["model"])
    engine_b.load_state_dict(saved["engine"])
    assert engine_b.progress.to_dict() == saved["engine"]["progress"]
    losses_b = train(engine_b, 4, start=6)
    assert losses_a == losses_b
    assert engine_a.progress == engine_b.progress and engine_a.lr == engine_b.lr
    assert engine_a.current_seqlen == engine_b.current_seqlen
    for p, q in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(p, q)
    assert "optimizer" not in engine_a.state_dict(include_optimizer=False)
    with pytest.raises(ValueError, match="not a CurriculumEngine state dict"):
        engine_b.load_state_dict({"progress": {}})


def test_a_resume_with_other_accumulation_steps_starts_on_a_step_boundary():
    """--allow-config-change may change gradient_accumulation_steps: the saved micro-step count (3 steps x 2)
    must not leave the new engine mid-accumulation, where the loop's next begin_step would be the second."""
    model_a = Recorder()
    engine_a = make(model_a, config(LINEAR, gas=2))
    train(engine_a, 3)
    saved = copy.deepcopy(engine_a.state_dict())
    assert saved["micro_steps"] == 6
    engine_b = make(Recorder(), config(LINEAR, gas=4))
    engine_b.load_state_dict(saved)
    assert engine_b.progress.step == 3 and not engine_b.slw.step_open
    for i in range(2):  # two whole optimizer steps of 4 micro-batches, each begun by the loop
        engine_b.begin_step()
        results = []
        for j in range(4):
            engine_b.backward(engine_b(data(10 + 4 * i + j)))
            results.append(engine_b.step())
        assert results == [False, False, False, True]
    assert engine_b.progress.step == 5


def test_engine_doc_examples_run():
    """Every python block in docs/ENGINE.md runs (each block in a fresh namespace)."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "ENGINE.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert len(blocks) >= 2
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {"__name__": "__engine_doc__"})


def test_state_dict_written_before_the_core_still_loads():
    """A "seqwarm.engine/1" state dict as the engine wrote it before CurriculumCore (half a step pending):
    the engine writes the same dict today, and loading it continues exactly like the run that wrote it."""
    old = {
        "format": "seqwarm.engine/1",
        "progress": {"step": 2, "samples": 8, "tokens": 17, "warmup_end_tokens": 0},
        "micro_steps": 5,
        "skipped_steps": 0,
        "lr": 0.01,
        "current_seqlen": 4,
        "step_seqlen": 4,
        "pending_samples": 2,
        "pending_tokens": 5,
        "scheduler": {"current_difficulty": 4},
        "loss_scaler": None,
    }
    cfg = config(LINEAR, gas=2, count_tokens_by="loss_mask")
    model = NoInject()
    writer = make(model, cfg)
    train(writer, 2)
    writer(data(9))
    writer.backward(torch.zeros((), requires_grad=True))
    writer.step()
    assert writer.state_dict(include_optimizer=False) == old
    reader = make(copy.deepcopy(model), cfg)
    reader.load_state_dict(old)
    assert reader.progress == writer.progress and reader.current_seqlen == 4 and reader.micro_steps == 5
    for engine in (writer, reader):
        engine(data(10))
        engine.step()
        train(engine, 2, start=11)
    assert reader.state_dict() == writer.state_dict()


class LegacySimpleModel(nn.Module):
    """DeepSpeed's own legacy test model: forward(x, y, **kwargs) reads curriculum_seqlen from kwargs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, VOCAB)
        self.shapes: list = []

    def forward(self, x, y, **kwargs):
        seqlen = kwargs.get("curriculum_seqlen", None)
        if seqlen is not None:
            x, y = x[:, :seqlen], y[:, :seqlen]
        self.shapes.append(tuple(x.shape))
        return F.cross_entropy(self.head(self.emb(x)).flatten(0, 1), y.flatten()), seqlen


class IgnoresLength(NoInject):
    """Takes curriculum_seqlen by name but trains at full length: logits (B, S, V) give it away."""

    def forward(self, input_ids, labels=None, loss_mask=None, position_ids=None, curriculum_seqlen=None):
        return self.head(self.emb(input_ids))


def test_legacy_kwargs_model_needs_the_explicit_opt_in():
    cfg = config(LINEAR, curriculum_mode="inject")
    with pytest.raises(
        ValueError,
        match=r"LegacySimpleModel\.forward\(x, y, \*\*kwargs\) has no such parameter"
        r".*inject_via_kwargs=True",
    ):
        make(LegacySimpleModel(), cfg)
    assert make(LegacySimpleModel(), config(LINEAR)).mode == "truncate"  # auto: **kwargs does not count
    model = LegacySimpleModel()
    engine = CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, inject_via_kwargs=True)
    assert engine.mode == "inject"
    with pytest.warns(UserWarning, match="returned only a loss: seqwarm cannot check"):
        for i in range(3):
            b = data(i)
            loss, seqlen = engine(b["input_ids"], b["labels"])
            engine.backward(loss)
            engine.step()
    assert model.shapes == [(2, 2), (2, 4), (2, 4)] and engine.progress.tokens == 2 * (2 + 4 + 4)


def test_a_model_that_ignores_the_injected_length_is_caught_at_the_first_step():
    model = IgnoresLength()
    engine = make(model, config(LINEAR))
    assert engine.mode == "inject"
    with pytest.raises(
        ValueError,
        match=r"IgnoresLength was given curriculum_seqlen=2 but returned outputs of "
        r"length 10: it ignores the keyword.*'truncate'",
    ):
        engine(data(0))


def test_default_precision_on_a_mocked_cuda_device_is_bf16(monkeypatch):
    """A config that names no precision trains in bf16 autocast on CUDA (the engine asks the device)."""
    from types import SimpleNamespace

    from seqwarm import load_config

    class OnCuda(nn.Module):  # reports a CUDA parameter without needing one
        def parameters(self, recurse=True):
            yield SimpleNamespace(device=torch.device("cuda"))

        def forward(self, input_ids, labels=None):
            return input_ids

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    cfg = load_config({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2})
    engine = CurriculumEngine(OnCuda(), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), cfg)
    assert engine.config.precision == "bf16" and engine._autocast_dtype is torch.bfloat16
    cpu = CurriculumEngine(nn.Linear(2, 2), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), cfg)
    assert cpu.config.precision == "fp32" and cpu._autocast_dtype is None


def test_adam_statistics_in_one_transfer_match_the_per_tensor_sums():
    from seqwarm.trainer.metrics import adam_stats
    from seqwarm.trainer.optim import _fused

    m = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    vs = [s["exp_avg_sq"] for s in opt.state.values()]
    stats = adam_stats(opt)
    assert stats["adam_v_l1"] == pytest.approx(float(sum(v.abs().sum() for v in vs)), rel=1e-6)
    assert stats["adam_v_max"] == float(max(v.max() for v in vs))
    assert _fused(list(m.parameters())) == {}  # fused AdamW only for CUDA parameters


def _inputs_by_binding(signature, args, kwargs):
    """What the engine found before the binding was cached: a fresh bind_partial of every call."""
    import contextlib
    import inspect

    named = dict(kwargs)
    with contextlib.suppress(TypeError):
        params = signature.parameters
        for name, value in signature.bind_partial(*args, **kwargs).arguments.items():
            if params[name].kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif params[name].kind is not inspect.Parameter.VAR_POSITIONAL:
                named[name] = value
    return named.get("input_ids"), named.get("loss_mask"), named.get("labels")


class PositionalOnly(Recorder):
    def forward(self, input_ids, /, labels=None, loss_mask=None, *rest, curriculum_seqlen=None, **extra):
        return super().forward(input_ids, labels, loss_mask, None, curriculum_seqlen)


class MaskFirst(Recorder):
    def forward(self, loss_mask, input_ids, labels=None, curriculum_seqlen=None):
        return super().forward(input_ids, labels, loss_mask, None, curriculum_seqlen)


@pytest.mark.parametrize("model_cls", [Recorder, PositionalOnly, MaskFirst])
def test_inputs_are_found_as_a_fresh_binding_finds_them_and_bound_once_per_call_shape(model_cls, monkeypatch):
    import inspect

    engine = make(model_cls(), config(LINEAR))
    b = data(0)
    t, y, m = b["input_ids"], b["labels"], b["loss_mask"]
    calls = [
        ((t,), {}),
        ((t, y), {}),
        ((t, y, m), {}),
        ((), {"input_ids": t, "loss_mask": m}),
        ((t,), {"loss_mask": m}),
        ((m, t), {}),
        ((t,), {"input_ids": y}),  # bound twice: TypeError
        ((t, y, m, y, y), {}),
        ((t,), {"unknown": m, "input_ids": t}),
        ((t,), {"loss_mask": m, "other": y}),
    ]
    binds = []
    real_bind = inspect.Signature.bind_partial
    monkeypatch.setattr(
        inspect.Signature, "bind_partial", lambda self, *a, **k: binds.append(1) or real_bind(self, *a, **k)
    )
    for args, kwargs in calls:
        expected = _inputs_by_binding(engine._signature, args, kwargs)
        expected = (
            expected[0] if isinstance(expected[0], torch.Tensor) and expected[0].dim() == 2 else t,
            expected[1] if isinstance(expected[1], torch.Tensor) else None,
            expected[2] if isinstance(expected[2], torch.Tensor) else None,
        )
        for _ in range(3):  # micro-batches of the same shape
            tokens, mask, labels = engine._inputs(args, kwargs)
            assert tokens is expected[0] and mask is expected[1] and labels is expected[2], (
                model_cls.__name__,
                len(args),
                list(kwargs),
            )
    shapes = {(len(args), tuple(kwargs)) for args, kwargs in calls}  # (t, y) and (m, t) are one shape
    assert len(binds) == len(calls) + len(shapes)  # the reference once per call, the engine once per shape


def test_the_precision_rule_takes_any_settings_object_not_only_a_dataclass():
    """curriculum.run's Protocols promise that any object with a run config's attributes will do; the rule
    returns a copy with the precision fixed and leaves the object it was given as it was."""
    from types import SimpleNamespace

    from seqwarm.curriculum.loss_scale import resolve_precision

    given = SimpleNamespace(precision="fp32", precision_named=False, train_tokens=10)
    on_cuda = resolve_precision(given, "cuda", bf16_supported=True)
    assert (on_cuda.precision, on_cuda.precision_named, on_cuda.train_tokens) == ("bf16", True, 10)
    assert resolve_precision(given, "cuda", bf16_supported=True, resumed="fp16").precision == "fp16"
    assert resolve_precision(given, "cpu").precision == "fp32"
    assert (given.precision, given.precision_named) == ("fp32", False)
