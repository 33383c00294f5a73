"""The compare report a person reads: ``report.md`` and two figures, from the dict ``report.json`` holds.

The figures are drawn by :mod:`seqwarm.trainer.plots`; this module writes the files and the markdown.

- ``compare_val.png``: full-length validation loss against tokens and against wall-clock, with the
  target (the baseline's final loss) and where each run first reaches it.
- ``compare_stability.png``: loss ratio (smoothed, with the spike threshold), training loss at the
  current length, sequence length, gradient norm, and Adam's second-moment l1 norm and max — all
  against tokens.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from seqwarm.experiments import curves, spread
from seqwarm.trainer.metrics import format_duration, read_metrics
from seqwarm.trainer.plots import COMPARE_RUNS as RUNS
from seqwarm.trainer.plots import compare_arm, compare_arms, plot_compare_stability, plot_compare_val
from seqwarm.util.atomic import write_json, write_text
from seqwarm.util.units import human_count

TIME_NOTE = (
    "measured, not a result: it moves with the machine's load and includes evaluations and checkpoints; "
    "the tokens are the speedup"
)
"""What the report and the console say beside the wall-clock speedup (two runs with the same losses
measured 3.01x and 4.16x on a shared machine)."""

PER_TOKEN_NOTE = (
    "Tokens to target: the tokens an arm trained until its full-length validation loss first reached the target "
    "(interpolated; the baseline's: its own first crossing). µs per token: the seconds its training steps took "
    "per token trained, evaluations and checkpoints left out (shorter rows cost less attention)."
)

FIGURES = ("compare_val.png", "compare_stability.png")


def write_report(out: Path, report: dict[str, Any]) -> list[Path]:
    """Write ``report.json``, the figures and ``report.md`` into ``out``; return the paths written."""
    out = Path(out)
    report["figures"] = list(FIGURES)
    paths = [write_json(out / "report.json", report)]
    paths += [
        plot_compare_val(report, out / FIGURES[0], seed_val_curves(report)),
        plot_compare_stability(
            report,
            stability_curves(report),
            out / FIGURES[1],
            [stability_curves(report, dirs) for dirs in seed_run_dirs(report)[1:]],
        ),
    ]
    md = render_modes_markdown(report) if report.get("modes") else render_markdown(report)
    return paths + [write_text(out / "report.md", md)]


def _arm_seed_rows(report: dict[str, Any], name: str) -> list[tuple[dict[str, Any], str]]:
    """Arm ``name``'s seed rows with the row key the arm has in them (a mode is ``curriculum`` in its own)."""
    modes = report.get("modes") or {}
    if name in modes:
        return [(r, "curriculum") for r in modes[name].get("seeds") or []]
    return [(r, name) for r in report.get("seeds") or []]


def seed_run_dirs(report: dict[str, Any]) -> list[dict[str, str]]:
    """Every seed's run folder of every arm, first seed first."""
    out: list[dict[str, str]] = []
    for name in compare_arms(report):
        for i, (row, key) in enumerate(_arm_seed_rows(report, name)):
            if i == len(out):
                out.append({})
            out[i][name] = row["run_dirs"][key]
    return out


def seed_val_curves(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's validation curves of every seed and their point-by-point median (for the figure)."""
    out = {}
    for name in compare_arms(report):
        each = [r["evals"][key] for r, key in _arm_seed_rows(report, name)]
        tok, loss = spread.median_curve([(e["tokens"], e["val_loss"]) for e in each])
        sec, _ = spread.median_curve([(e["elapsed_s"], e["val_loss"]) for e in each])
        out[name] = {"each": each, "median": {"tokens": tok, "elapsed_s": sec, "val_loss": loss}}
    return out


def stability_curves(
    report: dict[str, Any], run_dirs: dict[str, str] | None = None
) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """Each run's ``(tokens, values)`` for every panel of the stability figure, from its metrics.jsonl
    (``run_dirs``: another seed's runs; default the report's own, the first seed's)."""
    window = report["stability"]["smooth_steps"]
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for name in compare_arms(report):
        folder = (run_dirs or {}).get(name) or compare_arm(report, name)["run_dir"]
        rows = [r for r in read_metrics(Path(folder) / "metrics.jsonl") if r.get("kind") == "train"]
        if not rows:
            continue
        tokens = [r["tokens"] for r in rows]
        losses = [r["loss"] for r in rows]
        series = {
            "ratio": (tokens, curves.loss_ratio(losses, window)),
            "loss": (tokens, losses),
            "seqlen": (tokens, [r["seqlen"] for r in rows]),
        }
        for key in ("grad_norm", "adam_v_l1", "adam_v_max"):
            pts = [(t, r[key]) for t, r in zip(tokens, rows) if isinstance(r.get(key), (int, float))]
            series[key] = ([t for t, _ in pts], [v for _, v in pts])
        out[name] = series
    return out


# --------------------------------------------------------------------------------------------------
# markdown


def _f(value: Any, fmt: str = ".4f") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, fmt)


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _seeds_label(report: dict[str, Any]) -> str:
    n = len(report.get("seeds") or [None])
    return "one seed (no spread measured)" if n == 1 else f"{n} seeds"


