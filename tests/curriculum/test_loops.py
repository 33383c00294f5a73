"""The loops people keep: ``cut`` takes what they hand it (a dict under the model's own key names, a tuple
``(inputs, targets, ...)``, one tensor) and gives back the same kind, contiguous; a nanoGPT-shaped loop
(positional ``forward(idx, targets)`` that calls ``targets.view(-1)``) trains at the schedule with
gradient accumulation; a checkpoint without seqwarm's state says what it lacks; ``plan`` works from the
keywords."""

from __future__ import annotations

import warnings
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

from seqwarm.config import load_config
from seqwarm.curriculum.lr import LRConfig
from seqwarm.curriculum.plan import make_plan
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.util.problems import ConfigError

VOCAB, BLOCK = 32, 16


class TinyCharModel(torch.nn.Module):
    """nanoGPT's interface, not its code: ``forward(idx, targets=None) -> (logits, loss)``, the loss
    computed on flattened ``.view(-1)`` tensors, which a strided (non-contiguous) cut cannot give."""

    def __init__(self, d=16):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, d)
        self.wpe = torch.nn.Embedding(BLOCK, d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.head = torch.nn.Linear(d, VOCAB)
        self.seen = []  # (B, T) of every forward

    def forward(self, idx, targets=None):
        b, t = idx.size()
        self.seen.append((b, t))
        x = self.wte(idx) + self.wpe(torch.arange(t))  # (B, T, d)
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)  # (B, 1, T, d) each: one head
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)
        logits = self.head(x)  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def get_batch(gen, batch_size=4):
    """nanoGPT's get_batch: random windows of a token stream, inputs and the next tokens as targets."""
    data = torch.randint(0, VOCAB, (512,), generator=gen)
    ix = torch.randint(len(data) - BLOCK, (batch_size,), generator=gen)
    x = torch.stack([data[i : i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
    return x, y


def test_a_nanogpt_shaped_loop_trains_at_the_schedule_with_accumulation():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = TinyCharModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    slw = SequenceLengthWarmup(min_length=4, max_length=BLOCK, steps=6, multiple_of=4, lr=LRConfig(lr=1e-2))
    accumulation, lengths, losses = 2, [], []
    for _ in range(8):
        length = slw.begin_step()
        for _micro in range(accumulation):
            X, Y = get_batch(gen)
            X, Y = slw.cut((X, Y))
            logits, loss = model(X, Y)  # .view(-1) inside: raises on a strided cut
            (loss / accumulation).backward()
        seqwarm_lr = slw.step_lr()
        for group in optimizer.param_groups:
            group["lr"] = seqwarm_lr
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        slw.end_step()
        lengths.append(length)
        losses.append(loss.item())
    assert lengths == [difficulty_at(step, slw.curriculum) for step in range(1, 9)]
    assert lengths[0] == 4 and lengths[-1] == BLOCK and len(set(lengths)) > 2
    assert model.seen == [(4, n) for n in lengths for _ in range(accumulation)]
    assert slw.progress.tokens == sum(4 * n * accumulation for n in lengths)
    assert slw.progress.samples == 8 * 4 * accumulation and all(torch.isfinite(torch.tensor(losses)))


def test_the_cut_is_contiguous_because_the_view_of_a_plain_slice_fails():
    x, y = get_batch(torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        y[:, :8].view(-1)  # what nanoGPT would meet with a strided cut
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    slw.begin_step()
    cx, cy = slw.cut((x, y))
    assert cx.is_contiguous() and cy.is_contiguous() and cy.view(-1).shape == (4 * 8,)
    assert torch.equal(cx, x[:, :8]) and torch.equal(cy, y[:, :8])


Pair = namedtuple("Pair", "inputs targets")


@pytest.mark.parametrize("make", [tuple, list, lambda items: Pair(*items)], ids=["tuple", "list", "namedtuple"])
def test_a_sequence_comes_back_as_the_same_kind_in_the_same_order(make):
    x, y = get_batch(torch.Generator().manual_seed(0))
    batch = make([x, y])
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    slw.begin_step()
    out = slw.cut(batch)
    assert type(out) is type(batch) and len(out) == 2
    assert torch.equal(out[0], x[:, :8]) and torch.equal(out[1], y[:, :8])
    assert batch[0].shape == (4, BLOCK)  # the input is not changed
    slw.end_step()
    assert slw.progress.tokens == 4 * 8


def test_extra_tuple_elements_are_cut_when_per_token_and_passed_otherwise():
    x, y = get_batch(torch.Generator().manual_seed(0))
    mask = torch.ones(4, BLOCK)
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    slw.begin_step()
    cx, cy, cmask, note, scale = slw.cut((x, y, mask, "meta", torch.tensor(2.0)))
    assert cx.shape == cy.shape == cmask.shape == (4, 8) and note == "meta" and scale.item() == 2.0


def test_one_tensor_comes_back_as_one_tensor():
    x, _ = get_batch(torch.Generator().manual_seed(0))
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    slw.begin_step()
    out = slw.cut(x)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 8) and out.is_contiguous()


def test_a_dict_under_the_models_own_names_is_cut_with_keys():
    x, y = get_batch(torch.Generator().manual_seed(0))
    plain = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    plain.begin_step()
    with pytest.raises(ValueError, match=r"keys=\{'input_ids': 'idx'"):
        plain.cut({"idx": x, "targets": y})
    slw = SequenceLengthWarmup(
        min_length=8, max_length=BLOCK, steps=4, multiple_of=8, keys={"input_ids": "idx", "labels": "targets"}
    )
    slw.begin_step()
    out = slw.cut({"idx": x, "targets": y, "step": 3})
    assert list(out) == ["idx", "targets", "step"] and out["step"] == 3
    assert out["idx"].shape == out["targets"].shape == (4, 8) and out["targets"].is_contiguous()
    with pytest.raises(ValueError, match="both 'input_ids' and 'idx'"):
        slw.cut({"idx": x, "input_ids": x})


def test_keys_names_the_padding_mask_too():
    ids = torch.arange(1, 17).repeat(2, 1)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 5:] = 0  # the second row holds 5 real tokens, right-padded
    slw = SequenceLengthWarmup(
        min_length=8, max_length=16, steps=4, multiple_of=8, keys={"input_ids": "ids", "attention_mask": "pad"}
    )
    slw.begin_step()
    out = slw.cut({"ids": ids, "pad": mask})
    assert out["ids"].shape == (2, 8) and out["pad"][1].tolist() == [1] * 5 + [0] * 3
    slw.end_step()
    assert slw.progress.tokens == 8 + 5  # padding is not counted: the mask was read under its own name


def test_bad_keys_are_listed_at_construction():
    with pytest.raises(ConfigError) as err:
        SequenceLengthWarmup(min_length=8, max_length=16, steps=4, keys={"input_id": "idx", "labels": 3})
    text = str(err.value)
    assert "2 problems" in text and 'did you mean "input_ids"?' in text and "keys['labels'] = 3" in text
    with pytest.raises(ConfigError, match="names one batch key for two"):
        SequenceLengthWarmup(min_length=8, max_length=16, steps=4, keys={"input_ids": "x", "labels": "x"})


def test_inject_mode_refuses_a_tuple_it_cannot_pass_the_length_through():
    def forward(idx, targets=None, curriculum_seqlen=None):
        return idx

    x, y = get_batch(torch.Generator().manual_seed(0))
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8, mode=None, forward=forward)
    assert slw.mode == "inject"
    slw.begin_step()
    with pytest.raises(ValueError, match="cannot carry: cut\\(batch, trim=True\\)"):
        slw.cut((x, y))
    cx, cy = slw.cut((x, y), trim=True)
    assert cx.shape == cy.shape == (4, 8)


def test_cut_names_what_it_takes():
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    slw.begin_step()
    with pytest.raises(TypeError, match="a dict of tensors, a tuple or list of tensors"):
        slw.cut("tokens")
    with pytest.raises(TypeError, match="first element is str"):
        slw.cut(("a", "b"))


def test_a_checkpoint_without_seqwarm_state_says_what_is_missing():
    slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    with pytest.raises(ValueError, match="no seqwarm state \\(missing progress, skipped_steps") as err:
        slw.load_state_dict({})
    assert "KeyError" not in repr(err.value)
    saved = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8)
    saved.begin_step()
    saved.cut(torch.zeros(2, BLOCK, dtype=torch.long))
    saved.end_step()
    checkpoint = {"model": {}, "optimizer": {}, "slw": saved.state_dict()}
    with pytest.raises(ValueError, match="it holds one under 'slw': pass state\\['slw'\\]"):
        slw.load_state_dict(checkpoint)
    partial = {k: v for k, v in saved.state_dict().items() if k != "pending_tokens"}
    with pytest.raises(ValueError, match="an incomplete seqwarm state \\(missing pending_tokens"):
        slw.load_state_dict(partial)
    slw.load_state_dict(checkpoint["slw"])
    assert slw.progress == saved.progress


