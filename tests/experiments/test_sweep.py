"""`seqwarm sweep`: the grid plan (no training), bad input, and a 2x1 grid of tiny runs, reused on rerun.

The slow, end-to-end tests of this file are in tests/e2e/test_sweep_runs.py.
"""

import json

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import build_parser, main
from seqwarm.cli.commands.sweep import sweep_inputs
from seqwarm.experiments.sweep import plan_sweep, render_sweep
from seqwarm.run.spec import resolve_config


def _inputs(tmp_path, *extra):
    return sweep_inputs(build_parser().parse_args(["sweep", *FAST_TRAIN_FLAGS, "--out", str(tmp_path / "sw"), *extra]))


def test_grid_plan_cells_folders_and_both_arms_at_the_batch_scale(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    base, options = _inputs(
        tmp_path,
        "--config",
        str(cfg),
        "--lr",
        "1e-3,4e-3",
        "--scale-batch",
        "1,4",
        "--clip-grad",
        "1,0",
        "--pos",
        "learned,rotary",
        "--seeds",
        "2",
    )
    assert base.settings.get("lr") is None  # the grid's --lr is not the train flag
    cells = plan_sweep(base, options)
    assert len(cells) == 2 * 2 * 2 * 2
    cell = next(c for c in cells if c["name"] == "lr-0.004_bs-4_clip-0_wu-cfg_pos-rotary")
    assert list(cell["runs"]) == [1234, 1235]
    runs = cell["runs"][1235]
    assert runs["baseline"].out == tmp_path / "sw" / cell["name"] / "seed-1235" / "baseline"
    b, c = (resolve_config(runs[arm]) for arm in ("baseline", "curriculum"))
    assert b.train_batch_size == c.train_batch_size == 4 * 8 and b.curriculum is None and c.curriculum
    assert b.lr.lr == c.lr.lr == 4e-3 and b.gradient_clipping == 0 and runs["curriculum"].rotary
    assert c.curriculum.schedule_config["total_curriculum_step"] == 10  # 40 steps / 4


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--pos", "alibi"], "--pos alibi: choose learned or rotary"),
        (["--scale-batch", "0"], "--scale-batch 0: must be >= 1"),
        (["--lr", "x"], "'x' is not a float"),
    ],
)
def test_bad_grid_exits_2(tmp_path, capsys, extra, fragment):
    cfg = small_config(tmp_path / "c.json")
    try:
        code = main(["sweep", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "sw"), *extra])
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and fragment in capsys.readouterr().err


def test_sweep_markdown_labels_one_seed():
    report = {
        "grid": {"seeds": 1},
        "definitions": {"spread": "def"},
        "cells": [
            {
                "name": "lr-0.001_bs-1_clip-cfg_wu-cfg_pos-learned",
                "baseline": {"final_val_loss": {"median": 4.0, "min": 4.0, "max": 4.0, "n": 1}, "diverged": 0},
                "curriculum": {
                    "final_val_loss": {"median": 3.9, "min": 3.9, "max": 3.9, "n": 1},
                    "diverged": 1,
                    "speedup_tokens": {"median": None, "min": None, "max": None, "n": 0},
                    "tokens_to_target": {"median": None, "min": None, "max": None, "n": 0},
                    "reached": 0,
                },
            }
        ],
    }
    md = render_sweep(report)
    assert "one seed: no spread measured" in md and "| curriculum | 3.9000 | 1/1 | – | – | 0/1 | – |" in md
    assert "| baseline | 4.0000 | 0/1 | – | – | – | – |" in md


def _run(tokens, losses, diverged=False):
    return {
        "tokens": tokens,
        "val_loss": losses,
        "final_val_loss": losses[-1],
        "diverged": diverged,
        "non_finite": False,
    }


def _cell_of(name, k, seeds, base_median):
    return {
        "name": name,
        "lr": 1e-3,
        "scale_batch": k,
        "seeds": seeds,
        "baseline": {"final_val_loss": {"median": base_median}, "diverged": 0},
    }


