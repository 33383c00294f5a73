"""A stage's windows read at its length (issue #36 item 3): trainer.stage_data.StageBatches over a prepared
folder and a Megatron blend — the windows and rows after a switch, the run's windows until one, and a
position saved inside a stage continuing exactly."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from data.test_megatron import BYTE_EOD, BYTE_VOCAB, _small
from seqwarm.data import open_prepared
from seqwarm.data.megatron import MegatronData
from seqwarm.trainer.feed import DeviceFeed
from seqwarm.trainer.stage_data import StageBatches


def _blend(tmp_path):
    p1, p2 = _small(tmp_path, "a"), _small(tmp_path, "b", n=30)
    return MegatronData(["0.3", p1, "0.7", p2], split="8,2,0", vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("source", ["prepared", "blend"])
def test_a_stage_reads_its_own_windows_and_its_position_resumes_exactly(tmp_path, byte_data, source):
    data = open_prepared(byte_data) if source == "prepared" else _blend(tmp_path)
    make = partial(data.train_batches, seed=3, rank=1, world_size=2)
    batches = StageBatches(make, 32, 4)
    plain = make(32, 4)
    for _ in range(3):  # before a stage: exactly the run's own windows
        assert _same(batches.next_batch(), plain.next_batch())
    assert not batches.switch(32, 4)  # the same windows go on
    assert _same(batches.next_batch(), plain.next_batch())
    assert batches.switch(64, 2)
    first = batches.next_batch()
    assert first["input_ids"].shape == (2, 64) and _same(first, make(64, 2).next_batch())  # a pass of its own
    # the tokens of a window of 64 follow each other in the data (not two windows of 32 side by side)
    assert torch.equal(first["labels"][:, :-1], first["input_ids"][:, 1:])
    state = batches.state_dict()
    assert state["length"] == 64 and state["rows"] == 2
    ahead = [batches.next_batch() for _ in range(3)]

    resumed = StageBatches(make, 32, 4)  # a new run: the run's windows until it loads the position
    resumed.load_state_dict(state)
    assert resumed.shape == (64, 2) and all(_same(resumed.next_batch(), b) for b in ahead)
    old = StageBatches(make, 32, 4)  # a position written before the stages read their own windows
    old.load_state_dict(plain.state_dict())
    assert old.shape == (32, 4) and _same(old.next_batch(), plain.next_batch())


def test_the_feed_gives_back_a_batch_read_ahead_before_the_switch(byte_data):
    """On CUDA the feed reads one batch ahead from the source in use; the stage closes the feed first (as
    StagePositions.follow does), so the run's windows lose no batch and the stage's begin at their first
    (threaded here on the CPU)."""
    make = partial(open_prepared(byte_data).train_batches, seed=0)
    batches = StageBatches(make, 32, 4)
    feed = DeviceFeed(batches, "cpu", threaded=True)
    feed.draw()  # the thread now reads the second batch
    feed.close()
    assert batches.state_dict()["source"]["sample_index"] == 4  # rewound: one batch drawn
    batches.switch(64, 2)
    assert _same(feed.draw(), make(64, 2).next_batch())
    feed.close()


def test_a_resume_with_other_rows_per_micro_batch_goes_on_with_the_stages_windows(byte_data):
    """A resume may split an unchanged global batch into other micro-batches (resume.LAYOUT_KEYS), and a
    stage's rows follow micro_batch_size: the switch to the new rows at the first step after the resume
    (StagePositions.follow) must go on with the stage's pass of windows, not read it again from its start."""
    make = partial(open_prepared(byte_data).train_batches, seed=3)
    batches = StageBatches(make, 32, 4)
    batches.switch(64, 2)
    for _ in range(3):
        batches.next_batch()
    state = batches.state_dict()
    ahead = torch.cat([batches.next_batch()["input_ids"] for _ in range(4)])
    resumed = StageBatches(make, 32, 8)  # micro_batch_size 8 instead of 4: the stage's rows 4 instead of 2
    resumed.load_state_dict(state)
    assert resumed.switch(64, 4)
    assert torch.equal(torch.cat([resumed.next_batch()["input_ids"] for _ in range(2)]), ahead)
    assert not torch.equal(make(64, 4).next_batch()["input_ids"], ahead[:4])  # not the pass's first windows
