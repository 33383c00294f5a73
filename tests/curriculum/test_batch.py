"""Batch shaping: truncate / reshape semantics, views, token preservation, position ids, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.curriculum.batch import count_tokens, reshape_batch, truncate_batch

EOD = 0


def make_batch(b: int = 2, s: int = 8, seed: int = 0, eod_every: int | None = None) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 100, (b, s + 1), generator=g)
    if eod_every:
        tokens[:, eod_every::eod_every] = EOD
    input_ids, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    pos = torch.arange(s).repeat(b, 1)
    if eod_every:  # Megatron's reset_position_ids: restart after every EOD in the input
        for row in range(b):
            start = 0
            for j in range(s):
                pos[row, j] = j - start
                if input_ids[row, j] == EOD:
                    start = j + 1
    return {"input_ids": input_ids, "labels": labels, "loss_mask": (input_ids != EOD).float(), "position_ids": pos}


def clone(batch):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


# -- truncate ------------------------------------------------------------------------------------


def test_truncate_prefix_cut_views_and_passthrough():
    batch = make_batch(3, 10)
    batch["attention_mask"] = torch.ones(1, 1, 10, 10, dtype=torch.bool).tril()
    batch["doc_ids"] = torch.arange(3)  # not per-token: passes through
    batch["hidden"] = torch.randn(3, 10, 4)  # (B, S, ...) unknown key: cut on dim 1
    batch["note"] = "keep me"
    before = clone(batch)
    out = truncate_batch(batch, 4)
    assert out is not batch
    assert_same(batch, before)  # input dict and tensors untouched
    for key in ("input_ids", "labels", "loss_mask", "position_ids"):
        assert torch.equal(out[key], batch[key][:, :4])
        assert out[key].data_ptr() == batch[key].data_ptr()  # a view, no copy
    assert out["hidden"].shape == (3, 4, 4)
    assert out["attention_mask"].shape == (1, 1, 4, 4)
    assert torch.equal(out["attention_mask"][0, 0], torch.ones(4, 4, dtype=torch.bool).tril())
    assert out["doc_ids"] is batch["doc_ids"] and out["note"] == "keep me"


def test_truncate_padding_mask_and_per_sample_4d_mask():
    batch = make_batch(2, 6)
    batch["attention_mask"] = torch.ones(2, 6)
    assert truncate_batch(batch, 3)["attention_mask"].shape == (2, 3)
    batch["attention_mask"] = torch.rand(2, 1, 6, 6)
    out = truncate_batch(batch, 3)
    assert torch.equal(out["attention_mask"], batch["attention_mask"][:, :, :3, :3])


def test_long_length_is_a_shallow_copy():
    batch = make_batch(2, 8)
    for fn in (truncate_batch, reshape_batch):
        for length in (8, 9, 1000):
            out = fn(batch, length)
            assert out is not batch
            assert all(out[k] is batch[k] for k in batch)


@pytest.mark.parametrize("bad", [0, -3, 2.0, "4", None, True, False])
@pytest.mark.parametrize("fn", [truncate_batch, reshape_batch])
def test_bad_length_raises_value_error_naming_the_tensor(fn, bad):
    with pytest.raises(ValueError, match=r"input_ids.*\[2, 8\]"):
        fn(make_batch(2, 8), bad)


def test_numpy_int_length_is_accepted():
    assert truncate_batch(make_batch(2, 8), np.int64(3))["input_ids"].shape == (2, 3)


@pytest.mark.parametrize("fn", [truncate_batch, reshape_batch])
def test_inconsistent_shapes_are_reported(fn):
    batch = make_batch(2, 8)
    batch["labels"] = batch["labels"][:, :7]
    with pytest.raises(ValueError, match=r"labels.*\[2, 7\]"):
        fn(batch, 4)
    batch = make_batch(2, 8)
    batch["attention_mask"] = torch.ones(2, 1, 8, 7)
    with pytest.raises(ValueError, match="attention_mask"):
        fn(batch, 4)
    with pytest.raises(ValueError, match="none of the keys"):
        fn({"x": torch.ones(2, 8)}, 4)


# -- reshape -------------------------------------------------------------------------------------


def test_reshape_keeps_tokens_order_and_pairs():
    batch = make_batch(4, 16)
    out = reshape_batch(batch, 8)
    assert out["input_ids"].shape == (8, 8)
    assert torch.equal(out["input_ids"].reshape(-1), batch["input_ids"].reshape(-1))
    assert torch.equal(out["labels"].reshape(-1), batch["labels"].reshape(-1))
    assert out["input_ids"].data_ptr() == batch["input_ids"].data_ptr()  # contiguous input: a view
    assert torch.equal(out["position_ids"], torch.arange(8).repeat(8, 1))


def test_reshape_drops_fewer_than_length_tokens():
    batch = make_batch(3, 10)  # 30 tokens into rows of 7: 4 rows, 2 dropped
    out = reshape_batch(batch, 7)
    assert out["input_ids"].shape == (4, 7)
    assert torch.equal(out["input_ids"].reshape(-1), batch["input_ids"].reshape(-1)[:28])
    assert count_tokens(out) == 28


def test_reshape_position_ids_restart_at_row_start_and_keep_eod_resets():
    # One row of 12 tokens with an EOD at index 4: positions 0 1 2 3 4 | 0 1 2 3 4 5 6.
    ids = torch.tensor([[5, 6, 7, 8, EOD, 9, 10, 11, 12, 13, 14, 15]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    out = reshape_batch({"input_ids": ids, "labels": ids, "position_ids": pos}, 3)
    # Rows: [0 1 2] [3 4 | 0] [1 2 3] [4 5 6] -> restart at each row start, reset after the EOD.
    expected = torch.tensor([[0, 1, 2], [0, 1, 0], [0, 1, 2], [0, 1, 2]])
    assert torch.equal(out["position_ids"], expected)


def test_reshape_row_straddling_two_samples_restarts_at_the_seam():
    batch = make_batch(2, 6)  # positions 0..5, 0..5 flattened; rows of 4: [0 1 2 3] [4 5 | 0 1] [2 3 4 5]
    out = reshape_batch(batch, 4)
    assert torch.equal(out["position_ids"], torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1], [0, 1, 2, 3]]))


def test_reshape_broadcast_position_ids_and_masks():
    batch = make_batch(2, 8)
    batch["position_ids"] = torch.arange(8)[None]  # (1, S)
    batch["attention_mask"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
    out = reshape_batch(batch, 4)
    assert torch.equal(out["position_ids"], torch.arange(4).repeat(4, 1))
    assert out["attention_mask"].shape == (1, 1, 4, 4)
    batch["attention_mask"] = torch.ones(2, 8)
    assert reshape_batch(batch, 4)["attention_mask"].shape == (4, 4)
    batch["attention_mask"] = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    with pytest.raises(ValueError, match="per-sample 4-D attention_mask"):
        reshape_batch(batch, 4)


def test_reshape_does_not_mutate():
    batch = make_batch(3, 12, eod_every=5)
    before = clone(batch)
    reshape_batch(batch, 5)
    assert_same(batch, before)


def _runs_of_positions(pos_flat: torch.Tensor) -> list[int]:
    """Lengths of runs of consecutive position ids in a flat stream."""
    runs, current = [], 1
    for a, b in zip(pos_flat[:-1].tolist(), pos_flat[1:].tolist()):
        if b == a + 1:
            current += 1
        else:
            runs.append(current)
            current = 1
    return runs + [current]


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 4), s=st.integers(2, 24), data=st.data())
def test_reshape_properties(b, s, data):
    length = data.draw(st.integers(1, s + 2))
    eod = data.draw(st.sampled_from([None, 2, 3, 5]))
    batch = make_batch(b, s, seed=b * 100 + s, eod_every=eod)
    out = reshape_batch(batch, length)
    if length >= s:
        assert out["input_ids"] is batch["input_ids"]
        return
    kept = (b * s) // length * length
    assert b * s - kept < length
    assert out["input_ids"].shape == (kept // length, length)
    for key in ("input_ids", "labels", "loss_mask"):
        assert torch.equal(out[key].reshape(-1), batch[key].reshape(-1)[:kept])
    pos = out["position_ids"]
    assert torch.all(pos[:, 0] == 0)
    # Within a row, a position either continues (+1) or restarts at 0 exactly where the original did.
    orig = batch["position_ids"].reshape(-1)[:kept].view(-1, length)
    cont_new = pos[:, 1:] == pos[:, :-1] + 1
    cont_old = orig[:, 1:] == orig[:, :-1] + 1
    assert torch.equal(cont_new, cont_old)
    assert torch.all(pos[:, 1:][~cont_new] == 0)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), s=st.integers(1, 20), data=st.data())
def test_truncate_properties(b, s, data):
    length = data.draw(st.integers(1, s + 3))
    batch = make_batch(b, s, seed=s)
    out = truncate_batch(batch, length)
    for key in batch:
        assert torch.equal(out[key], batch[key][:, :length])
    assert count_tokens(out) == b * min(length, s)


def test_count_tokens():
    batch = make_batch(2, 8)
    batch["loss_mask"] = torch.zeros(2, 8)
    batch["loss_mask"][0, :5] = 1
    assert count_tokens(batch) == 16
    assert count_tokens(batch, use_loss_mask=True) == 5
    assert count_tokens(truncate_batch(batch, 3), use_loss_mask=True) == 3
    del batch["loss_mask"]  # the clock's rule: without a loss_mask, the labels that are not -100
    batch["labels"][1, 2:] = -100
    assert count_tokens(batch, use_loss_mask=True) == 8 + 2
    del batch["labels"]
    with pytest.raises(ValueError, match="a loss_mask tensor or labels"):
        count_tokens(batch, use_loss_mask=True)
