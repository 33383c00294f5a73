"""The compare report a person reads: ``report.md`` and two figures, from the dict ``report.json`` holds.

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

from seqwarm.atomic import write_json
from seqwarm.experiments import curves
from seqwarm.metrics import format_duration, read_metrics
from seqwarm.report import pyplot
from seqwarm.units import human_count

RUNS = ("baseline", "curriculum")
COLORS = {"baseline": "tab:gray", "curriculum": "tab:blue"}
FIGURES = ("compare_val.png", "compare_stability.png")


def write_report(out: Path, report: dict[str, Any]) -> list[Path]:
    """Write ``report.json``, the figures and ``report.md`` into ``out``; return the paths written."""
    out = Path(out)
    report["figures"] = list(FIGURES)
    paths = [write_json(out / "report.json", report)]
    paths += [plot_val(report, out / FIGURES[0]), plot_stability(report, out / FIGURES[1])]
    md = out / "report.md"
    md.write_text(render_markdown(report))
    return paths + [md]


def _label(report: dict[str, Any], name: str) -> str:
    run = report[name]
    if name == "baseline":
        return "baseline (full length)"
    k = report["settings"].get("scale_batch", 1)
    m = report["settings"].get("scale_lr", 1)
    extra = f", {k}x batch, {m:g}x LR" if (k, m) != (1, 1) else ""
    return f"curriculum (T={run.get('total_curriculum_step')}{extra})"


def plot_val(report: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3), sharey=True)
    target = report.get("target")
    for name in RUNS:
        ev = report[name]["evals"]
        axes[0].plot([t / 1e6 for t in ev["tokens"]], ev["val_loss"], "o-", ms=3, color=COLORS[name],
                     label=_label(report, name))
        axes[1].plot([s / 60 for s in ev["elapsed_s"]], ev["val_loss"], "o-", ms=3, color=COLORS[name],
                     label=_label(report, name))
    if target is not None:
        for ax, key, scale in ((axes[0], "tokens_to_target", 1e6), (axes[1], "time_to_target", 60)):
            ax.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:.3f}")
            hit = report.get(key) or {}
            for name in RUNS:
                if hit.get(name) is not None:
                    ax.axvline(hit[name] / scale, color=COLORS[name], ls=":", lw=1)
    axes[0].set_xlabel("tokens trained (M)")
    axes[1].set_xlabel("wall-clock (minutes, incl. evaluation)")
    axes[0].set_ylabel("validation loss (full length)")
    sp_t, sp_s = report.get("speedup_tokens"), report.get("speedup_time")
    axes[0].set_title(f"against tokens (speedup {sp_t:.2f}x)" if sp_t else "against tokens")
    axes[1].set_title(f"against wall-clock (speedup {sp_s:.2f}x)" if sp_s else "against wall-clock")
    _zoom(axes[0], [v for n in RUNS for v in report[n]["evals"]["val_loss"]])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("seqwarm compare: full-length validation loss")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


def _zoom(ax, values: list[float]) -> None:
    """Leave out the first evaluations' very high losses so the end of the race is readable."""
    finite = sorted(v for v in values if isinstance(v, (int, float)) and math.isfinite(v))
    if len(finite) >= 4:
        lo, hi = finite[0], finite[int(len(finite) * 0.85)]
        pad = (hi - lo) * 0.08 or 0.1
        ax.set_ylim(lo - pad, hi + pad)


