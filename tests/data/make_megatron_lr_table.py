"""Write tests/data/megatron_lr_table.json: Megatron-DeepSpeed's learning rate at every step, recorded once.

Run from the repository root with a checkout of microsoft/Megatron-DeepSpeed (no GPU, no apex, no
DeepSpeed needed):

    .venv/bin/python tests/data/make_megatron_lr_table.py PATH/TO/Megatron-DeepSpeed

It loads that checkout's own ``megatron/optimizer_param_scheduler.py`` (its ``OptimizerParamScheduler``),
with a stand-in ``megatron`` package that supplies the two names the file imports (``get_args``: the few
arguments it reads; ``print_rank_0``), builds one scheduler per config below with the lengths
``get_optimizer_param_scheduler`` in ``megatron/training.py`` computes from the flags (iteration-based:
``lr_decay_steps = (lr_decay_iters or train_iters) x global batch``, ``lr_warmup_steps = lr_warmup_iters x
global batch``; sample-based: ``lr_decay_samples or train_samples`` and ``lr_warmup_samples``), and drives it
the way ``training.py``'s DeepSpeed path does:

- the scheduler is built (its ``__init__`` calls ``step(0)``) before the first step;
- each training step runs the optimizer at the LR the param groups hold, then DeepSpeed's ``engine.step``
  calls ``scheduler.step(increment=global batch)``, which reads ``args.consumed_train_tokens``;
- only after that does the loop add the step's tokens to ``args.consumed_train_tokens``.

A step's tokens are those of a sequence-length curriculum (``global batch x seqlen(step)``, below). Each
config records, per step, the samples and tokens it trained and the LR it trained at. A config whose
scheduler raises is recorded with the error instead (seqwarm's documented fixes cover those).

tests/curriculum/test_megatron_lr.py reads the JSON only; it never imports Megatron.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

COMMAND = ".venv/bin/python tests/data/make_megatron_lr_table.py PATH/TO/Megatron-DeepSpeed"
OUT = Path(__file__).resolve().with_name("megatron_lr_table.json")
SOURCE = "megatron/optimizer_param_scheduler.py"
FULL = 64


def seqlen(step: int) -> int:
    """The length step ``step`` (from 1) trains at: 8, 8, 8, 16, ... up to 64."""
    return min(FULL, 8 * (1 + (step - 1) // 3))


# Megatron's flags (as argparse dests); a missing one has Megatron's default.
CONFIGS = {
    "iters_warmup_cosine_over_train_iters": dict(
        lr=6e-4, min_lr=1e-5, lr_decay_style="cosine", train_iters=40, lr_warmup_iters=4, global_batch_size=8
    ),
    "iters_train_tokens_budget_cosine": dict(
        lr=6e-4,
        min_lr=1e-5,
        lr_decay_style="cosine",
        train_iters=40,
        train_tokens=10**6,
        lr_warmup_iters=2,
        global_batch_size=8,
    ),
    "iters_linear_decay_iters": dict(
        lr=1e-3,
        min_lr=1e-4,
        lr_decay_style="linear",
        train_iters=30,
        lr_decay_iters=20,
        lr_warmup_iters=5,
        global_batch_size=4,
    ),
    "iters_cosine_decay_tokens": dict(
        lr=6e-4,
        min_lr=1e-5,
        lr_decay_style="cosine",
        train_iters=40,
        lr_decay_tokens=12_000,
        lr_warmup_iters=3,
        global_batch_size=8,
    ),
    "iters_linear_decay_tokens": dict(
        lr=3e-4,
        min_lr=0.0,
        lr_decay_style="linear",
        train_iters=35,
        lr_decay_tokens=8_000,
        lr_warmup_iters=1,
        global_batch_size=4,
    ),
    "iters_inverse_sqrt": dict(
        lr=1e-3,
        min_lr=1e-4,
        lr_decay_style="inverse-square-root",
        train_iters=40,
        lr_decay_iters=30,
        lr_warmup_iters=3,
        global_batch_size=8,
    ),
    "iters_inverse_sqrt_no_warmup": dict(
        lr=1e-3, min_lr=1e-5, lr_decay_style="inverse-square-root", train_iters=20, global_batch_size=8
    ),
    "iters_inverse_sqrt_decay_tokens": dict(
        lr=1e-3,
        min_lr=1e-4,
        lr_decay_style="inverse-square-root",
        train_iters=40,
        lr_decay_tokens=15_000,
        lr_warmup_iters=4,
        global_batch_size=8,
    ),
    "iters_constant_warmup": dict(
        lr=2e-4, lr_decay_style="constant", train_iters=12, lr_warmup_iters=5, global_batch_size=8
    ),
    "iters_default_linear_no_warmup": dict(lr=5e-4, train_iters=16, global_batch_size=2),
    "samples_warmup_linear_over_train_samples": dict(
        lr=6e-4, min_lr=6e-5, lr_decay_style="linear", train_samples=320, lr_warmup_samples=32, global_batch_size=8
    ),
    "samples_cosine_decay_samples": dict(
        lr=6e-4,
        min_lr=6e-5,
        lr_decay_style="cosine",
        train_samples=400,
        lr_decay_samples=200,
        lr_warmup_samples=40,
        global_batch_size=8,
    ),
    "samples_cosine_decay_tokens": dict(
        lr=6e-4,
        min_lr=1e-5,
        lr_decay_style="cosine",
        train_samples=320,
        lr_decay_tokens=10_000,
        lr_warmup_samples=24,
        global_batch_size=8,
    ),
    "samples_inverse_sqrt_warmup": dict(
        lr=1e-3,
        min_lr=0.0,
        lr_decay_style="inverse-square-root",
        train_samples=200,
        lr_warmup_samples=24,
        global_batch_size=8,
    ),
    "tokens_warmup_linear_over_iters": dict(
        lr=6e-4, min_lr=1e-5, lr_decay_style="linear", train_iters=30, lr_warmup_tokens=1_000, global_batch_size=8
    ),
    "tokens_warmup_cosine_decay_tokens": dict(
        lr=6e-4,
        min_lr=1e-5,
        lr_decay_style="cosine",
        train_iters=40,
        lr_warmup_tokens=1_500,
        lr_decay_tokens=14_000,
        global_batch_size=8,
    ),
    "tokens_warmup_inverse_sqrt": dict(
        lr=1e-3,
        min_lr=1e-4,
        lr_decay_style="inverse-square-root",
        train_samples=240,
        lr_warmup_tokens=800,
        global_batch_size=8,
    ),
    # Megatron raises on these two (a TypeError, subtracting None): seqwarm's documented fixes run them
    "crash_warmup_samples_not_whole_batches": dict(
        lr=6e-4,
        min_lr=1e-5,
        lr_decay_style="cosine",
        train_samples=320,
        lr_decay_tokens=10_000,
        lr_warmup_samples=20,
        global_batch_size=8,
    ),
    "crash_decay_tokens_without_warmup": dict(
        lr=6e-4, min_lr=1e-5, lr_decay_style="linear", train_iters=20, lr_decay_tokens=5_000, global_batch_size=8
    ),
}


def load_scheduler_class(checkout: Path, args: types.SimpleNamespace):
    """Megatron-DeepSpeed's OptimizerParamScheduler, read from ``checkout`` with a stand-in ``megatron``."""
    stand_in = types.ModuleType("megatron")
    stand_in.get_args = lambda: args
    stand_in.print_rank_0 = lambda *a, **k: None
    sys.modules["megatron"] = stand_in
    module = types.ModuleType("megatron_optimizer_param_scheduler")
    source = (checkout / SOURCE).read_text()
    exec(compile(source, str(checkout / SOURCE), "exec"), module.__dict__)
    return module.OptimizerParamScheduler


