"""Context extension with stages (issue #36, item 5): pretrain at 256, extend to 1024, four position arms.

A small rotary GPT (2 layers, d 128, 2 heads of 64: the tiny preset's head size, a quarter of its
compute) on the embedded corpus, the same recipe, token budget, tokens per step and LR schedule
in every arm; only the positions and the lengths differ:

- ``none``:  256, then a stage at 1024 with no position change (the rotary tables extrapolate);
- ``abf``:   256, then 1024 with the rotary base raised 10,000 -> 500,000 ("ABF", arXiv 2309.16039);
- ``yarn``:  256, then 1024 with YaRN, factor 4 over the 256 trained before (Transformers' defaults);
- ``long``:  1024 from the first step (no stage, no curriculum).

The pretraining phase reads the same 1024-token windows as ``long`` and re-chunks each into four rows of
256 (``curriculum_mode: reshape``), so every arm sees the same tokens per step and no token is thrown
away. Each arm runs ``seqwarm train`` in a subprocess, once per seed; afterwards every final checkpoint is
scored on the whole validation split at 256 and at 1024 with the positions it trained with.

Printed and written to OUT/summary.json, per arm (median and min-max over seeds):

- ``val@256``, ``val@1024``: the final checkpoint's validation loss at each length;
- ``spike``: the largest rise of the training loss after the boundary over the loss just before it, both
  smoothed over 5 steps (the loss at 1024 is per token of 1024-token rows, so a rise is a real rise);
- ``tokens to long``: the tokens of the first evaluation during training (every ``--eval-interval`` steps, at
  1024, on the same ``--eval-iters`` windows in every arm) whose loss is at or below the ``long`` arm's last
  such evaluation of the same seed ("never" when none is).

    python benchmarks/context_extension.py --out runs/ext --seeds 1,2,3
    python benchmarks/context_extension.py --out runs/ext --report   # the summary of finished runs again
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("none", "abf", "yarn", "long")
SHORT, LONG = 256, 1024
FINAL_TOKENS = 131_072
"""Tokens of the validation split each final checkpoint is scored on at each length (windows spread evenly)."""


def arm_config(arm: str, budget: int, boundary: int) -> dict:
    config = {
        "train_batch_size": 4,  # 4 x 1024 = 4096 tokens per step in every arm (16 rows of 256 before the stage)
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "seqwarm": {
            "seq_length": LONG,
            "train_tokens": budget,
            "lr_warmup_iters": 8,
            "lr_decay_style": "cosine",
            "min_lr": 0.0001,
        },
    }
    if arm == "long":
        config["curriculum_learning"] = {"enabled": False}
        return config
    config["curriculum_learning"] = {  # a constant 256: the pretraining length, no warmup
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": SHORT,
        "max_difficulty": SHORT,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [SHORT, SHORT], "max_step": [1]},
    }
    stage = {"start_tokens": boundary, "length": LONG}
    if arm == "abf":
        stage["rope_theta"] = 500_000
    elif arm == "yarn":
        stage["rope_scaling"] = {"type": "yarn", "factor": LONG / SHORT}
    config["seqwarm"].update(curriculum_mode="reshape", stages=[stage])
    return config


def train(out: Path, arm: str, seed: int, args) -> Path:
    run = out / arm / f"seed-{seed}"
    if (run / "summary.json").exists():
        return run
    run.parent.mkdir(parents=True, exist_ok=True)
    cfg = run.parent / "config.json"
    cfg.write_text(json.dumps(arm_config(arm, args.tokens, args.boundary), indent=2))
    cmd = [sys.executable, "-m", "seqwarm", "train", "--config", str(cfg), "--rotary", "--seed", str(seed)]
    cmd += ["--out", str(run), "--log-interval", "1", "--eval-interval", str(args.eval_interval)]
    cmd += ["--eval-iters", str(args.eval_iters), "--no-progress", "--device", "cpu", "--save-interval", "1000"]
    cmd += ["--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd), "--n-head", str(args.n_head)]
    if (run / "checkpoints").exists():
        cmd += ["--resume"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"  {arm} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run


def rows(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind", "train") == kind]


def smoothed(values: list[float], k: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def spike(run: Path, boundary_step: int, k: int = 5) -> float:
    """Largest smoothed training loss after the boundary minus the smoothed loss of the step before it."""
    train = [r for r in rows(run, "train") if "loss" in r]
    before = [r["loss"] for r in train if r["step"] < boundary_step][-k:]
    after = [r["loss"] for r in train if r["step"] >= boundary_step]
    return max(smoothed(after, k)) - statistics.fmean(before)


def final_losses(run: Path) -> dict[str, float]:
    from seqwarm.evaluation.common import evaluate_val
    from seqwarm.evaluation.runs import load_run

    loaded = load_run(run, device="cpu")
    data = loaded.val_data()
    return {
        str(n): evaluate_val(loaded.model, data, seq_length=n, num_windows=windows, device="cpu", progress=False)[
            "loss"
        ]
        for n, windows in ((SHORT, FINAL_TOKENS // SHORT), (LONG, FINAL_TOKENS // LONG))
    }


def measure(run: Path, arm: str) -> dict:
    stage_rows = rows(run, "stage")
    result = {"final": final_losses(run)}
    if stage_rows:
        result["boundary_step"] = stage_rows[0]["step"]
        result["spike"] = spike(run, stage_rows[0]["step"])
    result["evals"] = [(r["tokens"], r["val_loss"]) for r in rows(run, "eval")]
    return result


POSITIONS = {  # the settings each arm's stage sets, for the zero-shot change of the pretrained model
    "none": (None, None),
    "abf": (500_000, None),
    "yarn": (None, {"type": "yarn", "factor": LONG / SHORT, "original_max_position_embeddings": SHORT}),
}


def zero_shot(out: Path, seed: int, args) -> dict:
    """The model at the end of pretraining (the arms' common prefix: the ``none`` arm stopped at the step
    before the boundary, same seed, same LR schedule, so the same weights) scored at 1024 and 256 with each
    arm's positions set and nothing trained: what the change alone does to the loss."""
    from seqwarm.evaluation.common import evaluate_val
    from seqwarm.evaluation.runs import load_run

    boundary = rows(out / "none" / f"seed-{seed}", "stage")[0]["step"]
    run = out / "prefix" / f"seed-{seed}"
    if not (run / "summary.json").exists():
        run.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "seqwarm", "train", "--config", str(out / "none" / "config.json"), "--rotary"]
        cmd += ["--seed", str(seed), "--out", str(run), "--train-iters", str(boundary - 1), "--no-progress"]
        cmd += [
            "--device",
            "cpu",
            "--eval-iters",
            str(args.eval_iters),
            "--eval-interval",
            "1000",
            "--log-interval",
            "1",
        ]
        cmd += ["--n-layer", str(args.n_layer), "--n-embd", str(args.n_embd), "--n-head", str(args.n_head)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    mine = [r["loss"] for r in rows(run, "train") if "loss" in r]
    arm = [r["loss"] for r in rows(out / "none" / f"seed-{seed}", "train") if "loss" in r][: len(mine)]
    if mine != arm:  # the same weights as every arm's at the boundary, or the comparison means nothing
        raise SystemExit(f"{run}: its losses differ from the none arm's first {len(mine)} steps")
    loaded = load_run(run, device="cpu")
    data = loaded.val_data()
    result = {}
    for arm, (theta, scaling) in POSITIONS.items():
        loaded.model.set_positions(theta, scaling)
        result[arm] = {
            str(n): evaluate_val(
                loaded.model, data, seq_length=n, num_windows=FINAL_TOKENS // n, device="cpu", progress=False
            )["loss"]
            for n in (SHORT, LONG)
        }
    return result


def fmt(values: list[float | None], digits: int = 3) -> str:
    real = [v for v in values if v is not None]
    if not real:
        return "never"
    text = f"{statistics.median(real):.{digits}f} ({min(real):.{digits}f}-{max(real):.{digits}f})"
    return text + (f", never in {len(values) - len(real)}" if len(real) < len(values) else "")


def report(out: Path, seeds: list[int]) -> dict:
    results = {
        arm: {s: json.loads((out / arm / f"seed-{s}" / "measured.json").read_text()) for s in seeds} for arm in ARMS
    }
    table = {}
    print(f"\n{'arm':6} {'val@256':>24} {'val@1024':>24} {'spike':>24} {'tokens to long':>26}")
    for arm in ARMS:
        per = results[arm]
        reach = []
        for s in seeds:
            target = results["long"][s]["evals"][-1][1]
            hit = [t for t, v in per[s]["evals"] if v <= target]
            reach.append(hit[0] if hit else None)
        table[arm] = {
            "val_256": [per[s]["final"][str(SHORT)] for s in seeds],
            "val_1024": [per[s]["final"][str(LONG)] for s in seeds],
            "spike": [per[s].get("spike") for s in seeds],
            "tokens_to_long_final": reach,
        }
        row = table[arm]
        spikes = "-" if arm == "long" else fmt(row["spike"])
        tokens = "-" if arm == "long" else fmt([None if t is None else t / 1e3 for t in reach], 0) + " k"
        print(f"{arm:6} {fmt(row['val_256']):>24} {fmt(row['val_1024']):>24} {spikes:>24} {tokens:>26}")
    shots = {}
    for s in seeds:
        path = out / "prefix" / f"seed-{s}" / "zero_shot.json"
        if path.exists():
            shots[s] = json.loads(path.read_text())
    if shots:
        print("\nzero shot: the pretrained model (before the boundary) with each arm's positions, nothing trained")
        print(f"{'arm':6} {'val@256':>24} {'val@1024':>24}")
        for arm in POSITIONS:
            short = [shots[s][arm][str(SHORT)] for s in shots]
            long = [shots[s][arm][str(LONG)] for s in shots]
            print(f"{arm:6} {fmt(short):>24} {fmt(long):>24}")
    (out / "summary.json").write_text(json.dumps({"seeds": seeds, "arms": table, "zero_shot": shots}, indent=2))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--tokens", type=int, default=480_000, help="token budget of every arm")
    parser.add_argument("--boundary", type=int, default=360_000, help="start_tokens of the 1024 stage")
    parser.add_argument("--eval-interval", type=int, default=15)
    parser.add_argument("--eval-iters", type=int, default=4)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--n-layer", type=int, default=2, help="GPT layers (the tiny preset has 4)")
    parser.add_argument("--n-embd", type=int, default=128, help="GPT width (tiny: 256)")
    parser.add_argument("--n-head", type=int, default=2, help="attention heads (tiny: 4); head size 64 as tiny's")
    parser.add_argument("--report", action="store_true", help="only summarise finished runs")
    parser.add_argument("--zero-shot", action="store_true", help="also score the pretrained model per position")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.report:
        for seed in seeds:  # seed-major: a run cut short still has whole seeds
            for arm in args.arms.split(","):
                run = train(args.out, arm, seed, args)
                measured = run / "measured.json"
                if not measured.exists():
                    measured.write_text(json.dumps(measure(run, arm)))
    if args.zero_shot:
        for seed in seeds:
            path = args.out / "prefix" / f"seed-{seed}" / "zero_shot.json"
            if not path.exists():
                result = zero_shot(args.out, seed, args)
                path.write_text(json.dumps(result))
    report(args.out, seeds)


if __name__ == "__main__":
    main()
