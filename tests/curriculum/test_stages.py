"""Stages after the warmup: the pure rule, the checks, SequenceLengthWarmup's stage and positions, the
RunConfig round trip, and the rotary numbers against Transformers' own rope functions."""

from __future__ import annotations

import json

import pytest
import torch

from seqwarm.config import RunConfig, load_config
from seqwarm.curriculum.rope import rope_frequencies
from seqwarm.curriculum.stages import RopeScaling, StageConfig, StageTracker, stage_at
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.util.problems import ConfigError

STAGES = [
    {"start_tokens": 1000, "length": 64, "rope_theta": 40000.0},
    {"start_tokens": 3000, "length": 128, "rope_scaling": {"type": "yarn", "factor": 2.0}},
]


def _config(stages, seq_length=128):
    return {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 32,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8},
        },
        "seqwarm": {"seq_length": seq_length, "train_tokens": 5000, "stages": stages},
    }


def test_stage_at_is_the_last_stage_reached():
    stages = [StageConfig(10, 64), StageConfig(20, 128)]
    assert stage_at(9, stages) is None
    assert stage_at(10, stages) == (0, stages[0])
    assert stage_at(19, stages)[0] == 0
    assert stage_at(25, stages) == (1, stages[1])


def test_config_reads_stages_and_a_left_out_key_keeps_the_previous_value():
    cfg = load_config(_config(STAGES))
    first, second = cfg.stages
    assert first == StageConfig(1000, 64, 40000.0, None)
    # the second stage keeps the first's theta; YaRN's original length defaults to the length before it
    assert second.rope_theta == 40000.0
    assert second.rope_scaling == RopeScaling("yarn", 2.0, original_max_position_embeddings=64)
    back = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back.stages == cfg.stages


def test_check_lists_every_stage_problem_at_once():
    bad = [
        {"start_tokens": 0, "length": 16, "rope_thetta": 5},
        {"start_tokens": 500, "length": 256, "rope_scaling": {"type": "yarnn", "factor": 2}},
        {"start_tokens": 400, "length": 64, "rope_scaling": {"type": "linear", "factor": 0.5}, "micro_batch_size": 0},
    ]
    with pytest.raises(ConfigError) as err:
        load_config(_config(bad))
    text = str(err.value)
    for needle in (
        'did you mean "rope_theta"',
        "starts before the warmup ends",
        "is below the length before it (32)",
        "micro_batch_size = 0: must be positive",
        'did you mean "yarn"',
        "stages must be in order",
        "must be >= 1",
    ):
        assert needle in text, needle
    assert len(err.value.problems) == 8  # and stage 2 is shorter than stage 1
    # a length above seq_length (256 > 128) is the trainer's to judge: a rotary model holds it
    assert "exceeds" not in text and "stages[1].length" not in text


def test_a_stage_keeps_the_micro_batch_tokens_unless_it_gives_its_rows():
    from seqwarm.curriculum.plan_stages import longest_shape, micro_tokens, stage_micro_rows
    from seqwarm.curriculum.stages import stage_rows

    assert stage_rows(StageConfig(0, 256), 4 * 128) == 2  # twice the length: half the rows
    assert stage_rows(StageConfig(0, 384), 4 * 128) == 1  # rounded down
    assert stage_rows(StageConfig(0, 4096), 4 * 128) == 1  # at least one row
    assert stage_rows(StageConfig(0, 256, micro_batch_size=3), 4 * 128) == 3  # the stage's own
    long = [{"start_tokens": 5000, "length": 128}, {"start_tokens": 9000, "length": 512, "micro_batch_size": 1}]
    cfg = load_config(_config(long) | {"train_micro_batch_size_per_gpu": 8, "train_batch_size": 16})
    # the micro-batch's tokens at the pretraining length (the warmup's top, 32), not at seq_length
    assert cfg.seq_length == 128 and micro_tokens(cfg) == 8 * 32
    assert [stage_micro_rows(cfg, s) for s in cfg.stages] == [2, 1]
    assert longest_shape(cfg) == (1, 512) and cfg.stages[1].describe().endswith("micro_batch_size 1")


def test_stages_from_the_command_line_are_json_text():
    cfg = load_config(_config(None) | {"seqwarm": {"seq_length": 128}}, overrides={"stages": json.dumps(STAGES)})
    assert [s.length for s in cfg.stages] == [64, 128]
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_config(_config(None) | {"seqwarm": {"seq_length": 128}}, overrides={"stages": "[{"})


