"""A run given as a Megatron-DeepSpeed command line: its optimizer, its LR rule, its gradient accumulation.

The template is Megatron-DeepSpeed's ``examples_deepspeed/curriculum_learning/ds_zero_stage_1_config_*.json``
(its ``optimizer`` block: Adam, betas [0.9, 0.95], no weight decay; ``gradient_accumulation_steps`` 1), with a
small curriculum. Megatron-DeepSpeed builds its optimizer from its flags (defaults in ``arguments.py``:
``--adam-beta1 0.9``, ``--adam-beta2 0.999``, ``--adam-eps 1e-8``, ``--weight-decay 0.01``) and hands it to
``deepspeed.initialize``, which then ignores the block.
"""

import json

import pytest

from seqwarm.cli import main
from seqwarm.config import load_config
from seqwarm.config.describe import describe
from seqwarm.util.problems import ConfigError

TEMPLATE = {
    "train_batch_size": 512,
    "gradient_accumulation_steps": 1,
    "steps_per_print": 1,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "Adam", "params": {"lr": 0.00015, "max_grad_norm": 1.0, "betas": [0.9, 0.95]}},
    "gradient_clipping": 1.0,
    "curriculum_learning": {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 8,
        "max_difficulty": 64,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8},
    },
}
# ds_pretrain_gpt2.sh's LR and batch flags, small
FLAGS = {
    "lr": 6e-4,
    "min_lr": 1e-5,
    "lr_decay_style": "cosine",
    "lr_warmup_iters": 2,
    "train_iters": 40,
    "train_tokens": 10**6,
    "train_micro_batch_size_per_gpu": 4,
    "train_batch_size": 8,
    "seq_length": 64,
}


def test_a_megatron_command_line_gets_megatrons_optimizer_and_says_the_block_is_not_used():
    cfg = load_config(TEMPLATE, overrides=FLAGS)
    assert cfg.lr.rule == "megatron"
    opt = cfg.optimizer
    assert (opt.type, opt.betas, opt.eps, opt.weight_decay) == ("AdamW", (0.9, 0.999), 1e-8, 0.01)
    (warning,) = [w for w in cfg.warnings if "optimizer block" in w]
    assert "betas [0.9, 0.999] (the block: [0.9, 0.95])" in warning and "weight decay 0.01 (the block: 0)" in warning
    assert "--no-megatron" in warning and "deepspeed.initialize" in warning
    assert any(line.startswith("rules:       Megatron-DeepSpeed's") for line in describe(cfg))
    # the flags set it, as in Megatron
    mine = load_config(TEMPLATE, overrides={**FLAGS, "adam_beta2": 0.95, "weight_decay": 0.1, "adam_eps": 1e-6})
    assert (mine.optimizer.betas, mine.optimizer.weight_decay, mine.optimizer.eps) == ((0.9, 0.95), 0.1, 1e-6)
    (warning,) = [w for w in mine.warnings if "optimizer block" in w]
    assert "weight decay 0.1 (the block: 0)" in warning and "betas" not in warning.split(". ")[0]


def test_no_megatron_keeps_the_block_and_a_deepspeed_native_run_is_unchanged():
    block = load_config(TEMPLATE, overrides={**FLAGS, "megatron": False})
    assert block.lr.rule == "seqwarm"
    assert (block.optimizer.betas, block.optimizer.weight_decay) == ((0.9, 0.95), 0.0)
    # the same settings in the config's "seqwarm" block (no command line): DeepSpeed-native, today's rule
    native = load_config({**TEMPLATE, "train_batch_size": 8, "gradient_accumulation_steps": 2, "seqwarm": FLAGS})
    assert native.lr.rule == "seqwarm" and native.optimizer == block.optimizer
    assert not any(line.startswith("rules:") for line in describe(native))
    # without a training length in iterations or samples it is not Megatron's command line either
    partial = {k: v for k, v in FLAGS.items() if k != "train_iters"}
    assert load_config(TEMPLATE, overrides=partial).lr.rule == "seqwarm"
    # and it can be asked for in a config
    asked = load_config(
        {**TEMPLATE, "train_batch_size": 8, "gradient_accumulation_steps": 2, "seqwarm": {**FLAGS, "megatron": True}}
    )
    assert asked.lr.rule == "megatron" and asked.optimizer.betas == (0.9, 0.999)


def test_gradient_accumulation_comes_from_micro_and_global_batch_over_the_templates_one():
    cfg = load_config(TEMPLATE, overrides=FLAGS)
    assert (cfg.train_batch_size, cfg.micro_batch_size, cfg.gradient_accumulation_steps) == (8, 4, 2)
    assert any("gradient_accumulation_steps 1 (the config) becomes 2" in w for w in cfg.warnings)
    assert load_config(TEMPLATE, overrides=FLAGS, world_size=2).gradient_accumulation_steps == 1
    # a value other than the template's 1 is the user's: checked against the flags as before
    with pytest.raises(ConfigError, match="train_batch_size must equal"):
        load_config({**TEMPLATE, "gradient_accumulation_steps": 4}, overrides=FLAGS)
    with pytest.raises(ConfigError) as err:
        load_config(TEMPLATE, overrides={**FLAGS, "train_batch_size": 10})
    assert err.value.problems[0].path == "--global-batch-size"


def test_megatrons_lr_rules_are_checked_with_the_flag_and_the_fix():
    with pytest.raises(ConfigError) as err:
        load_config(TEMPLATE, overrides={**FLAGS, "train_iters": None, "megatron": True})
    assert err.value.problems[0].path == "--train-iters" and "--no-megatron" in err.value.problems[0].fix
    with pytest.raises(ConfigError) as err:
        load_config(TEMPLATE, overrides={**FLAGS, "lr_warmup_iters": None, "lr_warmup_samples": 16})
    problem = err.value.problems[0]
    assert problem.path == "--lr-warmup-samples" and "--lr-warmup-iters" in problem.fix
    with pytest.raises(ConfigError, match="iterations or by samples, not both"):
        load_config(TEMPLATE, overrides={**FLAGS, "train_samples": 320})
    # Megatron's spelling of the style, in either rule
    for megatron in (True, False):
        cfg = load_config(TEMPLATE, overrides={**FLAGS, "lr_decay_style": "inverse-square-root", "megatron": megatron})
        assert cfg.lr.decay_style == "inverse-sqrt"


def test_a_bad_megatron_command_line_exits_2_with_one_line_per_problem(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(TEMPLATE))
    code = main(
        ["plan", str(path), "--megatron", "--lr", "6e-4", "--micro-batch-size", "4"]
        + ["--global-batch-size", "8", "--train-tokens", "1M", "--seq-length", "64"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "--train-iters" in err and "--no-megatron" in err
