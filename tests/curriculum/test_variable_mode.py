"""SequenceLengthWarmup(mode="variable"): the sampler inside the loop's one object — lengths, a DataLoader's
batch_sampler, the clock, resume (with a DataLoader that drew ahead) and the keyword errors."""

import itertools
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.variable import VariableLengthSampler
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError

TPS = 1024
SIZES = np.random.default_rng(0).integers(5, 600, 300)
OFFSETS = np.concatenate([[0], np.cumsum(SIZES)])
TOKENS = np.random.default_rng(1).integers(0, 64, OFFSETS[-1])


def make(**kw):
    args = dict(mode="variable", documents=OFFSETS, tokens_per_step=TPS, min_length=16, max_length=128)
    return SequenceLengthWarmup(**{**args, "schedule": "grow_p2", "num_cycles": 2, "seed": 4, **kw})


class Rows(Dataset):
    """A dataset whose items are chunks; the DataLoader's batch_sampler hands it one step's indices."""

    def __init__(self, decomposition):
        self.d = decomposition

    def __getitem__(self, i):
        return torch.from_numpy(self.d.rows(TOKENS, [i])[0])  # (L + 1,)

    def __len__(self):
        return self.d.num_chunks


def run(slw, batches, steps):
    """Train ``steps`` steps from the iterator ``batches`` (micro-batches of a DataLoader); return each
    step's length and the rows' first tokens."""
    out = []
    for _ in range(steps):
        length = slw.begin_step()
        firsts = []
        for _ in range(slw.sampler.micro_batches(512).per_step):
            rows = next(batches)
            x, y = slw.cut((rows[:, :-1], rows[:, 1:]))
            assert x.shape[1] == length and y.shape == x.shape
            firsts += x[:, 0].tolist()
        slw.end_step()
        out.append((length, firsts))
    return out


def test_the_steps_are_the_samplers_and_every_step_counts_tokens_per_step():
    slw = make(train_tokens=20 * TPS)
    plain = VariableLengthSampler(decompose(OFFSETS, 16, 128), TPS, curriculum="grow_p2", num_cycles=2, seed=4)
    loader = DataLoader(Rows(slw.sampler.decomposition), batch_sampler=slw.sampler.micro_batches(512))
    batches = iter(loader)
    seen = run(slw, batches, 20)
    assert [length for length, _ in seen] == [plain.next_step().length for _ in range(20)]
    assert len({length for length, _ in seen}) > 2  # several lengths trained
    assert slw.done and slw.progress.tokens == 20 * TPS and slw.progress.step == 20
    assert slw.mode == "variable" and slw.current_seqlen == seen[-1][0]


def test_a_resume_continues_exactly_though_the_dataloader_drew_ahead():
    slw = make()
    loader = DataLoader(Rows(slw.sampler.decomposition), batch_sampler=slw.sampler.micro_batches(512))
    batches = iter(loader)
    first = run(slw, batches, 6)
    ahead = [next(batches) for _ in range(5)]  # prefetched (as workers do): two and a half steps drawn
    saved = json.loads(json.dumps(slw.state_dict()))
    rest = run(slw, itertools.chain(ahead, batches), 8)  # the uninterrupted run trains them in order

    again = make()
    again.load_state_dict(saved)
    assert again.progress.tokens == 6 * TPS
    batches2 = iter(DataLoader(Rows(again.sampler.decomposition), batch_sampler=again.sampler.micro_batches(512)))
    assert run(again, batches2, 8) == rest
    assert first != rest[:6]


def test_a_resume_with_another_range_or_corpus_is_refused_with_the_samplers_reason():
    slw = make()
    slw.begin_step()
    slw.end_step()
    saved = slw.state_dict()
    with pytest.raises(UserError, match="min_length: 16 in the checkpoint, 32 now"):
        make(min_length=32).load_state_dict(saved)
    other = np.concatenate([[0], np.cumsum(SIZES[::-1])])
    with pytest.raises(UserError, match="corpus"):
        make(documents=other).load_state_dict(saved)
    plain = SequenceLengthWarmup(train_tokens=TPS)  # a state saved in another mode has no sampler state
    plain.begin_step()
    plain.end_step()
    with pytest.raises(UserError, match="no sampler state"):
        make().load_state_dict(plain.state_dict())