def test_warmup_object_switches_length_and_positions_at_the_boundary():
    slw = SequenceLengthWarmup(min_length=8, max_length=32, steps=4, multiple_of=8, stages=STAGES)
    seen = []
    batch = torch.zeros(2, 128, dtype=torch.long)
    while slw.progress.tokens < 3500:
        length = slw.begin_step()
        seen.append((slw.progress.tokens, length, slw.stage_changed, slw.positions))
        slw.cut(batch)
        slw.end_step()
    before = [s for s in seen if s[0] < 1000]
    assert all(s[1] <= 32 and s[3] is None and not s[2] for s in before)
    first = next(i for i, s in enumerate(seen) if s[0] >= 1000)
    assert seen[first][1] == 64 and seen[first][2] and seen[first][3] == {"rope_theta": 40000.0, "rope_scaling": None}
    assert not seen[first + 1][2]  # changed only at the first step of the stage
    second = next(i for i, s in enumerate(seen) if s[0] >= 3000)
    assert seen[second][1] == 128 and seen[second][2]
    assert seen[second][3]["rope_scaling"]["type"] == "yarn" and seen[second][3]["rope_theta"] == 40000.0
    # a resume inside a stage: the first step reports the stage as changed, so positions are set again
    fresh = SequenceLengthWarmup(min_length=8, max_length=32, steps=4, multiple_of=8, stages=STAGES)
    fresh.load_state_dict(slw.state_dict())
    assert fresh.begin_step() == 128 and fresh.stage_changed and fresh.positions == seen[second][3]


@pytest.mark.parametrize("mode", ["truncate", "reshape", "window"])
def test_a_batch_shorter_than_the_stage_is_an_error_not_a_stage_at_the_old_length(mode):
    # cut cannot lengthen rows: a loop that keeps feeding the warmup's windows would train the stage's
    # positions at the old length while the clock and the console say the stage's
    slw = SequenceLengthWarmup(8, 32, 2, mode=mode, stages=[{"start_tokens": 500, "length": 128, "rope_theta": 5e4}])
    short, long = torch.zeros(4, 32, dtype=torch.long), torch.zeros(4, 128, dtype=torch.long)
    while slw.begin_step() != 128:
        slw.cut(short)  # before the stage: the warmup's windows are fine
        slw.end_step()
    with pytest.raises(ValueError, match="stage 1 trains at length 128.* 32 tokens"):
        slw.cut(short)
    assert slw.cut(long).shape == (4, 128)  # the stage's own windows pass


def test_keyword_stages_are_checked():
    with pytest.raises(ConfigError, match="is below the length before it"):
        SequenceLengthWarmup(min_length=8, max_length=32, steps=4, stages=[{"start_tokens": 10, "length": 16}])
    tracker = StageTracker([StageConfig(5, 8)])
    assert tracker.begin(0) is None and not tracker.changed
    assert tracker.begin(5).length == 8 and tracker.changed


def test_a_scaling_writes_only_its_types_keys_and_stage_configs_go_back_in_unchanged():
    linear = {"start_tokens": 1000, "length": 64, "rope_scaling": {"type": "linear", "factor": 2.0}}
    slw = SequenceLengthWarmup(min_length=8, max_length=32, steps=4, stages=[linear, STAGES[1]])
    first, second = slw.stages.stages
    assert first.positions()["rope_scaling"] == {"type": "linear", "factor": 2.0}  # no YaRN defaults
    yarn = second.positions()["rope_scaling"]
    assert yarn.items() >= {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}.items()
    assert yarn["beta_fast"] == 32.0 and yarn["beta_slow"] == 1.0 and yarn["truncate"] is True
    assert RopeScaling("linear", 3.0).to_dict() == {"type": "linear", "factor": 3.0}
    # the StageConfig objects themselves (SequenceLengthWarmup takes them as well as dicts)
    again = SequenceLengthWarmup(min_length=8, max_length=32, steps=4, stages=[first, second])
    assert again.stages.stages == (first, second)


def _transformers_rope(theta, dim, scaling, max_positions):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        params.update({k: v for k, v in scaling.items() if k != "type"}, rope_type=scaling["type"])
    heads = 2
    config = transformers.LlamaConfig(
        hidden_size=dim * heads,
        num_attention_heads=heads,
        max_position_embeddings=max_positions,
        rope_parameters=params,
    )
    if params["rope_type"] == "default":  # plain RoPE is the model's own function
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        inv, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv, factor = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None)
    return inv.tolist(), float(factor)


@pytest.mark.parametrize(
    "theta, scaling",
    [
        (10000.0, None),
        (500000.0, None),
        (10000.0, {"type": "linear", "factor": 4.0}),
        (10000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        (40000.0, {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256, "beta_fast": 16}),
        (10000.0, {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128, "attention_factor": 1.3}),
        (
            10000.0,
            {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 128,
                "mscale": 1.0,
                "mscale_all_dim": 0.7,
            },
        ),
    ],
)
def test_rope_numbers_match_transformers(theta, scaling):
    dim = 32
    theirs, their_factor = _transformers_rope(theta, dim, scaling, 1024)
    ours, our_factor = rope_frequencies(dim, theta, scaling)
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert our_factor == pytest.approx(their_factor, rel=1e-6)