def record(checkout: Path, name: str, flags: dict) -> dict:
    gbs = flags["global_batch_size"]
    args = types.SimpleNamespace(
        lr_decay_tokens=flags.get("lr_decay_tokens"),
        lr_warmup_tokens=flags.get("lr_warmup_tokens"),
        consumed_train_tokens=0,
    )
    cls = load_scheduler_class(checkout, args)
    # get_optimizer_param_scheduler (megatron/training.py), without --lr-warmup-fraction
    if flags.get("train_iters"):
        steps = flags["train_iters"]
        decay_steps = (flags.get("lr_decay_iters") or flags["train_iters"]) * gbs
        warmup_steps = flags.get("lr_warmup_iters", 0) * gbs
        wd_steps = flags["train_iters"] * gbs
    else:
        steps = flags["train_samples"] // gbs
        decay_steps = flags.get("lr_decay_samples") or flags["train_samples"]
        warmup_steps = flags.get("lr_warmup_samples", 0)
        wd_steps = flags["train_samples"]
    optimizer = types.SimpleNamespace(param_groups=[{"lr": None, "weight_decay": None}])
    out: dict = {"name": name, "flags": flags, "steps": []}
    try:
        sched = cls(
            optimizer,
            max_lr=flags["lr"],
            min_lr=flags.get("min_lr", 0.0),
            lr_warmup_steps=warmup_steps,
            lr_decay_steps=decay_steps,
            lr_decay_style=flags.get("lr_decay_style", "linear"),
            start_wd=0.01,
            end_wd=0.01,
            wd_incr_steps=wd_steps,
            wd_incr_style="constant",
        )
        for step in range(1, steps + 1):
            trained_at = optimizer.param_groups[0]["lr"]  # the optimizer step of this iteration
            sched.step(increment=gbs)  # DeepSpeed's engine.step(lr_kwargs={"increment": gbs})
            tokens = gbs * seqlen(step)
            args.consumed_train_tokens += tokens  # training.py adds them after train_step
            out["steps"].append([step, gbs, tokens, trained_at])
    except Exception as err:  # noqa: BLE001 - recorded: Megatron cannot run this config
        out["error"] = f"{type(err).__name__}: {err} (at step {len(out['steps']) + 1})"
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(f"usage: {COMMAND}")
    checkout = Path(argv[0]).resolve()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    table = {
        "description": (
            "Megatron-DeepSpeed's OptimizerParamScheduler driven as megatron/training.py's DeepSpeed path "
            "drives it; steps is [step, samples, tokens, lr the step trained at]; tokens are global batch x "
            "seqlen(step) = min(64, 8 * (1 + (step - 1) // 3))"
        ),
        "command": COMMAND,
        "repository": "microsoft/Megatron-DeepSpeed",
        "commit": commit or None,
        "source": SOURCE,
        "configs": [record(checkout, name, flags) for name, flags in CONFIGS.items()],
    }
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main(sys.argv[1:])
