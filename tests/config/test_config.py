"""Config loading: the seed config verbatim, both curriculum forms, every problem reported at once."""

import json
from pathlib import Path

import pytest

from seqwarm import ConfigError, load_config
from seqwarm.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "ds_config_gpt2.json"


def seed():
    return json.loads(SEED.read_text())


def problems_of(cfg, **kw):
    with pytest.raises(ConfigError) as info:
        load_config(cfg, **kw)
    return [f"{p.path} :: {p.rule} :: {p.fix}" for p in info.value.problems]


def test_seed_config_loads_verbatim():
    cfg = load_config(SEED)
    assert (cfg.train_batch_size, cfg.micro_batch_size, cfg.gradient_accumulation_steps) == (4096, 4096, 1)
    assert cfg.curriculum.min_difficulty == 8 and cfg.curriculum.max_difficulty == 1024
    assert cfg.curriculum.schedule_type == "fixed_linear" and cfg.curriculum.source == "curriculum_learning"
    assert cfg.curriculum.mode is None
    assert cfg.precision == "fp16" and cfg.fp16.loss_scale_window == 1000 and cfg.fp16.hysteresis == 2
    assert cfg.optimizer.lr == 0.00015 and cfg.optimizer.betas == (0.9, 0.95)
    assert cfg.gradient_clipping == 1.0
    assert cfg.full_length == 1024
    # the hand-over copy for DeepSpeed has no curriculum block (0.19 rejects it) but keeps the rest
    assert "curriculum_learning" not in cfg.deepspeed and cfg.deepspeed["steps_per_print"] == 1
    assert cfg.warnings == ()


def test_seed_file_is_the_spec_config():
    spec = ROOT.parent / "shared" / "SPEC.md"
    if not spec.exists():
        pytest.skip("shared/SPEC.md not beside the checkout")
    text = spec.read_text()
    block = text.split("```json", 1)[1].split("```", 1)[0]
    assert json.loads(block) == seed()


def test_data_efficiency_form_selects_mode():
    for metric, mode in (("seqlen_truncate", "truncate"), ("seqlen_reshape", "reshape")):
        cfg = load_config(
            {
                "train_batch_size": 8,
                "zero_optimization": {"stage": 2},
                "data_efficiency": {
                    "enabled": True,
                    "seed": 1,
                    "data_sampling": {
                        "enabled": True,
                        "num_epochs": 1,
                        "curriculum_learning": {
                            "enabled": True,
                            "curriculum_metrics": {
                                metric: {
                                    "difficulty_type": "value",
                                    "clustering_type": "single_cluster",
                                    "min_difficulty": 8,
                                    "max_difficulty": 64,
                                    "schedule_type": "fixed_linear",
                                    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
                                }
                            },
                        },
                    },
                },
            }
        )
        assert cfg.curriculum.mode == mode and cfg.curriculum.source == "data_efficiency"
        assert cfg.deepspeed["zero_optimization"] == {"stage": 2}
        assert "curriculum_learning" not in cfg.deepspeed["data_efficiency"]["data_sampling"]


def test_data_efficiency_needs_all_enabled_flags():
    cfg = load_config(
        {
            "train_batch_size": 8,
            "data_efficiency": {
                "enabled": False,
                "data_sampling": {"enabled": True, "curriculum_learning": {"enabled": True, "curriculum_metrics": {}}},
            },
        }
    )
    assert cfg.curriculum is None
    assert any("curriculum is off" in w for w in cfg.warnings)


def test_other_metric_rejected_with_suggestion():
    probs = problems_of(
        {
            "train_batch_size": 8,
            "data_efficiency": {
                "enabled": True,
                "data_sampling": {
                    "enabled": True,
                    "curriculum_learning": {
                        "enabled": True,
                        "curriculum_metrics": {"seqlen_truncat": {}, "vocabularyrarity": {}},
                    },
                },
            },
        }
    )
    assert any("seqlen_truncat" in p and 'did you mean "seqlen_truncate"' in p for p in probs)
    assert any("vocabularyrarity" in p for p in probs)


