"""Windows, masks, positions, sharding, resume, evaluation order and file verification."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.data.dataset import TokenWindows, TrainBatches, build_batch, eval_window_indices, iter_eval_batches
from seqwarm.data.prepare import prepare_dataset
from seqwarm.data.prepared import open_prepared
from seqwarm.util.errors import UserError

E = 9  # EOD id in the synthetic streams


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    src = root / "in"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        words = rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"], size=int(rng.integers(30, 90)))
        (src / f"d{i:02d}.txt").write_text(" ".join(words))
    out = root / "out"
    prepare_dataset(out, [src], tokenizer="byte", val_fraction=0.2, workers=1, progress=False)
    return out


def test_windows_and_shifted_labels(prepared):
    data = open_prepared(prepared)
    tokens = np.asarray(data.split("train").tokens)
    s = 16
    win = data.windows("train", s)
    assert len(win) == (len(tokens) - 1) // s
    batch = win.batch([0, 3, len(win) - 1])
    assert set(batch) == {"input_ids", "labels", "loss_mask", "position_ids"}
    assert batch["input_ids"].dtype == torch.int64 and batch["labels"].dtype == torch.int64
    assert batch["loss_mask"].dtype == torch.float32 and batch["position_ids"].dtype == torch.int64
    assert batch["input_ids"].shape == (3, s)
    for row, i in enumerate([0, 3, len(win) - 1]):
        assert batch["input_ids"][row].tolist() == tokens[i * s : i * s + s].tolist()
        assert batch["labels"][row].tolist() == tokens[i * s + 1 : i * s + s + 1].tolist()
    assert torch.equal(batch["labels"][:, :-1], batch["input_ids"][:, 1:])
    assert torch.all(batch["loss_mask"] == 1)
    assert batch["position_ids"][1].tolist() == list(range(s))
    single = win[3]
    assert torch.equal(single["input_ids"], batch["input_ids"][1])
    with pytest.raises(IndexError):
        win.batch([len(win)])


def test_reset_position_ids_and_eod_loss_mask():
    tokens = np.array([1, 2, E, 3, 4, 5, E, E, 6, 7, 8], dtype=np.uint16)
    win = TokenWindows(tokens, 10, eod_id=E, eod_mask_loss=True, reset_position_ids=True)
    b = win.batch([0])
    assert b["input_ids"][0].tolist() == [1, 2, E, 3, 4, 5, E, E, 6, 7]
    assert b["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 1]
    assert b["loss_mask"][0].tolist() == [1, 1, 0, 1, 1, 1, 0, 0, 1, 1]
    plain = TokenWindows(tokens, 10, eod_id=E).batch([0])
    assert plain["position_ids"][0].tolist() == list(range(10))
    assert torch.all(plain["loss_mask"] == 1)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, E), min_size=3, max_size=3), min_size=1, max_size=4).map(
        lambda rows: np.array(rows, dtype=np.int64)
    )
)
def test_position_ids_match_a_naive_loop(windows):
    b = build_batch(windows, eod_id=E, reset_position_ids=True, eod_mask_loss=True)
    for r, row in enumerate(windows[:, :-1]):
        pos, expected = 0, []
        for tok in row:
            expected.append(pos)
            pos = 0 if tok == E else pos + 1
        assert b["position_ids"][r].tolist() == expected
        assert b["loss_mask"][r].tolist() == [0.0 if t == E else 1.0 for t in row]


def _order(batches: TrainBatches, steps: int) -> list[list[int]]:
    return [batches.next_indices().tolist() for _ in range(steps)]


def test_sharding_is_disjoint_and_covers_each_global_batch():
    tokens = np.arange(1 + 4 * 23, dtype=np.uint16)  # 23 windows of 4(+1)
    win = TokenWindows(tokens, 4)
    world, mb = 3, 2
    ranks = [TrainBatches(win, mb, seed=5, rank=r, world_size=world) for r in range(world)]
    single = TrainBatches(win, mb * world, seed=5)
    steps_per_epoch = 23 // (mb * world)
    assert ranks[0].samples_per_epoch == steps_per_epoch * mb * world
    seen: list[int] = []
    for step in range(steps_per_epoch * 2 + 1):
        parts = [r.next_indices().tolist() for r in ranks]
        flat = [i for p in parts for i in p]
        assert all(len(p) == mb for p in parts)
        assert len(set(flat)) == len(flat), "ranks overlap"
        assert flat == single.next_indices().tolist(), "ranks together = one global micro-batch"
        if step < steps_per_epoch:
            seen += flat
    assert len(set(seen)) == steps_per_epoch * mb * world  # no window twice within an epoch
    assert ranks[0].epoch == 2


def test_shuffle_differs_between_epochs_and_seeds():
    win = TokenWindows(np.arange(1 + 4 * 40, dtype=np.uint16), 4)
    a = TrainBatches(win, 40, seed=1)
    e0, e1 = a.next_indices().tolist(), a.next_indices().tolist()
    assert sorted(e0) == sorted(e1) == list(range(40))
    assert e0 != e1
    assert TrainBatches(win, 40, seed=2).next_indices().tolist() != e0
    assert TrainBatches(win, 40, seed=1).next_indices().tolist() == e0
    assert TrainBatches(win, 40, shuffle=False).next_indices().tolist() == list(range(40))


def test_resume_gives_identical_following_batches(prepared):
    data = open_prepared(prepared)
    first = data.train_batches(32, 4, seed=3, reset_position_ids=True)
    per_epoch = first.samples_per_epoch // 4
    for _ in range(per_epoch - 2):  # stop just before an epoch boundary
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    expected = [first.next_batch() for _ in range(5)]
    assert first.epoch == 1
    resumed = open_prepared(prepared).train_batches(32, 4, seed=3, reset_position_ids=True)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        for key in want:
            assert torch.equal(got[key], want[key]), key
    fresh = data.train_batches(32, 4, seed=3)
    assert not torch.equal(fresh.next_batch()["input_ids"], expected[0]["input_ids"])
    with pytest.raises(UserError, match="seed"):
        data.train_batches(32, 4, seed=4).load_state_dict(state)
    with pytest.raises(UserError, match="seq_length"):
        data.train_batches(16, 4, seed=3).load_state_dict(state)


def test_eval_batches_are_deterministic_and_in_order(prepared):
    data = open_prepared(prepared)
    win = data.windows("val", 8)
    got = [b["input_ids"] for b in data.val_batches(8, 3, num_windows=7)]
    assert [len(b) for b in got] == [3, 3, 1]
    picked = eval_window_indices(len(win), 7)  # spread over the whole split, first and last included
    assert len(picked) == 7 and picked[0] == 0 and picked[-1] == len(win) - 1 and (picked[1:] > picked[:-1]).all()
    assert torch.equal(torch.cat(got), win.batch(picked)["input_ids"])
    again = torch.cat([b["input_ids"] for b in data.val_batches(8, 3, num_windows=7)])
    assert torch.equal(torch.cat(got), again)
    parts = [
        torch.cat([b["input_ids"] for b in iter_eval_batches(win, 2, num_windows=7, rank=r, world_size=2)])
        for r in range(2)
    ]
    assert len(parts[0]) == len(parts[1]) == 3  # as many on every rank: the 7th picked window is left out
    assert torch.equal(parts[1][0], got[0][1])  # rank 1 takes the 2nd, 4th, 6th picked windows
    everything = list(data.val_batches(8, 1000))
    assert len(everything) == 1 and len(everything[0]["input_ids"]) == len(win)


def test_too_little_data_is_a_user_error():
    with pytest.raises(UserError, match="too few for one window"):
        TokenWindows(np.arange(8, dtype=np.uint16), 8)
    win = TokenWindows(np.arange(1 + 8 * 3, dtype=np.uint16), 8)
    with pytest.raises(UserError, match="fewer than one global micro-batch"):
        TrainBatches(win, 2, world_size=2)
    with pytest.raises(UserError, match="rank"):
        TrainBatches(win, 1, rank=2, world_size=2)


# --------------------------------------------------------------------------------------------------
# Verification of the prepared files


def _copy(prepared, tmp_path, name="copy"):
    dst = tmp_path / name
    shutil.copytree(prepared, dst)
    return dst


def test_truncated_bin_is_detected(prepared, tmp_path):
    folder = _copy(prepared, tmp_path)
    path = folder / "train.bin"
    path.write_bytes(path.read_bytes()[:-2])
    for verify in (True, False):
        with pytest.raises(UserError, match=r"train\.bin.*truncated"):
            open_prepared(folder, verify_checksums=verify)


def test_corrupted_bin_is_detected_by_checksum(prepared, tmp_path):
    folder = _copy(prepared, tmp_path)
    path = folder / "val.bin"
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"val\.bin.*checksum"):
        open_prepared(folder)
    open_prepared(folder, verify_checksums=False)  # sizes are still right


def test_missing_or_foreign_folders(prepared, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        open_prepared(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no meta.json"):
        open_prepared(tmp_path / "empty")
    folder = _copy(prepared, tmp_path)
    (folder / "train.idx").unlink()
    with pytest.raises(UserError, match=r"train\.idx.*missing"):
        open_prepared(folder)
    folder = _copy(prepared, tmp_path, "copy2")
    meta = json.loads((folder / "meta.json").read_text())
    meta["format_version"] = 99
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="format version 99"):
        open_prepared(folder)


def test_hf_label_style_gives_unshifted_labels_with_the_same_targets():
    windows = np.array([[1, 2, E, 3, 4, 5], [E, 6, 7, E, 8, 9]], dtype=np.int64)
    meg = build_batch(windows, eod_id=E, eod_mask_loss=True)
    hf = build_batch(windows, eod_id=E, eod_mask_loss=True, label_style="hf")
    assert set(hf) == {"input_ids", "labels", "position_ids"}  # no loss_mask: HF models do not read one
    assert torch.equal(hf["input_ids"], meg["input_ids"]) and torch.equal(hf["position_ids"], meg["position_ids"])
    # the model shifts: it predicts hf labels[:, t + 1] from input t; Megatron's labels[:, t] is that token
    shifted = hf["labels"][:, 1:]
    assert torch.equal(shifted[shifted != -100], meg["labels"][:, :-1][meg["loss_mask"][:, :-1] > 0])
    assert torch.equal(build_batch(windows, label_style="hf")["labels"], meg["input_ids"])
    tw = TokenWindows(windows.reshape(-1), 5, eod_id=E)
    assert tw.with_label_style("hf")[0]["labels"].tolist() == [1, 2, E, 3, 4]
    assert tw.with_label_style("megatron") is tw
    with pytest.raises(UserError, match="label_style must be one of megatron, hf"):
        build_batch(windows, label_style="shifted")


def test_eval_batches_give_every_rank_as_many_windows():
    """A sharded model's ranks must run the same forwards: 7 windows over 2 ranks are 3 + 3, distinct."""
    import numpy as np

    from seqwarm.data.dataset import TokenWindows, iter_eval_batches

    windows = TokenWindows(np.arange(7 * 8 + 1) % 250, 8)
    assert len(windows) == 7
    ranks = [
        [row.tolist() for b in iter_eval_batches(windows, 2, rank=r, world_size=2) for row in b["input_ids"]]
        for r in range(2)
    ]
    assert [len(r) for r in ranks] == [3, 3]
    assert not set(map(tuple, ranks[0])) & set(map(tuple, ranks[1]))
    assert len(list(iter_eval_batches(windows, 2))) == 4  # one process: all 7


@pytest.mark.parametrize(
    "state, kind",
    [
        ({"variable": 1, "weights": [1.0], "micro": 0}, "curriculum mode variable"),
        ({"length": 64, "rows": 2, "source": {}}, "stages, whose windows change length"),
        ({"sources": [], "served": []}, "a --data-path blend of several sources"),
    ],
)
def test_another_sources_position_is_refused_naming_what_wrote_it(state, kind):
    """A checkpoint's data position from another kind of source (variable mode, stage windows, a blend)
    resumed into plain windows (e.g. with --allow-config-change): one line naming which kind it was."""
    win = TokenWindows(np.arange(1 + 8 * 6, dtype=np.uint16), 8)
    with pytest.raises(UserError, match=f"other training data \\({kind}\\)"):
        TrainBatches(win, 2).load_state_dict(state)