def test_a_batch_at_another_length_and_a_skipped_step():
    slw = make()
    length = slw.begin_step()
    with pytest.raises(ValueError, match=f"trains length {length}"):
        slw.cut(torch.zeros(2, length + 1, dtype=torch.long))
    rows = torch.zeros(TPS // length, length, dtype=torch.long)
    slw.cut(rows)
    slw.end_step(applied=False)  # fp16 skip: the clock stays, the next step is the next draw
    assert slw.progress.tokens == 0 and slw.skipped_steps == 1
    slw.begin_step()
    assert slw.sampler.step.step == 2
    with pytest.raises(ValueError, match="plan_variable"):
        slw.plan(8)


def test_the_keyword_errors_list_every_problem_in_the_callers_words():
    with pytest.raises(ConfigError) as err:
        SequenceLengthWarmup(mode="variable", min_length=24, max_length=128, num_cycles=3, stages=[{"tokens": 1}])
    text = str(err.value)
    for part in (
        "documents = null: is required",
        "tokens_per_step = null: must be a positive integer",
        "min_length = 24: must be a power of 2",
        "num_cycles = 3: is a setting of schedule 'grow_p2'",
        "stages = ",
    ):
        assert part in text, text
    with pytest.raises(ConfigError, match="schedule = 'cosine': is not one of natural, grow_p2, linear"):
        make(schedule="cosine")
    with pytest.raises(ConfigError, match="steps = null: is required by schedule 'linear'"):
        make(schedule="linear", num_cycles=None)
    with pytest.raises(ConfigError, match="steps = 10: is not used by schedule 'natural'"):
        make(schedule="natural", num_cycles=None, steps=10)
    with pytest.raises(
        ConfigError, match="documents = 'ndarray of 301': is a setting of mode 'variable', not 'truncate'"
    ):
        SequenceLengthWarmup(min_length=8, max_length=64, steps=10, documents=OFFSETS)
    with pytest.raises(UserError, match="tokens_per_step 1000 must be a multiple of max_length x world_size"):
        make(tokens_per_step=1000)
    with pytest.raises(ConfigError, match="micro_batch_tokens = 100"):
        make().sampler.micro_batches(100)


def test_from_deepspeed_takes_the_blocks_range_and_schedule():
    block = {
        "train_batch_size": 8,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 16,
            "max_difficulty": 128,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
        },
    }
    slw = SequenceLengthWarmup.from_deepspeed(block, mode="variable", documents=OFFSETS, tokens_per_step=TPS)
    caps = []
    for _ in range(12):
        caps.append(slw.begin_step())
        slw.end_step()
    assert max(caps[:3]) <= 32 and 128 in caps[9:]  # the block's fixed_linear caps the length, reaching 128 at 10
    assert slw.sampler.sampler.curriculum == "schedule"
    natural = SequenceLengthWarmup.from_deepspeed(
        block, mode="variable", documents=OFFSETS, tokens_per_step=TPS, schedule="natural"
    )
    assert natural.sampler.sampler.curriculum == "natural" and natural.sampler.decomposition.min_length == 16
    bad = {**block, "curriculum_learning": {**block["curriculum_learning"], "min_difficulty": 24}}
    with pytest.raises(ConfigError, match="min_difficulty = 24: must be a power of 2"):
        SequenceLengthWarmup.from_deepspeed(bad, mode="variable", documents=OFFSETS, tokens_per_step=TPS)


def test_a_decomposition_may_be_handed_in_and_its_range_is_used():
    d = decompose(OFFSETS, 32, 128, shift=0)
    slw = SequenceLengthWarmup(mode="variable", documents=d, tokens_per_step=TPS)
    assert slw.begin_step() in (32, 64, 128) and slw.sampler.decomposition is d
    with pytest.raises(ConfigError, match="differ from the decomposition's"):
        SequenceLengthWarmup(mode="variable", documents=d, tokens_per_step=TPS, min_length=16, max_length=128)


def test_a_deepspeed_schedule_by_keyword_caps_the_length():
    slw = make(schedule="discrete", num_cycles=None, lengths=[16, 64, 128], until_steps=[3, 9])
    lengths = []
    for _ in range(20):
        lengths.append(slw.begin_step())
        slw.end_step()
    # DeepSpeed's fixed_discrete: 16 up to step 3, 64 up to step 9, then 128 (natural odds under the cap)
    assert lengths[:3] == [16, 16, 16] and 16 < max(lengths[3:9]) <= 64 and 128 in lengths[9:]
    assert slw.sampler.sampler.curriculum == "schedule"
    with pytest.raises(ConfigError, match="root_degree = \\(missing\\): is required for schedule 'root'"):
        make(schedule="root", num_cycles=None, steps=10)
    with pytest.raises(ConfigError, match="min_length = 'abc': must be a power of 2"):
        make(min_length="abc")


def test_ranks_taken_from_torch_distributed_are_checked_when_a_step_begins(monkeypatch):
    # a callback or loop built before the process group (Lightning builds its callbacks first) got rank 0
    # of 1: every rank would train the same rows while the clock sums them over the ranks
    dist = torch.distributed
    slw = make()
    assert (slw.sampler.sampler.rank, slw.sampler.sampler.world_size) == (0, 1)
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    with pytest.raises(UserError, match="built for rank 0 of 1, .* rank 1 of 2"):
        slw.begin_step()
    built_after = make()  # built once the group exists: its ranks, nothing to refuse
    assert (built_after.sampler.sampler.rank, built_after.sampler.sampler.world_size) == (1, 2)
    assert built_after.begin_step() in (16, 32, 64, 128)
    given = make(rank=0, world_size=1)  # given by the caller (e.g. a data-parallel group of its own): kept
    assert given.begin_step() in (16, 32, 64, 128)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    half = make(world_size=2)  # the rank left to torch.distributed, not initialized yet: rank 0 on every process
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    with pytest.raises(UserError, match="built for rank 0 of 2, .* rank 1 of 2"):
        half.begin_step()
