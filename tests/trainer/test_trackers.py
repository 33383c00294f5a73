"""Trackers: DeepSpeed's tensorboard / wandb / csv_monitor blocks and flags, Megatron-DeepSpeed's tag names,
one warning for a tracker asked for and not installed. W&B runs offline (WANDB_MODE=offline)."""

from __future__ import annotations

import builtins
import logging

import pytest

from helpers import wandb_summary
from seqwarm.trainer.metrics import MetricsWriter
from seqwarm.trainer.trackers import TrackerConfig, open_trackers, scalars, tracker_config

TRAIN = {
    "kind": "train",
    "step": 3,
    "tokens": 1536,
    "samples": 24,
    "seqlen": 64,
    "lr": 1e-3,
    "loss": 4.5,
    "grad_norm": 0.7,
    "tokens_per_s": 100.0,
}
EVAL = {"kind": "eval", "step": 3, "tokens": 1536, "samples": 24, "val_loss": 4.9, "val_ppl": 134.0, "seqlen": 128}


def test_rows_get_seqwarm_and_megatron_deepspeed_tags_against_steps_samples_and_tokens():
    tags = {tag: (value, x) for tag, value, x in scalars(TRAIN)}
    assert tags["train/loss"] == (4.5, 3) and tags["curriculum/seqlen"] == (64.0, 3)
    assert tags["lm-loss-training/lm loss"] == (4.5, 3)
    assert tags["lm-loss-training/lm loss vs samples"] == (4.5, 24)
    assert tags["lm-loss-training/lm loss vs tokens"] == (4.5, 1536)
    assert tags["seqlen/curriculum_seqlen vs tokens"] == (64.0, 1536)
    assert tags["learning-rate/learning-rate vs samples"] == (1e-3, 24)
    assert tags["steps-vs-tokens/y=tokens,x=steps"] == (1536.0, 3)
    val = {tag: (value, x) for tag, value, x in scalars(EVAL)}
    assert val["lm-loss-validation/lm loss validation vs tokens"] == (4.9, 1536)
    assert val["lm-loss-validation/lm loss validation ppl"] == (134.0, 3)


def test_deepspeed_blocks_choose_the_trackers(tmp_path):
    run = tmp_path / "run"
    assert tracker_config({}, run) == TrackerConfig(tensorboard_dir=run / "tensorboard")
    assert tracker_config({}, run, tensorboard=False) == TrackerConfig()
    ds = {
        "tensorboard": {"enabled": True, "output_path": str(tmp_path / "tb"), "job_name": "job"},
        "wandb": {"enabled": True, "project": "proj", "group": "g", "team": "t"},
        "csv_monitor": {"enabled": True, "output_path": str(tmp_path / "csv"), "job_name": "job"},
    }
    got = tracker_config(ds, run)
    assert got.tensorboard_dir == tmp_path / "tb" / "job" and got.tensorboard_asked
    assert got.csv_dir == tmp_path / "csv" / "job"
    assert got.wandb == {"project": "proj", "name": "run", "group": "g", "entity": "t", "dir": str(run)}
    flags = tracker_config(ds, run, wandb_project="mine", wandb_run_name="r1", tensorboard_dir=tmp_path / "x")
    assert (flags.wandb["project"], flags.wandb["name"], flags.tensorboard_dir) == ("mine", "r1", tmp_path / "x")
    off = {name: {**block, "enabled": False} for name, block in ds.items()}
    assert tracker_config(off, run, tensorboard=False) == TrackerConfig()


def test_describe_says_who_logs_the_monitor_blocks():
    from seqwarm.config import load_config
    from seqwarm.config.defaults import default_train_config
    from seqwarm.config.describe import describe

    raw = {
        **default_train_config(),
        "wandb": {"enabled": True},
        "tensorboard": {"enabled": False},
        "steps_per_print": 10,
    }
    lines = describe(load_config(raw))
    assert any(line.startswith("trackers:    wandb (logged by seqwarm") for line in lines)
    assert any(line.startswith("for DeepSpeed: steps_per_print (") for line in lines)


def test_csv_monitor_writes_one_file_per_tag(tmp_path):
    writer = MetricsWriter(tmp_path, trackers=TrackerConfig(csv_dir=tmp_path / "csv"))
    writer.write(TRAIN)
    writer.write({**TRAIN, "step": 4, "tokens": 2048, "samples": 32, "loss": 4.0})
    writer.close()
    lines = (tmp_path / "csv" / "lm-loss-training_lm_loss_vs_tokens.csv").read_text().splitlines()
    assert lines == ["step,lm-loss-training/lm loss vs tokens", "1536,4.5", "2048,4.0"]
    assert (tmp_path / "csv" / "train_loss.csv").exists()


