"""VariableLengthSampler: one length per step, constant tokens per step, curricula, ranks, epochs, resume."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.schedule import difficulty_at
from seqwarm.curriculum.variable import VariableLengthSampler
from seqwarm.util.errors import UserError

TPS = 1024  # tokens per step


def corpus(seed=0, docs=400, min_length=16, max_length=256):
    sizes = np.random.default_rng(seed).integers(1, 900, docs)
    return decompose(np.concatenate([[0], np.cumsum(sizes)]), min_length, max_length)


def steps(sampler, n):
    return [sampler.next_step() for _ in range(n)]


@pytest.mark.parametrize(
    "curriculum, extra", [("natural", {}), ("grow_p2", {"num_cycles": 3}), ("linear", {"total_steps": 50})]
)
def test_every_step_holds_tokens_per_step_and_the_ranks_split_one_length(curriculum, extra):
    d = corpus()
    ranks = [
        VariableLengthSampler(d, TPS, curriculum=curriculum, seed=3, rank=r, world_size=2, **extra) for r in range(2)
    ]
    for _ in range(300):  # past the end of the first epoch
        a, b = (s.next_step() for s in ranks)
        assert a.length == b.length and a.step == b.step and a.epoch == b.epoch
        assert not set(a.indices) & set(b.indices)
        both = np.array(a.indices + b.indices)
        assert (d.lengths[both] == a.length).all()
        assert both.size * a.length == TPS


def test_an_epoch_uses_each_chunk_at_most_once_and_each_bucket_for_its_steps():
    d = corpus()
    s = VariableLengthSampler(d, TPS, seed=1)
    first = steps(s, s.steps_per_epoch)
    assert {x.epoch for x in first} == {0}
    seen = np.concatenate([x.indices for x in first])
    assert len(set(seen.tolist())) == seen.size
    stats = s.stats()
    for length, b in stats["buckets"].items():
        assert sum(x.length == length for x in first) == b["steps_per_epoch"]
        assert b["chunks"] - b["steps_per_epoch"] * (TPS // length) == b["chunks_left_over_per_epoch"]
    assert stats["dropped_tokens"] == d.dropped_tokens > 0
    nxt = s.next_step()
    assert nxt.epoch == 1 and s.stats()["skipped_steps"] == 0
    again = steps(s, s.steps_per_epoch - 1)
    assert [x.length for x in [nxt, *again]] != [x.length for x in first]  # a new shuffle


def test_natural_trains_each_length_in_proportion_to_its_tokens():
    d = corpus(docs=3000)
    s = VariableLengthSampler(d, TPS, seed=0)
    lengths = np.array([x.length for x in steps(s, s.steps_per_epoch)])
    tokens = np.array(d.tokens_per_bucket(), dtype=float)
    used = np.array([(lengths == n).sum() * TPS for n in d.bucket_lengths], dtype=float)
    assert np.abs(used / used.sum() - tokens / tokens.sum()).max() < 0.02
    half = len(lengths) // 2
    assert abs(lengths[:half].mean() - lengths[half:].mean()) < 0.25 * lengths.mean()  # no drift: a shuffle


def test_grow_p2_runs_short_to_long_in_each_cycle_with_an_equal_share():
    d = corpus(docs=3000)
    s = VariableLengthSampler(d, TPS, curriculum="grow_p2", num_cycles=4, seed=0)
    epoch = steps(s, s.steps_per_epoch)
    lengths = np.array([x.length for x in epoch])
    cycle = np.array([x.cycle for x in epoch])
    assert (np.diff(cycle) >= 0).all() and set(cycle.tolist()) == {0, 1, 2, 3}
    total = {n: (lengths == n).sum() for n in d.bucket_lengths}
    for c in range(4):
        cyc = lengths[cycle == c]
        for n in d.bucket_lengths:
            assert (cyc == n).sum() in (total[n] // 4, total[n] // 4 + 1)  # an equal share of each bucket
        first, second = np.array_split(np.log2(cyc), 2)
        assert first.mean() < second.mean() - 0.5
    natural = np.array([x.length for x in steps(VariableLengthSampler(d, TPS, seed=0), len(lengths))])
    assert np.log2(lengths[: len(lengths) // 8]).mean() < np.log2(natural[: len(lengths) // 8]).mean() - 0.2


def test_linear_and_a_deepspeed_schedule_cap_the_length():
    d = corpus()
    s = VariableLengthSampler(d, TPS, curriculum="linear", total_steps=60, seed=2)
    block = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 16,
        "max_difficulty": 256,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [16, 64, 256], "max_step": [10, 30]},
    }
    t = VariableLengthSampler(d, TPS, curriculum="schedule", schedule=block, seed=2)
    lin, disc = steps(s, 150), steps(t, 150)
    for x in lin:
        assert x.length <= max(16, 16 + (256 - 16) * min(x.step, 60) // 60)
    for x in disc:
        assert x.length <= difficulty_at(x.step, block)
    assert {x.length for x in disc[:10]} == {16} and max(x.length for x in disc[30:]) == 256
    assert max(x.length for x in lin[60:]) == 256 and max(x.length for x in lin[:10]) <= 32


def test_a_cap_ends_the_epoch_early_and_counts_the_skipped_steps():
    d = corpus()
    block = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 16,
        "max_difficulty": 256,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [16, 256], "max_step": [10_000]},
    }
    s = VariableLengthSampler(d, TPS, curriculum="schedule", schedule=block, seed=0)
    short = s.stats()["buckets"][16]["steps_per_epoch"]
    got = steps(s, short + 1)
    assert {x.length for x in got} == {16}
    assert got[-1].epoch == 1 and got[-2].epoch == 0
    assert s.stats()["skipped_steps"] == s.steps_per_epoch - short


def test_a_bucket_too_small_for_one_step_is_never_drawn():
    d = decompose([0, 300, 600, 2000, 4100], 16, 1024)  # one or two chunks of each length
    s = VariableLengthSampler(d, 1024, seed=0)
    per = s.stats()["buckets"]
    assert per[1024]["steps_per_epoch"] == 3 and per[16]["steps_per_epoch"] == 0
    assert {x.length for x in steps(s, 10)} == {1024}


def test_the_same_seed_gives_the_same_sequence_and_another_seed_another():
    d = corpus()
    a, b, c = (VariableLengthSampler(d, TPS, curriculum="grow_p2", seed=s) for s in (5, 5, 6))
    sa, sb, sc = steps(a, 80), steps(b, 80), steps(c, 80)
    assert sa == sb and sa != sc


@pytest.mark.parametrize(
    "curriculum, extra", [("natural", {}), ("grow_p2", {"num_cycles": 3}), ("linear", {"total_steps": 40})]
)
def test_resume_continues_the_uninterrupted_sequence(curriculum, extra):
    d = corpus()
    whole = steps(VariableLengthSampler(d, TPS, curriculum=curriculum, seed=9, **extra), 260)
    first = VariableLengthSampler(d, TPS, curriculum=curriculum, seed=9, **extra)
    steps(first, 97)
    state = json.loads(json.dumps(first.state_dict()))  # it survives a JSON checkpoint
    resumed = VariableLengthSampler(d, TPS, curriculum=curriculum, seed=9, **extra)
    resumed.load_state_dict(state)
    assert steps(resumed, 163) == whole[97:]
    assert whole[-1].epoch >= 1  # the test crosses an epoch boundary


def test_resume_under_another_world_size_keeps_the_global_sequence():
    d = corpus()
    one = VariableLengthSampler(d, TPS, seed=4)
    steps(one, 30)
    state = one.state_dict()
    expected = steps(one, 20)
    halves = []
    for r in range(2):
        s = VariableLengthSampler(d, TPS, seed=4, rank=r, world_size=2)
        s.load_state_dict(state)
        halves.append(steps(s, 20))
    for x, a, b in zip(expected, *halves):
        assert x.length == a.length and x.indices == a.indices + b.indices


@pytest.mark.parametrize(
    "change, name",
    [
        ({"decomposition": "max"}, "max_length"),
        ({"decomposition": "corpus"}, "corpus"),
        ({"tokens_per_step": 2048}, "tokens_per_step"),
        ({"curriculum": "grow_p2"}, "curriculum"),
        ({"seed": 1}, "seed"),
    ],
)
def test_a_resume_that_changes_the_range_or_the_batch_is_refused(change, name):
    saved = VariableLengthSampler(corpus(), TPS)
    steps(saved, 5)
    d = {"max": corpus(max_length=128), "corpus": corpus(seed=1)}.get(change.get("decomposition"), corpus())
    kwargs = {k: v for k, v in change.items() if k != "decomposition"}
    other = VariableLengthSampler(d, kwargs.pop("tokens_per_step", TPS), **kwargs)
    with pytest.raises(UserError, match=rf"cannot change .*changed: {name}:"):
        other.load_state_dict(saved.state_dict())
    with pytest.raises(UserError, match="not a VariableLengthSampler state"):
        other.load_state_dict({"step": 3})


def test_user_mistakes_have_clear_errors():
    d = corpus()
    with pytest.raises(UserError, match="shorter than min_length 1024"):
        VariableLengthSampler(decompose([0, 100, 900], 1024, 2048), 2048)
    with pytest.raises(UserError, match="multiple of max_length x world_size = 256 x 2 = 512"):
        VariableLengthSampler(d, 768, world_size=2)
    with pytest.raises(UserError, match="no bucket holds"):
        VariableLengthSampler(decompose([0, 300], 16, 256), 256 * 64)
    with pytest.raises(UserError, match="not one of"):
        VariableLengthSampler(d, TPS, curriculum="grow")
    with pytest.raises(UserError, match="needs total_steps"):
        VariableLengthSampler(d, TPS, curriculum="linear")
    with pytest.raises(UserError, match="needs schedule"):
        VariableLengthSampler(d, TPS, curriculum="schedule")
    short = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 128}
    short |= {"schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 9, "difficulty_step": 8}}
    with pytest.raises(UserError, match="max_difficulty 128 never reaches max_length 256"):
        VariableLengthSampler(d, TPS, curriculum="schedule", schedule=short)
    with pytest.raises(UserError, match="takes no schedule"):
        VariableLengthSampler(d, TPS, total_steps=5)
    with pytest.raises(UserError, match="seed must be an integer >= 0"):
        VariableLengthSampler(d, TPS, seed=-1)
    with pytest.raises(UserError, match="takes total_steps, not schedule="):
        VariableLengthSampler(d, TPS, curriculum="linear", total_steps=5, schedule=short)
    with pytest.raises(UserError, match="rank 2"):
        VariableLengthSampler(d, TPS, rank=2, world_size=2)


def test_a_dataloader_takes_it_as_batch_sampler():
    torch = pytest.importorskip("torch")
    d = corpus()
    tokens = np.random.default_rng(0).integers(0, 50, int(d.starts.max() + 600))

    class Chunks(torch.utils.data.Dataset):
        def __getitem__(self, i):
            return torch.from_numpy(d.rows(tokens, [i])[0])

    sampler = VariableLengthSampler(d, TPS, seed=0)
    loader = torch.utils.data.DataLoader(Chunks(), batch_sampler=sampler)
    for _, batch in zip(range(5), loader):
        rows, width = batch.shape
        assert rows * (width - 1) == TPS


def test_the_decomposition_and_the_sampler_import_no_torch():
    import subprocess
    import sys

    code = "import sys, seqwarm.curriculum.variable; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 600), min_size=20, max_size=200),
    kmin=st.integers(2, 5),
    span=st.integers(0, 3),
    per_step=st.sampled_from([1, 2, 4]),
    world=st.sampled_from([1, 2]),
    curriculum=st.sampled_from(["natural", "grow_p2", "linear"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_corpus_every_step_holds_the_same_tokens_inside_one_bucket(
    sizes, kmin, span, per_step, world, curriculum, seed
):
    d = decompose(np.concatenate([[0], np.cumsum(sizes)]), 1 << kmin, 1 << (kmin + span))
    tps = d.max_length * world * per_step
    extra = {"total_steps": 7} if curriculum == "linear" else {"num_cycles": 3} if curriculum == "grow_p2" else {}
    try:
        ranks = [
            VariableLengthSampler(d, tps, curriculum=curriculum, seed=seed, rank=r, world_size=world, **extra)
            for r in range(world)
        ]
    except UserError as err:  # a corpus with no chunk, or none that fills one step, is a clear error
        assert "shorter than min_length" in str(err) or "no bucket holds" in str(err)
        return
    seen = {}
    for _ in range(3 * ranks[0].steps_per_epoch + 2):
        got = [s.next_step() for s in ranks]
        rows = np.concatenate([g.indices for g in got])
        assert len({g.length for g in got}) == 1 and rows.size * got[0].length == tps
        assert (d.lengths[rows] == got[0].length).all()
        epoch = seen.setdefault(got[0].epoch, set())
        assert not epoch & set(rows.tolist())  # no chunk twice in an epoch
        epoch |= set(rows.tolist())


def test_micro_batches_hold_the_same_tokens_at_every_length():
    d = corpus()
    s = VariableLengthSampler(d, 2048, seed=0, rank=1, world_size=2)  # 1024 tokens per rank
    lengths = set()
    for _ in range(60):
        step = s.next_step()
        parts = step.micro_batches(512)
        assert [len(p) * step.length for p in parts] == [512, 512]
        assert sum(parts, []) == step.indices
        lengths.add(step.length)
    assert len(lengths) > 2
    with pytest.raises(UserError, match="micro_batch_tokens 768 cannot split"):
        step.micro_batches(768)
    with pytest.raises(UserError, match="cannot split"):
        s.next_step().micro_batches(8)