def spread_text(s: dict[str, Any] | None, fmt: str, unit: str = "", dash: str = "–") -> str:
    """A spread (``spread.aggregate``'s median, min, max, n) as ``median (min–max)``; ``dash`` alone when
    there is none (the console passes an ASCII ``-``)."""
    if not s or s.get("median") is None:
        return dash
    if s["n"] == 1:
        return f"{format(s['median'], fmt)}{unit}"
    return f"{format(s['median'], fmt)}{unit} ({format(s['min'], fmt)}{dash}{format(s['max'], fmt)}{unit})"


def _seeds_section(report: dict[str, Any]) -> list[str]:
    """Every seed's numbers, their median and min–max, and the plain verdict on the seed spread.

    The sections above are the first seed's (``report.json``'s top-level keys); this one is the whole.
    """
    rows, agg = report.get("seeds"), report.get("aggregate")
    if not rows or not agg:
        return []
    lines = ["## Seeds", ""]
    if len(rows) > 1:
        lines += [
            f"The sections above show seed {rows[0]['seed']}; the figures draw every seed thinly and the "
            "median boldly.",
            "",
        ]
    lines += [
        "| seed | speedup_tokens | speedup_time | final val loss baseline | final val loss curriculum | "
        "spikes baseline | spikes curriculum |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        fl, sp = r["final_val_loss"], r["spikes"]
        never = "never reached" if r.get("target") is not None and not r.get("reached") else "–"
        lines.append(
            f"| {r['seed']} | {_x(r['speedup_tokens']) if r['speedup_tokens'] else never} | "
            f"{_x(r['speedup_time']) if r['speedup_time'] else never} | {_f(fl['baseline'])} | "
            f"{_f(fl['curriculum'])} | {sp['baseline']} | {sp['curriculum']} |"
        )
    fl, sk = agg["final_val_loss"], agg["spikes"]
    lines.append(
        f"| **median (min–max)** | {spread_text(agg['speedup_tokens'], '.2f', 'x')} | "
        f"{spread_text(agg['speedup_time'], '.2f', 'x')} | {spread_text(fl['baseline'], '.4f')} | "
        f"{spread_text(fl['curriculum'], '.4f')} | {spread_text(sk['baseline'], 'g')} | "
        f"{spread_text(sk['curriculum'], 'g')} |"
    )
    lines += ["", f"Reached the target on {agg['reached']} of {agg['n_seeds']} seed(s)."]
    lines += [""] + [f"- **{t}**" for t in agg["verdict"]["text"]]
    if "spread" in report.get("definitions", {}):
        lines += ["", f"_{report['definitions']['spread']}_"]
    return lines + [""]


def render_markdown(report: dict[str, Any]) -> str:
    cur = report["curriculum"]
    lines = [
        "# seqwarm compare: baseline vs sequence-length curriculum",
        "",
        f"{report['date']} · seqwarm {report['seqwarm_version']} · {report['machine']['platform']}, "
        f"{report['machine']['cpus']} CPUs · {_seeds_label(report)}",
        "",
    ]
    for note in report.get("notes", []):
        lines.append(f"- {note}")
    if report.get("notes"):
        lines.append("")
    lines += ["## Runs", ""] + _runs_table(report, RUNS)
    lines += ["", "## Speedup to the baseline's final validation loss", ""]
    if report.get("target") is None:
        lines.append(report.get("target_note", "no target"))
    else:
        tt, st = report["tokens_to_target"], report["time_to_target"]
        lines.append(f"Target: full-length validation loss **{report['target']:.4f}** (the baseline's final).")
        lines.append("")
        if report["reached"]:
            lines += [
                f"- **tokens**: baseline {human_count(round(tt['baseline']))}, curriculum "
                f"{human_count(round(tt['curriculum']))} → **speedup_tokens {_x(report['speedup_tokens'])}**",
                f"- wall-clock: baseline {format_duration(st['baseline'])}, curriculum "
                f"{format_duration(st['curriculum'])} → speedup_time {_x(report['speedup_time'])} ({TIME_NOTE})",
            ]
        else:
            lines.append(
                f"**The curriculum never reached the target**: its best full-length validation loss was "
                f"{_f(min(cur['evals']['val_loss'], default=None))} against {report['target']:.4f}, so "
                "speedup_tokens and speedup_time are null (reached: false)."
            )
        lines += ["", f"_{report['definitions']['target']}_", ""]
        gap = report.get("val_gap") or []
        if gap:
            lines += [
                "Full-length validation loss at the baseline's evaluations (curriculum interpolated "
                "between its own evaluations):",
                "",
                "| tokens | baseline | curriculum | curriculum − baseline |",
                "|---:|---:|---:|---:|",
            ]
            lines += [
                f"| {human_count(g['tokens'])} | {g['baseline']:.4f} | {g['curriculum']:.4f} | {g['difference']:+.4f} |"
                for g in gap
            ]
            ahead = sum(g["difference"] < 0 for g in gap)
            lines += ["", f"The curriculum is ahead (lower loss) at {ahead} of these {len(gap)} points."]
    lines += ["", "## Stability", ""] + _stability_table(report, RUNS)
    lines += ["", f"_{report['definitions']['stability']}_", ""]
    lines += _seeds_section(report)
    lines += _figures_and_commands(report, RUNS)
    return "\n".join(lines)


def _runs_table(report: dict[str, Any], arms: Any) -> list[str]:
    """One row per arm: steps, tokens, time, final loss, batch, LR, curriculum length (first seed)."""
    lines = [
        "| run | steps | tokens | wall-clock | tokens/s | µs per token (steps) | final val loss | final val ppl | "
        "global batch | peak LR | total_curriculum_step | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in arms:
        r = compare_arm(report, name)
        lines.append(
            f"| {name} | {_f(r['steps'], ',')} | {human_count(r['tokens'])} | "
            f"{format_duration(r['wall_time_s'])} | {_f(r['tokens_per_s'], ',.0f')} | "
            f"{_f(r.get('step_us_per_token'), '.3g')} | "
            f"{_f(r['final_val_loss'])} | {_f(r['final_val_ppl'], '.1f')} | "
            f"{_f(r['global_batch_size'], 'd')} | {_f(r['lr'], 'g')} | "
            f"{r['total_curriculum_step'] if r['total_curriculum_step'] else '–'} | {r['status']} |"
        )
    return lines


def _stability_table(report: dict[str, Any], arms: Any) -> list[str]:
    """One row per arm: loss ratio, spikes, gradient and Adam second-moment norms (first seed)."""
    threshold = report["stability"]["threshold"]
    lines = [
        "| run | max loss ratio (smoothed) | max loss ratio (raw) | spikes > "
        f"{threshold:g} | spike steps | max grad norm | max Adam v l1 | max Adam v max |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name in arms:
        s = compare_arm(report, name)["stability"]
        steps = ", ".join(map(str, s["spike_steps"][:10])) + (" …" if len(s["spike_steps"]) > 10 else "")
        lines.append(
            f"| {name} | {_f(s['max_loss_ratio'], '.3f')} (step {s['max_loss_ratio_step']}) | "
            f"{_f(s['max_loss_ratio_raw'], '.3f')} | {s['spikes']} | {steps or '–'} | "
            f"{_f(s['max_grad_norm'], '.3g')} | {_f(s['max_adam_v_l1'], '.3g')} | "
            f"{_f(s['max_adam_v_max'], '.3g')} |"
        )
    return lines


def _figures_and_commands(report: dict[str, Any], arms: Any) -> list[str]:
    lines = [
        "## Figures",
        "",
        f"![validation loss]({FIGURES[0]})",
        "",
        f"![stability]({FIGURES[1]})",
        "",
        "## Commands",
        "",
        "Each run can be repeated on its own with:",
        "",
        "```",
    ]
    lines += [report["commands"][name] for name in arms]
    return lines + [
        "```",
        "",
        f"Caveats: {_seeds_label(report)}; wall-clock includes evaluations and checkpoints and depends on "
        "what else the machine ran at the time; the training loss is measured at the current (short) length, so judge "
        "progress by the full-length validation loss.",
        "",
    ]


# --------------------------------------------------------------------------------------------------
# --modes: every mode against the one baseline


def _exceeds(verdict: dict[str, Any]) -> str:
    """The table's word for :func:`seqwarm.experiments.spread.verdict`."""
    if verdict.get("exceeds_spread") is None:
        return "– (one seed)" if verdict.get("text", [""])[0].startswith("One seed") else "–"
    if not verdict["exceeds_spread"]:
        return "no (ranges overlap)"
    return "yes, mode lower" if verdict["lower"] == "curriculum" else "yes, baseline lower"


def mode_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm of a ``--modes`` report, over the seeds: final loss, speedups, steps, spikes and
    whether the difference exceeds the seed spread (the baseline's row has no speedup or verdict)."""
    modes = report["modes"]
    first = modes[next(iter(modes))]["aggregate"]
    rows = [
        {
            "arm": "baseline",
            "final_val_loss": first["final_val_loss"]["baseline"],
            "steps": first["steps"]["baseline"],
            **{key: (first.get(key) or {}).get("baseline") for key in ("tokens_to_target", "step_us_per_token")},
            "spikes": first["spikes"]["baseline"],
            "diverged": first["diverged"]["baseline"],
            "n_seeds": first["n_seeds"],
        }
    ]
    for mode, r in modes.items():
        agg = r["aggregate"]
        rows.append(
            {
                "arm": mode,
                "final_val_loss": agg["final_val_loss"]["curriculum"],
                "speedup_tokens": agg["speedup_tokens"],
                "reached": agg["reached"],
                "speedup_time": agg["speedup_time"],
                "steps": agg["steps"]["curriculum"],
                **{key: (agg.get(key) or {}).get("curriculum") for key in ("tokens_to_target", "step_us_per_token")},
                "spikes": agg["spikes"]["curriculum"],
                "diverged": agg["diverged"]["curriculum"],
                "n_seeds": agg["n_seeds"],
                "exceeds_spread": agg["verdict"]["exceeds_spread"],
                "exceeds": _exceeds(agg["verdict"]),
                "verdict": agg["verdict"]["text"],
            }
        )
    return rows


def render_modes_markdown(report: dict[str, Any]) -> str:
    """report.md of ``compare --modes``: one row per mode against the baseline, then the first seed's runs."""
    arms = compare_arms(report)
    seeds = report["settings"].get("seeds") or [None]
    first = seeds[0]
    threshold = report["stability"]["threshold"]
    lines = [
        f"# seqwarm compare: baseline vs curriculum modes {', '.join(arms[1:])}",
        "",
        f"{report['date']} · seqwarm {report['seqwarm_version']} · {report['machine']['platform']}, "
        f"{report['machine']['cpus']} CPUs · {_seeds_label(report)}",
        "",
    ]
    lines += [f"- {note}" for note in report.get("notes", [])] + ([""] if report.get("notes") else [])
    lines += [
        "## Modes against the baseline",
        "",
        "Target on each seed: that seed's baseline final full-length validation loss. Each cell is the median "
        f"(min–max) over {len(seeds)} seed(s).",
        "",
        f"| arm | final val loss | tokens to target | speedup_tokens | reached | speedup_time | µs per token (steps) "
        f"| optimizer steps | spikes > {threshold:g} | diverged | exceeds seed spread |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in mode_rows(report):
        n = r["n_seeds"]
        if r["arm"] == "baseline":
            middle = "– | – | –"
        else:
            middle = (
                f"{spread_text(r['speedup_tokens'], '.2f', 'x')} | {r['reached']}/{n} | "
                f"{spread_text(r['speedup_time'], '.2f', 'x')}"
            )
        to_target, per_token = spread_text(r["tokens_to_target"], ",.0f"), spread_text(r["step_us_per_token"], ".3g")
        lines.append(
            f"| {r['arm']} | {spread_text(r['final_val_loss'], '.4f')} | {to_target} | {middle} | {per_token} | "
            f"{spread_text(r['steps'], ',.0f')} | {spread_text(r['spikes'], 'g')} | {r['diverged']}/{n} | "
            f"{r.get('exceeds', '–')} |"
        )
    lines += ["", f"Wall-clock speedups are {TIME_NOTE}. {PER_TOKEN_NOTE}", ""]
    for r in mode_rows(report)[1:]:
        lines += [f"- **{r['arm']}**: {' '.join(r['verdict'])}"]
    lines += ["", f"_{report['definitions']['target']}_", ""]
    if "spread" in report["definitions"]:
        lines += [f"_{report['definitions']['spread']}_", ""]
    lines += [f"## Runs (seed {first})", ""] + _runs_table(report, arms)
    lines += ["", f"## Stability (seed {first})", ""] + _stability_table(report, arms)
    lines += ["", f"_{report['definitions']['stability']}_", ""]
    if len(seeds) > 1:
        lines += [
            "## Seeds",
            "",
            "| seed | arm | final val loss | speedup_tokens | spikes |",
            "|---:|---|---:|---:|---:|",
        ]
        for i, seed in enumerate(seeds):
            base = report["modes"][arms[1]]["seeds"][i]
            lines.append(
                f"| {seed} | baseline | {_f(base['final_val_loss']['baseline'])} | – | {base['spikes']['baseline']} |"
            )
            for mode in arms[1:]:
                row = report["modes"][mode]["seeds"][i]
                never = "never reached" if row.get("target") is not None and not row.get("reached") else "–"
                sp = _x(row["speedup_tokens"]) if row["speedup_tokens"] else never
                lines.append(
                    f"| {seed} | {mode} | {_f(row['final_val_loss']['curriculum'])} | {sp} | "
                    f"{row['spikes']['curriculum']} |"
                )
        lines += [""]
    lines += _figures_and_commands(report, arms)
    return "\n".join(lines)
