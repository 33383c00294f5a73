"""The record of a run folder, without training: history.jsonl, what proves a run wrote checkpoints, the
old record moved aside, the settings a resume changes (old and new values), metrics lines that are not
rows, each (kind, step) row written once, and ``--resume auto`` / ``--start-over`` as flags.

The end-to-end runs are in tests/e2e/test_run_record.py."""

import json

import pytest

from seqwarm.cli import build_parser
from seqwarm.cli.commands.spec_flags import spec_from_args
from seqwarm.run.command import train_argv
from seqwarm.run.spec import RunSpec, spec_problems
from seqwarm.trainer.history import append_event, checkpoint_evidence, move_aside, read_history
from seqwarm.trainer.metrics import MetricsLogger, metrics_rows, read_metrics, truncate_metrics
from seqwarm.trainer.resume import check_resume_config, config_changes, format_changes
from seqwarm.trainer.run_folder import LOCK_FILE, _folder_problem
from seqwarm.util.errors import UserError


def _rows(path, *rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_history_is_appended_and_read_back(tmp_path):
    append_event(tmp_path, "start", step=0)
    append_event(tmp_path, "checkpoint", step=4)
    with open(tmp_path / "history.jsonl", "a") as fh:
        fh.write('[1, 2]\n{"event": "checkpoint", "st')  # not an event, then a torn line
    assert [(e["event"], e["step"]) for e in read_history(tmp_path)] == [("start", 0), ("checkpoint", 4)]


def test_what_proves_a_run_wrote_checkpoints(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _rows(run / "metrics.jsonl", {"kind": "train", "step": 1}, {"kind": "train", "step": 2})
    append_event(run, "start", step=0)
    assert checkpoint_evidence(run) == []  # killed before its first checkpoint: may start again
    append_event(run, "checkpoint", step=2)
    assert checkpoint_evidence(run) == [
        "history.jsonl (checkpoints written up to step 2)",
        "metrics.jsonl (2 rows, to step 2)",
    ]
    (run / "summary.json").write_text(json.dumps({"steps": 89}))
    assert checkpoint_evidence(run)[0] == "summary.json (a finished run, 89 steps)"


def test_a_folder_from_before_history_shows_its_checkpoints_by_its_rows(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"options": {"save_interval": 2}}))
    _rows(tmp_path / "metrics.jsonl", {"kind": "train", "step": 1}, {"kind": "train", "step": 2})
    assert checkpoint_evidence(tmp_path) == []  # the checkpoint of step 2 may not have been written
    _rows(tmp_path / "metrics.jsonl", {"kind": "train", "step": 2}, {"kind": "train", "step": 3})
    assert checkpoint_evidence(tmp_path) == ["metrics.jsonl (2 rows, to step 3)"]


@pytest.mark.parametrize("damage", ["deleted", "dangling"])
def test_resume_refuses_a_run_whose_checkpoints_are_gone(tmp_path, damage):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps({"steps": 6}))
    if damage == "dangling":
        (run / "checkpoints").symlink_to(tmp_path / "scratch" / "ckpts")
    problem = _folder_problem(run, True, False)
    assert "summary.json (a finished run, 6 steps)" in problem and "--start-over" in problem
    assert ("is a link to" in problem) == (damage == "dangling")
    assert _folder_problem(run, "auto", False) == problem
    assert _folder_problem(run, False, False, start_over=True) is None
    (run / "summary.json").unlink()  # a run killed before its first checkpoint starts again
    assert _folder_problem(run, True, False) is None


def test_resume_auto_starts_a_new_run_only_in_a_folder_without_one(tmp_path):
    assert _folder_problem(tmp_path / "new", "auto", False) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _folder_problem(empty, "auto", False) is None
    assert "holds no run" in _folder_problem(empty, True, False)
    (empty / "notes.txt").write_text("mine")
    assert "holds files but no seqwarm run (notes.txt)" in _folder_problem(empty, "auto", False)
    assert "--start-over" in _folder_problem(empty, False, False)


def test_move_aside_keeps_the_old_record_whole(tmp_path):
    for name in ("config.json", "metrics.jsonl", LOCK_FILE):
        (tmp_path / name).write_text(name)
    (tmp_path / "checkpoints").symlink_to(tmp_path / "gone")
    first = move_aside(tmp_path, keep=(LOCK_FILE,))
    assert first == tmp_path / "previous-1"
    assert sorted(p.name for p in first.iterdir()) == ["checkpoints", "config.json", "metrics.jsonl"]
    assert (first / "checkpoints").is_symlink() and (first / "metrics.jsonl").read_text() == "metrics.jsonl"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE, "previous-1"]
    (tmp_path / "metrics.jsonl").write_text("second")
    assert move_aside(tmp_path, keep=(LOCK_FILE,)) == tmp_path / "previous-2"
    assert move_aside(tmp_path, keep=(LOCK_FILE,)) is None


def _resolved(**run):
    base = {"train_batch_size": 8, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "lr": {"lr": 0.002}}
    base.update(optimizer={"type": "AdamW", "weight_decay": 0.1}, gradient_clipping=1.0, world_size=1, warnings=[])
    base.update(run)
    return {"run": base, "model": {"n_layer": 4}, "data": {"fingerprint": "1b80a26c42" + "0" * 54}}


