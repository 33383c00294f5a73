"""Batches to the device (issue #14): drawn raw (read one batch ahead on a thread on CUDA), cut once by the
loop, to the step's length, before the copy, trivial keys left out — and not one number changes.

The slow, end-to-end tests of this file are in tests/e2e/test_feed_runs.py.
"""

import threading

import numpy as np
import pytest
import torch

from seqwarm.curriculum.batch import reshape_batch, truncate_batch
from seqwarm.data.dataset import TokenWindows, TrainBatches, build_batch
from seqwarm.trainer.feed import DeviceFeed, is_trivial, lean_batch
from seqwarm.trainer.model import GPT, GPTConfig


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "seqwarm-prefetch"]


def _source(micro=3, seq=16, **opts) -> TrainBatches:
    tokens = np.random.default_rng(0).integers(0, 50, 2000).astype(np.int64)
    tokens[::37] = 0  # EOD
    return TrainBatches(TokenWindows(tokens, seq, eod_id=0, **opts), micro, seed=5)


# -- the model: a left-out key is its default, bit for bit --------------------------------------------


@pytest.mark.parametrize("rotary", [False, True])
def test_leaving_out_a_trivial_mask_and_positions_changes_no_bit(rotary, one_thread):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=50, seq_length=16, rotary=rotary))
    full = build_batch(np.random.default_rng(1).integers(0, 50, (4, 17)))
    for cut in (lambda b: b, lambda b: truncate_batch(b, 8), lambda b: reshape_batch(b, 8)):
        batch = cut(full)
        lean = lean_batch(batch)
        assert set(lean) == {"input_ids", "labels"}
        losses, grads = [], []
        for b in (batch, lean):
            model.zero_grad()
            loss = model(**b)
            loss.backward()
            losses.append(loss)
            grads.append([p.grad.clone() for p in model.parameters()])
        assert torch.equal(losses[0], losses[1])
        assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_lean_batch_keeps_what_is_not_trivial():
    batch = build_batch(np.arange(40).reshape(4, 10) % 7, eod_id=0, eod_mask_loss=True, reset_position_ids=True)
    out = lean_batch(batch)
    assert set(out) == set(batch) and all(torch.equal(out[k], batch[k]) for k in batch)  # EOD resets: kept
    plain = build_batch(np.arange(40).reshape(4, 10) % 7)
    assert is_trivial("loss_mask", plain["loss_mask"]) and is_trivial("position_ids", plain["position_ids"])
    assert is_trivial("position_ids", torch.arange(6)[None]) and not is_trivial("input_ids", plain["input_ids"])
    assert set(lean_batch(plain, ("loss_mask",))) == {"input_ids", "labels", "position_ids"}
    assert lean_batch(plain, ()) == plain and lean_batch(plain, ()) is not plain  # a new dict
    # reshape restarts positions at the seam between two samples: kept when a seam falls inside a row
    assert "position_ids" in lean_batch(reshape_batch(plain, 5)) and "position_ids" not in lean_batch(
        reshape_batch(plain, 3)
    )  # rows of 9 tokens: re-chunked by 5 a seam falls inside a row, by 3 never


# -- the feed -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("threaded", [False, True])
def test_the_feed_hands_out_the_source_batches_in_order_raw_and_copies_the_cut(threaded):
    reference = _source()
    with DeviceFeed(_source(), "cpu", drop_trivial=True, threaded=threaded) as feed:
        for i in range(7):
            raw, want = feed.draw(), reference.next_batch()
            assert set(raw) == set(want) and all(torch.equal(raw[k], want[k]) for k in want), i  # whole, all keys
            got = feed.to_device(truncate_batch(raw, 4 + i))  # the loop's cut, on the host, then the copy
            assert set(got) == {"input_ids", "labels"}  # the trivial mask and positions left out
            assert all(torch.equal(got[k], want[k][:, : 4 + i]) for k in got), i
        assert feed.state_dict()["sample_index"] == reference.state_dict()["sample_index"]  # one read ahead
        assert bool(_threads()) == threaded
        assert feed.to_device(feed.draw())["input_ids"].shape == (3, 16)  # not cut: every column
    assert not _threads()
    reference.next_batch()
    assert feed.batches.state_dict() == reference.state_dict()  # the batch read ahead was given back


def test_the_feed_moves_only_the_columns_of_the_cut(monkeypatch):
    moved = []
    real = DeviceFeed._move

    def record(self, batch):
        moved.append({k: tuple(v.shape) for k, v in batch.items()})
        return real(self, batch)

    monkeypatch.setattr(DeviceFeed, "_move", record)
    feed = DeviceFeed(_source(micro=2, seq=32), "cpu", drop_trivial=True, threaded=True)
    feed.to_device(truncate_batch(feed.draw(), 8))
    feed.to_device(truncate_batch(feed.draw(), 8))
    feed.close()
    assert moved == [{"input_ids": (2, 8), "labels": (2, 8)}] * 2


def test_the_state_of_a_feed_is_the_position_before_the_next_batch_it_hands_out():
    feed, reference = DeviceFeed(_source(), "cpu", threaded=True), _source()
    for _ in range(3):
        feed.draw()
        reference.next_batch()
    state = feed.state_dict()
    assert state == reference.state_dict()  # the batch fetched ahead (maybe still being read) not counted
    expected = reference.next_batch()
    resumed = DeviceFeed(_source(), "cpu", threaded=True)
    resumed.load_state_dict(state)
    for got in (resumed.draw(), (feed.load_state_dict(state), feed.draw())[1]):  # drops the one in flight
        assert all(torch.equal(got[k], v) for k, v in expected.items())
    feed.close()
    resumed.close()
    assert not _threads()


@pytest.mark.parametrize("threaded", [False, True])
def test_an_error_in_the_source_is_raised_by_draw_and_leaves_no_thread(threaded):
    source = _source()
    real, calls = source.next_batch, []

    def flaky():
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk went away")
        return real()

    source.next_batch = flaky
    feed = DeviceFeed(source, "cpu", threaded=threaded)
    feed.draw()
    feed.draw()
    with pytest.raises(OSError, match="disk went away"):
        feed.draw()
    assert not _threads()
    feed.close()  # closing again is fine


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_feed_copies_pinned_batches_ahead_on_a_side_stream():
    reference = _source()
    with DeviceFeed(_source(), "cuda", drop_trivial=True) as feed:
        assert feed.threaded
        for _ in range(5):
            got, want = feed.to_device(truncate_batch(feed.draw(), 5)), reference.next_batch()
            assert got["input_ids"].is_cuda and set(got) == {"input_ids", "labels"}
            assert all(torch.equal(got[k].cpu(), want[k][:, :5]) for k in got)
    assert not _threads()
