"""--data-path details that decide which documents train and which validate: --split's rounding
(Megatron-DeepSpeed's by default, megatron-core's on request), lists of prefixes without weights, and
validation of a blend in proportion to its weights."""

from __future__ import annotations

import numpy as np
import pytest
from test_megatron import BYTE_EOD, BYTE_VOCAB, write_megatron

from seqwarm.data.blend import blend_eval_indices, parse_data_path, split_documents
from seqwarm.data.megatron import MegatronData
from seqwarm.run.spec import SPLIT_ROUNDINGS
from seqwarm.util.errors import UserError

# Megatron-DeepSpeed's get_train_valid_test_split_ (megatron/data/dataset_utils.py, microsoft/Megatron-DeepSpeed
# at f4157be): part i gets round(w_i / sum(w) * N) documents (Python's round: half to even), the boundaries
# are the running sums, and their surplus over N is taken off every boundary but the leading 0.
# megatron-core (BlendedMegatronDatasetBuilder): boundary i is round(cumulative fraction i * N).
# Each row: N, split, Megatron-DeepSpeed's boundaries, megatron-core's, worked out by hand from those rules.
BOUNDARIES = [
    # 1000 x .969/.03/.001 = 969, 30, 1 exactly: both rules agree
    (1000, "969,30,1", [0, 969, 999, 1000], [0, 969, 999, 1000]),
    # 47.481 -> 47, 1.47 -> 1, .049 -> 0: 48, one short, every boundary +1 | round(47.481), round(48.951)
    (49, "969,30,1", [0, 48, 49, 49], [0, 47, 49, 49]),
    # 78.489 -> 78, 2.43 -> 2, .081 -> 0: 80, +1 | round(78.489), round(80.919)
    (81, "969,30,1", [0, 79, 81, 81], [0, 78, 81, 81]),
    # 2.5 -> 2 (half to even) twice: 4, +1 | round(2.5) = 2, 5
    (5, "1,1", [0, 3, 5, 5], [0, 2, 5, 5]),
    # .667 -> 1 three times: 3, one over, every boundary -1 | round(.667), round(1.333), 2
    (2, "1,1,1", [0, 0, 1, 2], [0, 1, 1, 2]),
]


def _ranges(bounds):
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


@pytest.mark.parametrize(("n", "split", "deepspeed", "core"), BOUNDARIES)
def test_split_rounds_as_megatron_deepspeed_by_default_and_as_megatron_core_on_request(n, split, deepspeed, core):
    assert split_documents(n, split) == _ranges(deepspeed)
    assert split_documents(n, split, "megatron-deepspeed") == _ranges(deepspeed)
    assert split_documents(n, split, "megatron-core") == _ranges(core)
    with pytest.raises(UserError, match="--split-rounding"):
        split_documents(n, split, "nearest")


def test_the_spec_names_the_data_layers_roundings():
    from seqwarm.data.blend import SPLIT_ROUNDINGS as in_data

    assert SPLIT_ROUNDINGS == in_data


def _docs(n, low, high, seed):
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(low, high, 40), BYTE_EOD) for _ in range(n)]


def test_a_blend_splits_each_source_at_megatron_deepspeeds_boundaries(tmp_path):
    """Two sources of 49 and 81 documents at 969,30,1: Megatron-DeepSpeed trains on 48 + 79 of them and
    validates on 1 + 2; megatron-core's rounding trains on 47 + 78 and validates on 2 + 3."""
    docs_a, docs_b = _docs(49, 0, 100, 1), _docs(81, 100, 200, 2)
    a, b = write_megatron(tmp_path / "a", docs_a), write_megatron(tmp_path / "b", docs_b)
    for rounding, train, val in (("megatron-deepspeed", (48, 79), (1, 2)), ("megatron-core", (47, 78), (2, 3))):
        data = MegatronData(["0.3", a, "0.7", b], split_rounding=rounding, vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)
        splits = data.meta["splits"]
        assert splits["train"]["documents"] == sum(train) and splits["val"]["documents"] == sum(val)
        tokens = sum(len(d) for d in docs_a[: train[0]]) + sum(len(d) for d in docs_b[: train[1]])
        assert splits["train"]["tokens"] == tokens
        assert data.meta["split_rounding"] == rounding
        # the validation stream of each source starts right after its last training document
        first_val = np.asarray(data.sources[0].stream(1)[: len(docs_a[train[0]])])
        np.testing.assert_array_equal(first_val, docs_a[train[0]])