def _hide(monkeypatch, name):
    real = builtins.__import__

    def fake(mod, *args, **kwargs):
        if mod == name or mod.startswith(name + "."):
            raise ImportError(f"No module named {name!r}")
        return real(mod, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_a_tracker_asked_for_and_missing_warns_once_naming_the_extra(tmp_path, monkeypatch, caplog):
    _hide(monkeypatch, "wandb")
    with caplog.at_level(logging.WARNING):
        assert open_trackers(TrackerConfig(wandb={"project": "p"})) == []
    assert [r.getMessage() for r in caplog.records if "seqwarm[wandb]" in r.getMessage()] != []
    assert len(caplog.records) == 1
    _hide(monkeypatch, "torch.utils.tensorboard")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        open_trackers(TrackerConfig(tensorboard_dir=tmp_path / "tb"))  # the default: not asked for
        assert not caplog.records
        open_trackers(TrackerConfig(tensorboard_dir=tmp_path / "tb", tensorboard_asked=True))
    assert len(caplog.records) == 1 and "seqwarm[tensorboard]" in caplog.records[0].getMessage()


def test_tensorboard_gets_both_tag_sets(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install 'seqwarm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    writer = MetricsWriter(tmp_path, trackers=TrackerConfig(tensorboard_dir=tmp_path / "tb"))
    writer.write(TRAIN)
    writer.write(EVAL)
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {
        "train/loss",
        "seqlen/curriculum_seqlen",
        "seqlen/curriculum_seqlen vs tokens",
        "lm-loss-validation/lm loss validation vs samples",
    } <= set(tags)
    assert [e.step for e in acc.Scalars("lm-loss-training/lm loss vs tokens")] == [1536]


def test_wandb_offline_run_holds_the_numbers(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install 'seqwarm[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tracker_config({"wandb": {"enabled": True, "project": "p"}}, tmp_path, tensorboard=False)
    writer = MetricsWriter(tmp_path, trackers=cfg)
    writer.write(TRAIN)
    writer.write(EVAL)
    writer.close({"final_val_loss": 4.9, "tokens": 1536, "curriculum": {"not": "a scalar"}})
    summary = wandb_summary(tmp_path)
    assert summary["curriculum/seqlen"] == 64 and summary["seqlen/curriculum_seqlen"] == 64
    assert summary["train/loss"] == 4.5 and summary["val/loss"] == 4.9
    assert summary["lm-loss-validation/lm loss validation"] == 4.9
    assert summary["final_val_loss"] == 4.9 and summary["tokens"] == 1536 and "curriculum" not in summary


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install 'seqwarm[wandb]'")
    from seqwarm.trainer.trackers import WANDB_ID_FILE

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    ids = []
    for run_dir in (tmp_path / "a", tmp_path / "a", tmp_path / "b"):  # started, resumed; another run
        run_dir.mkdir(exist_ok=True)
        writer = MetricsWriter(
            run_dir, trackers=tracker_config({"wandb": {"enabled": True}}, run_dir, tensorboard=False)
        )
        writer.write(TRAIN)
        writer.close(None)
        ids.append((run_dir / WANDB_ID_FILE).read_text().strip())
    assert ids[0] == ids[1] != ids[2] and len(ids[0]) == 12
    offline = sorted(p.name for p in (tmp_path / "a" / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(f"-{ids[0]}" in name for name in offline)  # `wandb sync` joins them
    # a run that starts again from step 1 forgets its id; an id the user sets (WANDB_RUN_ID) wins
    from seqwarm.trainer.trackers import forget_wandb_run, wandb_run_id

    forget_wandb_run(tmp_path / "a")
    assert wandb_run_id(tmp_path / "a") not in ids
    import wandb

    class FakeRun:
        def define_metric(self, *a, **k):
            pass

    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or FakeRun())
    monkeypatch.setenv("WANDB_RUN_ID", "mine12345678")  # read by wandb itself
    (tmp_path / "c").mkdir()
    open_trackers(tracker_config({"wandb": {"enabled": True}}, tmp_path / "c", tensorboard=False))
    assert "id" not in calls[0] and "resume" not in calls[0] and not (tmp_path / "c" / WANDB_ID_FILE).exists()
    monkeypatch.delenv("WANDB_RUN_ID")
    open_trackers(tracker_config({"wandb": {"enabled": True}}, tmp_path / "c", tensorboard=False))
    assert calls[1]["id"] == (tmp_path / "c" / WANDB_ID_FILE).read_text().strip() and calls[1]["resume"] == "allow"
