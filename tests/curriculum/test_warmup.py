"""SequenceLengthWarmup: the keyword constructor, the two-call step protocol, mode resolution, the length
once per optimizer step, counting (shape, loss mask, summed over the given group), the clock, the state
dict; and the one counting rule of budget.py."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.config import load_config
from seqwarm.curriculum.batch import reshape_batch, truncate_batch
from seqwarm.curriculum.clock import Progress, micro_batch_shape, tokens_per_step
from seqwarm.curriculum.engine import CurriculumEngine
from seqwarm.curriculum.inputs import set_lr
from seqwarm.curriculum.modes import resolve_mode
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.integrations.deepspeed.curriculum import DeepSpeedCurriculum
from seqwarm.util.problems import ConfigError

LINEAR = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 2,
    "max_difficulty": 10,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 2},
}


def config(curriculum=LINEAR, gas=1, micro=2, world_size=1, **seqwarm):
    raw = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    }
    if curriculum is not None:
        raw["curriculum_learning"] = curriculum
    if seqwarm:
        raw["seqwarm"] = seqwarm
    return load_config(raw, world_size=world_size)


def batch(b=2, s=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (b, s), generator=g)
    return {
        "input_ids": ids,
        "labels": ids,
        "loss_mask": (torch.rand(b, s, generator=g) > 0.3).float(),
        "position_ids": torch.arange(s).repeat(b, 1),
    }


def takes_seqlen(input_ids, labels=None, curriculum_seqlen=None):
    pass


def plain(input_ids, labels=None):
    pass


def open_kwargs(input_ids, **kwargs):
    pass


def core_of(cfg, forward=None, **kwargs):
    return SequenceLengthWarmup.from_config(cfg, forward, **kwargs)


def run_steps(core, steps, gas, start=0):
    """``steps`` optimizer steps of ``gas`` micro-batches; the length each micro-batch got."""
    seen = []
    for i in range(steps):
        core.begin_step()
        for j in range(gas):
            core.cut(batch(seed=start + i * gas + j))
            seen.append(core.current_seqlen)
        core.end_step()
    return seen


# -- mode resolution ----------------------------------------------------------------------------------


def test_mode_resolution_rules_and_errors():
    assert resolve_mode(None, takes_seqlen) == "inject" and resolve_mode("auto", takes_seqlen) == "inject"
    assert resolve_mode(None, plain) == "truncate" and resolve_mode(None, open_kwargs) == "truncate"
    # **kwargs is not a curriculum_seqlen parameter (HF models take **kwargs and ignore it) unless opted in
    with pytest.raises(
        ValueError,
        match=r"open_kwargs\(input_ids, \*\*kwargs\) has no such parameter \(its \*\*kwargs"
        r".*inject_via_kwargs=True",
    ):
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
    assert core_of(config(curriculum_mode="reshape"), plain).mode == "reshape"
    assert core_of(config(curriculum_mode="reshape"), plain, mode="truncate").mode == "truncate"
    assert core_of(config(None), plain).mode is None
    with pytest.raises(ValueError, match="count_tokens_by"):
        core_of(config().replace(count_tokens_by="rows"), plain)


# -- the length, once per optimizer step ------------------------------------------------------------


def test_length_is_decided_once_per_optimizer_step(monkeypatch):
    core = core_of(config(gas=3), plain)
    calls = []
    update = core.scheduler.update_difficulty
    monkeypatch.setattr(core.scheduler, "update_difficulty", lambda step: calls.append(step) or update(step))
    seen = run_steps(core, 4, gas=3)
    assert calls == [1, 2, 3, 4]  # the first micro-batch of step n + 1 asks for n + 1, the rest reuse it
    assert seen == [2, 2, 2, 4, 4, 4, 4, 4, 4, 6, 6, 6]
    assert core.progress.step == 4


def test_a_skipped_step_is_retried_at_the_same_length():
    core = core_of(config(), plain)
    run_steps(core, 1, gas=1)
    core.begin_step()
    core.cut(batch())
    before = core.progress
    core.end_step(applied=False)  # not applied: the clock stays, the next step is the same step again
    assert core.progress == before and core.skipped_steps == 1
    assert core.begin_step() == 4
    core.cut(batch())
    assert core.current_seqlen == 4 and core.end_step().step == 2


# -- counting ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, forward, model_shape",
    [("truncate", plain, (2, 2)), ("reshape", plain, (10, 2)), ("inject", takes_seqlen, (2, 10))],
)
def test_counting_by_shape(mode, forward, model_shape):
    core = core_of(config(gas=2, world_size=2, curriculum_mode=mode), forward)
    core.begin_step()
    shaped = [core.cut(batch(seed=i)) for i in range(2)]
    assert tuple(shaped[0]["input_ids"].shape) == model_shape
    assert ("curriculum_seqlen" in shaped[0]) == (mode == "inject")
    new, lr = core.step_progress(), core.step_lr()
    # samples: full-length rows drawn; tokens: rows x length as trained; both x world_size
    tokens = 2 * 2 * 2 * 2 if mode != "reshape" else 2 * 2 * 20 // 2 * 2
    assert (new.samples, new.tokens) == (2 * 2 * 2, tokens)
    assert core.progress == Progress()  # not ended yet
    assert core.end_step() == new and core.progress == new and core.lr == lr


def test_counting_by_loss_mask_and_without_a_curriculum():
    core = core_of(config(count_tokens_by="loss_mask", curriculum_mode="reshape"), plain)
    b = batch()
    core.begin_step()
    core.cut(b)
    assert core.end_step().tokens == int(b["loss_mask"].flatten()[:20].sum())
    inject = core_of(config(count_tokens_by="loss_mask"), takes_seqlen)
    inject.begin_step()
    assert inject.record(2, 10, b["loss_mask"]) == 2
    assert inject.end_step().tokens == int(b["loss_mask"][:, :2].sum())
    inject.begin_step()
    with pytest.raises(ValueError, match="needs a loss_mask tensor or labels"):
        inject.cut({"input_ids": b["input_ids"]})
    off = core_of(config(None), plain)
    assert off.begin_step() is None
    assert off.cut(b).keys() == b.keys() and off.current_seqlen == 10 and off.micro_shape == (2, 10)
    assert off.end_step().tokens == 20


def test_one_counting_rule_for_every_path_labels_without_a_loss_mask():
    """count_tokens_by loss_mask on batches with -100 labels and no loss_mask: every path (the cut in each
    mode, a length bucket, inject, record() and the engine's positional call) counts the labels that train.
    Before, record() and the engine's inject call knew only a loss_mask and refused these batches."""
    b = batch()
    labels = b["labels"].clone()
    labels[0, 1] = labels[1, :3] = -100  # inside the first L = 2 columns and past them
    b = {"input_ids": b["input_ids"], "labels": labels}  # no loss_mask: a Hugging Face collator's batch
    want_prefix = int((labels[:, :2] != -100).sum())
    want_reshape = int((reshape_batch(b, 2)["labels"] != -100).sum())
    assert 0 < want_prefix < 4

    def counted(mode, forward, **kw):
        core = core_of(config(count_tokens_by="loss_mask", curriculum_mode=mode, **kw), forward)
        assert core.begin_step() == 2
        core.cut(b)
        return core.end_step().tokens

    assert counted("truncate", plain) == want_prefix
    assert counted("inject", takes_seqlen) == want_prefix
    assert counted("truncate", plain, length_bucket=4) == want_prefix  # the bucket's extra columns masked
    assert counted("reshape", plain) == want_reshape
    recorded = core_of(config(count_tokens_by="loss_mask"), takes_seqlen)
    recorded.begin_step()
    assert recorded.record(2, 10, labels=labels) == 2
    assert recorded.end_step().tokens == want_prefix

    class Model(torch.nn.Module):  # takes curriculum_seqlen: inject mode, called with positional tensors
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, input_ids, labels=None, curriculum_seqlen=None):
            return self.w * input_ids[:, :curriculum_seqlen].float().mean()

    model = Model()
    cfg = config(count_tokens_by="loss_mask")
    engine = CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg)
    engine.backward(engine(b["input_ids"], labels))
    engine.step()
    assert engine.progress.tokens == want_prefix


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
        core = core_of(config(world_size=2, count_tokens_by="loss_mask"), plain, process_group=group)
        core.begin_step()
        core.cut(b)
        core.step_lr()  # the sum is made once per step, whoever asks first
        new = core.end_step()
        assert (new.samples, new.tokens) == (2 * 2, 2 * per_rank)
    assert world.groups == [None, dp_group]
    core = core_of(config(world_size=2), plain, process_group=dp_group)
    core.begin_step()
    core.cut(b)
    assert core.end_step().tokens == 2 * 2 * 2 and len(world.groups) == 2  # shapes: no all-reduce