def test_disabled_legacy_block_is_off_and_unchecked():
    raw = seed()
    raw["curriculum_learning"] = {"enabled": False, "min_difficulty": "junk"}
    assert load_config(raw).curriculum is None


def test_every_problem_reported_at_once():
    raw = seed()
    cl = raw["curriculum_learning"]
    cl.update(min_difficulty=2048, schedule_type="fixed_linar", curriculum_typ="seqlen")
    cl["schedule_config"] = {"total_curriculum_step": 0, "difficulty_step": 8.0}
    raw["optimizer"]["params"]["lr"] = -0.1
    raw["train_micro_batch_size_per_gpu"] = 3
    probs = problems_of(raw)
    joined = "\n".join(probs)
    assert "curriculum_learning.min_difficulty" in joined and "max_difficulty (1024)" in joined
    assert 'did you mean "fixed_linear"' in joined
    assert "curriculum_learning.curriculum_typ :: unknown key" in joined and '"curriculum_type"' in joined
    assert "schedule_config.total_curriculum_step :: must be positive" in joined
    assert "schedule_config.difficulty_step :: must be an integer, not a decimal" in joined
    assert "optimizer.params.lr" in joined
    assert "train_batch_size" in joined and "3 x 1 x 1 = 3" in joined
    assert len(probs) >= 7


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("min_difficulty", True, "got a boolean"),
        ("min_difficulty", "8", "not a string"),
        ("min_difficulty", 8.5, "got a number"),
        ("max_difficulty", 0, "must be positive"),
        ("max_difficulty", -4, "must be positive"),
        ("enabled", "true", "write true"),
        ("curriculum_type", "vocab", "unknown curriculum_type"),
        ("schedule_type", "linear", "unknown schedule_type"),
    ],
)
def test_wrong_types_and_values(key, value, fragment):
    raw = seed()
    raw["curriculum_learning"][key] = value
    probs = problems_of(raw)
    assert any(f"curriculum_learning.{key}" in p and fragment in p for p in probs), probs


@pytest.mark.parametrize(
    "kind,missing",
    [
        ("fixed_linear", "total_curriculum_step"),
        ("fixed_linear", "difficulty_step"),
        ("fixed_root", "root_degree"),
        ("fixed_discrete", "difficulty"),
        ("fixed_discrete", "max_step"),
    ],
)
def test_missing_schedule_keys(kind, missing):
    full = {
        "total_curriculum_step": 100,
        "difficulty_step": 8,
        "root_degree": 2,
        "difficulty": [8, 16],
        "max_step": [10],
    }
    keep = {
        "fixed_linear": ("total_curriculum_step", "difficulty_step"),
        "fixed_root": ("total_curriculum_step", "difficulty_step", "root_degree"),
        "fixed_discrete": ("difficulty", "max_step"),
    }[kind]
    raw = seed()
    raw["curriculum_learning"].update(min_difficulty=8, max_difficulty=16, schedule_type=kind)
    raw["curriculum_learning"]["schedule_config"] = {k: full[k] for k in keep if k != missing}
    probs = problems_of(raw)
    assert any(f"schedule_config.{missing} :: is required" in p for p in probs), probs


def test_missing_required_top_keys_of_enabled_block():
    raw = seed()
    raw["curriculum_learning"] = {"enabled": True}
    joined = "\n".join(problems_of(raw))
    for key in ("min_difficulty", "max_difficulty", "schedule_type"):
        assert f"curriculum_learning.{key} :: is required" in joined


@pytest.mark.parametrize(
    "sc,fragment",
    [
        ({"difficulty": [], "max_step": []}, "must not be empty"),
        ({"difficulty": [8, 16, 32], "max_step": [10]}, "one element fewer"),
        ({"difficulty": [16, 8], "max_step": [10]}, "sorted"),
        ({"difficulty": [8, 128], "max_step": [10]}, "outside [min_difficulty, max_difficulty]"),
        ({"difficulty": [8, 16, 32], "max_step": [10, 5]}, "strictly increasing"),
    ],
)
def test_discrete_lists(sc, fragment):
    raw = seed()
    raw["curriculum_learning"].update(
        min_difficulty=8, max_difficulty=64, schedule_type="fixed_discrete", schedule_config=sc
    )
    probs = problems_of(raw)
    assert any(fragment in p for p in probs), probs


