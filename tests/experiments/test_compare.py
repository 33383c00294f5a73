"""`seqwarm compare`: the curve arithmetic on synthetic curves, the report of two tiny real runs, reuse and
resume of run folders, the scaled and quick plans, and bad input.

The slow, end-to-end tests of this file are in tests/e2e/test_compare_runs.py.
"""

import argparse
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import build_parser, main
from seqwarm.data import data_fingerprint, read_meta
from seqwarm.experiments import curves, spread
from seqwarm.experiments.compare import QUICK_FRACTION, ComparePlan, build_report, plan_compare, with_seed_spread
from seqwarm.experiments.launch import check_same_run, spec_data_fingerprint
from seqwarm.experiments.report import write_report
from seqwarm.run.spec import RunSpec, resolve_config
from seqwarm.util.errors import UserError

FAST = FAST_TRAIN_FLAGS


# -- crossings and speedups -------------------------------------------------------------------------


def test_crossing_interpolates_between_evaluations():
    # 3.0 at 200 tokens, 1.0 at 300: the line is at 2.0 halfway
    assert curves.first_crossing([100, 200, 300], [4.5, 3.0, 1.0], 2.0) == pytest.approx(250)
    # an evaluation exactly on the target is the crossing
    assert curves.first_crossing([100, 200, 300], [4.5, 2.0, 1.0], 2.0) == pytest.approx(200)
    # already below at the first evaluation: nothing is assumed before it
    assert curves.first_crossing([100, 200], [1.5, 1.0], 2.0) == 100
    # the first crossing counts, not a later one after a rise
    assert curves.first_crossing([1, 2, 3, 4], [3.0, 1.0, 3.0, 1.0], 2.0) == pytest.approx(1.5)
    assert curves.first_crossing([1, 2], [3.0, 2.5], 2.0) is None
    assert curves.first_crossing([1, 2, 3], [3.0, math.nan, 1.0], 2.0) == 3  # NaN breaks the segment


def test_speedup_reached_and_interpolated():
    base_x, base_y = [100, 200, 300, 400], [5.0, 4.0, 3.0, 2.0]
    res = curves.speedup_to_target(base_x, base_y, [100, 200, 300], [4.5, 3.0, 1.0])
    assert res.target == 2.0 and res.baseline == 400 and res.curriculum == pytest.approx(250)
    assert res.speedup == pytest.approx(1.6) and res.reached


def test_speedup_never_reached_is_null():
    res = curves.speedup_to_target([1, 2], [3.0, 2.0], [1, 2, 3], [3.5, 2.5, 2.01])
    assert res.speedup is None and res.reached is False and res.curriculum is None
    assert res.to_dict()["reached"] is False


def test_speedup_below_one_when_curriculum_is_slower():
    res = curves.speedup_to_target([10, 20], [3.0, 2.0], [10, 20, 30, 40], [3.5, 3.0, 2.5, 2.0])
    assert res.speedup == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 5.0), min_size=2, max_size=12), st.floats(0.0, 1.0))
def test_crossing_lies_on_the_curve(drops, frac):
    ys = [10.0]
    for d in drops:
        ys.append(ys[-1] - d)
    xs = [100.0 * (i + 1) for i in range(len(ys))]
    target = ys[-1] + frac * (ys[0] - ys[-1])
    x = curves.first_crossing(xs, ys, target)
    assert xs[0] <= x <= xs[-1]
    assert curves.interpolate(xs, ys, x) == pytest.approx(target, abs=1e-9)


# -- loss ratio and spikes --------------------------------------------------------------------------


def test_loss_ratio_and_spike_counting():
    losses = [4.0, 3.0, 3.0, 4.5, 4.2, 3.0, 2.0, 2.0, 3.1, 2.0]
    ratios = curves.loss_ratio(losses)
    assert ratios[:4] == pytest.approx([1.0, 1.0, 1.0, 1.5])
    assert ratios[8] == pytest.approx(1.55)
    spikes = curves.find_spikes(ratios, 1.2)
    # steps 3-4 (one excursion, peak 1.5) and step 8
    assert [(s.start, s.end) for s in spikes] == [(3, 4), (8, 8)]
    assert spikes[0].peak == pytest.approx(1.5)
    assert curves.find_spikes(ratios, 1.6) == []


