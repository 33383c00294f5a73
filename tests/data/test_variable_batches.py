"""Curriculum mode variable's batch source (seqwarm.data.variable): rows of one document at the step's
length, the same tokens every step, the rank split, the blend's weights over tokens, the position."""

import json

import numpy as np
import pytest

from seqwarm.config import load_config
from seqwarm.data.megatron import MegatronData
from seqwarm.data.variable import VariableBatches, VariableData, VariableSettings
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

VOCAB, EOD = 1 << 20, (1 << 20) - 1
B_START = 500_000  # source B's tokens are positions from here: a token says its source and its place


def write_source(prefix, sizes, first=0):
    """PREFIX.bin/.idx whose tokens are their own positions (+ ``first``): a row shows where it was read."""
    from seqwarm.data.indexed import IndexedWriter

    writer = IndexedWriter(prefix, np.int32)
    writer.add_documents(np.arange(first, first + int(np.sum(sizes))), np.asarray(sizes))
    writer.close()
    return str(prefix)


def sizes(seed, docs=300, low=3, high=400):
    return np.random.default_rng(seed).integers(low, high, docs)


def megatron(tmp_path, *blend, seed=0):
    """MegatronData over one source A (``blend`` empty) or ``blend`` = (wA, wB) over A and B."""
    a = write_source(tmp_path / "a", sizes(seed))
    if not blend:
        return MegatronData([a], split="1,0,0", vocab_size=VOCAB, eod_id=EOD)
    b = write_source(tmp_path / "b", sizes(seed + 1, docs=500), first=B_START)
    return MegatronData([str(blend[0]), a, str(blend[1]), b], split="1,0,0", vocab_size=VOCAB, eod_id=EOD)


def config(curriculum="natural", micro=2, accumulation=2, world=1, **seqwarm):
    raw = {
        "train_batch_size": micro * accumulation * world,
        "train_micro_batch_size_per_gpu": micro,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 64,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 20, "difficulty_step": 8},
        },
        "seqwarm": {
            "seq_length": 64,
            "train_tokens": 100_000,
            "curriculum_mode": "variable",
            "variable_curriculum": curriculum,
            **seqwarm,
        },
    }
    return load_config(raw, world_size=world)


def source(data, cfg, rank=0, world=1, seed=5) -> VariableBatches:
    return VariableData(data, VariableSettings.of(cfg)).train_batches(
        64, cfg.micro_batch_size, seed=seed, rank=rank, world_size=world
    )


def step(batches: VariableBatches, accumulation=2):
    return [batches.next_batch() for _ in range(accumulation)]


def doc_of(data, tokens):
    """The (source, document) of each token value."""
    out = []
    for t in np.asarray(tokens).reshape(-1).tolist():
        k = int(t >= B_START)
        offsets = data.sources[k].files[0].doc_offsets
        out.append((k, int(np.searchsorted(offsets, t - k * B_START, side="right")) - 1))
    return out