def test_step_with_no_multiple_in_range():
    raw = seed()
    raw["curriculum_learning"].update(min_difficulty=10, max_difficulty=12)
    probs = problems_of(raw)
    assert any("no multiple of it lies in" in p for p in probs)


@pytest.mark.parametrize(
    "sizes,world,ok",
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}, 2, True),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}, 1, False),
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 1, False),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, True),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 3}, 1, False),
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 2, True),
        ({}, 1, False),
    ],
)
def test_batch_size_rule(sizes, world, ok):
    if ok:
        cfg = load_config(sizes, world_size=world)
        assert cfg.train_batch_size == cfg.micro_batch_size * cfg.gradient_accumulation_steps * world
    else:
        assert any("train_batch_size" in p for p in problems_of(sizes, world_size=world))


def test_tutorial_advice_is_a_warning_not_an_error():
    raw = seed()
    raw["curriculum_learning"].update(min_difficulty=12, max_difficulty=1000)
    raw["curriculum_learning"]["schedule_config"]["difficulty_step"] = 16
    cfg = load_config(raw)
    text = "\n".join(cfg.warnings)
    assert "multiple of 8" in text and "exactly max_difficulty" in text


def test_overrides_win_and_are_checked():
    cfg = load_config(
        SEED,
        overrides={
            "train_tokens": 1000,
            "lr": 3e-4,
            "seq_length": 1024,
            "lr_warmup_iters": 10,
            "lr_decay_style": "cosine",
            "min_lr": 1e-5,
        },
    )
    assert cfg.train_tokens == 1000 and cfg.lr.lr == 3e-4 and cfg.seq_length == 1024
    assert cfg.lr.decay_style == "cosine" and cfg.lr.decay_tokens == 1000  # decay defaults to the budget
    probs = problems_of(SEED, overrides={"seq_length": 512, "min_lr": 1.0, "lr_decay_style": "cosin"})
    joined = "\n".join(probs)
    assert "max_difficulty" in joined and "(512)" in joined
    assert "--min-lr" in joined and "--lr-decay-style" in joined
    assert load_config(SEED, overrides={"curriculum": False}).curriculum is None
    assert load_config(SEED, overrides={"curriculum_mode": "reshape"}).curriculum.mode == "reshape"


def test_seqwarm_block_in_file():
    raw = seed()
    raw["seqwarm"] = {"train_tokens": 5000, "lr_decay_tokens": 4000, "lr_warmup_samples": 100}
    cfg = load_config(raw)
    assert cfg.train_tokens == 5000 and cfg.lr.decay_tokens == 4000 and cfg.lr.decay_style == "linear"
    assert "seqwarm" not in cfg.deepspeed
    raw["seqwarm"] = {"train_tokns": 5}
    assert any('did you mean "train_tokens"' in p for p in problems_of(raw))


def test_ds_scheduler_block_is_mapped():
    raw = seed()
    raw["scheduler"] = {
        "type": "WarmupDecayLR",
        "params": {"warmup_max_lr": 1e-3, "warmup_num_steps": 10, "total_num_steps": 100},
    }
    cfg = load_config(raw)
    assert (cfg.lr.lr, cfg.lr.warmup_iters, cfg.lr.decay_iters, cfg.lr.decay_style) == (1e-3, 10, 100, "linear")


def test_fp16_and_bf16_both_enabled():
    raw = seed()
    raw["bf16"] = {"enabled": True}
    assert any("fp16 and bf16" in p for p in problems_of(raw))


def test_malformed_json_names_the_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true,}\n}\n')
    probs = problems_of(path)
    assert len(probs) == 1 and "line 3" in probs[0]


def test_missing_file_and_folder(tmp_path):
    assert "not found" in problems_of(tmp_path / "nope.json")[0]
    assert "is a folder" in problems_of(tmp_path)[0]


