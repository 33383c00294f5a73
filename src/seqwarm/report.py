"""Figures a person can read at a glance: a run's curves (``RUN/curves.png``)."""

from __future__ import annotations

from pathlib import Path

from seqwarm.errors import MissingDependencyError
from seqwarm.metrics import read_metrics


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only), or MissingDependencyError."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("matplotlib", "plot", "plots") from None
    return plt


def plot_run(run_dir: Path, path: Path | None = None) -> Path:
    """Train loss (current length) and val loss (full length) against tokens; length and LR against steps."""
    plt = pyplot()
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    if train:
        ax.plot([r["tokens"] / 1e6 for r in train], [r["loss"] for r in train], color="tab:blue", alpha=0.7,
                label="train loss (current length)")
    if evals:
        ax.plot([r["tokens"] / 1e6 for r in evals], [r["val_loss"] for r in evals], "o-", color="tab:red",
                label="val loss (full length)")
    ax.set_xlabel("tokens trained (M)")
    ax.set_ylabel("loss")
    ax.set_title("loss against tokens")
    ax.legend()
    ax.grid(alpha=0.3)
    if train:
        steps = [r["step"] for r in train]
        axes[1].step(steps, [r["seqlen"] for r in train], where="post", color="tab:green")
        axes[2].plot(steps, [r["lr"] for r in train], color="tab:purple")
    axes[1].set_title("sequence length")
    axes[1].set_xlabel("optimizer step")
    axes[1].set_ylabel("tokens per sequence")
    axes[2].set_title("learning rate")
    axes[2].set_xlabel("optimizer step")
    for a in axes[1:]:
        a.grid(alpha=0.3)
    fig.suptitle(f"seqwarm run: {run_dir.name}")
    fig.tight_layout()
    out = Path(path) if path else run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
