"""The cut of every batch layout keeps each sequence's first L real tokens, and counts only those.

The same sequences are laid out as a right-padded batch, a left-padded batch and one padding-free row
(built here the way Hugging Face's collators lay them out); every cut is compared with the sequences
cut by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.curriculum.layouts import batch_layout, cut_to_layout, read_layout
from seqwarm.curriculum.warmup import SequenceLengthWarmup

PAD = 0


def sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 50, (n,), generator=g) for n in lengths]


def padded(seqs, side):
    """input_ids / attention_mask / labels (-100 on pads), padded to the longest on ``side``."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros(len(seqs), width, dtype=torch.int64)
    for i, s in enumerate(seqs):
        cols = slice(0, len(s)) if side == "right" else slice(width - len(s), width)
        ids[i, cols], mask[i, cols] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def flattened(seqs, flash=False):
    """One row, positions restarting per sequence, label -100 at each sequence's first token."""
    ids = torch.cat(seqs).unsqueeze(0)
    pos = torch.cat([torch.arange(len(s)) for s in seqs]).unsqueeze(0)
    labels = ids.clone()
    labels[pos == 0] = -100
    out = {"input_ids": ids, "labels": labels, "position_ids": pos}
    if flash:
        offsets = torch.tensor([0, *torch.cumsum(torch.tensor([len(s) for s in seqs]), 0).tolist()], dtype=torch.int32)
        longest = max(len(s) for s in seqs)
        out.update(cu_seq_lens_q=offsets, cu_seq_lens_k=offsets, max_length_q=longest, max_length_k=longest)
    return out


def real_rows(batch):
    """Each row's real tokens, in order."""
    return [row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]


def test_layouts_are_read_from_the_batch():
    seqs = sequences([5, 9, 3])
    assert batch_layout(padded(seqs, "right")) == "right_padded"
    assert batch_layout(padded(seqs, "left")) == "left_padded"
    assert batch_layout(flattened(seqs)) == "padding_free"
    assert batch_layout(flattened(seqs, flash=True)) == "padding_free"
    same = padded(sequences([6, 6]), "left")
    assert batch_layout(same) == "dense"  # no padding at all
    packed = {"input_ids": torch.ones(1, 8, dtype=torch.long), "position_ids": flattened(seqs)["position_ids"][:, :8]}
    assert batch_layout({**packed, "loss_mask": torch.ones(1, 8)}) == "dense"  # Megatron's windows: EOD resets
    assert read_layout({**packed, "loss_mask": torch.ones(1, 8)}, "padding_free") == "padding_free"
    with pytest.raises(ValueError, match="layout 'padding_free' was set, but this batch is right-padded"):
        read_layout(padded(seqs, "right"), "padding_free")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b["attention_mask"][1].copy_(torch.tensor([1, 0, 1, 1, 1, 1, 1, 1, 1])), "row 1"),
        (lambda b: b["attention_mask"][0].copy_(b["attention_mask"][0].flip(0)), "mixes both sides"),
    ],
)
def test_a_layout_that_cannot_be_read_is_named_never_guessed(change, message):
    batch = copy.deepcopy(padded(sequences([5, 9, 7]), "right"))
    change(batch)
    with pytest.raises(ValueError, match=message):
        batch_layout(batch)
    two_rows = {**flattened(sequences([3, 4]), flash=True), "input_ids": torch.ones(2, 7, dtype=torch.long)}
    with pytest.raises(ValueError, match="padding-free batch.*2 rows"):
        batch_layout(two_rows)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=6), seqlen=st.integers(1, 24))