def test_a_mid_step_sum_leaves_the_rank_count_alone(monkeypatch):
    """all_reduce works in place: asking for the LR after one micro-batch must not turn the rank's own
    count into the sum, or the next cut (and a checkpoint's pending tokens) count the other ranks twice."""
    FakeWorld(monkeypatch)
    b = batch()
    per_rank = int(b["loss_mask"][:, :2].sum())
    cfg = config(gas=2, world_size=2, count_tokens_by="loss_mask")
    asked, quiet = core_of(cfg, plain), core_of(cfg, plain)
    for core in (asked, quiet):
        core.begin_step()
        core.cut(b)
    asked.step_lr()  # mid-step: the sum of the first micro-batch
    assert int(asked.state_dict()["pending_tokens"]) == per_rank
    for core in (asked, quiet):
        core.cut(b)
    assert asked.end_step().tokens == quiet.end_step().tokens == 2 * 2 * per_rank


def test_both_engines_hand_their_group_to_the_core(monkeypatch):
    world = FakeWorld(monkeypatch)
    group = object()
    model = torch.nn.Linear(2, 2)
    engine = CurriculumEngine(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        config(world_size=2, count_tokens_by="loss_mask"),
        process_group=group,
    )
    engine.cut(batch())
    engine.step()
    assert world.groups == [group] and engine.progress.step == 1
    assert CurriculumEngine(model, engine.optimizer, config()).slw.process_group is None

    class DeepSpeedStandIn:  # what DeepSpeedCurriculum reads of a (non-pipeline) DeepSpeed engine
        module, optimizer, data_parallel_group = model, engine.optimizer, object()
        dp_world_size, global_steps = 2, 0

        def is_gradient_accumulation_boundary(self):
            return True

        def step(self):
            self.global_steps += 1

    ds = DeepSpeedStandIn()
    cur = DeepSpeedCurriculum(ds, config(world_size=2, count_tokens_by="loss_mask"))
    cur.cut(batch())
    cur.step()
    assert world.groups == [group, ds.data_parallel_group] and cur.slw.progress.step == 1


