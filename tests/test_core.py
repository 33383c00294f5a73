"""CurriculumCore: mode resolution, the length once per optimizer step, counting (shape, loss mask,
summed over the given group), the clock, the state dict; and the one counting rule of budget.py."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.batch import reshape_batch, truncate_batch
from seqwarm.budget import Progress, micro_batch_shape, tokens_per_step
from seqwarm.config import load_config
from seqwarm.core import CurriculumCore, resolve_mode, set_lr
from seqwarm.engine import CurriculumEngine
from seqwarm.integrations.deepspeed import DeepSpeedCurriculum

LINEAR = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 2, "max_difficulty": 10,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 2}}


def config(curriculum=LINEAR, gas=1, micro=2, world_size=1, **seqwarm):
    raw = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if curriculum is not None:
        raw["curriculum_learning"] = curriculum
    if seqwarm:
        raw["seqwarm"] = seqwarm
    return load_config(raw, world_size=world_size)


def batch(b=2, s=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (b, s), generator=g)
    return {"input_ids": ids, "labels": ids, "loss_mask": (torch.rand(b, s, generator=g) > 0.3).float(),
            "position_ids": torch.arange(s).repeat(b, 1)}


def takes_seqlen(input_ids, labels=None, curriculum_seqlen=None):
    pass


def plain(input_ids, labels=None):
    pass


def open_kwargs(input_ids, **kwargs):
    pass


def run_steps(core, steps, gas, start=0):
    """``steps`` optimizer steps of ``gas`` micro-batches; the length each micro-batch got."""
    seen = []
    for i in range(steps):
        for j in range(gas):
            core.shape(batch(seed=start + i * gas + j))
            seen.append(core.current_seqlen)
        core.commit(*core.end_step())
    return seen


# -- mode resolution ----------------------------------------------------------------------------------

def test_mode_resolution_rules_and_errors():
    assert resolve_mode(None, takes_seqlen) == "inject" and resolve_mode("auto", takes_seqlen) == "inject"
    assert resolve_mode(None, plain) == "truncate" and resolve_mode(None, open_kwargs) == "truncate"
    # **kwargs is not a curriculum_seqlen parameter (HF models take **kwargs and ignore it) unless opted in
    with pytest.raises(ValueError, match=r"open_kwargs\(input_ids, \*\*kwargs\) has no such parameter \(its \*\*kwargs"
                                         r".*inject_via_kwargs=True"):
        resolve_mode("inject", open_kwargs)
    assert resolve_mode("inject", open_kwargs, inject_via_kwargs=True) == "inject"
    assert resolve_mode(None, open_kwargs, inject_via_kwargs=True) == "inject"
    with pytest.raises(ValueError, match="has no such parameter"):
        resolve_mode("inject", plain, inject_via_kwargs=True)
    assert resolve_mode("reshape", takes_seqlen) == "reshape"
    with pytest.raises(ValueError, match=r"needs a model whose forward takes curriculum_seqlen; plain\(input_ids"):
        resolve_mode("inject", plain)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_mode("chop", plain)
    assert resolve_mode(None, None, pipeline=True) == "truncate"
    assert resolve_mode("reshape", None, pipeline=True) == "reshape"
    with pytest.raises(ValueError, match="cannot pass curriculum_seqlen"):
        resolve_mode("inject", None, pipeline=True)
    # the core: the config's mode, unless one is given; no curriculum, no mode
    assert CurriculumCore(config(curriculum_mode="reshape"), plain).mode == "reshape"
    assert CurriculumCore(config(curriculum_mode="reshape"), plain, mode="truncate").mode == "truncate"
    assert CurriculumCore(config(None), plain).mode is None
    with pytest.raises(ValueError, match="count_tokens_by"):
        CurriculumCore(config().replace(count_tokens_by="rows"), plain)


# -- the length, once per optimizer step ------------------------------------------------------------

def test_length_is_decided_once_per_optimizer_step(monkeypatch):
    core = CurriculumCore(config(gas=3), plain)
    calls = []
    update = core.scheduler.update_difficulty
    monkeypatch.setattr(core.scheduler, "update_difficulty", lambda step: calls.append(step) or update(step))
    seen = run_steps(core, 4, gas=3)
    assert calls == [1, 2, 3, 4]  # the first micro-batch of step n + 1 asks for n + 1, the rest reuse it
    assert seen == [2, 2, 2, 4, 4, 4, 4, 4, 4, 6, 6, 6]
    assert core.progress.step == 4


def test_a_skipped_step_is_retried_at_the_same_length():
    core = CurriculumCore(config(), plain)
    run_steps(core, 1, gas=1)
    core.shape(batch())
    before = core.progress
    core.end_step()
    core.skip()  # not applied: the clock stays, the next micro-batch re-asks for the same step
    assert core.progress == before and core.skipped_steps == 1
    core.shape(batch())
    assert core.current_seqlen == 4 and core.end_step()[0].step == 2


# -- counting ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, forward, model_shape", [("truncate", plain, (2, 2)), ("reshape", plain, (10, 2)),
                                                        ("inject", takes_seqlen, (2, 10))])
def test_counting_by_shape(mode, forward, model_shape):
    core = CurriculumCore(config(gas=2, world_size=2, curriculum_mode=mode), forward)
    shaped = [core.shape(batch(seed=i)) for i in range(2)]
    assert tuple(shaped[0]["input_ids"].shape) == model_shape
    assert ("curriculum_seqlen" in shaped[0]) == (mode == "inject")
    new, lr = core.end_step()
    # samples: full-length rows drawn; tokens: rows x length as trained; both x world_size
    tokens = 2 * 2 * 2 * 2 if mode != "reshape" else 2 * 2 * 20 // 2 * 2
    assert (new.samples, new.tokens) == (2 * 2 * 2, tokens)
    assert core.progress == Progress()  # not committed yet
    core.commit(new, lr)
    assert core.progress == new and core.lr == lr


def test_counting_by_loss_mask_and_without_a_curriculum():
    core = CurriculumCore(config(count_tokens_by="loss_mask", curriculum_mode="reshape"), plain)
    b = batch()
    core.shape(b)
    assert core.end_step()[0].tokens == int(b["loss_mask"].flatten()[:20].sum())
    inject = CurriculumCore(config(count_tokens_by="loss_mask"), takes_seqlen)
    assert inject.observe(2, 10, b["loss_mask"]) == 2
    assert inject.end_step()[0].tokens == int(b["loss_mask"][:, :2].sum())
    with pytest.raises(ValueError, match="needs a loss_mask tensor"):
        inject.shape({"input_ids": b["input_ids"]})
    off = CurriculumCore(config(None), plain)
    assert off.shape(b).keys() == b.keys() and off.current_seqlen == 10 and off.micro_shape == (2, 10)
    assert off.end_step()[0].tokens == 20


class FakeWorld:
    """torch.distributed as seen from rank 0 of 2 ranks whose loss masks are identical."""

    def __init__(self, monkeypatch):
        self.groups = []
        monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(torch.distributed, "all_reduce", self.all_reduce)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self.groups.append(group)
        tensor.mul_(2)


def test_loss_mask_counts_are_summed_over_the_given_group(monkeypatch):
    world = FakeWorld(monkeypatch)
    b = batch()
    per_rank = int(b["loss_mask"][:, :2].sum())
    dp_group = object()
    for group in (None, dp_group):  # None: the default group
        core = CurriculumCore(config(world_size=2, count_tokens_by="loss_mask"), plain, process_group=group)
        core.shape(b)
        new, _ = core.end_step()
        assert (new.samples, new.tokens) == (2 * 2, 2 * per_rank)
    assert world.groups == [None, dp_group]
    core = CurriculumCore(config(world_size=2), plain, process_group=dp_group)
    core.shape(b)
    assert core.end_step()[0].tokens == 2 * 2 * 2 and len(world.groups) == 2  # shapes: no all-reduce


def test_both_engines_hand_their_group_to_the_core(monkeypatch):
    world = FakeWorld(monkeypatch)
    group = object()
    model = torch.nn.Linear(2, 2)
    engine = CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1),
                              config(world_size=2, count_tokens_by="loss_mask"), process_group=group)
    engine.core.shape(batch())
    engine.step()
    assert world.groups == [group] and engine.progress.step == 1
    assert CurriculumEngine(model, engine.optimizer, config()).core.process_group is None

    class DeepSpeedStandIn:  # what DeepSpeedCurriculum reads of a (non-pipeline) DeepSpeed engine
        module, optimizer, data_parallel_group = model, engine.optimizer, object()
        dp_world_size, global_steps = 2, 0

        def is_gradient_accumulation_boundary(self):
            return True

    ds = DeepSpeedStandIn()
    cur = DeepSpeedCurriculum(ds, config(world_size=2, count_tokens_by="loss_mask"))
    cur.shape(batch())
    cur.before_step()
    assert world.groups == [group, ds.data_parallel_group]


# -- clock, LR, state -----------------------------------------------------------------------------------

def test_set_lr_respects_lr_scale():
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr_scale": 0.5}], lr=1.0)
    set_lr(opt, 0.2)
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.1]


def test_state_dict_round_trip_mid_step():
    cfg = config(gas=2, count_tokens_by="loss_mask", lr_warmup_iters=2)
    a = CurriculumCore(cfg, plain)
    run_steps(a, 2, gas=2)
    a.shape(batch(seed=99))  # half a step pending
    state = copy.deepcopy(a.state_dict())
    assert set(state) == {"progress", "lr", "skipped_steps", "current_seqlen", "step_seqlen", "pending_samples",
                          "pending_tokens", "scheduler"}
    b = CurriculumCore(cfg, plain)
    b.load_state_dict({**state, "format": "anything", "micro_steps": 5})  # a caller's larger dict
    assert b.state_dict() == state
    for core in (a, b):
        core.shape(batch(seed=100))
        core.commit(*core.end_step())
    assert run_steps(a, 3, gas=2, start=7) == run_steps(b, 3, gas=2, start=7)
    assert a.state_dict() == b.state_dict() and a.progress.step == 6


# -- the one counting rule --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 5), s=st.integers(1, 24), seqlen=st.integers(1, 30))
def test_micro_batch_shape_is_what_the_ops_return(b, s, seqlen):
    data = batch(b, s)
    assert tuple(truncate_batch(data, seqlen)["input_ids"].shape) == micro_batch_shape(b, s, seqlen, "truncate")
    assert tuple(truncate_batch(data, seqlen)["input_ids"].shape) == micro_batch_shape(b, s, seqlen, "inject")
    assert tuple(reshape_batch(data, seqlen)["input_ids"].shape) == micro_batch_shape(b, s, seqlen, "reshape")


def test_tokens_per_step_uses_the_rule():
    cfg = config(gas=2, world_size=2, micro=3, curriculum_mode="reshape")
    rows, length = micro_batch_shape(3, 10, 4, "reshape")
    assert (rows, length) == (7, 4)  # 30 tokens -> 7 rows of 4, 2 dropped
    assert tokens_per_step(cfg, 4) == rows * length * 2 * 2
    with pytest.raises(ValueError, match=">= 1"):
        micro_batch_shape(2, 10, 0, "truncate")


def test_output_length_reads_logits_and_per_token_outputs():
    from types import SimpleNamespace

    from seqwarm.core import output_length
    logits = torch.zeros(2, 5, 7)
    assert output_length(logits, 2) == 5 and output_length(SimpleNamespace(logits=logits), 2) == 5
    assert output_length({"loss": torch.zeros(()), "logits": logits}, 2) == 5
    assert output_length((torch.zeros(()), logits), 2) == 5 and output_length(torch.zeros(2, 5), 2) == 5
    assert output_length(torch.zeros(()), 2) is None and output_length((torch.zeros(()), 3), 2) is None