def test_every_layout_keeps_each_sequence_first_l_real_tokens(lengths, seqlen):
    seqs = sequences(lengths, seed=len(lengths) * 31 + seqlen)
    want = [s[:seqlen].tolist() for s in seqs]
    width = max(min(n, seqlen) for n in lengths)
    for side in ("right", "left"):
        batch = padded(seqs, side)
        before = copy.deepcopy(batch)
        out = cut_to_layout(batch, seqlen, batch_layout(batch))
        assert all(torch.equal(batch[k], before[k]) for k in batch)  # the input is not changed
        assert out["input_ids"].shape == (len(seqs), width)
        assert real_rows(out) == want
        assert torch.equal(out["labels"], out["input_ids"].masked_fill(out["attention_mask"] == 0, -100))
        if side == "left" and out["attention_mask"].shape[1] > 0:  # still left-padded: real tokens last
            assert bool(out["attention_mask"][:, -1].all())
    for flash in (False, True):
        out = cut_to_layout(flattened(seqs, flash), seqlen, "padding_free")
        assert out["input_ids"].tolist() == [sum(want, [])]
        assert out["position_ids"].tolist() == [sum((list(range(len(w))) for w in want), [])]
        assert out["labels"][out["position_ids"] == 0].eq(-100).all()
        if flash:
            kept = [len(w) for w in want]
            assert out["cu_seq_lens_q"].tolist() == [0, *torch.cumsum(torch.tensor(kept), 0).tolist()]
            assert out["cu_seq_lens_q"].dtype == torch.int32 and out["max_length_k"] == max(kept)


def slw(**kw):
    return SequenceLengthWarmup(min_length=4, max_length=16, steps=4, multiple_of=4, **kw)


@pytest.mark.parametrize("count_tokens_by", ["shape", "loss_mask"])
def test_the_clock_counts_real_tokens_the_same_in_every_layout(count_tokens_by):
    seqs = sequences([3, 10, 16, 7])
    steps = {}
    for name, batch in [
        ("right", padded(seqs, "right")),
        ("left", padded(seqs, "left")),
        ("flat", flattened(seqs)),
        ("flash", flattened(seqs, flash=True)),
    ]:
        core = slw(count_tokens_by=count_tokens_by)
        counts = []
        for _ in range(5):
            length = core.begin_step()
            out = core.cut(batch)
            assert core.trained_length == min(length, 16)
            counts.append((core.end_step().tokens, out["input_ids"].numel()))
        steps[name] = [c[0] for c in counts]
    real = [sum(min(n, L) for n in (3, 10, 16, 7)) for L in (4, 8, 12, 16, 16)]
    if count_tokens_by == "shape":
        assert steps["right"][0] == real[0]
        assert all(steps[name] == [sum(real[: i + 1]) for i in range(5)] for name in steps)
    else:  # the labels that train: the padded rows' real tokens; the flattened rows mark each first token
        assert steps["right"] == steps["left"] == [sum(real[: i + 1]) for i in range(5)]
        assert steps["flat"] == steps["flash"] == [sum(real[: i + 1]) - 4 * (i + 1) for i in range(5)]


def test_modes_that_cannot_cut_a_padded_batch_refuse_it():
    batch = padded(sequences([3, 10]), "left")
    for core, message in [
        (slw(mode="reshape"), "reshape works on dense rows; this batch is left-padded"),
        (slw(length_bucket=8), "a length bucket works on dense rows"),
        (slw(mode="inject", forward=lambda input_ids, curriculum_seqlen=None: None), "not each sequence's first"),
    ]:
        core.begin_step()
        with pytest.raises(ValueError, match=message):
            core.cut(batch)
    inject = slw(mode="inject", forward=lambda input_ids, attention_mask=None, curriculum_seqlen=None: None)
    inject.begin_step()
    out = inject.cut(padded(sequences([3, 10]), "right"))
    assert out["curriculum_seqlen"] == 4 and inject.end_step().tokens == 3 + 4  # the real tokens it trains on


def test_dynamic_padding_shorter_than_the_top_is_not_warned_about(recwarn):
    core = slw()
    core.begin_step()
    core.cut(padded(sequences([3, 9]), "right"))  # the collator padded to 9 < max_length 16
    assert not [w for w in recwarn if "max_difficulty" in str(w.message)]
    core.end_step()
    core.begin_step()
    with pytest.warns(UserWarning, match="never reaches the full length"):
        core.cut(padded(sequences([3, 20]), "right"))