def test_check_config_cli(tmp_path, capsys):
    assert main(["check-config", str(SEED)]) == 0
    out = capsys.readouterr().out
    assert "8 -> 1024 tokens linearly over 15,000 steps" in out
    raw = seed()
    raw["curriculum_learning"]["min_difficulty"] = 7  # the schedule rounds it up to difficulty_step 8
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(raw))
    assert main(["check-config", str(odd)]) == 0
    captured = capsys.readouterr()
    assert "seqlen 8 -> 1024 tokens linearly" in captured.out and "7 -> 1024" not in captured.out
    assert "in multiples of 8, min_difficulty 7 rounded up to 8 (" in captured.out
    assert "the schedule starts at 8" in captured.out + captured.err
    raw = seed()
    raw["curriculum_learning"]["schedule_config"]["difficulty_step"] = 0
    raw["curriculum_learning"]["max_difficulty"] = "1024"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2 and "Traceback" not in err
    assert main(["check-config", str(tmp_path / "missing.json")]) == 2


def test_review_findings_are_reported():
    # a near miss of a key seqwarm reads is an error, not a silently ignored key
    raw = seed()
    raw["curriculum_learnin"] = raw.pop("curriculum_learning")
    assert any(p.startswith("curriculum_learnin ::") and '"curriculum_learning"' in p for p in problems_of(raw))
    # every bad batch-size key at once
    probs = problems_of(
        {"train_batch_size": "8", "train_micro_batch_size_per_gpu": 2.5, "gradient_accumulation_steps": -1}
    )
    assert len([p for p in probs if "batch_size" in p or "accumulation" in p]) == 3
    # an explicit gradient_clipping 0 is not overridden by optimizer.params.max_grad_norm
    cfg = load_config(
        {
            "train_batch_size": 8,
            "optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}},
            "seqwarm": {"gradient_clipping": 0},
        }
    )
    assert cfg.gradient_clipping == 0
    # warmup must end before decay, in samples and tokens too
    for unit in ("samples", "tokens"):
        probs = problems_of({"train_batch_size": 8, "seqwarm": {f"lr_warmup_{unit}": 1000, f"lr_decay_{unit}": 500}})
        assert any("warmup must end before the decay" in p for p in probs)
    # the data_efficiency form's key path in the max_difficulty check
    de = {
        "train_batch_size": 8,
        "seqwarm": {"seq_length": 32},
        "data_efficiency": {
            "enabled": True,
            "data_sampling": {
                "enabled": True,
                "curriculum_learning": {
                    "enabled": True,
                    "curriculum_metrics": {
                        "seqlen_truncate": {
                            "min_difficulty": 8,
                            "max_difficulty": 64,
                            "schedule_type": "fixed_linear",
                            "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
                        }
                    },
                },
            },
        },
    }
    assert any(
        p.startswith(
            "data_efficiency.data_sampling.curriculum_learning.curriculum_metrics.seqlen_truncate.max_difficulty"
        )
        for p in problems_of(de)
    )
    # DeepSpeed scheduler fields seqwarm does not follow are said
    raw = seed()
    raw["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10},
    }
    text = "\n".join(load_config(raw).warnings)
    assert "warmup_min_lr" in text and "warmup_type" in text


# -- the settings table ------------------------------------------------------------------------------


def test_every_setting_is_a_flag_and_a_block_key_and_changes_the_config():
    """Each row of the table is a `seqwarm train` flag whose value reaches load_config's result."""
    from seqwarm.cli import build_parser
    from seqwarm.cli.commands.common import overrides_from_args
    from seqwarm.config.settings import SETTINGS

    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    flags = {f for a in train._actions for f in a.option_strings}
    for s in SETTINGS:
        assert s.flag in flags, s
    args = parser.parse_args(
        [
            "train",
            "--weight-decay",
            "0.25",
            "--clip-grad",
            "0.5",
            "--count-tokens-by",
            "loss_mask",
            "--no-curriculum",
            "--train-tokens",
            "1M",
        ]
    )
    overrides = overrides_from_args(args)
    assert overrides == {
        "weight_decay": 0.25,
        "gradient_clipping": 0.5,
        "count_tokens_by": "loss_mask",
        "curriculum": False,
        "train_tokens": 1_000_000,
    }
    base = {
        "train_batch_size": 8,
        "curriculum_learning": {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 64,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
        },
    }
    cfg = load_config(base, overrides=overrides)
    assert (
        cfg.optimizer.weight_decay,
        cfg.gradient_clipping,
        cfg.count_tokens_by,
        cfg.curriculum,
        cfg.train_tokens,
    ) == (0.25, 0.5, "loss_mask", None, 1_000_000)
    same = load_config({**base, "seqwarm": {"weight_decay": 0.25, "gradient_clipping": 0.5}})
    assert (same.optimizer.weight_decay, same.gradient_clipping) == (0.25, 0.5)