def test_plan_from_the_keywords_is_the_plan_of_the_same_deepspeed_config():
    block = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 8,
        "max_difficulty": 64,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
    }
    raw = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "curriculum_learning": block,
        "seqwarm": {"train_tokens": 20_000, "lr_warmup_iters": 2, "lr_decay_style": "cosine"},
    }
    from_file = make_plan(load_config(raw))
    slw = SequenceLengthWarmup(
        min_length=8,
        max_length=64,
        steps=10,
        multiple_of=8,
        lr=LRConfig(lr=1e-3, warmup_iters=2, decay_style="cosine"),
        train_tokens=20_000,
    )
    plan = slw.plan(8, micro_batch_size=4)
    assert plan.total_steps == from_file.total_steps > 10 and plan.total_tokens == from_file.total_tokens
    assert plan.points == from_file.points and plan.curriculum_end_step == from_file.curriculum_end_step
    no_budget = SequenceLengthWarmup(min_length=8, max_length=64, steps=10, multiple_of=8).plan(4)
    assert no_budget.total_steps == 10 and no_budget.points[-1].seqlen == 64
    reshape = SequenceLengthWarmup(min_length=8, max_length=64, steps=10, multiple_of=8, mode="reshape").plan(4)
    assert reshape.points[0].tokens_per_step == 4 * 64  # reshape keeps every token: the mode is planned
    with pytest.raises(ValueError, match="does not divide"):
        slw.plan(8, micro_batch_size=3)