def test_smoothing_hides_batch_noise_but_not_a_real_spike():
    noisy = [3.0 * (1.15 if i % 2 else 1.0) for i in range(40)]  # +-15% alternating: batch noise
    assert max(curves.loss_ratio(noisy)) == pytest.approx(1.15)
    assert max(curves.loss_ratio(noisy, window=8)) < 1.01
    spiky = [3.0] * 20 + [6.0] * 6 + [3.0] * 10
    assert len(curves.find_spikes(curves.loss_ratio(spiky, window=8), 1.2)) == 1


def test_trailing_mean_has_no_lookahead():
    assert curves.trailing_mean([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError):
        curves.trailing_mean([1], 0)


def test_stability_summary_of_rows():
    rows = [
        {"step": i + 1, "loss": v, "grad_norm": g, "adam_v_l1": 1.0 + i, "adam_v_max": 0.1}
        for i, (v, g) in enumerate(zip([3.0, 2.0, 2.0, 3.0, 2.0], [1.0, 0.5, 0.4, 5.0, 0.3]))
    ]
    s = curves.stability(rows, threshold=1.2, window=1)
    assert s["spikes"] == 1 and s["spike_steps"] == [4] and s["max_loss_ratio"] == pytest.approx(1.5)
    assert s["max_loss_ratio_step"] == 4 and s["max_grad_norm"] == 5.0 and s["max_adam_v_l1"] == 5.0


# -- reports from run folders ------------------------------------------------------------------------


def _fake_run(folder: Path, evals, final=True):
    folder.mkdir(parents=True)
    rows = [
        {
            "kind": "train",
            "step": s,
            "tokens": t,
            "loss": v + 0.5,
            "seqlen": 64,
            "lr": 1e-3,
            "elapsed_s": t / 100,
            "grad_norm": 1.0,
        }
        for s, (t, v) in enumerate(evals, 1)
    ]
    rows += [
        {"kind": "eval", "step": s, "tokens": t, "val_loss": v, "val_ppl": math.exp(v), "elapsed_s": t / 100}
        for s, (t, v) in enumerate(evals, 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if final:
        (folder / "summary.json").write_text(
            json.dumps(
                {
                    "final_val_loss": evals[-1][1],
                    "final_val_ppl": math.exp(evals[-1][1]),
                    "steps": len(evals),
                    "tokens": evals[-1][0],
                    "wall_time_s": evals[-1][0] / 100,
                }
            )
        )


def _synthetic_plan(tmp_path, base_evals, cur_evals):
    _fake_run(tmp_path / "baseline", base_evals)
    _fake_run(tmp_path / "curriculum", cur_evals)
    runs = {n: RunSpec(out=tmp_path / n) for n in ("baseline", "curriculum")}
    return ComparePlan(tmp_path, runs, {"spike_threshold": 1.2, "smooth_steps": 2, "scale_batch": 1, "scale_lr": 1.0})


def test_report_says_when_the_target_is_never_reached(tmp_path):
    plan = _synthetic_plan(tmp_path, [(1000, 5.0), (2000, 4.0)], [(1000, 4.8), (2000, 4.3)])
    report = build_report(plan, {"baseline": {"status": "trained"}, "curriculum": {"status": "trained"}})
    write_report(tmp_path, report)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["speedup_tokens"] is None and saved["speedup_time"] is None and saved["reached"] is False
    assert "never reached the target" in (tmp_path / "report.md").read_text()


def test_report_speedups_from_synthetic_runs(tmp_path):
    plan = _synthetic_plan(
        tmp_path, [(1000, 5.0), (2000, 4.0), (3000, 3.0)], [(500, 5.0), (1000, 4.0), (2000, 2.0), (3000, 1.5)]
    )
    report = build_report(plan, {})
    assert report["target"] == 3.0
    assert report["tokens_to_target"]["curriculum"] == pytest.approx(1500)
    assert report["speedup_tokens"] == pytest.approx(2.0)
    assert report["speedup_time"] == pytest.approx(2.0)  # elapsed = tokens / 100 in both runs
    assert [g["difference"] < 0 for g in report["val_gap"]] == [True, True, True]


def test_report_refuses_runs_on_different_data(tmp_path):
    plan = _synthetic_plan(tmp_path, [(1000, 5.0), (2000, 4.0)], [(1000, 4.8), (2000, 3.9)])
    for name, fp in (("baseline", "a" * 64), ("curriculum", "b" * 64)):
        (tmp_path / name / "config.json").write_text(json.dumps({"data": {"fingerprint": fp}}))
    with pytest.raises(UserError, match="different data"):
        build_report(plan, {})
    (tmp_path / "curriculum" / "config.json").write_text(json.dumps({"data": {"fingerprint": "a" * 64}}))
    assert build_report(plan, {})["target"] == 4.0


def test_a_finished_run_on_other_data_is_not_reused(tmp_path, byte_data):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"fingerprint": "0" * 64}}))
    with pytest.raises(UserError, match=r"different .*data \(its token files' fingerprint\)"):
        check_same_run(run, RunSpec(out=run, data=str(byte_data)))
    assert spec_data_fingerprint(RunSpec(out=run, data=str(byte_data))) == data_fingerprint(read_meta(byte_data))


