"""curriculum_mode variable in a config (#37): its keys and flags, its problems (check-config lists them),
and the backends that refuse it."""

import json

import pytest

from seqwarm.config import load_config
from seqwarm.config.defaults import default_train_config
from seqwarm.config.variable import VARIABLE_CURRICULA
from seqwarm.util.errors import UserError
from seqwarm.util.problems import ConfigError


def recipe(**seqwarm):
    raw = default_train_config()
    raw["seqwarm"].update({"curriculum_mode": "variable", **seqwarm})
    return raw


def test_the_mode_and_its_curriculum_are_read_from_the_block_and_the_flags():
    cfg = load_config(recipe())
    assert cfg.curriculum.mode == "variable" and cfg.variable_curriculum == "schedule" and cfg.variable_cycles == 8
    cfg = load_config(recipe(variable_curriculum="natural"), overrides={"variable_curriculum": "grow_p2"})
    assert cfg.variable_curriculum == "grow_p2"
    assert load_config(recipe(variable_curriculum="grow_p2", variable_cycles=3)).variable_cycles == 3
    samples = load_config(recipe(), overrides={"train_samples": 6400})
    assert any("train_samples in curriculum mode variable: a sample is a row" in w for w in samples.warnings)
    truncate = load_config(default_train_config(), overrides={"variable_curriculum": "natural"})
    assert any("no effect outside curriculum mode variable" in w for w in truncate.warnings)


def test_the_choices_are_the_samplers_curricula():
    from seqwarm.curriculum.variable import CURRICULA

    assert set(VARIABLE_CURRICULA) == set(CURRICULA) and VARIABLE_CURRICULA[0] == "schedule"


def test_every_problem_of_the_mode_is_listed_at_once():
    raw = recipe(document_masking=True, variable_curriculum="grow_p2", variable_cycles=0)
    raw["curriculum_learning"]["min_difficulty"] = 48
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    text = str(err.value)
    assert "must be powers of 2" in text and "is not needed in curriculum mode variable" in text
    assert "seqwarm.variable_cycles = 0: must be positive" in text
    raw = recipe()
    raw["curriculum_learning"]["schedule_type"] = "custom"
    raw["curriculum_learning"]["schedule_config"] = {}
    with pytest.raises(ConfigError, match="custom schedule has no lengths"):
        load_config(raw)
    raw["seqwarm"]["variable_curriculum"] = "natural"  # no cap to follow: the schedule is not read
    assert load_config(raw).variable_curriculum == "natural"
    with pytest.raises(ConfigError, match="needs a curriculum block"):
        load_config(recipe(curriculum=False))
    with pytest.raises(ConfigError, match="stages"):
        load_config(recipe(stages=[{"start_tokens": 10**6, "length": 256}]))


def test_check_config_says_what_the_mode_does_or_lists_its_problems(tmp_path, capsys):
    from seqwarm.cli import main

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(recipe(variable_curriculum="grow_p2", variable_cycles=4)))
    assert main(["check-config", str(good)]) == 0
    out = capsys.readouterr().out
    assert "mode: variable: every row one document, chunks of power-of-2 lengths 8..256" in out
    assert "curriculum grow_p2 (4 cycles)" in out
    bad.write_text(json.dumps(recipe(document_masking=True)))
    assert main(["check-config", str(bad)]) == 2
    assert "document_masking" in capsys.readouterr().err


def test_only_the_torch_backends_run_it():
    from seqwarm.curriculum.modes import resolve_mode
    from seqwarm.trainer.backends import TorchEngineBuilder, curriculum_mode, variable_positions
    from seqwarm.trainer.model import GPT, GPTConfig

    cfg = load_config(recipe())
    assert TorchEngineBuilder().curriculum_mode(cfg, None) == "variable"
    for kwargs in ({}, {"pipeline": True, "variable": True}):  # DeepSpeed, hf: models, a pipeline
        with pytest.raises(UserError, match="torch backends only"):
            curriculum_mode(cfg, GPT.forward, **kwargs)
    with pytest.raises(ValueError, match="VariableLengthSampler"):  # nothing may cut its rows
        resolve_mode("variable", GPT.forward)
    with pytest.raises(UserError, match="128 learned positions, fewer than the longest chunk max_difficulty 256"):
        variable_positions(GPTConfig.preset("tiny", vocab_size=64, seq_length=128), cfg)
    variable_positions(GPTConfig.preset("tiny", vocab_size=64, seq_length=256), cfg)


def test_the_deepspeed_and_hf_builders_refuse_it():
    pytest.importorskip("deepspeed")
    from seqwarm.integrations.deepspeed.run import DeepSpeedEngineBuilder
    from seqwarm.trainer.model import GPTConfig

    with pytest.raises(UserError, match="torch backends only"):
        DeepSpeedEngineBuilder().curriculum_mode(load_config(recipe()), GPTConfig.preset("tiny", vocab_size=64))
