"""`seqwarm sweep` with the curriculum mode and document masking as grid axes: the plan (no training)."""

import pytest

from conftest import FAST_TRAIN_FLAGS, small_config
from seqwarm.cli import build_parser, main
from seqwarm.cli.commands.sweep import sweep_inputs
from seqwarm.experiments.sweep import plan_sweep, state_key
from seqwarm.run.spec import resolve_config


def _inputs(tmp_path, *extra):
    argv = ["sweep", *FAST_TRAIN_FLAGS, "--out", str(tmp_path / "sw"), *extra]
    return sweep_inputs(build_parser().parse_args(argv))


def test_mode_and_masking_axes_share_the_baseline_across_modes(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    extra = ["--curriculum-mode", "truncate,window", "--document-masking", "off,on", "--seeds", "2"]
    cells = plan_sweep(*_inputs(tmp_path, "--config", str(cfg), *extra))
    assert [c["name"] for c in cells] == [
        f"lr-cfg_bs-1_clip-cfg_wu-cfg_pos-learned_docmask-{m}_mode-{mode}"
        for m in ("off", "on")
        for mode in ("truncate", "window")
    ]
    out = tmp_path / "sw"
    for cell in cells:
        folder = out / cell["name"].rsplit("_mode-", 1)[0]
        for seed, runs in cell["runs"].items():
            where = folder if seed == 1234 else folder / f"seed-{seed}"
            assert runs["baseline"].out == where / "baseline"
            assert runs["curriculum"].out == where / cell["curriculum_mode"]
            b, c = (resolve_config(runs[arm]) for arm in ("baseline", "curriculum"))
            assert b.curriculum is None and c.curriculum.mode == cell["curriculum_mode"]
            assert b.document_masking is c.document_masking is cell["document_masking"]
            assert "curriculum_mode" not in runs["baseline"].settings
    # the two modes of one masking setting train the same baseline, in the same folder
    trunc, window = cells[0]["runs"][1235], cells[1]["runs"][1235]
    assert trunc["baseline"].out == window["baseline"].out
    assert resolve_config(trunc["baseline"]).to_dict() == resolve_config(window["baseline"]).to_dict()
    assert trunc["baseline"].settings == window["baseline"].settings


def test_the_modes_of_a_cell_share_the_baselines_state_and_keep_their_own(tmp_path):
    """One state entry for the shared baseline (a diverged one is not trained again per mode); a sweep
    without a mode axis keeps the keys it always had."""
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    out = tmp_path / "sw"
    cells = plan_sweep(*_inputs(tmp_path, "--config", str(cfg), "--curriculum-mode", "truncate,window", "--seeds", "2"))
    for seed in (1234, 1235):
        base = {state_key(out, c, seed, "baseline") for c in cells}
        cur = {state_key(out, c, seed, "curriculum") for c in cells}
        assert base == {f"lr-cfg_bs-1_clip-cfg_wu-cfg_pos-learned/seed-{seed}/baseline"} and len(cur) == 2
    (plain,) = plan_sweep(*_inputs(tmp_path, "--config", str(cfg)))
    assert [state_key(out, plain, 1234, arm) for arm in ("baseline", "curriculum")] == [
        f"{plain['name']}/seed-1234/baseline",
        f"{plain['name']}/seed-1234/curriculum",
    ]


def test_one_mode_or_masking_value_is_a_setting_and_keeps_the_cell_names(tmp_path):
    cfg = small_config(tmp_path / "c.json", train_tokens=20_000, total_step=40)
    plain = plan_sweep(*_inputs(tmp_path, "--config", str(cfg)))
    cells = plan_sweep(*_inputs(tmp_path, "--config", str(cfg), "--curriculum-mode", "reshape", "--document-masking"))
    assert [c["name"] for c in cells] == [c["name"] for c in plain] == ["lr-cfg_bs-1_clip-cfg_wu-cfg_pos-learned"]
    runs = cells[0]["runs"][1234]
    assert runs["curriculum"].out == tmp_path / "sw" / cells[0]["name"] / "curriculum"
    c = resolve_config(runs["curriculum"])
    assert c.curriculum.mode == "reshape" and c.document_masking is True
    assert resolve_config(runs["baseline"]).document_masking is True
    assert "curriculum_mode" not in cells[0] and "curriculum_mode" not in plain[0]["runs"][1234]["curriculum"].settings


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--curriculum-mode", "truncate,inject"], "--curriculum-mode inject: as a grid axis choose from truncate"),
        (["--curriculum-mode", "slice"], "--curriculum-mode slice: choose from truncate, reshape, window, inject"),
        (["--curriculum-mode", "reshape,reshape"], "--curriculum-mode: a value is named twice"),
        (["--document-masking", "off,maybe"], "'maybe' is not on or off"),
    ],
)
def test_bad_mode_or_masking_axis_exits_2(tmp_path, capsys, extra, fragment):
    cfg = small_config(tmp_path / "c.json")
    try:  # a flag argparse refuses exits at parse time
        code = main(["sweep", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--out", str(tmp_path / "o"), *extra])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_limits_keep_the_modes_apart():
    from seqwarm.experiments.sweep import stability_limits

    def cell(lr, mode, diverged):
        arms = {"baseline": {"diverged": False}, "curriculum": {"diverged": diverged}}
        return {"lr": lr, "scale_batch": 1, "pos": "learned", "curriculum_mode": mode, **arms}

    cells = [cell(1e-3, "truncate", False), cell(4e-3, "truncate", True)]
    cells += [cell(1e-3, "window", False), cell(4e-3, "window", False)]
    limits = {(r["curriculum_mode"], r["arm"]): r for r in stability_limits(cells)}
    assert limits[("truncate", "curriculum")]["largest_stable_lr"] == 1e-3
    assert limits[("truncate", "curriculum")]["smallest_diverged_lr"] == 4e-3
    assert limits[("window", "curriculum")]["largest_stable_lr"] == 4e-3
    assert limits[("window", "curriculum")]["smallest_diverged_lr"] is None