@pytest.mark.parametrize("curriculum", ["natural", "grow_p2", "linear", "schedule"])
def test_each_step_is_one_length_of_rows_from_one_document_with_the_same_tokens(tmp_path, curriculum):
    data, cfg = megatron(tmp_path), config(curriculum, train_tokens=40 * 256)  # linear: over the 40 steps
    batches = source(data, cfg)
    lengths = []
    for _ in range(40):
        micro = step(batches)
        length = micro[0]["input_ids"].shape[1]
        lengths.append(length)
        assert batches.current_length == length
        for batch in micro:  # each micro-batch: micro_batch_size x max_length tokens, rows of the length
            ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
            assert ids.shape == (2 * 64 // length, length) and labels.shape == ids.shape
            row = np.concatenate([ids, labels[:, -1:]], axis=1)  # the L + 1 tokens read
            assert (np.diff(row, axis=1) == 1).all()  # consecutive tokens of the stream
            for r in row:  # its first and last token in one document
                assert doc_of(data, r[[0, -1]])[0] == doc_of(data, r[[0, -1]])[1]
            assert batch["loss_mask"].all() and (batch["position_ids"][0] == np.arange(length)).all()
        assert sum(b["input_ids"].numel() for b in micro) == batches.tokens_per_step == 256
    assert set(lengths) <= {8, 16, 32, 64} and len(set(lengths)) > 1
    if curriculum in ("linear", "schedule"):  # the cap: nothing longer than the schedule allows yet
        assert max(lengths[:3]) < 64


def test_the_ranks_train_one_length_each_step_on_their_own_rows(tmp_path):
    data, cfg = megatron(tmp_path), config(world=2)
    ranks = [source(data, cfg, rank=r, world=2) for r in range(2)]
    assert ranks[0].tokens_per_step == 2 * 2 * 2 * 64
    for _ in range(20):
        a, b = step(ranks[0]), step(ranks[1])
        assert [x["input_ids"].shape for x in a] == [x["input_ids"].shape for x in b]
        starts = [set(x["input_ids"][:, 0].tolist()) for x in (*a, *b)]
        assert sum(map(len, starts)) == len(set().union(*starts))  # no row twice, on one rank or two


def test_a_blend_keeps_its_weights_over_tokens(tmp_path):
    data, cfg = megatron(tmp_path, 0.25, 0.75), config("grow_p2")
    batches = source(data, cfg)
    tokens = [0, 0]
    for i in range(1, 201):
        micro = step(batches)
        k = int(micro[0]["input_ids"][0, 0] >= B_START)
        for batch in micro:
            assert ((batch["input_ids"] >= B_START) == k).all()  # a step's rows come from one source
            tokens[k] += batch["input_ids"].numel()
        assert abs(tokens[0] - 0.25 * i * 256) <= 256  # within one step of the weight, at every step
    assert batches.served == [50, 150]


def test_the_position_inside_a_step_resumes_exactly_and_a_changed_run_is_refused(tmp_path):
    data, cfg = megatron(tmp_path, 0.5, 0.5), config("schedule")
    batches = source(data, cfg)
    for _ in range(7):
        batches.next_batch()  # three and a half steps
    state = json.loads(json.dumps(batches.state_dict()))
    assert state["micro"] == 1
    ahead = [batches.next_batch()["input_ids"] for _ in range(9)]
    again = source(data, cfg)
    again.load_state_dict(state)
    assert all((x == again.next_batch()["input_ids"]).all() for x in ahead)
    for changed, what in ((config("natural"), "curriculum"), (config("schedule", micro=4), "tokens_per_step")):
        with pytest.raises(UserError, match=what):
            source(data, changed).load_state_dict(state)
    (tmp_path / "other").mkdir()
    with pytest.raises(UserError, match="corpus"):
        source(megatron(tmp_path / "other", 0.5, 0.5, seed=9), cfg).load_state_dict(state)
    with pytest.raises(UserError, match="not trained in curriculum mode variable"):
        source(data, cfg).load_state_dict({"epoch": 0, "sample_index": 0})


def test_a_corpus_of_documents_shorter_than_min_difficulty_is_refused(tmp_path):
    prefix = write_source(tmp_path / "short", sizes(0, low=2, high=8))
    data = MegatronData([prefix], split="1,0,0", vocab_size=VOCAB, eod_id=EOD)
    with pytest.raises(UserError, match="shorter than min_difficulty 8"):
        source(data, config())


def test_the_model_must_hold_max_difficulty_and_needs_no_document_masking(tmp_path):
    data, cfg = megatron(tmp_path), config()
    wrapped = VariableData(data, VariableSettings.of(cfg))
    with pytest.raises(UserError, match="cannot hold max_difficulty 64"):
        wrapped.train_batches(32, 2)
    with pytest.raises(UserError, match="no document masking"):
        wrapped.train_batches(64, 2, document_masking=True)
    assert wrapped.vocab_size == VOCAB and wrapped.sources is data.sources  # the rest is the data's own


def test_the_console_line_says_the_buckets_the_dropped_tokens_and_the_curriculum(tmp_path):
    data = megatron(tmp_path)
    line = source(data, config("grow_p2", variable_cycles=3)).describe()
    dropped = source(data, config()).decompositions[0].dropped_tokens
    assert line.startswith("variable:") and "8 " in line and "64 " in line
    assert f"{human_count(dropped)} tokens dropped" in line and dropped > 0
    assert "grow_p2 (3 cycles)" in line and "256 tokens per step" in line


def test_the_plan_of_a_blend_read_from_the_indexes_alone_is_the_draw_training_makes(tmp_path):
    from seqwarm.data.variable_sources import decompose_sources, read_sources, sources_of, variable_plan

    data, cfg = megatron(tmp_path, 0.25, 0.75), config("schedule", train_tokens=80 * 256)
    argument = ["0.25", str(tmp_path / "a"), "0.75", str(tmp_path / "b")]
    planned = read_sources(data_path=argument, split="1,0,0", rounding="megatron-deepspeed")
    for mine, trained in zip(planned, sources_of(data), strict=True):  # the one reader, two ways in
        assert np.array_equal(mine.offsets, trained.offsets) and mine.weight == pytest.approx(trained.weight)
    chunks = decompose_sources(planned, VariableSettings.of(cfg))
    plan = variable_plan(cfg, chunks, [s.weight for s in planned], seed=5, world_size=1, keep_steps=True)
    batches = source(data, cfg, seed=5)
    drawn = []
    for _ in range(plan.total_steps):
        micro = step(batches)
        drawn.append((int(micro[0]["input_ids"][0, 0] >= B_START), micro[0]["input_ids"].shape[1]))
    assert plan.total_steps == 80 and list(plan.lengths) == [length for _, length in drawn]
    assert [s.steps for s in plan.sources] == batches.served == [20, 60]
    assert {(b.source, b.length): b.steps for b in plan.buckets} == {
        (b.source, b.length): drawn.count((b.source, b.length)) for b in plan.buckets
    }
    assert batches.plan(cfg).buckets == plan.buckets  # what train prints at its start


def test_a_list_without_weights_is_planned_with_the_weights_training_gives_it(tmp_path):
    from seqwarm.data.variable_sources import read_sources

    a = write_source(tmp_path / "a", sizes(0))
    b = write_source(tmp_path / "b", sizes(1, docs=500), first=B_START)
    data = MegatronData([a, b], split="9,1,0", split_rounding="megatron-core", vocab_size=VOCAB, eod_id=EOD)
    planned = read_sources(data_path=[a, b], split="9,1,0", rounding="megatron-core")
    assert [s.weight for s in planned] == pytest.approx([s.weight for s in data.sources])
    assert [len(s.offsets) - 1 for s in planned] == [s.ranges[0][1] - s.ranges[0][0] for s in data.sources]
