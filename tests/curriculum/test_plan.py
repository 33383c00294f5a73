"""`seqwarm plan`: the run ahead of time, and its agreement with the token budget."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqwarm import load_config, make_plan
from seqwarm.cli import main

SEED = Path(__file__).resolve().parents[2] / "examples" / "ds_config_gpt2.json"


def test_seed_config_total_steps_golden():
    plan = make_plan(load_config(SEED, overrides={"train_tokens": 157_286_400_000}))
    assert plan.total_steps == 45_000
    assert plan.curriculum_end_step == 15_000
    assert plan.total_tokens >= 157_286_400_000
    # tokens at the curriculum end = sum over steps 1..14999 of 4096 x length
    assert plan.tokens_at_curriculum_end == plan.points[-2].tokens - plan.points[-2].tokens_per_step
    assert [p.seqlen for p in plan.points[:3]] == [8, 16, 24]
    assert plan.points[1].step == 119


def test_plan_json_cli(capsys):
    assert (
        main(
            [
                "plan",
                str(SEED),
                "--train-tokens",
                "157286400000",
                "--json",
                "--lr-warmup-samples",
                "46875000",
                "--lr-decay-style",
                "cosine",
                "--min-lr",
                "1e-5",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for key in ("total_steps", "tokens_at_curriculum_end", "warmup_end_tokens", "points"):
        assert key in out
    assert out["total_steps"] == 45_000
    assert set(out["points"][0]) >= {"step", "seqlen", "tokens", "lr"}
    assert out["warmup_end_tokens"] > 0
    lrs = [p["lr"] for p in out["points"]]
    assert lrs[-1] == pytest.approx(1e-5)


def test_fifty_thousand_steps():
    # How fast this is belongs in a benchmark, not in a timed test (shared CI machines swing 5x).
    cfg = load_config(
        SEED,
        overrides={
            "train_iters": 50_000,
            "lr_warmup_iters": 500,
            "lr_decay_style": "cosine",
            "lr_decay_tokens": 10**11,
        },
    )
    plan = make_plan(cfg)
    assert plan.total_steps == 50_000 and plan.points[-1].step <= 50_000


def test_warnings_and_table(capsys, tmp_path):
    png = tmp_path / "plan.png"
    assert (
        main(
            [
                "plan",
                str(SEED),
                "--train-iters",
                "10000",
                "--lr-warmup-iters",
                "10",
                "--rampup-batch-size",
                "32",
                "32",
                "2000",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "curriculum is longer than the run" in captured.err
    assert "before the curriculum does" in captured.err
    assert "batch-size ramp" in captured.err
    assert "length changes shown" in captured.out
    assert png.stat().st_size > 10_000


TINY = SEED.parent / "tiny_cpu.json"


def test_a_warmup_longer_than_the_run_is_said(capsys):
    """--no-curriculum --train-tokens 20000: 5 steps of an 8-iteration warmup end at 62% of the peak."""
    assert main(["plan", str(TINY), "--no-curriculum", "--train-tokens", "20000"]) == 0
    captured = capsys.readouterr()
    assert "LR warmup ends:            never: the run stops first, at 62% of the peak LR" in captured.out
    assert "the LR warmup (8 iters) is longer than the run (5 steps" in captured.err
    assert "62% of its peak 0.001" in captured.err
    plan = make_plan(load_config(TINY, overrides={"train_tokens": 20000, "curriculum": False}))
    assert plan.warmup_reached == pytest.approx(5 / 8)
    full = make_plan(load_config(TINY))  # the demo: warmup ends at step 8, no such warning
    assert full.warmup_reached is None and full.warmup_end_step == 8
    assert not any("warmup" in w and "longer than the run" in w for w in full.warnings)


def test_the_budget_says_how_often_it_repeats_the_data():
    """The README's `--train-tokens 2M` on a 38k-token folder: 148 windows of 257 tokens, drawn ~100 times
    each with the curriculum (it trains a prefix of each window); the default run does not warn."""
    from seqwarm.curriculum.plan import MANY_PASSES, data_use

    plan = make_plan(load_config(TINY, overrides={"train_tokens": 2_000_000}))
    line, warning = data_use(plan, 148)
    passes = plan.total_samples / 148
    assert passes > 52 and f"{passes:.2f} passes over the training data" in line
    assert warning is not None and f"goes over the training data {passes:.0f} times" in warning
    demo = make_plan(load_config(TINY))  # the embedded corpus (13.5 MB of text): ~10k windows of 257 tokens
    assert data_use(demo, 13_000)[1] is None and demo.total_samples / 13_000 < MANY_PASSES


def test_plan_without_budget_goes_to_curriculum_end(capsys):
    assert main(["plan", str(SEED)]) == 0
    assert "planned to the end of the curriculum" in capsys.readouterr().out


def test_plan_errors_exit_2(capsys, tmp_path):
    assert main(["plan", str(SEED), "--train-tokens", "1e3", "--model", "gpt3"]) == 2
    assert "--model 'gpt3': choose one of tiny" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["plan", str(SEED), "--train-tokens", "abc"])
    assert info.value.code == 2
    assert main(["plan", str(tmp_path / "none.json")]) == 2


def test_plan_shows_the_tutorial_conversions(capsys):
    assert (
        main(
            [
                "plan",
                str(SEED),
                "--train-tokens",
                "157286400000",
                "--lr-warmup-tokens",
                "375M",
                "--lr-decay-samples",
                "100000",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    # 375M tokens at min_difficulty 8 = 46,875,000 samples = 11,445 iterations of 4096 (rounded up)
    assert out["conversions"] == {
        "lr_decay_tokens": 100_000 * 1024,
        "lr_warmup_samples": 46_875_000,
        "lr_warmup_iters": 11_445,
    }


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    """`seqwarm plan ... --json | head -c 100`: the reader leaves early; no traceback, exit 0."""
    cfg = json.loads(SEED.read_text())  # a length change every step: far more JSON than a pipe holds
    cfg["curriculum_learning"].update(
        max_difficulty=4096, schedule_config={"total_curriculum_step": 4000, "difficulty_step": 1}
    )
    path = tmp_path / "many.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "seqwarm", "plan", str(path), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()  # like `head` exiting
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
    assert proc.returncode == 0


def test_plan_and_check_config_do_not_import_torch_or_matplotlib():
    # cli.py registers every command at start-up, so one command module importing torch slows them all.
    code = (
        "import sys; from seqwarm.cli import main; "
        f"assert main(['check-config', {str(SEED)!r}]) == 0; assert main(['plan', {str(SEED)!r}]) == 0; "
        "heavy = sorted(m for m in ('torch', 'matplotlib') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_curves_figure_draws_the_schedule_with_the_logged_points(tmp_path, monkeypatch):
    """curves.png: the length panel is the plan's staircase, step by step (not the logged steps joined,
    10 steps wide), the logged values sit on it, and the LR panel has a y label."""
    from seqwarm.config import RunConfig
    from seqwarm.trainer import plots

    cfg = load_config(TINY)
    plan = make_plan(cfg, keep_series=True)
    run_config = json.loads(json.dumps(cfg.to_dict(), default=lambda o: list(o) if isinstance(o, tuple) else str(o)))
    assert RunConfig.from_dict(run_config) == cfg  # what config.json holds replays as the same plan
    (tmp_path / "config.json").write_text(json.dumps({"run": run_config}))
    logged = [i for i in range(len(plan.steps)) if plan.steps[i] % 10 == 0 or i == 0]
    rows = [
        {
            "kind": "train",
            "step": plan.steps[i],
            "tokens": plan.cum_tokens[i],
            "seqlen": plan.seqlens[i],
            "lr": plan.lrs[i],
            "loss": 5.0,
        }
        for i in logged
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figures = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path, dpi: figures.append(fig) or path)
    plots.plot_run(tmp_path)
    _, length, lr = figures[0].axes
    schedule, dots = length.get_lines()
    assert list(schedule.get_xdata()) == plan.steps and list(schedule.get_ydata()) == plan.seqlens
    assert schedule.get_drawstyle() == "steps-post"
    assert list(dots.get_xdata()) == [r["step"] for r in rows] and dots.get_linestyle() == "None"
    assert list(lr.get_lines()[0].get_ydata()) == plan.lrs
    assert lr.get_ylabel() == "learning rate" and length.get_ylabel() == "tokens per sequence"
    (tmp_path / "config.json").unlink()  # no recipe: the logged values alone, still a figure
    plots.plot_run(tmp_path)
    assert len(figures[1].axes[1].get_lines()) == 1


def test_plan_refuses_a_figure_format_it_cannot_write_and_a_world_size_of_0(tmp_path, capsys):
    assert main(["plan", str(SEED), "--plot", str(tmp_path / "plan.txt")]) == 2
    assert "cannot write .txt figures" in capsys.readouterr().err and not (tmp_path / "plan.txt").exists()
    with pytest.raises(SystemExit) as err:
        main(["plan", str(SEED), "--world-size", "0"])
    assert err.value.code == 2


def test_check_config_warns_what_train_would_refuse(tmp_path, capsys):
    cfg = json.loads(SEED.read_text())
    cfg["seqwarm"] = {"rampup_batch_size": [16, 16, 1000]}
    path = tmp_path / "ramp.json"
    path.write_text(json.dumps(cfg))
    assert main(["check-config", str(path)]) == 0
    err = capsys.readouterr().err
    assert "`seqwarm train` refuses it: rampup_batch_size" in err and "no budget" not in err


def _mode_config(mode: str | None, **seqwarm) -> dict:
    """A small config: curriculum 8 -> 64 in steps of 8 over 16 steps, micro-batch 3 (reshape leaves
    remainders), 200k tokens (the curriculum ends well before the budget)."""
    cur = {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": 8,
        "max_difficulty": 64,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 16, "difficulty_step": 8},
    }
    extra = {"curriculum_mode": mode} if mode else {}
    return {
        "train_batch_size": 6,
        "train_micro_batch_size_per_gpu": 3,
        "curriculum_learning": cur,
        "seqwarm": {"seq_length": 64, "train_tokens": 200_000, **extra, **seqwarm},
    }


def _cut_shapes(plan, cut) -> list[tuple[int, int]]:
    """The shapes the cut op really makes of a dummy (3, 64) batch at each length the plan trains at."""
    import torch

    ids = torch.arange(3 * 64).reshape(3, 64)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(64).expand(3, 64)}
    seen = [tuple(cut(batch, p.seqlen)["input_ids"].shape) for p in plan.points]
    return list(dict.fromkeys(seen))


@pytest.mark.parametrize("mode", ["truncate", "reshape", "window", "inject", "bucket"])
def test_plan_shapes_are_those_the_cut_ops_make(mode):
    from seqwarm.curriculum.batch import bucket_batch, reshape_batch, truncate_batch, window_batch

    cuts = {
        "truncate": truncate_batch,
        "inject": truncate_batch,  # the loop hands the model the first L columns
        "reshape": reshape_batch,
        "window": window_batch,
        "bucket": lambda batch, length: bucket_batch(batch, length, 24),
    }
    settings = {"length_bucket": 24} if mode == "bucket" else {}
    plan = make_plan(load_config(_mode_config(None if mode == "bucket" else mode, **settings)))
    assert [p.seqlen for p in plan.points][:2] == [8, 16] and plan.points[-1].seqlen == 64
    assert plan.shapes == _cut_shapes(plan, cuts[mode])
    assert plan.val_shape == (3, 64)
    expected_count = {"truncate": 8, "inject": 8, "reshape": 8, "window": 1, "bucket": 3}[mode]
    assert len(plan.shapes) == expected_count, plan.shapes  # 8 lengths; window one; buckets 24, 48, 64


def test_plan_compile_count_follows_the_mode():
    def count(mode, **settings):
        return make_plan(load_config(_mode_config(mode, **settings))).compiles

    # one graph for every length + validation; inject +1 for curriculum_seqlen; window: one input set at
    # every length (its positions are kept); reshape: a second row count, and position_ids kept where rows
    # cross two windows
    assert (count("truncate"), count("inject"), count(None), count("window")) == (2, 3, 3, 2)
    assert count("reshape") == 5
    assert count(None, length_bucket=24) == 3  # loss_mask kept where the bucket masks columns: 2 input sets
    assert count(None, length_bucket=8) == 2  # every length a multiple of 8: nothing masked, one input set
    no_curriculum = load_config({**_mode_config("truncate"), "curriculum_learning": {"enabled": False}})
    plan = make_plan(no_curriculum)
    assert (plan.shapes, plan.compiles) == ([(3, 64)], 2)


def test_plan_without_a_budget_does_not_warn_of_the_curriculum_share():
    """Planned only to the end of the curriculum, the curriculum is the whole plan: no '100%' warning."""
    cfg = _mode_config("truncate")
    del cfg["seqwarm"]["train_tokens"]
    plan = make_plan(load_config(cfg))
    assert plan.curriculum_end_step == plan.total_steps
    assert not any("of the run's steps" in w for w in plan.warnings)
    short = _mode_config("truncate", train_tokens=3_500)  # a real budget the curriculum nearly fills
    assert any("of the run's steps" in w for w in make_plan(load_config(short)).warnings)
