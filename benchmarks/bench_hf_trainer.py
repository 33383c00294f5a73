"""CurriculumTrainer's overhead against a plain transformers.Trainer, as a ratio in one run.

Both train the same tiny GPT-2 (built from a config; nothing downloaded) on the same HF-style batches
with the same optimizer, accumulation and logging; CurriculumTrainer's curriculum is pinned at the
full length (min = max = the sequence length), so both do the same arithmetic and the difference is
seqwarm's machinery: the per-step cut (a no-op at full length), token counting, the clock, the LR
scheduler, the budget check and the extra log keys.

Whole ``trainer.train()`` runs alternate plain/curriculum (the order flips every pair), so load from
other processes hits both alike. A run's time is the median of its step times (the interval between
consecutive ``on_step_end`` calls: data, the cut, forward/backward, optimizer, logging; the median
shrugs off bursts of load from other processes); the script prints the median of the per-pair
ratios (curriculum / plain) and the ratio of the whole-run totals. Goal: < 1.03.

    python benchmarks/bench_hf_trainer.py                 # 8 pairs of 40-step runs, 1 thread
    python benchmarks/bench_hf_trainer.py --pairs 10 --steps 50 --threads 2
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings

import numpy as np
import torch


def run(kind: str, args: argparse.Namespace, data) -> tuple[float, float]:
    """(median step seconds, whole train() seconds) of one run."""
    import transformers

    class StepTimes(transformers.TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, *a, **k):
            self.ends.append(time.perf_counter())

    from seqwarm.integrations.hf.trainer import CurriculumTrainer

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=args.vocab, n_positions=args.seq, n_embd=args.width, n_layer=args.layers, n_head=4
        )
    )
    targs = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=2,
        max_steps=args.steps,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        learning_rate=1e-3,
        dataloader_num_workers=0,
    )
    if kind == "plain":
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=data)
    else:
        full = {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": args.seq,
            "max_difficulty": args.seq,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 1, "difficulty_step": 8},
        }
        trainer = CurriculumTrainer(
            model=model,
            args=targs,
            train_dataset=data,
            curriculum={
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "curriculum_learning": full,
                "seqwarm": {"lr_warmup_iters": 2, "lr_decay_style": "linear", "lr_decay_iters": args.steps},
            },
        )
    trainer.remove_callback(transformers.PrinterCallback)  # no per-log prints in the timed run
    times = StepTimes()
    trainer.add_callback(times)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    steps = [b - a for a, b in zip(times.ends, times.ends[1:])]
    return statistics.median(steps), total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import transformers

    from seqwarm.data.dataset import TokenWindows

    transformers.logging.set_verbosity_error()
    logging.getLogger("seqwarm").setLevel(logging.ERROR)
    n = args.micro * 2 * args.steps
    tokens = np.random.default_rng(0).integers(0, args.vocab, args.seq * n + 1)
    data = TokenWindows(tokens, args.seq, label_style="hf")
    run("plain", args, data)  # warm-up: imports, allocator, first-call costs
    ratios, totals = [], {"plain": 0.0, "curriculum": 0.0}
    for i in range(args.pairs):
        order = ("plain", "curriculum") if i % 2 == 0 else ("curriculum", "plain")
        times = {kind: run(kind, args, data) for kind in order}
        for kind, (_, t) in times.items():
            totals[kind] += t
        ratios.append(times["curriculum"][0] / times["plain"][0])
        print(
            f"pair {i + 1}: median step plain {times['plain'][0] * 1e3:.1f} ms, curriculum "
            f"{times['curriculum'][0] * 1e3:.1f} ms, ratio {ratios[-1]:.3f}",
            flush=True,
        )
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"\n{args.steps} steps x 2 micro-batches of {args.micro} x {args.seq} tokens, {args.pairs} pairs")
    print(
        f"curriculum/plain step time: median of pairs {statistics.median(ratios):.3f}, whole runs "
        f"{totals['curriculum'] / totals['plain']:.3f}, interquartile {q[0]:.3f}..{q[2]:.3f}"
    )


if __name__ == "__main__":
    main()