def test_a_bad_flag_value_is_reported_with_the_flag_name():
    from seqwarm.config.settings import flag_for

    with pytest.raises(ConfigError) as err:
        load_config({"train_batch_size": 8}, overrides={"lr_warmup_iters": 5, "lr_warmup_samples": 9})
    assert flag_for("lr_warmup_samples") in str(err.value) and "--lr-warmup-iters" in str(err.value)


def test_every_lr_setting_is_an_lr_config_field_and_lr_schedule_checks_it():
    """The reader hands the table's LR settings to lr_schedule by LRConfig field name."""
    import dataclasses

    from seqwarm.config.settings import keys_in_group
    from seqwarm.curriculum.lr import LRConfig, lr_config_from
    from seqwarm.util.problems import Checker

    fields = {f.name for f in dataclasses.fields(LRConfig)}
    # "megatron" picks LRConfig.rule (and the optimizer's defaults): not a field by its own name
    assert {key.removeprefix("lr_") for key in keys_in_group("lr") if key != "megatron"} == fields - {"rule"}
    chk = Checker()
    cfg = lr_config_from(
        chk,
        {"warmup_samples": (10, "x.warmup"), "decay_style": ("cosine", "x.style")},
        default_lr=0.5,
        budget={"train_tokens": None, "train_iters": 100},
    )
    assert not chk.problems
    assert cfg == LRConfig(lr=0.5, decay_style="cosine", warmup_samples=10, decay_iters=100)


def test_components_do_not_import_the_layers_above():
    """curriculum, lr_schedule and budget import only layer 1 and each other (not even for type checking)."""
    import ast

    allowed = {
        "seqwarm.util.errors",
        "seqwarm.util.units",
        "seqwarm.util.atomic",
        "seqwarm.util.problems",
        "seqwarm.curriculum.schedule",
        "seqwarm.curriculum.checks",
        "seqwarm.curriculum.lr",
        "seqwarm.curriculum.lr_checks",
        "seqwarm.curriculum.clock",
    }
    src = Path(__file__).resolve().parents[2] / "src" / "seqwarm"
    graph = {}
    for name in (
        "curriculum.schedule",
        "curriculum.checks",
        "curriculum.lr",
        "curriculum.lr_checks",
        "curriculum.clock",
    ):
        tree = ast.parse((src / f"{name.replace('.', '/')}.py").read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        ours = {m for m in mods if m.startswith("seqwarm")}
        assert ours <= allowed, (name, ours - allowed)
        graph[f"seqwarm.{name}"] = ours
    for mod, deps in graph.items():  # no cycle between them
        for dep in deps & graph.keys():
            assert mod not in graph[dep], (mod, dep)


def test_atomic_writes_replace_whole_files_and_leave_no_temporaries(tmp_path):
    from seqwarm.util.atomic import TMP_MARK, atomic_path, write_json, write_text

    target = tmp_path / "sub" / "summary.json"
    write_json(target, {"a": (1, 2), "p": tmp_path})
    assert json.loads(target.read_text()) == {"a": [1, 2], "p": str(tmp_path)}
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text())["a"] == [1, 2]  # the old file is intact
    write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert not [p for p in target.parent.iterdir() if TMP_MARK in p.name]