def plot_stability(report: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    window = report["stability"]["smooth_steps"]
    threshold = report["stability"]["threshold"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    panels = {"ratio": axes[0][0], "loss": axes[0][1], "seqlen": axes[0][2], "grad_norm": axes[1][0],
              "adam_v_l1": axes[1][1], "adam_v_max": axes[1][2]}
    for name in RUNS:
        rows = [r for r in read_metrics(Path(report[name]["run_dir"]) / "metrics.jsonl") if r.get("kind") == "train"]
        if not rows:
            continue
        tokens = [r["tokens"] / 1e6 for r in rows]
        style = {"color": COLORS[name], "label": _label(report, name), "lw": 1}
        panels["ratio"].plot(tokens, curves.loss_ratio([r["loss"] for r in rows], window), **style)
        panels["loss"].plot(tokens, [r["loss"] for r in rows], **style)
        panels["seqlen"].plot(tokens, [r["seqlen"] for r in rows], **style)
        for key in ("grad_norm", "adam_v_l1", "adam_v_max"):
            pts = [(t, r[key]) for t, r in zip(tokens, rows) if isinstance(r.get(key), (int, float))]
            if pts:
                panels[key].plot(*zip(*pts), **style)
    panels["ratio"].axhline(threshold, color="tab:red", ls="--", lw=1, label=f"spike threshold {threshold:g}")
    titles = {"ratio": f"loss ratio (trailing mean of {window} / min so far)",
              "loss": "training loss (current length)", "seqlen": "sequence length",
              "grad_norm": "gradient norm (before clipping)", "adam_v_l1": "Adam second moment: l1 norm",
              "adam_v_max": "Adam second moment: max"}
    for key, ax in panels.items():
        ax.set_title(titles[key], fontsize=10)
        ax.set_xlabel("tokens trained (M)")
        ax.grid(alpha=0.3)
        if key in ("adam_v_l1", "adam_v_max", "loss"):
            ax.set_yscale("log")
    panels["ratio"].legend(fontsize=8)
    fig.suptitle("seqwarm compare: stability")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


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


def render_markdown(report: dict[str, Any]) -> str:
    cur = report["curriculum"]
    lines = ["# seqwarm compare: baseline vs sequence-length curriculum", "",
             f"{report['date']} · seqwarm {report['seqwarm_version']} · {report['machine']['platform']}, "
             f"{report['machine']['cpus']} CPUs · one seed", ""]
    for note in report.get("notes", []):
        lines.append(f"- {note}")
    if report.get("notes"):
        lines.append("")
    lines += ["## Runs", "",
              "| run | steps | tokens | wall-clock | tokens/s | final val loss | final val ppl | global batch | "
              "peak LR | total_curriculum_step | status |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in RUNS:
        r = report[name]
        lines.append(f"| {name} | {_f(r['steps'], ',')} | {human_count(r['tokens'])} | "
                     f"{format_duration(r['wall_time_s'])} | {_f(r['tokens_per_s'], ',.0f')} | "
                     f"{_f(r['final_val_loss'])} | {_f(r['final_val_ppl'], '.1f')} | "
                     f"{_f(r['global_batch_size'], 'd')} | {_f(r['lr'], 'g')} | "
                     f"{r['total_curriculum_step'] if r['total_curriculum_step'] else '–'} | {r['status']} |")
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
                f"- **wall-clock**: baseline {format_duration(st['baseline'])}, curriculum "
                f"{format_duration(st['curriculum'])} → **speedup_time {_x(report['speedup_time'])}**",
            ]
        else:
            lines.append(f"**The curriculum never reached the target**: its best full-length validation loss was "
                         f"{_f(min(cur['evals']['val_loss'], default=None))} against {report['target']:.4f}, so "
                         "speedup_tokens and speedup_time are null (reached: false).")
        lines += ["", f"_{report['definitions']['target']}_", ""]
        gap = report.get("val_gap") or []
        if gap:
            lines += ["Full-length validation loss at the baseline's evaluations (curriculum interpolated "
                      "between its own evaluations):", "",
                      "| tokens | baseline | curriculum | curriculum − baseline |", "|---:|---:|---:|---:|"]
            lines += [f"| {human_count(g['tokens'])} | {g['baseline']:.4f} | {g['curriculum']:.4f} | "
                      f"{g['difference']:+.4f} |" for g in gap]
            ahead = sum(g["difference"] < 0 for g in gap)
            lines += ["", f"The curriculum is ahead (lower loss) at {ahead} of these {len(gap)} points."]
    stab = report["stability"]
    lines += ["", "## Stability", "",
              "| run | max loss ratio (smoothed) | max loss ratio (raw) | spikes > "
              f"{stab['threshold']:g} | spike steps | max grad norm | max Adam v l1 | max Adam v max |",
              "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name in RUNS:
        s = stab[name]
        steps = ", ".join(map(str, s["spike_steps"][:10])) + (" …" if len(s["spike_steps"]) > 10 else "")
        lines.append(f"| {name} | {_f(s['max_loss_ratio'], '.3f')} (step {s['max_loss_ratio_step']}) | "
                     f"{_f(s['max_loss_ratio_raw'], '.3f')} | {s['spikes']} | {steps or '–'} | "
                     f"{_f(s['max_grad_norm'], '.3g')} | {_f(s['max_adam_v_l1'], '.3g')} | "
                     f"{_f(s['max_adam_v_max'], '.3g')} |")
    lines += ["", f"_{report['definitions']['stability']}_", "",
              "## Figures", "", f"![validation loss]({FIGURES[0]})", "", f"![stability]({FIGURES[1]})", "",
              "## Commands", "", "Each run can be repeated on its own with:", "", "```"]
    lines += [report["commands"][name] for name in RUNS]
    lines += ["```", "",
              "Caveats: one seed; wall-clock includes evaluations and checkpoints and depends on what else the "
              "machine ran at the time; the training loss is measured at the current (short) length, so judge "
              "progress by the full-length validation loss.", ""]
    return "\n".join(lines)
