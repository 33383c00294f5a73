"""Batches to the device (issue #14): cut once, to the step's length, before the copy, trivial keys left
out, read one batch ahead on a thread on CUDA — and not one number changes.

The slow, end-to-end part; the fast tests are in tests/trainer/test_feed.py.
"""

import shutil
import threading

import pytest
import torch

from conftest import small_config
from seqwarm.trainer.feed import DeviceFeed
from seqwarm.trainer.metrics import read_metrics


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "seqwarm-prefetch"]


# -- a whole run: the same numbers with the feed as without --------------------------------------------


def _run(tmp_path, byte_data, name, mode, *, feed="whole", **opts):
    from helpers import tiny_run

    config = small_config(
        tmp_path / f"{name}.json", train_tokens=4000, total_step=7, **({"curriculum_mode": mode} if mode else {})
    )
    run = tiny_run(tmp_path / name, byte_data, config, **opts)
    if feed == "whole":  # every key of the cut batch moved, trivial or not
        run.feed.drop_trivial = False
    run.feed.threaded = feed == "threaded"
    return run


def _train_losses(run):
    return [r["loss"] for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "truncate", "reshape"])  # None: auto, which injects into the GPT
def test_a_run_trains_the_same_numbers_with_the_feed(tmp_path, byte_data, one_thread, monkeypatch, mode):
    moved = []
    real = DeviceFeed._move
    monkeypatch.setattr(DeviceFeed, "_move", lambda self, b: (moved.append(b), real(self, b))[1])
    out = {}
    for feed in ("whole", "cpu", "threaded"):
        moved.clear()
        run = _run(tmp_path, byte_data, f"{mode}-{feed}", mode, feed=feed)
        result = run.train()
        out[feed] = (_train_losses(run), result.final_val_loss, [p.detach().clone() for p in run.model.parameters()])
        assert not _threads()
        lengths = [r["seqlen"] for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"]
        train = moved[: 2 * len(lengths)]  # only training batches go through the feed
        widths = [b["input_ids"].shape[1] for b in train]  # 2 micro-batches a step, each cut to its step
        rows = [b["input_ids"].shape[0] for b in train]
        assert widths == [n for n in lengths for _ in (0, 1)], feed
        assert rows == ([4 * 64 // n for n in lengths for _ in (0, 1)] if mode == "reshape" else [4] * len(rows))
        assert ("loss_mask" in train[0]) == (feed == "whole")
        assert ("position_ids" in train[0]) == (mode == "reshape" and 64 % lengths[0] != 0 or feed == "whole")
    assert len(out["whole"][0]) > 4 and len(set(lengths)) > 3
    for feed in ("cpu", "threaded"):
        assert out[feed][0] == out["whole"][0] and out[feed][1] == out["whole"][1], feed
        assert all(torch.equal(a, b) for a, b in zip(out[feed][2], out["whole"][2])), feed


@pytest.mark.slow
def test_a_threaded_run_resumes_exactly_from_a_checkpoint_saved_with_a_batch_in_flight(tmp_path, byte_data, one_thread):
    whole = _run(tmp_path, byte_data, "whole", "truncate", feed="threaded", save_interval=2, keep_checkpoints=0)
    whole.train()
    expected = _train_losses(whole)
    cut = tmp_path / "cut"
    shutil.copytree(whole.run_dir, cut)
    for path in (cut / "checkpoints").glob("step_*.pt"):
        if int(path.stem.split("_")[1]) > 4:
            path.unlink()
    resumed = _run(
        tmp_path, byte_data, "cut", "truncate", feed="threaded", save_interval=2, keep_checkpoints=0, resume=True
    )
    assert resumed.resume() and resumed.engine.global_steps == 4
    resumed.train()
    assert _train_losses(resumed) == expected and len(expected) > 6


@pytest.mark.slow
def test_a_run_whose_data_fails_raises_and_leaves_no_thread(tmp_path, byte_data, one_thread):
    run = _run(tmp_path, byte_data, "fails", None, feed="threaded")
    real, calls = run.batches.next_batch, []

    def flaky():
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk went away")
        return real()

    run.batches.next_batch = flaky
    with pytest.raises(OSError, match="disk went away"):
        run.train()
    assert not _threads()