def test_cells_are_measured_against_the_best_stable_baseline():
    from seqwarm.experiments.sweep import against_best_baseline
    from seqwarm.experiments.sweep_report import _render_best

    xs = [100, 200, 300, 400]
    good = [
        {"seed": 1, "baseline": _run(xs, [6, 5, 4.5, 4.0]), "curriculum": _run(xs, [5, 4.4, 4.0, 3.9])},
        {"seed": 2, "baseline": _run(xs, [6, 5, 4.6, 4.2]), "curriculum": _run(xs, [6, 5, 4.8, 4.6])},
    ]
    worse = [
        {"seed": 1, "baseline": _run(xs, [6, 5.5, 5, 4.9]), "curriculum": _run(xs, [5, 4.5, 4.25, 4.0])},
        {"seed": 2, "baseline": _run(xs, [6, 5.5, 5, 4.9]), "curriculum": _run(xs, [5, 4.5, 4.3, 4.1])},
    ]
    unstable = _cell_of("lr-big", 1, worse, 3.0)
    unstable["baseline"]["diverged"] = 1  # lowest loss, but it diverged on a seed: never the reference
    cells = [
        _cell_of("lr-a", 1, good, 4.1),
        _cell_of("lr-b", 1, worse, 4.9),
        unstable,
        _cell_of("lr-c_bs-8", 8, worse, 2.0),
    ]  # a larger batch scale is never the reference either
    best = against_best_baseline(cells)
    assert best["cell"] == "lr-a" and [t["target"] for t in best["targets"]] == [4.0, 4.2]
    assert [t["tokens"] for t in best["targets"]] == [400, 400]
    rows = {(r["cell"], r["arm"]): r for r in best["rows"]}
    assert rows[("lr-a", "baseline")]["per_seed"] == [1.0, 1.0]
    # seed 1 reaches 4.0 at 300 tokens (0.75); seed 2 never reaches 4.2
    assert rows[("lr-a", "curriculum")]["per_seed"] == [0.75, None] and rows[("lr-a", "curriculum")]["reached"] == 1
    # seed 1: 4.25 at 300, 4.0 at 400 -> 400; seed 2: 4.3 at 300, 4.1 at 400 -> 4.2 at 350
    assert rows[("lr-b", "curriculum")]["per_seed"] == pytest.approx([1.0, 0.875])
    assert rows[("lr-b", "curriculum")]["tokens_ratio"]["median"] == pytest.approx(0.9375)
    assert rows[("lr-b", "baseline")]["reached"] == 0
    md = "\n".join(_render_best(best))
    assert "`lr-a`" in md and "| lr-b | curriculum | 0.94 (0.87–1.00) | 2/2 |" in md


def test_no_stable_baseline_means_no_reference():
    from seqwarm.experiments.sweep import against_best_baseline

    cell = _cell_of("lr-x", 1, [], 4.0)
    cell["baseline"]["diverged"] = 2
    assert against_best_baseline([cell]) is None and against_best_baseline([]) is None


def test_the_largest_lr_each_arm_survives_per_setting_of_the_other_axes():
    from seqwarm.experiments.sweep import stability_limits
    from seqwarm.experiments.sweep_report import _render_limits

    def cell(lr, k, base_div, cur_div, clip=None):
        return {
            "name": f"lr-{lr}_bs-{k}",
            "lr": lr,
            "scale_batch": k,
            "clip_grad": clip,
            "lr_warmup_iters": None,
            "pos": "learned",
            "baseline": {"diverged": base_div},
            "curriculum": {"diverged": cur_div},
        }

    cells = [
        cell(1e-3, 1, 0, 0),
        cell(4e-3, 1, 0, 0),
        cell(1.6e-2, 1, 2, 0),  # the baseline fails first
        cell(1e-3, 8, 0, 0),
        cell(4e-3, 8, 1, 1),
        cell(1.6e-2, 8, 3, 0),  # not monotone: both are said
        cell(1e-3, 1, 1, 0, clip=0.0),
        {**cell(None, 1, 0, 0), "lr": None},
    ]
    limits = {(r["scale_batch"], r["clip_grad"], r["arm"]): r for r in stability_limits(cells)}
    assert len(limits) == 6  # the config-LR cell has no LR axis
    assert (
        limits[(1, None, "baseline")]["largest_stable_lr"],
        limits[(1, None, "baseline")]["smallest_diverged_lr"],
    ) == (4e-3, 1.6e-2)
    assert limits[(1, None, "curriculum")]["smallest_diverged_lr"] is None
    assert (
        limits[(8, None, "curriculum")]["largest_stable_lr"],
        limits[(8, None, "curriculum")]["smallest_diverged_lr"],
    ) == (1.6e-2, 4e-3)
    assert limits[(1, 0.0, "baseline")]["largest_stable_lr"] is None
    md = "\n".join(_render_limits(list(limits.values())))
    assert "| x1 | config | config | learned | baseline | 0.004 | 0.016 |" in md
    assert "| x1 | config | config | learned | curriculum | 0.016 | none up to 0.016 |" in md
    assert "| x1 | off | config | learned | baseline | none | 0.001 |" in md


def test_a_run_whose_loss_blows_past_a_uniform_guess_diverged_even_without_a_ratio_spike(tmp_path):
    import math

    from seqwarm.experiments.sweep import run_result
    from seqwarm.run.spec import RunSpec

    def run(name, losses):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"kind": "train", "step": i + 1, "loss": v, "tokens": 10 * (i + 1)}) + "\n"
                for i, v in enumerate(losses)
            )
        )
        (folder / "summary.json").write_text(json.dumps({"final_val_loss": losses[-1]}))
        (folder / "config.json").write_text(json.dumps({"model": {"vocab_size": 100}, "run": {}}))
        return run_result(RunSpec(out=folder), {"status": "finished"}, 1.2, 2)

    uniform = math.log(100)  # 4.6: a fresh model's loss
    healthy = run("healthy", [uniform, 4.0, 3.5, 3.2, 3.0, 2.9])
    # blown up by the first logged step, then falling: no ratio spike (never above its lowest so far), but
    # 3x a uniform guess
    blown = run("blown", [14.0, 13.0, 12.0, 11.0, 6.0])
    assert not healthy["diverged"] and not healthy["blew_up"] and healthy["max_train_loss"] == uniform
    assert blown["spikes"] == 0 and blown["blew_up"] and blown["diverged"] and blown["max_train_loss"] == 14.0