# -- clock, LR, state -----------------------------------------------------------------------------------


def test_set_lr_respects_lr_scale():
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr_scale": 0.5}], lr=1.0)
    set_lr(opt, 0.2)
    assert [g["lr"] for g in opt.param_groups] == [0.2, 0.1]


def test_state_dict_round_trip_mid_step():
    cfg = config(gas=2, count_tokens_by="loss_mask", lr_warmup_iters=2)
    a = core_of(cfg, plain)
    run_steps(a, 2, gas=2)
    a.begin_step()
    a.cut(batch(seed=99))  # half a step pending
    state = copy.deepcopy(a.state_dict())
    assert set(state) == {
        "progress",
        "lr",
        "skipped_steps",
        "current_seqlen",
        "step_seqlen",
        "pending_samples",
        "pending_tokens",
        "scheduler",
    }
    b = core_of(cfg, plain)
    b.load_state_dict({**state, "format": "anything", "micro_steps": 5})  # a caller's larger dict
    assert b.state_dict() == state and b.step_open
    for core in (a, b):
        core.cut(batch(seed=100))
        core.end_step()
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

    from seqwarm.curriculum.modes import output_length

    logits = torch.zeros(2, 5, 7)
    assert output_length(logits, 2) == 5 and output_length(SimpleNamespace(logits=logits), 2) == 5
    assert output_length({"loss": torch.zeros(()), "logits": logits}, 2) == 5
    assert output_length((torch.zeros(()), logits), 2) == 5 and output_length(torch.zeros(2, 5), 2) == 5
    assert output_length(torch.zeros(()), 2) is None and output_length((torch.zeros(()), 3), 2) is None


# -- the keyword constructor and the two-call protocol ---------------------------------------------


