"""The Python entry point (RunSpec + run_training) and the `seqwarm train` flags generated from it.

The slow, end-to-end tests of this file are in tests/e2e/test_spec_runs.py.
"""

import ast
import json
from dataclasses import fields, replace
from pathlib import Path

import pytest

from conftest import small_config
from seqwarm.run.command import command_line, train_argv
from seqwarm.run.spec import RunSpec, with_changes
from seqwarm.run.training import run_training
from seqwarm.util.problems import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "seqwarm"

# `seqwarm train`'s flags, listed before the CLI was generated from RunSpec: (flag, default, --help group).
TRAIN_FLAGS = [
    ("--config", None, "options"),
    ("--data", None, "options"),
    ("--data-path", (), "options"),
    ("--split", "969,30,1", "options"),
    ("--split-rounding", "megatron-deepspeed", "options"),
    ("--tokenizer", None, "options"),
    ("--vocab-size", None, "options"),
    ("--eod-id", None, "options"),
    ("--model", "tiny", "options"),
    ("--n-layer", None, "options"),
    ("--n-head", None, "options"),
    ("--n-embd", None, "options"),  # issue #17
    ("--rotary", False, "options"),
    ("--rotary-percent", 1.0, "options"),
    ("--init-method-std", None, "options"),
    ("--fsdp", False, "options"),
    ("--deepspeed", False, "DeepSpeed"),
    ("--pipeline-stages", 0, "DeepSpeed"),
    ("--local-rank", None, "DeepSpeed"),
    ("--train-tokens", None, "budget"),
    ("--train-iters", None, "budget"),
    ("--train-samples", None, "budget"),
    ("--megatron", False, "learning rate"),  # issue #24
    ("--no-megatron", False, "learning rate"),
    ("--lr", None, "learning rate"),
    ("--min-lr", None, "learning rate"),
    ("--lr-decay-style", None, "learning rate"),
    ("--lr-decay-tokens", None, "learning rate"),
    ("--lr-decay-iters", None, "learning rate"),
    ("--lr-decay-samples", None, "learning rate"),
    ("--lr-warmup-iters", None, "learning rate"),
    ("--lr-warmup-samples", None, "learning rate"),
    ("--lr-warmup-tokens", None, "learning rate"),
    ("--seq-length", None, "batch"),
    ("--micro-batch-size", None, "batch"),
    ("--global-batch-size", None, "batch"),
    ("--gradient-accumulation-steps", None, "batch"),
    ("--rampup-batch-size", None, "batch"),
    ("--curriculum-mode", None, "batch"),
    ("--variable-curriculum", None, "batch"),  # issue #37
    ("--variable-cycles", None, "batch"),
    ("--count-tokens-by", None, "batch"),
    ("--stages", None, "batch"),  # issue #36
    ("--no-curriculum", False, "batch"),
    ("--document-masking", False, "batch"),  # issue #25
    ("--no-document-masking", False, "batch"),
    ("--weight-decay", None, "optimizer"),
    ("--clip-grad", None, "optimizer"),
    ("--adam-beta1", None, "optimizer"),
    ("--adam-beta2", None, "optimizer"),
    ("--adam-eps", None, "optimizer"),
    ("--precision", None, "optimizer"),
    ("--fp16", False, "optimizer"),
    ("--bf16", False, "optimizer"),
    ("--compile", False, "performance"),
    ("--no-compile", False, "performance"),  # a config key too since #14
    ("--length-bucket", None, "performance"),
    ("--peak-tflops", None, "performance"),  # issue #38
    ("--out", None, "run"),
    ("--resume", False, "run"),  # or --resume auto (issue #29)
    ("--start-over", False, "run"),  # issue #28
    ("--allow-config-change", False, "run"),
    ("--seed", 1234, "run"),
    ("--device", "auto", "run"),
    ("--eval-interval", 50, "run"),
    ("--eval-iters", 8, "run"),
    ("--save-interval", 100, "run"),
    ("--keep-checkpoints", 3, "run"),
    ("--exit-duration-in-mins", None, "run"),  # issue #26
    ("--dist-timeout-s", None, "run"),  # issue #26
    ("--log-interval", 10, "run"),
    ("--no-progress", False, "run"),
    ("--eval-wikitext", None, "run"),
    ("--eval-lambada", None, "run"),
    ("--no-tensorboard", False, "run"),
    ("--tensorboard-dir", None, "run"),
    ("--tensorboard-log-interval", 1, "run"),
    ("--log-optimizer-states-to-tensorboard", False, "run"),
    ("--wandb-project", None, "run"),
    ("--wandb-run-name", None, "run"),
]


def _train_parser():
    from seqwarm.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["train"]