def test_a_list_without_weights_weighs_each_source_by_its_training_tokens(tmp_path):
    a = write_megatron(tmp_path / "a", _docs(30, 0, 100, 1))
    b = write_megatron(tmp_path / "b", _docs(90, 100, 200, 2))
    assert parse_data_path([a, b]) == [(None, a), (None, b)]
    data = MegatronData([a, b], split="9,1,0", vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)
    sizes = [len(s.stream(0)) for s in data.sources]
    assert sizes == [27 * 41, 81 * 41]
    assert [s["weight"] for s in data.meta["sources"]] == pytest.approx([0.25, 0.75])
    with pytest.raises(UserError, match="weights to all sources or to none"):
        parse_data_path(["0.5", a, b])


def test_blend_eval_indices_take_each_source_by_its_weight():
    picks = blend_eval_indices([100, 50], [0.3, 0.7], 20)
    assert len(picks) == len(set(picks.tolist())) == 20
    assert int((picks < 100).sum()) == 6 and int((picks >= 100).sum()) == 14
    # the sources interleave: the first window of each half holds both
    assert {bool(i < 100) for i in picks[:4].tolist()} == {True, False}
    # more than the sources hold at these weights (50 / 0.7 = 71): every window of the scarce source
    every = blend_eval_indices([100, 50], [0.3, 0.7], None)
    assert int((every >= 100).sum()) == 50 and int((every < 100).sum()) == 21
    assert len(blend_eval_indices([100, 50], [0.3, 0.7], 1000)) == 71


def test_validation_of_a_blend_follows_its_weights(tmp_path):
    """Weights 0.2 / 0.8 over val splits of about 60 and 20 windows: 20 validation windows are 4 from the
    first source and 16 from the second (spread over the concatenation, about 15 and 5)."""
    a = write_megatron(tmp_path / "a", _docs(300, 0, 100, 1))  # val: 30 documents of 41 tokens
    b = write_megatron(tmp_path / "b", _docs(100, 100, 200, 2))  # val: 10
    data = MegatronData(["0.2", a, "0.8", b], split="9,1,0", vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)

    def shares(**kw):
        rows = np.concatenate([x["input_ids"].numpy() for x in data.val_batches(20, 4, **kw)])
        from_b = (rows[:, :-1] >= 100) & (rows[:, :-1] != BYTE_EOD)
        mostly_b = from_b.mean(axis=1) > 0.5
        return int((~mostly_b).sum()), int(mostly_b.sum())

    assert shares(num_windows=20) == (4, 16)
    windows_b = len(data._windows(1, 20)[1])
    assert shares() == (round(windows_b / 0.8 * 0.2), windows_b)  # all of b, a at its weight
    # two ranks split the same windows
    both = [shares(num_windows=20, rank=r, world_size=2) for r in range(2)]
    assert (both[0][0] + both[1][0], both[0][1] + both[1][1]) == (4, 16)


def test_offline_validation_of_a_blend_reads_the_windows_training_validates_on(tmp_path):
    """`seqwarm eval --val` (evaluate_val) on a blend: the weighted windows of training's validation
    (4 + 16 of 20 at 0.2 / 0.8), not 20 spread over the sources end to end (about 15 + 5)."""
    import torch

    from seqwarm.evaluation import evaluate_val

    a = write_megatron(tmp_path / "a", _docs(300, 0, 100, 1))
    b = write_megatron(tmp_path / "b", _docs(100, 100, 200, 2))
    data = MegatronData(["0.2", a, "0.8", b], split="9,1,0", vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)
    seen = []

    def model(ids):
        seen.append(ids.clone())
        return torch.zeros(*ids.shape, BYTE_VOCAB)  # uniform: the loss is log(vocab) whatever the rows

    res = evaluate_val(model, data, seq_length=20, num_windows=20, batch_size=4, progress=False)
    rows = torch.cat(seen).numpy()
    from_b = ((rows >= 100) & (rows != BYTE_EOD)).mean(axis=1) > 0.5
    assert (int((~from_b).sum()), int(from_b.sum())) == (4, 16) and res["num_windows"] == 20
    assert res["loss"] == pytest.approx(np.log(BYTE_VOCAB))
    training = np.concatenate([x["input_ids"].numpy() for x in data.val_batches(20, 4, num_windows=20)])
    np.testing.assert_array_equal(rows, training)  # the same windows, in the same order
