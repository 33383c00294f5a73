"""The top-level API: what ``dir(seqwarm)`` lists, the LR names a plain loop needs, the 0.1 names that still
work with a warning naming their replacement, the version written once, and the DeepSpeed-config reader
the curriculum gets from ``seqwarm.config`` (the one dependency inversion of docs/ARCHITECTURE.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import seqwarm
from seqwarm.curriculum import clock, inputs, modes, run, warmup
from seqwarm.util.version import __version__

ROOT = Path(__file__).resolve().parents[2]
BLOCK = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": 64,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
}


def test_dir_lists_every_public_name_the_lazy_ones_too():
    names = dir(seqwarm)
    assert "SequenceLengthWarmup" in names and "CurriculumLRScheduler" in names and "set_lr" in names
    assert set(seqwarm.__all__) <= set(names)
    assert "stop_reason" not in names  # deprecated names are not advertised
    for name in seqwarm.__all__:
        assert getattr(seqwarm, name) is not None


def test_set_lr_and_the_lr_scheduler_from_the_top_level():
    from seqwarm.curriculum.lr_scheduler import CurriculumLRScheduler
    from seqwarm.integrations import hf
    from seqwarm.integrations.hf import trainer

    assert seqwarm.CurriculumLRScheduler is CurriculumLRScheduler is hf.CurriculumLRScheduler
    assert trainer.CurriculumLRScheduler is CurriculumLRScheduler and seqwarm.set_lr is inputs.set_lr
    slw = seqwarm.SequenceLengthWarmup(min_length=8, max_length=64, steps=4, lr=seqwarm.LRConfig(lr=0.5))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr_scale": 0.1}], lr=1.0)
    scheduler = seqwarm.CurriculumLRScheduler(opt, slw)
    slw.begin_step()
    slw.cut({"input_ids": torch.zeros(2, 64, dtype=torch.long)})
    scheduler.step(slw.step_progress())
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.05])
    seqwarm.set_lr(opt, 0.2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.02])


def test_seqwarm_stop_reason_works_and_names_its_replacement():
    limits = warmup.Limits(train_iters=3)
    with pytest.warns(DeprecationWarning, match=r"use seqwarm\.curriculum\.clock\.stop_reason"):
        reason = seqwarm.stop_reason(clock.Progress(step=3), limits)
    assert reason == clock.stop_reason(clock.Progress(step=3), limits) and "train_iters" in reason
    with pytest.warns(DeprecationWarning):
        assert seqwarm.stop_reason(clock.Progress(step=2), limits) is None


@pytest.mark.parametrize(
    "name, instead",
    [
        ("advance", "seqwarm.curriculum.clock.advance"),
        ("should_stop", "seqwarm.curriculum.clock.should_stop"),
        ("tokens_per_step", "seqwarm.curriculum.clock.tokens_per_step"),
        ("count_tokens", "seqwarm.curriculum.batch.count_tokens"),
        ("CurriculumConfig", "seqwarm.config.CurriculumConfig"),
        ("FP16Config", "seqwarm.config.FP16Config"),
        ("OptimizerConfig", "seqwarm.config.OptimizerConfig"),
        ("Plan", "seqwarm.curriculum.plan.Plan"),
        ("SeqwarmError", "seqwarm.util.errors.SeqwarmError"),
    ],
)
def test_the_other_0_1_facade_names_work_and_name_their_replacement(name, instead):
    """Names ``seqwarm`` exported in 0.1 and stopped exporting (cfb92fb) without a word."""
    import importlib

    with pytest.warns(DeprecationWarning, match=rf"seqwarm\.{name} is deprecated; use {re.escape(instead)}$"):
        value = getattr(seqwarm, name)
    module, attribute = instead.rsplit(".", 1)
    assert value is getattr(importlib.import_module(module), attribute)
    assert name not in dir(seqwarm)


@pytest.mark.parametrize(
    "name, module, instead",
    [
        ("SequenceLengthWarmup", warmup, "seqwarm.SequenceLengthWarmup"),
        ("Limits", warmup, "seqwarm.curriculum.warmup.Limits"),
        ("as_run_config", run, "seqwarm.curriculum.run.as_run_config"),
        ("check_state_format", inputs, "seqwarm.curriculum.inputs.check_state_format"),
        ("set_lr", inputs, "seqwarm.set_lr"),
        ("output_length", modes, "seqwarm.curriculum.modes.output_length"),
        ("resolve_mode", modes, "seqwarm.curriculum.modes.resolve_mode"),
    ],
)
def test_the_seqwarm_core_module_works_and_names_each_replacement(name, module, instead):
    import seqwarm.core

    with pytest.warns(DeprecationWarning, match=rf"seqwarm\.core is deprecated; use {re.escape(instead)}$"):
        value = getattr(seqwarm.core, name)
    assert value is getattr(module, name)


def test_the_0_1_import_of_the_curriculum_object_still_trains():
    with pytest.warns(DeprecationWarning, match="use seqwarm.SequenceLengthWarmup"):
        from seqwarm.core import SequenceLengthWarmup
    slw = SequenceLengthWarmup(min_length=8, max_length=64, steps=4)
    assert slw.begin_step() == 16  # step 1 of 4 from 8 to 64, a multiple of 8
    assert slw.cut({"input_ids": torch.zeros(2, 64, dtype=torch.long)})["input_ids"].shape == (2, 16)
    assert slw.end_step().tokens == 32
    with pytest.raises(AttributeError, match="no attribute 'CurriculumCore'"):
        seqwarm.core.CurriculumCore  # noqa: B018 - gone before 0.1 was cut: not restored


def test_the_version_is_written_once_and_named_by_the_changelog():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert re.search(r'^version = \{attr = "seqwarm\.util\.version\.__version__"\}', pyproject, re.M)
    assert not re.search(r'^version = "', pyproject, re.M)  # no second copy to drift
    assert seqwarm.__version__ == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\d+\.\d+\.\d+)", changelog, re.M)
    assert newest and newest.group(1) == __version__


def test_a_fresh_interpreter_that_imports_only_the_curriculum_reads_deepspeed_configs(tmp_path):
    """The curriculum imports nothing from seqwarm.config; the reader it calls is registered when Python runs
    seqwarm/__init__.py, which it does before any seqwarm submodule: from_deepspeed works without
    importing seqwarm.config by hand, from a dict and from a path."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 4, "curriculum_learning": BLOCK}))
    code = (
        "from seqwarm.curriculum.warmup import SequenceLengthWarmup\n"
        "import json, sys\n"
        f"raw = {{'train_batch_size': 4, 'curriculum_learning': {BLOCK!r}}}\n"
        "a = SequenceLengthWarmup.from_deepspeed(raw)\n"
        "b = SequenceLengthWarmup.from_deepspeed(sys.argv[1])\n"
        "print(json.dumps([a.curriculum.max_difficulty, b.begin_step(), 'seqwarm.config' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [64, 8, True]


def test_as_run_config_refuses_what_is_not_a_config():
    with pytest.raises(TypeError, match="a RunConfig, a dict or a path"):
        run.as_run_config(42, world_size=1)
    cfg = seqwarm.load_config({"train_batch_size": 4, "curriculum_learning": BLOCK})
    assert run.as_run_config(cfg, world_size=1) is cfg and isinstance(cfg, run.WarmupSettings)