def test_train_flags_are_unchanged_and_all_have_help():
    parser = _train_parser()
    found = []
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.dest == "help":
                continue
            flag = action.option_strings[0]  # the others are aliases (Megatron's and launchers' spellings)
            switch = action.nargs == 0
            default = (action.default is False) != (action.const is False) if switch else action.default
            found.append((flag, False if switch else default, group.title))
            assert action.help, f"{flag} has no --help text"
    assert [f for f, _, _ in found] == [f for f, _, _ in TRAIN_FLAGS]
    for (flag, default, group), (_, was, title) in zip(found, TRAIN_FLAGS):
        assert default == was, flag
        assert group.startswith(title), (flag, group)


def test_argv_round_trip_through_the_cli():
    from seqwarm.cli import build_parser
    from seqwarm.cli.commands.spec_flags import spec_from_args

    spec = RunSpec(
        config=Path("c.json"),
        model="gpt2-124m",
        rotary=True,
        seed=7,
        progress_bar=False,
        settings={"train_tokens": 2_000_000, "lr": 0.001, "curriculum": False},
        out=Path("runs/x"),
        eval_interval=5,
    )
    argv = train_argv(spec)
    assert argv[:4] == ["--config", "c.json", "--model", "gpt2-124m"] and "--no-progress" in argv
    assert spec_from_args(build_parser().parse_args(["train", *argv])) == spec
    assert train_argv(RunSpec()) == [] and command_line(RunSpec(seed=3)) == "seqwarm train --seed 3"
    changed = with_changes(spec, lr=None, train_batch_size=16, seed=8)
    assert "lr" not in changed.settings and changed.settings["train_batch_size"] == 16 and changed.seed == 8
    with pytest.raises(KeyError):
        with_changes(spec, no_such_thing=1)


def test_every_spec_field_has_a_docstring():
    from seqwarm.cli.commands.spec_flags import field_docs

    docs = field_docs(RunSpec)
    assert [f.name for f in fields(RunSpec)] == list(docs)


def test_run_policy_problems_are_reported_together(tmp_path, byte_data):
    raw = json.loads(small_config(tmp_path / "c.json").read_text())
    raw["curriculum_learning"]["schedule_type"] = "custom"
    raw["curriculum_learning"].pop("schedule_config")
    for key in ("train_tokens", "lr_decay_style", "min_lr"):
        del raw["seqwarm"][key]
    (tmp_path / "c.json").write_text(json.dumps(raw))
    spec = RunSpec(
        config=tmp_path / "c.json", data=byte_data, out=tmp_path / "r", settings={"rampup_batch_size": [4, 4, 100]}
    )
    with pytest.raises(ConfigError) as err:
        run_training(spec)
    paths = [p.path for p in err.value.problems]
    assert len(paths) == 3 and "curriculum_learning.schedule_type" in paths, paths
    assert "cannot be combined with a sequence-length curriculum" in str(err.value) and "no budget" in str(err.value)
    assert not (tmp_path / "r").exists()


def test_only_the_cli_layer_imports_argparse_or_commands():
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert name != "argparse" and not name.startswith("seqwarm.cli.commands"), f"{rel} imports {name}"


def test_compile_from_the_config_is_refused_for_deepspeed_and_hf_models(tmp_path, byte_data):
    from seqwarm.run.spec import resolve_config

    raw = json.loads(small_config(tmp_path / "c.json").read_text())
    raw["seqwarm"]["compile"] = True
    (tmp_path / "c.json").write_text(json.dumps(raw))
    spec = RunSpec(config=tmp_path / "c.json", data=byte_data)
    assert resolve_config(spec).compile is True
    assert resolve_config(with_changes(spec, compile=False)).compile is False  # --no-compile
    with pytest.raises(ConfigError, match="own GPT") as err:
        resolve_config(replace(spec, deepspeed=True))
    assert "--no-compile" in str(err.value)


def test_curriculum_mode_variable_is_refused_on_deepspeed_and_hf_models_when_the_config_is_resolved(tmp_path):
    # train refuses it only once the engine is built: a compare / sweep arm would fail after the other arms
    # trained, and check_arms (which resolves each arm's config) must see it first
    from seqwarm.run.spec import resolve_config

    spec = with_changes(RunSpec(config=small_config(tmp_path / "c.json")), curriculum_mode="variable")
    assert resolve_config(spec).curriculum.mode == "variable"
    for changed in (replace(spec, deepspeed=True), replace(spec, model="hf:some/model")):
        with pytest.raises(ConfigError, match="curriculum mode variable trains seqwarm's GPT") as err:
            resolve_config(changed)
        assert "truncate" in str(err.value)
    truncate = with_changes(replace(spec, deepspeed=True), curriculum_mode="truncate")
    assert resolve_config(truncate).curriculum.mode == "truncate"