def test_keyword_constructor_equals_the_deepspeed_block():
    kw = SequenceLengthWarmup(min_length=2, max_length=10, steps=8, multiple_of=2)
    ds = SequenceLengthWarmup.from_deepspeed({"train_batch_size": 2, "curriculum_learning": LINEAR})
    assert kw.curriculum.block() == ds.curriculum.block() and kw.mode == "truncate" and kw.lr is None
    lengths = {name: [] for name in ("kw", "ds")}
    for name, slw in (("kw", kw), ("ds", ds)):
        for _ in range(10):
            lengths[name].append(slw.begin_step())
            slw.cut(batch())
            slw.end_step()
    assert lengths["kw"] == lengths["ds"] == [difficulty_at(step, LINEAR) for step in range(1, 11)]
    assert lengths["kw"][0] == 2 and lengths["kw"][-1] == 10
    root = SequenceLengthWarmup(min_length=8, max_length=64, steps=10, schedule="root", root_degree=2)
    assert root.curriculum.schedule_config["root_degree"] == 2
    discrete = SequenceLengthWarmup(schedule="discrete", lengths=[8, 32, 64], until_steps=[2, 4])
    got = []
    for _ in range(6):
        got.append(discrete.begin_step())
        discrete.end_step()
    assert got == [8, 8, 32, 32, 64, 64]


def test_keyword_errors_name_the_keywords_all_at_once():
    with pytest.raises(ConfigError) as err:
        SequenceLengthWarmup(min_length=64, max_length=8, steps=0, multiple_of=0)
    text = str(err.value)
    assert "SequenceLengthWarmup" in text and "min_length = 64" in text
    assert "steps = 0" in text and "multiple_of = 0" in text and "min_difficulty =" not in text
    with pytest.raises(ConfigError, match="schedule = 'cosine'"):
        SequenceLengthWarmup(min_length=8, max_length=64, steps=10, schedule="cosine")
    with pytest.raises(TypeError, match="not both"):
        SequenceLengthWarmup(min_length=8, curriculum=config().curriculum)


def test_the_step_protocol_cannot_freeze_silently():
    slw = SequenceLengthWarmup(min_length=2, max_length=10, steps=8, multiple_of=2)
    with pytest.raises(RuntimeError, match=r"cut\(\) outside a step: call begin_step\(\) first"):
        slw.cut(batch())
    with pytest.raises(RuntimeError, match=r"end_step\(\) outside a step"):
        slw.end_step()
    slw.begin_step()
    with pytest.raises(RuntimeError, match=r"begin_step\(\) called twice"):
        slw.begin_step()
    slw.cut(batch())
    assert slw.end_step().step == 1
    with pytest.raises(RuntimeError, match=r"end_step\(\) outside a step"):
        slw.end_step()
    budget = SequenceLengthWarmup(min_length=2, max_length=10, steps=8, multiple_of=2, train_tokens=8)
    budget.begin_step()
    budget.cut(batch())  # 2 rows x 2 tokens
    assert not budget.done
    budget.end_step()
    budget.begin_step()
    budget.cut(batch())
    budget.end_step()
    assert budget.done and "token budget" in budget.stop_reason()


def test_the_plain_loop_of_the_readme_trains_at_the_schedule(one_thread):
    """A plain loop with a dict batch (`model(**slw.cut(batch))`) and a Hugging Face GPT-2 built from a config."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (8, 4, 64), generator=torch.Generator().manual_seed(1))
    loader = [{"input_ids": x, "labels": x} for x in ids]
    seen = []
    slw = SequenceLengthWarmup(min_length=8, max_length=64, steps=6, multiple_of=8)
    for batch_ in loader:  # one micro-batch per optimizer step here
        length = slw.begin_step()
        cut = slw.cut(batch_)
        loss = model(**cut).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()  # noqa: E702 - the README's loop
        slw.end_step()
        seen.append((length, tuple(cut["input_ids"].shape)))
    assert [s[0] for s in seen] == [difficulty_at(step, slw.curriculum) for step in range(1, 9)]
    assert seen[0][0] == 16 and seen[-1][0] == 64
    assert all(shape == (4, length) for length, shape in seen)
    assert slw.progress.step == 8 and slw.progress.tokens == 4 * sum(s[0] for s in seen)
    assert loader[0]["input_ids"].shape == (4, 64)  # the input is never changed
