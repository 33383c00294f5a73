"""Trackers: DeepSpeed's tensorboard / wandb / csv_monitor blocks and flags, Megatron-DeepSpeed's tag names,
one warning for a tracker asked for and not installed. W&B runs offline (WANDB_MODE=offline)."""

from __future__ import annotations

import builtins
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import tiny_run, wandb_summary
from seqwarm.trainer.metrics import MetricsWriter
from seqwarm.trainer.trackers import STAGE_TAGS, TrackerConfig, open_trackers, scalars, tracker_config

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


def test_the_tools_own_environment_variables_win_over_seqwarms_defaults(tmp_path, monkeypatch):
    """WANDB_DIR / WANDB_PROJECT / WANDB_NAME: the offline W&B run goes where W&B is told, under that
    project and name, and the run folder still keeps the W&B run id (a resume continues the W&B run);
    TENSORBOARD_LOGGING_DIR replaces RUN/tensorboard. A flag or a config block still wins over them."""
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install 'seqwarm[wandb]'")
    from seqwarm.trainer.trackers import WANDB_ID_FILE

    for name in ("WANDB_PROJECT", "WANDB_NAME", "WANDB_DIR", "TENSORBOARD_LOGGING_DIR", "AIP_TENSORBOARD_LOG_DIR"):
        monkeypatch.delenv(name, raising=False)
    run, elsewhere = tmp_path / "run", tmp_path / "wandb-home"
    run.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(elsewhere))
    monkeypatch.setenv("WANDB_PROJECT", "their-project")
    monkeypatch.setenv("WANDB_NAME", "their-name")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    import wandb

    wandb.teardown()  # W&B reads its variables once per process, when set up: as a new process would
    cfg = tracker_config({"wandb": {"enabled": True}}, run)
    assert cfg.tensorboard_dir == tmp_path / "tb"
    assert cfg.wandb["dir"] is None and cfg.wandb["project"] is None and cfg.wandb["name"] is None
    [wb] = [t for t in open_trackers(replace(cfg, tensorboard_dir=None)) if type(t).__name__ == "_Wandb"]
    assert (wb.run.project, wb.run.name) == ("their-project", "their-name")
    assert wb.run.id == (run / WANDB_ID_FILE).read_text().strip()
    wb.log(TRAIN)
    wb.close(None)
    wandb.teardown()  # the next test's W&B reads its own variables
    assert not (run / "wandb").exists() and list((elsewhere / "wandb").glob("offline-run-*"))
    # flags and config blocks are the user's too, and win
    given = tracker_config(
        {"wandb": {"enabled": True, "project": "block"}, "tensorboard": {"enabled": True, "output_path": "o"}},
        run,
        wandb_run_name="flag",
    )
    assert (given.wandb["project"], given.wandb["name"], given.tensorboard_dir) == ("block", "flag", Path("o"))
    assert tracker_config({}, run, tensorboard_dir=tmp_path / "x").tensorboard_dir == tmp_path / "x"


def test_tensorboard_gets_every_steps_own_point_with_megatron_deepspeeds_tags(tmp_path, byte_data):
    """--log-interval 4 over 6 steps: the console rows come at steps 1, 4 and 6 (averaged over their
    window), TensorBoard gets a point at every step, each step's own loss, under the full tag list; with
    --log-optimizer-states-to-tensorboard, Megatron-DeepSpeed's optimizer/* tags against steps and tokens."""
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install 'seqwarm[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import small_config
    from seqwarm.trainer.metrics import read_metrics
    from seqwarm.trainer.trackers import OPTIMIZER_STATE_TAGS

    cfg = small_config(tmp_path / "c.json", train_tokens=6 * 8 * 64, train_iters=6)
    run = tmp_path / "run"
    tiny_run(run, byte_data, cfg, tensorboard=True, log_interval=4, log_optimizer_states_to_tensorboard=True).train()
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    steps = [r["step"] for r in rows]
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    per_step = [
        "lm-loss-training/lm loss",
        "learning-rate/learning-rate",
        "seqlen/curriculum_seqlen",
        "seqlen/actual_seq_length",
        "batch-size/batch-size",
        "loss-scale/loss-scale",
        "iteration-time/iteration-time",
        "steps-vs-tokens/y=tokens,x=steps",
    ]
    last = steps[-1]
    for tag in per_step + list(OPTIMIZER_STATE_TAGS):
        assert tag in tags, tag
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, last + 1)), tag
    tokens = [int(e.value) for e in acc.Scalars("steps-vs-tokens/y=tokens,x=steps")]
    for tag in [t + " vs tokens" for t in per_step[:-1]] + [t + " vs tokens" for t in OPTIMIZER_STATE_TAGS]:
        assert [e.step for e in acc.Scalars(tag)] == tokens, tag
    assert "grad-norm/grad-norm" in tags  # from the --log-interval rows
    assert steps == [1, 4, last] and last >= 5
    losses = {e.step: e.value for e in acc.Scalars("lm-loss-training/lm loss")}
    assert losses[1] == pytest.approx(rows[0]["loss"])  # a window of one step
    window = [losses[s] for s in range(2, 5)]  # the row of step 4 averages steps 2..4
    assert rows[1]["loss"] == pytest.approx(sum(window) / 3, rel=1e-5)
    assert len(set(window)) > 1  # each step's own loss, not the window's mean
    seqlens = {e.step: e.value for e in acc.Scalars("seqlen/actual_seq_length")}
    assert seqlens[1] == rows[0]["seqlen"] and seqlens[last] == rows[-1]["seqlen"]
    assert {e.value for e in acc.Scalars("batch-size/batch-size")} == {8.0}