# -- seeds: spread arithmetic and the report over seeds ------------------------------------------------


def _row(seed, base_loss, cur_loss, speedup, spikes=(0, 0)):
    return {
        "seed": seed,
        "reached": speedup is not None,
        "speedup_tokens": speedup,
        "speedup_time": speedup,
        "final_val_loss": {"baseline": base_loss, "curriculum": cur_loss},
        "spikes": {"baseline": spikes[0], "curriculum": spikes[1]},
        "diverged": {"baseline": False, "curriculum": False},
    }


def test_spread_is_median_and_range_of_finite_values():
    assert spread.spread([3.0, 1.0, 2.0, None, math.nan]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert spread.spread([1.0, 4.0])["median"] == 2.5
    assert spread.spread([None])["median"] is None and spread.spread([])["n"] == 0


def test_aggregate_and_verdict_when_ranges_do_not_overlap():
    agg = spread.aggregate([_row(1, 4.0, 3.8, 1.5, (1, 0)), _row(2, 4.1, 3.9, 1.2), _row(3, 4.05, 3.7, 1.9)])
    assert agg["n_seeds"] == 3 and agg["reached"] == 3
    assert agg["speedup_tokens"] == {"median": 1.5, "min": 1.2, "max": 1.9, "n": 3}
    assert agg["final_val_loss"]["baseline"]["median"] == pytest.approx(4.05)
    assert agg["spikes"]["baseline"] == {"median": 0.0, "min": 0.0, "max": 1.0, "n": 3}
    v = agg["verdict"]
    assert v["exceeds_spread"] is True and v["lower"] == "curriculum"
    assert "exceeds the seed spread" in v["text"][0] and "median 1.50x, range 1.20x–1.90x" in v["text"][1]


def test_verdict_overlap_never_reached_and_one_seed():
    # the measurement: 1.37x, 1.72x, never reached -- the losses overlap
    agg = spread.aggregate([_row(1234, 4.0, 3.9, 1.37), _row(2, 4.0, 3.95, 1.72), _row(1, 3.9, 4.1, None)])
    assert agg["verdict"]["exceeds_spread"] is False and agg["reached"] == 2
    assert "does not exceed the seed spread" in agg["verdict"]["text"][0]
    assert "on 2 of 3 seeds (the others: never)" in agg["verdict"]["text"][1]
    assert agg["speedup_tokens"]["n"] == 2  # a seed that never reached has no speedup
    one = spread.aggregate([_row(1, 4.0, 3.0, 2.0)])
    assert one["verdict"]["exceeds_spread"] is None and "One seed: no spread measured" in one["verdict"]["text"][0]
    assert spread.aggregate([_row(1, 4.0, 4.5, None), _row(2, 4.1, 4.4, None)])["verdict"]["lower"] == "baseline"


def test_median_curve_is_pointwise_over_the_shortest():
    xs, ys = spread.median_curve([([1, 2, 3], [5.0, 4.0, 3.0]), ([1, 2], [6.0, 3.0]), ([1, 2, 3], [4.0, 5.0, 1.0])])
    assert xs == [1, 2] and ys == [5.0, 4.0]
    assert spread.median_curve([]) == ([], [])


def test_report_over_seeds_from_synthetic_runs(tmp_path):
    plans = {
        1: _synthetic_plan(
            tmp_path / "s1", [(1000, 5.0), (2000, 4.0), (3000, 3.0)], [(1000, 4.0), (2000, 2.0), (3000, 1.5)]
        ),
        2: _synthetic_plan(
            tmp_path / "s2", [(1000, 5.0), (2000, 4.0), (3000, 3.2)], [(1000, 4.5), (2000, 3.5), (3000, 2.9)]
        ),
    }
    report = with_seed_spread({seed: build_report(plan, {}) for seed, plan in plans.items()})
    assert report["speedup_tokens"] == pytest.approx(2.0)  # today's keys: the first seed's
    assert [r["seed"] for r in report["seeds"]] == [1, 2]
    assert report["seeds"][1]["speedup_tokens"] == pytest.approx(3000 / 2500)
    agg = report["aggregate"]
    assert agg["n_seeds"] == 2 and agg["final_val_loss"]["curriculum"] == {
        "median": pytest.approx(2.2),
        "min": 1.5,
        "max": 2.9,
        "n": 2,
    }
    assert agg["verdict"]["exceeds_spread"] is True
    out = tmp_path / "report"
    write_report(out, report)
    md = (out / "report.md").read_text()
    assert "2 seeds" in md and "## Seeds" in md and "| **median (min–max)** |" in md
    assert "the difference exceeds the seed spread" in md
    assert (out / "compare_val.png").stat().st_size > 10_000
    saved = json.loads((out / "report.json").read_text())
    assert saved["aggregate"]["speedup_tokens"]["n"] == 2 and len(saved["seeds"]) == 2


def test_one_seed_report_says_no_spread_was_measured(tmp_path):
    plan = _synthetic_plan(tmp_path, [(1000, 5.0), (2000, 4.0)], [(1000, 4.0), (2000, 3.0)])
    report = with_seed_spread({1234: build_report(plan, {})})
    write_report(tmp_path, report)
    md = (tmp_path / "report.md").read_text()
    assert "one seed (no spread measured)" in md and "One seed: no spread measured" in md
    assert report["aggregate"]["speedup_tokens"]["n"] == 1 and len(report["seeds"]) == 1


def test_seeds_plan_puts_extra_seeds_in_their_own_folders(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    base, options = _compare_args(tmp_path, "--config", str(cfg), "--seed", "7", "--seeds", "3")
    plan = plan_compare(base, options)
    assert plan.settings["seeds"] == [7, 8, 9]
    by_seed = plan.by_seed()
    assert by_seed[7] == plan.runs and by_seed[7]["baseline"].out == tmp_path / "cmp" / "baseline"
    assert by_seed[9]["curriculum"].out == tmp_path / "cmp" / "seed-9" / "curriculum"
    assert by_seed[9]["curriculum"].seed == 9
    assert plan.for_seed(8).runs == by_seed[8]


def test_a_finished_run_of_another_model_size_is_not_reused(tmp_path, byte_data):
    run = tmp_path / "run"
    run.mkdir()
    spec = RunSpec(out=run, data=str(byte_data), model="nano")
    recorded = json.loads(json.dumps(resolve_config(spec).to_dict(), default=str))
    (run / "config.json").write_text(json.dumps({"run": recorded, "model": {"n_layer": 2, "n_head": 2, "n_embd": 64}}))
    check_same_run(run, spec)  # the preset's size
    with pytest.raises(UserError, match="model size"):
        check_same_run(run, RunSpec(out=run, data=str(byte_data), model="nano", n_layer=1))


def test_a_run_recorded_before_document_masking_is_reused_and_one_with_it_on_is_not(tmp_path, byte_data):
    run = tmp_path / "run"
    run.mkdir()
    spec = RunSpec(out=run, data=str(byte_data), model="nano")
    recorded = json.loads(json.dumps(resolve_config(spec).to_dict(), default=str))
    del recorded["document_masking"]  # runs recorded before the setting had it off
    (run / "config.json").write_text(json.dumps({"run": recorded}))
    check_same_run(run, spec)
    (run / "config.json").write_text(json.dumps({"run": {**recorded, "document_masking": True}}))
    with pytest.raises(UserError, match="different document_masking"):
        check_same_run(run, spec)


# -- plans (no training) -----------------------------------------------------------------------------


def _compare_args(tmp_path, *extra):
    from seqwarm.cli.commands.compare import compare_inputs

    return compare_inputs(build_parser().parse_args(["compare", *FAST, "--out", str(tmp_path / "cmp"), *extra]))


def test_scaled_batch_and_lr_plan(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plan = plan_compare(*_compare_args(tmp_path, "--config", str(cfg), "--scale-batch", "4", "--scale-lr", "3"))
    base, cur = plan.runs["baseline"], plan.runs["curriculum"]
    b, c = base.settings, cur.settings
    assert "train_batch_size" not in b and b["curriculum"] is False
    assert c["train_batch_size"] == 32 and c["gradient_accumulation_steps"] == 8
    assert c["train_micro_batch_size_per_gpu"] == 4
    assert c["lr"] == pytest.approx(0.006) and c["min_lr"] == pytest.approx(0.0006)
    assert c["lr_warmup_iters"] == 1  # 2 iterations of 8 sequences = 16 samples ~ 1 step of 32 (at least 1)
    written = json.loads(Path(cur.config).read_text())
    assert written["curriculum_learning"]["schedule_config"]["total_curriculum_step"] == 10
    assert cur.eval_interval == max(1, round(base.eval_interval / 4))
    assert plan.settings["scale_batch"] == 4 and any("4x global batch" in n for n in plan.notes)


def test_quick_plan_shrinks_budget_and_schedule(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=50_000, total_step=50)
    plan = plan_compare(*_compare_args(tmp_path, "--config", str(cfg), "--quick"))
    cur = plan.runs["curriculum"]
    tokens = round(50_000 * QUICK_FRACTION)
    assert cur.settings["train_tokens"] == tokens and cur.settings["lr_decay_tokens"] == tokens
    assert cur.eval_iters == 2
    assert json.loads(Path(cur.config).read_text())["curriculum_learning"]["schedule_config"][
        "total_curriculum_step"
    ] == round(50 * QUICK_FRACTION)
    assert cur.log_interval == 1
    # an explicit budget is kept
    plan = plan_compare(*_compare_args(tmp_path, "--config", str(cfg), "--quick", "--train-tokens", "9000"))
    assert plan.runs["curriculum"].settings["train_tokens"] == 9000


def test_quick_shrinks_the_stages_start_tokens_with_the_budget(tmp_path):
    # the warmup and the budget shrink to QUICK_FRACTION: stages left at their tokens would begin late or
    # never (a warning only), and the quick comparison would measure a recipe without its extension
    stages = [{"start_tokens": 30_000, "length": 64, "rope_theta": 40000.0}, {"start_tokens": 45_000, "length": 128}]
    cfg = small_config(tmp_path / "c.json", train_tokens=50_000, total_step=10, seq=32, stages=stages)
    plan = plan_compare(*_compare_args(tmp_path, "--config", str(cfg), "--quick", "--rotary"))
    for spec in plan.runs.values():
        got = resolve_config(spec).stages
        assert [s.start_tokens for s in got] == [round(30_000 * QUICK_FRACTION), round(45_000 * QUICK_FRACTION)]
        assert [(s.length, s.rope_theta) for s in got] == [(64, 40000.0), (128, 40000.0)]
    assert any("stages" in note for note in plan.notes)
    kept = plan_compare(*_compare_args(tmp_path, "--config", str(cfg), "--quick", "--rotary", "--train-tokens", "9e4"))
    assert [s.start_tokens for s in resolve_config(kept.runs["curriculum"]).stages] == [30_000, 45_000]


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--scale-batch", "0"], "--scale-batch 0"),
        (["--scale-lr", "-2"], "--scale-lr"),
        (["--spike-threshold", "0.9"], "--spike-threshold"),
        (["--smooth-steps", "0"], "--smooth-steps"),
        (["--no-curriculum"], "not a compare flag"),
        (["--resume"], "not a compare flag"),
        (["--config", "/nonexistent.json"], "config file not found"),
    ],
)
def test_bad_input_exits_2(tmp_path, byte_data, capsys, extra, fragment):
    code = main(["compare", *FAST, "--data", str(byte_data), "--out", str(tmp_path / "o"), *extra])
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_missing_out_and_no_curriculum_config_exit_2(tmp_path, capsys):
    assert main(["compare", *FAST]) == 2
    assert "--out DIR is required" in capsys.readouterr().err
    cfg = json.loads(small_config(tmp_path / "c.json").read_text())
    cfg["curriculum_learning"]["enabled"] = False
    (tmp_path / "off.json").write_text(json.dumps(cfg))
    assert main(["compare", *FAST, "--config", str(tmp_path / "off.json"), "--out", str(tmp_path / "o")]) == 2
    assert "nothing to compare" in capsys.readouterr().err


def _help_groups(parser) -> dict[str, str]:
    """option string -> title of the --help group that shows it (hidden flags left out)."""
    return {
        opt: group.title
        for group in parser._action_groups
        for action in group._group_actions
        if action.help != argparse.SUPPRESS
        for opt in action.option_strings
    }


@pytest.mark.parametrize("command", ["compare", "tune"])
def test_train_flags_keep_their_help_groups_in_experiments(command):
    """`compare --help` / `tune --help` show every train flag in the group `train --help` shows it in
    (argparse parents used to drop the mutually exclusive --lr-decay-*/--lr-warmup-* into "options")."""
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    train, experiment = _help_groups(sub["train"]), _help_groups(sub[command])
    own = {opt for opt, title in experiment.items() if title == command}  # the experiment's own flags
    moved = {
        opt: (title, experiment.get(opt))
        for opt, title in train.items()
        if opt not in own and opt in experiment and experiment[opt] != title
    }
    assert not moved, moved
    assert train["--lr-warmup-iters"] == "learning rate (warmup in iters/samples, decay in tokens)"


@pytest.mark.parametrize("extra", [[], ["--train-tokens", "50000", "--global-batch-size", "8"]])
def test_without_config_the_compared_recipe_follows_seq_length_as_train_does(tmp_path, extra):
    from seqwarm.config.defaults import default_train_config

    plan = plan_compare(*_compare_args(tmp_path, "--seq-length", "128", *extra))
    args = build_parser().parse_args(["train", "--seq-length", "128", *extra])
    from seqwarm.cli.commands.spec_flags import spec_from_args

    trained = resolve_config(spec_from_args(args)).curriculum  # what `seqwarm train` would run
    assert trained.max_difficulty == 128
    recipe = default_train_config(128, **({"train_tokens": 50_000, "train_batch_size": 8} if extra else {}))
    for name in ("baseline", "curriculum"):  # scale 1: both written configs are train's recipe
        written = json.loads(Path(plan.runs[name].config).read_text())
        assert written["curriculum_learning"] == recipe["curriculum_learning"], name
        assert (
            written["curriculum_learning"]["schedule_config"]["total_curriculum_step"] == trained.total_curriculum_step
        )
    assert resolve_config(plan.runs["curriculum"]).curriculum == trained


def test_the_report_leads_with_tokens_and_notes_what_wall_clock_measures(tmp_path):
    """Wall-clock moved 3.01x / 4.16x between two runs with the same losses: it is shown, not bolded."""
    from seqwarm.experiments.report import TIME_NOTE

    plan = _synthetic_plan(
        tmp_path, [(1000, 5.0), (2000, 4.0), (3000, 3.0)], [(500, 5.0), (1000, 4.0), (2000, 2.0), (3000, 1.5)]
    )
    write_report(tmp_path, build_report(plan, {}))
    md = (tmp_path / "report.md").read_text()
    [tokens] = [line for line in md.splitlines() if line.startswith("- **tokens**")]
    [time] = [line for line in md.splitlines() if line.startswith("- wall-clock:")]
    assert "**speedup_tokens 2.00x**" in tokens
    assert "**" not in time and time.endswith(f"speedup_time 2.00x ({TIME_NOTE})")
    assert md.index("- **tokens**") < md.index("- wall-clock:")


def test_time_per_token_is_the_step_time_of_each_logged_window_over_its_tokens():
    from seqwarm.experiments.curves import step_time_per_token

    rows = [
        {"tokens": 100, "tokens_per_s": 100.0},  # 1 s for its 100 tokens
        {"tokens": 300, "tokens_per_s": 200.0},  # 1 s for 200
        {"tokens": 300, "tokens_per_s": 50.0},  # no new tokens: no window
        {"tokens": 600, "tokens_per_s": None},  # no rate: left out, with its tokens
        {"tokens": 900, "tokens_per_s": 300.0},  # 1 s for 300
    ]
    assert step_time_per_token(rows) == pytest.approx(3 / 600)
    assert step_time_per_token([{"tokens": 10}]) is None and step_time_per_token([]) is None
