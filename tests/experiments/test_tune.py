"""`seqwarm tune`: the search against fake probes (monotone threshold, all fail, all pass, parallel rounds,
resume), the fluctuation verdict, the written config, one tiny real search, and bad input.

The slow, end-to-end tests of this file are in tests/e2e/test_tune_runs.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import build_parser, main
from seqwarm.experiments import curves
from seqwarm.experiments.launch import total_curriculum_step_of, with_total_curriculum_step
from seqwarm.experiments.tune import run_tune
from seqwarm.experiments.tune_search import ProbeResult, interior_points, search_largest_passing
from seqwarm.util.errors import UserError

FAST = FAST_TRAIN_FLAGS


class FakeProbe:
    """Passes for T <= limit: its val ppl falls steadily; above, it jumps 10% at the third evaluation."""

    def __init__(self, limit):
        self.limit = limit
        self.calls = []

    def __call__(self, value):
        self.calls.append(value)
        ppl = [100.0, 90.0, 80.0, 70.0] if value <= self.limit else [100.0, 90.0, 99.0, 95.0]
        return ProbeResult(value, steps=[2, 4, 6, 8], val_ppl=ppl)


def test_monotone_threshold_is_found_by_bisection():
    fake = FakeProbe(37)
    out = search_largest_passing(fake, 1, 100, fluctuation_pct=2.0)
    assert out.chosen == 37 and out.lowest_failing == 38
    assert fake.calls[:2] == [100, 1]
    assert len(fake.calls) <= 2 + 7  # bisection of 99 values
    assert out.results[38].max_rise_pct == pytest.approx(10.0) and out.results[38].rise_step == 6
    assert not out.warnings


@pytest.mark.parametrize("jobs", [2, 3, 5])
def test_parallel_rounds_find_the_same_value(jobs):
    fake = FakeProbe(61)
    rounds = []

    def runner(probe, values):
        rounds.append(list(values))
        for v in values:
            yield v, probe(v)

    out = search_largest_passing(fake, 4, 200, fluctuation_pct=2.0, jobs=jobs, runner=runner)
    assert out.chosen == 61 and out.lowest_failing == 62
    assert rounds[0] == [4, 200]
    assert all(len(r) <= jobs for r in rounds)
    assert len(rounds) < 2 + 8  # fewer rounds than plain bisection needs


def test_resolution_stops_early():
    fake = FakeProbe(500)
    out = search_largest_passing(fake, 10, 1000, fluctuation_pct=2.0, resolution=50)
    assert out.lowest_failing - out.chosen <= 50 and out.chosen <= 500 < out.lowest_failing


def test_all_fail_and_all_pass():
    fail = search_largest_passing(FakeProbe(0), 5, 50, fluctuation_pct=2.0)
    assert fail.chosen is None and fail.lowest_failing == 5 and "bottom of the range" in fail.reason
    ok = FakeProbe(10**6)
    out = search_largest_passing(ok, 5, 50, fluctuation_pct=2.0)
    assert out.chosen == 50 and ok.calls == [50] and "top of the range" in out.reason


def test_resume_skips_done_probes():
    first = FakeProbe(37)
    done = {}
    search_largest_passing(first, 1, 100, fluctuation_pct=2.0, on_result=lambda v, r, reused: done.update({v: r}))
    again = FakeProbe(37)
    reused = []
    out = search_largest_passing(
        again, 1, 100, fluctuation_pct=2.0, done=done, on_result=lambda v, r, was: reused.append(was)
    )
    assert out.chosen == 37 and again.calls == [] and all(reused)
    # half the probes done: only the rest run
    partial = dict(list(done.items())[:3])
    third = FakeProbe(37)
    search_largest_passing(third, 1, 100, fluctuation_pct=2.0, done=partial)
    assert set(third.calls) == set(done) - set(partial)


def test_done_probes_are_judged_again_with_a_new_threshold():
    done = {v: FakeProbe(37)(v) for v in (1, 100)}
    fake = FakeProbe(37)
    out = search_largest_passing(fake, 1, 100, fluctuation_pct=20.0, done=done)  # a 10% rise is now fine
    assert out.chosen == 100 and fake.calls == []


def test_non_monotone_results_are_reported():
    def probe(value):
        bad = value > 30 and value != 90
        return ProbeResult(value, [1, 2, 3], [10.0, 9.0, 9.9] if bad else [10.0, 9.0, 8.0])

    out = search_largest_passing(probe, 1, 100, fluctuation_pct=2.0, jobs=9)
    assert out.chosen == 30
    assert any("T = 90 passed" in w for w in out.warnings)


def test_diverged_probe_fails_and_fluctuation_definition():
    r = ProbeResult(7, [1, 2], [50.0, 40.0], diverged=True, message="loss became nan").judge(50.0)
    assert not r.passed and r.verdict() == "FAIL (diverged)"
    f = curves.fluctuation([100.0, 80.0, 82.0, 79.0, 83.0])
    assert f.max_rise_pct == pytest.approx(83 / 79 * 100 - 100) and f.at_index == 4
    assert curves.fluctuation([5.0, 4.0, 3.0]).max_rise_pct == 0.0
    assert not curves.fluctuation([5.0, float("nan")]).finite
    assert interior_points(0, 10, 1) == [5] and interior_points(0, 2, 5) == [1]
    assert interior_points(10, 20, 3) == [12, 15, 17]


def test_config_editing_in_both_curriculum_forms(tmp_path):
    legacy = json.loads(small_config(tmp_path / "c.json", total_step=6).read_text())
    assert total_curriculum_step_of(with_total_curriculum_step(legacy, 99)) == 99
    assert total_curriculum_step_of(legacy) == 6  # the input is not changed
    newer = {k: v for k, v in legacy.items() if k != "curriculum_learning"}
    newer["data_efficiency"] = {
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
                        "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8},
                    }
                },
            },
        },
    }
    changed = with_total_curriculum_step(newer, 42)
    assert (
        changed["data_efficiency"]["data_sampling"]["curriculum_learning"]["curriculum_metrics"]["seqlen_truncate"][
            "schedule_config"
        ]["total_curriculum_step"]
        == 42
    )
    with pytest.raises(UserError, match="no enabled sequence-length curriculum"):
        total_curriculum_step_of({"train_batch_size": 8})


def _tune_args(tmp_path, *extra):
    from seqwarm.cli.commands.tune import tune_inputs

    return tune_inputs(build_parser().parse_args(["tune", *FAST, "--out", str(tmp_path / "tune"), *extra]))


def test_run_tune_with_a_fake_probe_writes_the_tuned_config(tmp_path, capsys):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=6)
    args = _tune_args(tmp_path, "--config", str(cfg), "--lo", "2", "--hi", "40", "--resolution", "1")
    fake = FakeProbe(17)
    report = run_tune(*args, probe=fake)
    printed = capsys.readouterr().out
    assert report["chosen"] == 17 and "chosen total_curriculum_step = 17" in printed
    assert "probe T=    18: FAIL" in printed and "max rise 10.00%" in printed
    tuned = json.loads((tmp_path / "tune" / "tuned_config.json").read_text())
    original = json.loads(cfg.read_text())
    assert tuned["curriculum_learning"]["schedule_config"]["total_curriculum_step"] == 17
    tuned["curriculum_learning"]["schedule_config"]["total_curriculum_step"] = 6
    assert tuned == original  # nothing else changed
    saved = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert saved["chosen"] == 17 and saved["probe_steps"] == 8 and saved["config_value"] == 6
    assert {p["value"] for p in saved["probes"]} == set(fake.calls)
    assert "--train-iters 8" in saved["probe_command"]
    # a rerun reads the state file and probes nothing
    again = FakeProbe(17)
    assert run_tune(*args, probe=again)["chosen"] == 17 and again.calls == []
    assert "done before" in capsys.readouterr().out
    # a different probe length is a different search
    with pytest.raises(UserError, match="different settings"):
        run_tune(*_tune_args(tmp_path, "--config", str(cfg), "--probe-steps", "5"), probe=again)


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--jobs", "0"], "--jobs 0"),
        (["--fluctuation", "0"], "--fluctuation"),
        (["--probe-multiple", "0"], "--probe-multiple"),
        (["--lo", "9", "--hi", "3"], "1 <= --lo <= --hi"),
        (["--no-curriculum"], "not a tune flag"),
        (["--eval-interval", "0"], "at least 2 evaluations"),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, extra, fragment):
    cfg = small_config(tmp_path / "c.json")
    assert main(["tune", *FAST, "--config", str(cfg), "--out", str(tmp_path / "t"), *extra]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_missing_out_and_untunable_config_exit_2(tmp_path, capsys):
    assert main(["tune", *FAST]) == 2
    assert "--out DIR is required" in capsys.readouterr().err
    cfg = json.loads(small_config(tmp_path / "c.json").read_text())
    cfg["curriculum_learning"]["schedule_type"] = "fixed_discrete"
    cfg["curriculum_learning"]["schedule_config"] = {"difficulty": [8, 64], "max_step": [4]}
    (tmp_path / "d.json").write_text(json.dumps(cfg))
    assert main(["tune", *FAST, "--config", str(tmp_path / "d.json"), "--out", str(tmp_path / "t")]) == 2
    assert "only fixed_linear and fixed_root" in capsys.readouterr().err


def test_without_config_the_tuned_recipe_follows_seq_length_as_train_does(tmp_path):
    from seqwarm.config.defaults import default_train_config
    from seqwarm.experiments.tune import setup_tune

    setup = setup_tune(*_tune_args(tmp_path, "--seq-length", "128"))
    recipe = default_train_config(128)  # what `seqwarm train --seq-length 128` trains
    assert setup.raw_config["curriculum_learning"] == recipe["curriculum_learning"]
    assert setup.raw_config["curriculum_learning"]["max_difficulty"] == 128
    assert setup.current == recipe["curriculum_learning"]["schedule_config"]["total_curriculum_step"]


@pytest.mark.parametrize("curriculum", ["natural", "grow_p2", "linear"])
def test_a_variable_curriculum_that_does_not_read_total_curriculum_step_is_not_tuned(tmp_path, capsys, curriculum):
    # every probe would train the same run: the search would pick a value that changes nothing
    cfg = small_config(tmp_path / "c.json")
    argv = ["tune", *FAST, "--config", str(cfg), "--out", str(tmp_path / "t"), "--curriculum-mode", "variable"]
    assert main([*argv, "--variable-curriculum", curriculum]) == 2
    err = capsys.readouterr().err
    assert f"variable_curriculum {curriculum} does not read total_curriculum_step" in err and "Traceback" not in err
