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
from seqwarm.trainer.plots import plot_compare_stability, plot_compare_val
from seqwarm.util.atomic import write_json, write_text
from seqwarm.util.units import human_count

TIME_NOTE = (
    "measured, not a result: it moves with the machine's load and includes evaluations and checkpoints; "
    "the tokens are the speedup"
)
"""What the report and the console say beside the wall-clock speedup (two runs with the same losses
measured 3.01x and 4.16x on a shared machine)."""

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
            [stability_curves(report, r["run_dirs"]) for r in report.get("seeds", [])[1:]],
        ),
    ]
    return paths + [write_text(out / "report.md", render_markdown(report))]


def seed_val_curves(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each arm's validation curves of every seed and their point-by-point median (for the figure)."""
    out = {}
    for name in RUNS:
        each = [r["evals"][name] for r in report.get("seeds") or []]
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
    for name in RUNS:
        folder = (run_dirs or {}).get(name) or report[name]["run_dir"]
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


def _spread_cell(s: dict[str, Any] | None, fmt: str, unit: str = "") -> str:
    if not s or s.get("median") is None:
        return "–"
    if s["n"] == 1:
        return f"{format(s['median'], fmt)}{unit}"
    return f"{format(s['median'], fmt)}{unit} ({format(s['min'], fmt)}–{format(s['max'], fmt)}{unit})"


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
        f"| **median (min–max)** | {_spread_cell(agg['speedup_tokens'], '.2f', 'x')} | "
        f"{_spread_cell(agg['speedup_time'], '.2f', 'x')} | {_spread_cell(fl['baseline'], '.4f')} | "
        f"{_spread_cell(fl['curriculum'], '.4f')} | {_spread_cell(sk['baseline'], 'g')} | "
        f"{_spread_cell(sk['curriculum'], 'g')} |"
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
    lines += [
        "## Runs",
        "",
        "| run | steps | tokens | wall-clock | tokens/s | final val loss | final val ppl | global batch | "
        "peak LR | total_curriculum_step | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name in RUNS:
        r = report[name]
        lines.append(
            f"| {name} | {_f(r['steps'], ',')} | {human_count(r['tokens'])} | "
            f"{format_duration(r['wall_time_s'])} | {_f(r['tokens_per_s'], ',.0f')} | "
            f"{_f(r['final_val_loss'])} | {_f(r['final_val_ppl'], '.1f')} | "
            f"{_f(r['global_batch_size'], 'd')} | {_f(r['lr'], 'g')} | "
            f"{r['total_curriculum_step'] if r['total_curriculum_step'] else '–'} | {r['status']} |"
        )
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
    stab = report["stability"]
    lines += [
        "",
        "## Stability",
        "",
        "| run | max loss ratio (smoothed) | max loss ratio (raw) | spikes > "
        f"{stab['threshold']:g} | spike steps | max grad norm | max Adam v l1 | max Adam v max |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name in RUNS:
        s = stab[name]
        steps = ", ".join(map(str, s["spike_steps"][:10])) + (" …" if len(s["spike_steps"]) > 10 else "")
        lines.append(
            f"| {name} | {_f(s['max_loss_ratio'], '.3f')} (step {s['max_loss_ratio_step']}) | "
            f"{_f(s['max_loss_ratio_raw'], '.3f')} | {s['spikes']} | {steps or '–'} | "
            f"{_f(s['max_grad_norm'], '.3g')} | {_f(s['max_adam_v_l1'], '.3g')} | "
            f"{_f(s['max_adam_v_max'], '.3g')} |"
        )
    lines += ["", f"_{report['definitions']['stability']}_", ""]
    lines += _seeds_section(report)
    lines += [
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
    lines += [report["commands"][name] for name in RUNS]
    lines += [
        "```",
        "",
        f"Caveats: {_seeds_label(report)}; wall-clock includes evaluations and checkpoints and depends on "
        "what else the machine ran at the time; the training loss is measured at the current (short) length, so judge "
        "progress by the full-length validation loss.",
        "",
    ]
    return "\n".join(lines)
