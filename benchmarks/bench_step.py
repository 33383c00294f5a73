"""Step time (forward + backward + AdamW step) at each sequence length, relative to full length.

A fixed number of sequences per batch, cut to each length (what truncation does during the
curriculum). Lengths are measured in interleaved rounds (a shuffled order each round) so machine
drift hits all of them alike; the table shows medians and the ratio to the full length.

    python benchmarks/bench_step.py                                  # tiny, 16 x (8..256)
    python benchmarks/bench_step.py --preset gpt2-124m --batch 1 --repeats 3 --lengths 64,128,256,512,1024
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from seqwarm.trainer.model import GPT, GPTConfig

DEFAULT_LENGTHS = {"tiny": "8,32,64,128,256", "gpt2-124m": "64,128,256,512,1024"}


def step_time(model, opt, tokens, length: int, steps: int) -> float:
    """Seconds per step on the first ``length`` positions of ``tokens`` (B, S + 1)."""
    start = time.perf_counter()
    for _ in range(steps):
        # Next-token labels on random tokens keep the loss near ln(V): a task the model could learn
        # (labels = inputs) drives gradients towards denormal floats, which are very slow on CPUs.
        loss = model(tokens[:, :length], labels=tokens[:, 1 : length + 1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--lengths", default=None, help="comma-separated; the last is the reference")
    ap.add_argument("--repeats", type=int, default=9, help="interleaved rounds (median over them)")
    ap.add_argument("--steps", type=int, default=1, help="steps per measurement")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in (args.lengths or DEFAULT_LENGTHS.get(args.preset, "64,256")).split(",")]
    cfg = GPTConfig.preset(args.preset, seq_length=max(lengths))
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    full = torch.randint(0, cfg.vocab_size, (args.batch, max(lengths) + 1))
    for length in lengths:  # warm-up: allocator, kernels, optimizer state
        step_time(model, opt, full, length, 1)
    times: dict[int, list[float]] = {n: [] for n in lengths}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = lengths[:]
        rng.shuffle(order)
        for length in order:
            times[length].append(step_time(model, opt, full, length, args.steps))
    ref = statistics.median(times[lengths[-1]])
    print(
        f"# {args.preset} ({model.num_params() / 1e6:.1f}M params), batch {args.batch}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.machine()}; "
        f"median of {args.repeats} interleaved rounds x {args.steps} steps"
    )
    print("| length | step time (s) | time vs full | tokens vs full | tokens/s |")
    print("|---:|---:|---:|---:|---:|")
    for length in lengths:
        t = statistics.median(times[length])
        print(f"| {length} | {t:.3f} | {t / ref:.3f} | {length / lengths[-1]:.3f} | {args.batch * length / t:,.0f} |")


if __name__ == "__main__":
    main()
