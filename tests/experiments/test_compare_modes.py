"""`seqwarm compare --modes`: the plan (folders, specs that differ only in mode, bad input) and the
report of several modes against one baseline, from synthetic run folders. No training here; the
end-to-end run is in tests/e2e/test_compare_runs.py."""

import json
import math
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import build_parser, main
from seqwarm.cli.commands.compare import compare_inputs
from seqwarm.experiments.compare import ComparePlan, build_report, plan_compare, with_modes, with_seed_spread
from seqwarm.experiments.report import mode_rows, write_report
from seqwarm.run.spec import RunSpec, resolve_config

MODES = ("truncate", "reshape", "window")


def _args(tmp_path, *extra):
    argv = ["compare", *FAST_TRAIN_FLAGS, "--out", str(tmp_path / "cmp"), *extra]
    return compare_inputs(build_parser().parse_args(argv))


# -- the plan -----------------------------------------------------------------------------------------


def test_modes_plan_lays_out_one_folder_per_mode_and_seed(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plan = plan_compare(*_args(tmp_path, "--config", str(cfg), "--modes", ",".join(MODES), "--seeds", "2"))
    out = tmp_path / "cmp"
    assert list(plan.runs) == ["baseline", *MODES] and plan.curricula == MODES
    for seed, runs in plan.by_seed().items():
        where = out if seed == 1234 else out / f"seed-{seed}"
        assert {name: spec.out for name, spec in runs.items()} == {n: where / n for n in ("baseline", *MODES)}
        assert all(spec.seed == seed for spec in runs.values())
    assert plan.settings["modes"] == list(MODES) and plan.settings["seeds"] == [1234, 1235]
    for arm in ("baseline", *MODES):
        assert (out / "configs" / f"{arm}.json").is_file()
    assert not (out / "configs" / "curriculum.json").exists()
    # the curriculum arms differ only in their mode (and folder and config path, same content)
    specs = {m: plan.runs[m] for m in MODES}
    assert {m: s.settings["curriculum_mode"] for m, s in specs.items()} == {m: m for m in MODES}
    blank = [
        {**s.settings, "curriculum_mode": None} | {"_": (s.seed, s.model, s.eval_interval, s.eval_iters)}
        for s in specs.values()
    ]
    assert blank[0] == blank[1] == blank[2]
    texts = {(out / "configs" / f"{m}.json").read_text() for m in MODES}
    assert len(texts) == 1
    assert {resolve_config(s).curriculum.mode for s in specs.values()} == set(MODES)
    assert plan.runs["baseline"].settings["curriculum"] is False
    assert "curriculum_mode" not in plan.runs["baseline"].settings
    assert any("--modes" in n for n in plan.notes)
    # a pair of one seed reads a mode as the `curriculum` arm of a two-run comparison
    pair = plan.for_seed(1235, "reshape")
    assert pair.runs == {"baseline": plan.by_seed()[1235]["baseline"], "curriculum": plan.by_seed()[1235]["reshape"]}


def test_without_modes_the_plan_is_todays_two_arms(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plan = plan_compare(*_args(tmp_path, "--config", str(cfg)))
    assert list(plan.runs) == ["baseline", "curriculum"] and "modes" not in plan.settings
    assert plan.runs["curriculum"].out == tmp_path / "cmp" / "curriculum"
    assert "curriculum_mode" not in plan.runs["curriculum"].settings
    assert sorted(p.name for p in (tmp_path / "cmp" / "configs").iterdir()) == ["baseline.json", "curriculum.json"]


def test_modes_with_scaled_batch_scale_every_curriculum_arm(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plan = plan_compare(*_args(tmp_path, "--config", str(cfg), "--modes", "truncate,window", "--scale-batch", "2"))
    for mode in ("truncate", "window"):
        assert plan.runs[mode].settings["train_batch_size"] == 16
        assert plan.runs[mode].eval_interval == max(1, round(plan.runs["baseline"].eval_interval / 2))
    assert "train_batch_size" not in plan.runs["baseline"].settings


@pytest.mark.parametrize(
    "extra,fragments",
    [
        (["--modes", "truncate,inject"], ["'inject' is not a mode to compare", "truncate, reshape, window"]),
        (["--modes", "shuffle"], ["--modes shuffle", "choose from truncate, reshape, window"]),
        (["--modes", "window,window"], ["window named twice"]),
        (["--modes", "truncate,reshape", "--curriculum-mode", "window"], ["--modes and --curriculum-mode window"]),
        # a setting one mode refuses is found before the baseline and the other modes train
        (["--modes", "truncate,reshape,window", "--length-bucket", "16"], ["\n  reshape: ", "\n  window: "]),
    ],
)
def test_bad_modes_exit_2_with_the_allowed_values(tmp_path, capsys, extra, fragments):
    cfg = small_config(tmp_path / "c.json")
    assert main(["compare", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err
    assert all(f in err for f in fragments) and "Traceback" not in err
    assert not (tmp_path / "o" / "baseline").exists()


def test_an_empty_modes_list_is_refused_not_read_as_no_modes(tmp_path, capsys):
    cfg = small_config(tmp_path / "c.json")
    with pytest.raises(SystemExit) as exit_:
        main(["compare", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "o"), "--modes", ","])
    assert exit_.value.code == 2 and "names no mode" in capsys.readouterr().err


# -- the report from synthetic runs --------------------------------------------------------------------


def _fake_run(folder: Path, evals, mode=None, spike_at=None, rate=None):
    """A finished run folder: evaluations ``(tokens, val_loss)``; train rows one per evaluation (``rate``:
    their tokens_per_s)."""
    folder.mkdir(parents=True)
    rows = [
        {"kind": "train", "step": s, "tokens": t, "loss": v + (3 if s == spike_at else 0.5), "seqlen": 64}
        | {"elapsed_s": t / 100}
        | ({"tokens_per_s": rate} if rate else {})
        for s, (t, v) in enumerate(evals, 1)
    ]
    rows += [
        {"kind": "eval", "step": s, "tokens": t, "val_loss": v, "val_ppl": math.exp(v), "elapsed_s": t / 100}
        for s, (t, v) in enumerate(evals, 1)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"final_val_loss": evals[-1][1], "steps": len(evals), "tokens": evals[-1][0]}
    (folder / "summary.json").write_text(json.dumps({**summary, "wall_time_s": evals[-1][0] / 100}))
    cur = {"mode": mode, "schedule_config": {"total_curriculum_step": 3}} if mode else None
    (folder / "config.json").write_text(json.dumps({"run": {"curriculum": cur}, "data": {"fingerprint": "f" * 64}}))


BASES = {  # per seed: the baseline's curve; its final loss is that seed's target (3.0, 2.5, 3.2)
    1: [(1000, 5.0), (2000, 4.0), (3000, 3.0)],
    2: [(1000, 5.0), (2000, 4.2), (3000, 2.5)],
    3: [(1000, 5.1), (2000, 4.0), (3000, 3.2)],
}
CURVES = {  # per seed, per mode: the curve
    1: {"truncate": [(1000, 4.0), (2000, 2.0), (3000, 1.5)], "reshape": [(1000, 5.0), (2000, 4.0), (4000, 3.5)]},
    2: {"truncate": [(1000, 4.5), (2000, 3.0), (3000, 2.0)], "reshape": [(1000, 5.2), (2000, 4.1), (4000, 3.3)]},
    3: {"truncate": [(1000, 4.2), (2000, 2.5), (3000, 1.9)], "reshape": [(1000, 5.1), (2000, 3.9), (4000, 3.4)]},
}


def _modes_report(tmp_path, seeds=(1, 2, 3), rates=None):
    """The --modes report of synthetic runs (``rates``: tokens_per_s per arm, for the time per token)."""
    settings = {"spike_threshold": 1.2, "smooth_steps": 1, "scale_batch": 1, "scale_lr": 1.0}
    settings |= {"seeds": list(seeds), "modes": ["truncate", "reshape"]}
    by_mode, rates = {}, rates or {}
    for mode in ("truncate", "reshape"):
        reports = {}
        for seed in seeds:
            where = tmp_path if seed == seeds[0] else tmp_path / f"seed-{seed}"
            if not (where / "baseline").exists():
                spike = 2 if seed == 2 else None
                _fake_run(where / "baseline", BASES[seed], spike_at=spike, rate=rates.get("baseline"))
            _fake_run(where / mode, CURVES[seed][mode], mode=mode, rate=rates.get(mode))
            pair = ComparePlan(
                tmp_path,
                {"baseline": RunSpec(out=where / "baseline"), "curriculum": RunSpec(out=where / mode)},
                settings,
            )
            reports[seed] = build_report(pair, {})
        by_mode[mode] = with_seed_spread(reports)
    return with_modes(by_mode)


def test_modes_report_has_one_row_per_mode_with_spread_over_seeds(tmp_path):
    report = _modes_report(tmp_path)
    assert report["arms"] == ["baseline", "truncate", "reshape"] and list(report["modes"]) == ["truncate", "reshape"]
    # the one-mode keys stay, as the first mode's
    assert report["curriculum"]["run_dir"] == str(tmp_path / "truncate")
    assert report["speedup_tokens"] == pytest.approx(3000 / 1500)
    assert report["commands"]["curriculum"] == report["commands"]["truncate"] != report["commands"]["reshape"]
    trunc, resh = report["modes"]["truncate"], report["modes"]["reshape"]
    assert trunc["curriculum"]["curriculum_mode"] == "truncate" and resh["curriculum"]["curriculum_mode"] == "reshape"
    # truncate reaches its own seed's target (3.0, 2.5, 3.2) at 1500, 2500 and 1000 + 1000 x 1.0/1.7 tokens
    # (interpolated), each baseline at 3000; against another seed's baseline the numbers would differ
    assert trunc["aggregate"]["reached"] == 3 and trunc["aggregate"]["speedup_tokens"]["n"] == 3
    assert trunc["aggregate"]["speedup_tokens"]["median"] == pytest.approx(3000 / (1000 + 1000 / 1.7))
    speedups = {r["seed"]: r["speedup_tokens"] for r in trunc["seeds"]}
    assert speedups == pytest.approx({1: 3000 / 1500, 2: 3000 / 2500, 3: 3000 / (1000 + 1000 / 1.7)})
    assert (
        trunc["aggregate"]["verdict"]["exceeds_spread"] is True
        and trunc["aggregate"]["verdict"]["lower"] == "curriculum"
    )
    # reshape never reaches its target: no speedup, the baseline is lower on every seed (ranges apart)
    assert resh["aggregate"]["reached"] == 0 and resh["aggregate"]["speedup_tokens"]["median"] is None
    assert resh["aggregate"]["verdict"]["lower"] == "baseline"
    rows = mode_rows(report)
    assert [r["arm"] for r in rows] == ["baseline", "truncate", "reshape"]
    assert rows[0]["final_val_loss"]["median"] == 3.0 and rows[0]["spikes"]["max"] == 1  # seed 2's spike
    assert rows[1]["steps"]["median"] == 3 and rows[2]["exceeds"] == "yes, baseline lower"
    assert rows[1]["final_val_loss"] == {"median": 1.9, "min": 1.5, "max": 2.0, "n": 3}


def test_modes_report_files(tmp_path):
    report = _modes_report(tmp_path)
    out = tmp_path / "report"
    write_report(out, report)
    md = (out / "report.md").read_text()
    assert "# seqwarm compare: baseline vs curriculum modes truncate, reshape" in md
    table = md.split("## Modes against the baseline")[1].split("\n\n")[2].splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["baseline", "truncate", "reshape"]
    assert "| 3/3 |" in table[3] and "| 0/3 |" in table[4] and "yes, mode lower" in table[3]
    assert "| truncate | 1.9000 (1.5000–2.0000) |" in md
    assert "## Runs (seed 1)" in md and "## Seeds" in md and md.count("| 3 | reshape |") == 1
    assert (out / "compare_val.png").stat().st_size > 10_000
    saved = json.loads((out / "report.json").read_text())
    assert saved["modes"]["reshape"]["aggregate"]["reached"] == 0 and saved["arms"][0] == "baseline"


def test_cli_prints_one_line_per_arm(tmp_path, capsys, monkeypatch):
    from seqwarm.cli.commands import compare as command

    report = _modes_report(tmp_path, seeds=(1,))
    report["out"] = str(tmp_path)
    monkeypatch.setattr(command, "run_compare", lambda spec, options: report)
    cfg = small_config(tmp_path / "c.json")
    argv = ["compare", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path)]
    assert main([*argv, "--modes", "truncate,reshape"]) == 0
    lines = capsys.readouterr().out.splitlines()
    arms = [line.split()[0] for line in lines if "steps, spikes" in line]
    assert arms == ["baseline", "truncate", "reshape"]
    assert any(line.startswith("truncate") and "speedup_tokens 2.00x (reached on 1/1)" in line for line in lines)
    assert any(line.startswith("reshape") and "speedup_tokens - (reached on 0/1)" in line for line in lines)


def test_modes_report_gives_tokens_to_target_and_time_per_token(tmp_path, capsys, monkeypatch):
    from seqwarm.cli.commands import compare as command

    report = _modes_report(tmp_path, rates={"baseline": 1000, "truncate": 2000, "reshape": 1000})
    rows = {r["arm"]: r for r in mode_rows(report)}
    # each baseline reaches its own final loss at its last evaluation; truncate at its seed's crossing
    # (seed 1: 1,500; seed 2: 2,500; seed 3: 1,000 + 1,000 x 1.0/1.7)
    assert rows["baseline"]["tokens_to_target"]["median"] == 3000
    assert rows["truncate"]["tokens_to_target"] == {
        "median": pytest.approx(1000 + 1000 / 1.7),
        "min": 1500,
        "max": 2500,
        "n": 3,
    }
    assert rows["reshape"]["tokens_to_target"]["n"] == 0  # never reached
    # 1,000 tokens/s in every window: 1,000 us per token; truncate's rows at 2,000 tokens/s: 500
    assert rows["baseline"]["step_us_per_token"]["median"] == pytest.approx(1000)
    assert rows["truncate"]["step_us_per_token"]["median"] == pytest.approx(500)
    write_report(tmp_path / "report", report)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| tokens to target |" in md and "| µs per token (steps) |" in md and "Tokens to target:" in md
    line = next(x for x in md.splitlines() if x.startswith("| truncate | 1.9000"))
    assert "| 1,588 (1,500–2,500) |" in line and "| 500 (500–500) |" in line
    report["out"] = str(tmp_path)
    monkeypatch.setattr(command, "run_compare", lambda spec, options: report)
    cfg = small_config(tmp_path / "c.json")
    argv = ["compare", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path), "--modes", "truncate,reshape"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    said = "tokens to target 1,588 (1,500-2,500), 500 (500-500) us/token"
    assert any(x.startswith("truncate") and said in x for x in out.splitlines())


def test_variable_is_a_mode_arm_trained_with_curriculum_mode_variable(tmp_path, monkeypatch):
    from seqwarm.experiments import compare
    from seqwarm.run.command import command_line

    # the arm is built whether or not this seqwarm's train runs the mode yet; check_arms resolves it with
    # the config reader, which knows the mode once `seqwarm train --curriculum-mode variable` exists
    monkeypatch.setattr(compare, "CURRICULUM_MODES", (*compare.CURRICULUM_MODES, "variable"))
    monkeypatch.setattr(compare, "check_arms", lambda runs: None)
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plan = plan_compare(*_args(tmp_path, "--config", str(cfg), "--modes", "truncate,variable", "--seeds", "3"))
    out = tmp_path / "cmp"
    assert list(plan.runs) == ["baseline", "truncate", "variable"] and plan.curricula == ("truncate", "variable")
    variable, truncate = plan.runs["variable"], plan.runs["truncate"]
    assert variable.out == out / "variable" and plan.by_seed()[1236]["variable"].out == out / "seed-1236" / "variable"
    assert variable.settings["curriculum_mode"] == "variable" and "--curriculum-mode variable" in command_line(variable)
    assert {**variable.settings, "curriculum_mode": None} == {**truncate.settings, "curriculum_mode": None}
    assert (out / "configs" / "variable.json").read_text() == (out / "configs" / "truncate.json").read_text()
    assert "curriculum_mode" not in plan.runs["baseline"].settings


def test_variable_is_refused_with_the_reason_while_train_cannot_run_it(tmp_path, capsys, monkeypatch):
    from seqwarm.experiments import compare

    monkeypatch.setattr(compare, "CURRICULUM_MODES", tuple(m for m in compare.CURRICULUM_MODES if m != "variable"))
    cfg = small_config(tmp_path / "c.json")
    argv = ["compare", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "o"), "--modes"]
    assert main([*argv, "truncate,variable"]) == 2
    err = capsys.readouterr().err
    assert "--curriculum-mode variable`, which this seqwarm does not run yet" in err and "Traceback" not in err


def test_a_variable_arm_on_deepspeed_is_refused_before_any_arm_trains(tmp_path):
    from seqwarm.util.errors import UserError

    cfg = small_config(tmp_path / "c.json")
    with pytest.raises(UserError, match="(?s)variable: .*curriculum mode variable trains seqwarm's GPT"):
        plan_compare(*_args(tmp_path, "--config", str(cfg), "--modes", "truncate,variable", "--deepspeed"))
    assert not (tmp_path / "cmp" / "baseline").exists()