def test_unnamed_precision_is_bf16_on_cuda_and_fp32_elsewhere():
    from seqwarm.config import resolve_precision

    plain = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8}
    cfg = load_config(plain)
    assert cfg.precision == "fp32" and not cfg.precision_named
    assert resolve_precision(cfg, "cuda").precision == "bf16"
    assert resolve_precision(cfg, "cuda", bf16_supported=False).precision == "fp32"  # pre-Ampere
    assert resolve_precision(cfg, "cpu").precision == "fp32"
    # named precisions are kept, an explicit "enabled": false included (fp16 only when asked for)
    for extra, want in [
        ({"fp16": {"enabled": True}}, "fp16"),
        ({"bf16": {"enabled": False}}, "fp32"),
        ({"seqwarm": {"precision": "fp32"}}, "fp32"),
    ]:
        named = load_config({**plain, **extra})
        assert named.precision_named and resolve_precision(named, "cuda").precision == want
    assert load_config(plain, overrides={"precision": "fp16"}).precision_named


def test_the_pieces_moved_into_the_curriculum_keep_their_config_names():
    """FP16Config, the precision rule and the token-counting choices live in the curriculum now; the config
    package still exports each under its old name (the same object), and registered its reader there."""
    import seqwarm.config as config
    from seqwarm.config import run
    from seqwarm.curriculum import clock, loss_scale
    from seqwarm.curriculum import run as curriculum_run

    for name in ("FP16Config", "PRECISIONS", "resolve_precision"):
        assert getattr(config, name) is getattr(loss_scale, name) is getattr(run, name)
    assert run.DEFAULT_CUDA_PRECISION is loss_scale.DEFAULT_CUDA_PRECISION
    assert run.COUNT_TOKENS_BY is clock.COUNT_TOKENS_BY == ("shape", "loss_mask")
    assert curriculum_run._reader is config.load_config


def test_the_deepspeed_view_strips_seqwarm_blocks_without_touching_the_input():
    """One function for every backend; the user's dict (nested data_efficiency included) is not changed."""
    from seqwarm.config.reader import without_seqwarm_blocks
    from seqwarm.integrations.hf.trainer import trainer_deepspeed_config

    raw = {
        "train_batch_size": 8,
        "seqwarm": {"train_tokens": 10},
        "curriculum_learning": {"enabled": True},
        "scheduler": {"type": "WarmupLR"},
        "zero_optimization": {"stage": 2},
        "data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "curriculum_learning": {}}},
    }
    before = json.dumps(raw, sort_keys=True)
    ds = without_seqwarm_blocks(raw)
    assert sorted(ds) == ["data_efficiency", "scheduler", "train_batch_size", "zero_optimization"]
    assert ds["data_efficiency"]["data_sampling"] == {"enabled": True}
    assert "scheduler" not in trainer_deepspeed_config(raw)
    assert json.dumps(raw, sort_keys=True) == before


def test_compile_is_a_config_key_the_flags_override(tmp_path, capsys):
    """``"seqwarm": {"compile": true}`` turns torch.compile on; --compile / --no-compile win over the file."""
    from seqwarm.cli import build_parser
    from seqwarm.cli.commands.common import overrides_from_args
    from seqwarm.run.command import settings_argv

    base = {"train_batch_size": 8}
    assert load_config(base).compile is False
    on = {**base, "seqwarm": {"compile": True}}
    assert load_config(on).compile is True
    parser = build_parser()
    for argv, want in (([], None), (["--compile"], True), (["--no-compile"], False)):
        overrides = overrides_from_args(parser.parse_args(["train", *argv]))
        assert overrides.get("compile") is want, argv
        assert settings_argv(overrides) == argv  # the command an experiment writes out says the same
    assert load_config(on, overrides={"compile": False}).compile is False
    assert load_config(base, overrides={"compile": True}).compile is True
    path = tmp_path / "c.json"
    path.write_text(json.dumps(on))
    assert main(["check-config", str(path)]) == 0
    assert "compile:     torch.compile" in capsys.readouterr().out
    path.write_text(json.dumps({**base, "seqwarm": {"compile": "yes"}}))
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "seqwarm.compile" in err and "true or false" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="--compile"):
        load_config(base, overrides={"compile": 1})