def test_a_resume_that_forgot_the_curriculum_state_is_said_by_the_lr_scheduler():
    from seqwarm.curriculum.lr_scheduler import CurriculumLRScheduler

    def run(slw, optimizer, steps):
        scheduler = CurriculumLRScheduler(optimizer, slw)
        for _ in range(steps):
            slw.begin_step()
            slw.cut(get_batch(torch.Generator().manual_seed(0)))
            scheduler.step(slw.step_progress())  # before optimizer.step(): the clock including this step
            optimizer.step()
            slw.end_step()

    def fresh():
        model = torch.nn.Linear(2, 2)
        model.weight.grad = torch.ones(2, 2)
        slw = SequenceLengthWarmup(min_length=8, max_length=BLOCK, steps=4, multiple_of=8, lr=LRConfig(lr=0.1))
        return slw, torch.optim.AdamW(model.parameters(), lr=0.1)

    slw, optimizer = fresh()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh run says nothing
        run(slw, optimizer, 2)
    forgot, opt2 = fresh()
    opt2.load_state_dict(optimizer.state_dict())
    with pytest.warns(UserWarning, match="the curriculum's state was not restored"):
        run(forgot, opt2, 1)
    restored, opt3 = fresh()
    opt3.load_state_dict(optimizer.state_dict())
    restored.load_state_dict(slw.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(restored, opt3, 1)
    assert restored.progress.step == 3