def test_a_resume_names_each_changed_setting_with_old_and_new_values():
    old = _resolved()
    new = _resolved(optimizer={"type": "AdamW", "weight_decay": 0.05}, gradient_clipping=0.5, lr={"lr": 0.001})
    new["data"] = {"fingerprint": "18d324fd37" + "1" * 54}
    with pytest.raises(UserError) as err:
        check_resume_config("ckpt", old, new)
    message = str(err.value)
    for part in (
        "run.optimizer.weight_decay 0.1 -> 0.05",
        "run.gradient_clipping 1.0 -> 0.5",
        "run.lr.lr 0.002 -> 0.001",
        "training data (fingerprint 1b80a26c42 -> 18d324fd37)",
        "--allow-config-change",
    ):
        assert part in message
    check_resume_config("ckpt", old, new, allow_config_change=True)
    changes = config_changes(old, new)
    assert changes["run.lr.lr"] == [0.002, 0.001] and "run.warnings" not in changes
    assert format_changes({"run.lr.lr": [0.002, 0.001]}) == "run.lr.lr 0.002 -> 0.001"


def test_the_same_global_batch_may_be_split_otherwise():
    """1 process x accumulation 2 -> 2 processes x accumulation 1: the same 8 sequences per step."""
    old = _resolved()
    check_resume_config("ckpt", old, _resolved(gradient_accumulation_steps=1, world_size=2))
    check_resume_config("ckpt", old, _resolved(micro_batch_size=8, gradient_accumulation_steps=1))
    with pytest.raises(UserError, match="run.train_batch_size 8 -> 16"):
        check_resume_config("ckpt", old, _resolved(train_batch_size=16, gradient_accumulation_steps=4))


def test_a_resume_that_turns_document_masking_on_or_off_names_the_change():
    off, on = _resolved(document_masking=False), _resolved(document_masking=True)
    with pytest.raises(UserError, match="run.document_masking false -> true.*--allow-config-change"):
        check_resume_config("ckpt", off, on)
    with pytest.raises(UserError, match="run.document_masking true -> false"):
        check_resume_config("ckpt", on, off)
    check_resume_config("ckpt", off, on, allow_config_change=True)
    assert config_changes(off, on) == {"run.document_masking": [False, True]}  # what the resume prints
    before = _resolved()  # recorded before runs recorded it: masking was off
    check_resume_config("ckpt", before, off)
    assert config_changes(before, off) == {}
    with pytest.raises(UserError, match="run.document_masking false -> true"):
        check_resume_config("ckpt", before, on)


def test_a_metrics_line_that_is_not_a_row_is_named_and_never_dropped_by_a_resume(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    good = [{"kind": "train", "step": 1}, {"kind": "eval", "step": 2}]
    for bad, why in (("[1, 2]", "a JSON list, not an object"), ('{"kind": "train", "step": "3"}', "its step is '3'")):
        _rows(path, good[0], bad, good[1], '{"kind": "tr')
        before = path.read_text()
        rows, problems = metrics_rows(path)
        assert rows == good and len(problems) == 1 and f"{path} line 2: {why}" in problems[0]
        assert read_metrics(path) == good and f"line 2: {why}" in caplog.text
        with pytest.raises(UserError, match=f"{path} line 2: .*fix or delete that line"):
            truncate_metrics(path, 1)
        assert path.read_text() == before
    _rows(path, *good, '{"kind": "tr')  # a torn last line: dropped without a word
    truncate_metrics(path, 1)
    assert read_metrics(path) == good[:1]


def test_a_resumed_logger_writes_each_kind_and_step_once(tmp_path):
    _rows(tmp_path / "metrics.jsonl", {"kind": "train", "step": 6, "loss": 3.0}, {"kind": "eval", "step": 6})
    log = MetricsLogger(
        tmp_path, budget_tokens=None, is_main=True, log_interval=1, progress_bar=False, tensorboard=False
    )
    log.open(0)
    log.eval_row({"kind": "eval", "step": 6, "val_loss": 4.0})  # the final evaluation, again
    log.eval_row({"kind": "eval", "step": 7, "val_loss": 4.0})
    log.close()
    assert [(r["kind"], r["step"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        ("train", 6),
        ("eval", 6),
        ("eval", 7),
    ]


def test_resume_auto_and_start_over_are_flags_of_the_spec():
    parser = build_parser()
    for argv, value in ((["--resume"], True), (["--resume", "auto"], "auto"), ([], False)):
        spec = spec_from_args(parser.parse_args(["train", *argv, "--out", "r"]))
        assert spec.resume == value
        assert train_argv(spec) == ["--out", "r", *argv]
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--resume", "always"])
    problems = spec_problems(RunSpec(out="r", resume=True, start_over=True))
    assert [p.path for p in problems] == ["--start-over"]


def test_a_resume_with_other_stages_is_refused_and_a_record_from_before_stages_reads_as_none():
    """Stages change the length and the rotary positions mid-run: resuming without them (or with others)
    would train another model from the checkpoint on."""
    stage = {"start_tokens": 4096, "length": 128, "rope_theta": 500000.0, "rope_scaling": None}
    staged, plain = _resolved(stages=[stage]), _resolved(stages=[])
    with pytest.raises(UserError, match=r"run\.stages.*--allow-config-change"):
        check_resume_config("ckpt", staged, plain)
    with pytest.raises(UserError, match=r"run\.stages"):
        check_resume_config("ckpt", staged, _resolved(stages=[{**stage, "rope_theta": 1e6}]))
    check_resume_config("ckpt", staged, _resolved(stages=[dict(stage)]))
    check_resume_config("ckpt", _resolved(), plain)  # recorded before runs had stages: none