def test_optimizer_states_are_megatron_deepspeeds_norms_over_every_parameter():
    import math

    import torch

    from seqwarm.trainer.metrics import optimizer_states

    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=0.1)
    assert optimizer_states(opt) == {}  # no Adam state before the first step
    ((a * 2).sum() + (b**3).sum()).backward()
    opt.step()
    got = optimizer_states(opt)
    v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for p in (a, b)]).double()
    m = torch.cat([opt.state[p]["exp_avg"].flatten() for p in (a, b)]).double()
    w = torch.cat([p.detach().flatten() for p in (a, b)]).double()
    for name, t in (("variance", v), ("variance_sqrt", v.sqrt()), ("momentum", m), ("weight", w)):
        assert got[f"optimizer/{name}_l2"] == pytest.approx(float(t.norm()), rel=1e-6)
        assert got[f"optimizer/{name}_l1"] == pytest.approx(float(t.abs().sum()), rel=1e-6)
        assert got[f"optimizer/{name}_abs_max"] == pytest.approx(float(t.abs().max()), rel=1e-6)
    assert len(got) == 12 and all(math.isfinite(x) for x in got.values())


@pytest.mark.parametrize("interval", [0, 1])
def test_the_log_interval_row_gives_the_trackers_what_the_points_do_not(tmp_path, interval):
    """--tensorboard-log-interval 0: the --log-interval row (its window's mean loss) is the trackers' only
    point; otherwise the points carry the loss and the row adds only its grad norm and tokens/s."""
    from seqwarm.trainer.metrics import MetricsLogger

    log = MetricsLogger(
        tmp_path,
        budget_tokens=None,
        is_main=True,
        log_interval=2,
        progress_bar=False,
        tensorboard=False,
        trackers=TrackerConfig(csv_dir=tmp_path / "csv"),
        point_interval=interval,
    )
    log.open(0)
    for step, loss in ((1, 5.0), (2, 3.0)):
        log.step(step * 100, 100, loss, 0.1)
        if interval:
            log.point({"step": step, "samples": 8 * step, "tokens": 100 * step, "seqlen": 8, "lr": 1e-3, "loss": loss})
    log.train_row({"step": 2, "tokens": 200, "samples": 16, "seqlen": 8, "lr": 1e-3}, {"grad_norm": 0.5}, None)
    log.close()
    loss_csv = (tmp_path / "csv" / "lm-loss-training_lm_loss.csv").read_text().splitlines()[1:]
    grad_csv = (tmp_path / "csv" / "grad-norm_grad-norm.csv").read_text().splitlines()[1:]
    assert loss_csv == (["1,5.0", "2,3.0"] if interval else ["2,4.0"])
    assert grad_csv == ["2,0.5"]
    assert '"loss": 4.0' in (tmp_path / "metrics.jsonl").read_text()  # the file keeps the window's row


STAGE_ROWS = [
    {"kind": "stage", "step": 5, "tokens": 1280, "stage": 1, "seqlen": 48, "reason": "begins"}
    | {"rope_theta": 40000.0, "rope_scaling": None},
    {"kind": "stage", "step": 9, "tokens": 2800, "stage": 2, "seqlen": 64, "reason": "begins"}
    | {"rope_theta": 40000.0, "rope_scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 48}},
]


def test_a_stage_row_gets_its_own_tags_at_the_step_it_begins_and_nothing_else():
    assert list(scalars(STAGE_ROWS[0])) == [
        ("train/stage", 1.0, 5),
        ("train/rope_theta", 40000.0, 5),
        ("train/rope_scaling_factor", 1.0, 5),  # θ set, no scaling
    ]
    assert {tag: value for tag, value, _ in scalars(STAGE_ROWS[1])}["train/rope_scaling_factor"] == 2.0
    # a stage with a length only: its number (its tokens are before the step, not the train row's after it)
    length_only = {"kind": "stage", "step": 7, "tokens": 900, "stage": 1, "seqlen": 64, "reason": "resumed"}
    assert list(scalars(length_only | {"rope_theta": None, "rope_scaling": None})) == [("train/stage", 1.0, 7)]


def test_tensorboard_and_wandb_get_the_stage_tags(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install 'seqwarm[tensorboard]'")
    pytest.importorskip("wandb", reason="W&B is an optional extra: pip install 'seqwarm[wandb]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tracker_config({"wandb": {"enabled": True, "project": "p"}}, tmp_path, tensorboard_dir=tmp_path / "tb")
    writer = MetricsWriter(tmp_path, trackers=cfg)
    for row in STAGE_ROWS:
        writer.write(row)
    writer.write(TRAIN | {"step": 9, "tokens": 3300})  # the stage's first step: the tokens after it
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in STAGE_TAGS.values()}
    assert got == {
        "train/stage": [(5, 1.0), (9, 2.0)],
        "train/rope_theta": [(5, 40000.0), (9, 40000.0)],
        "train/rope_scaling_factor": [(5, 1.0), (9, 2.0)],
    }
    assert [(e.step, e.value) for e in acc.Scalars("progress/tokens")] == [(9, 3300.0)]
    summary = wandb_summary(tmp_path)
    assert summary["train/stage"] == 2 and summary["train/rope_scaling_factor"] == 2.0
    assert summary["progress/tokens"] == 3300
