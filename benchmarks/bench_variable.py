"""Time per token of a training step at each length: truncate's rows against the variable mode's.

Truncate keeps the batch's rows and cuts them to the step's length ``L`` (``B`` rows of ``L``: fewer tokens
in a short step); curriculum mode variable keeps the tokens and trains ``B x S / L`` rows of ``L`` (docs/
VARIABLE.md). Both are measured side by side in interleaved rounds (a shuffled order each round, so
machine drift hits them alike); the table shows the median microseconds per token trained and each one's
ratio to the full-length step's (``B`` rows of ``S``), so a ratio below 1 is a token cheaper than at full
length.

    python benchmarks/bench_variable.py                        # tiny GPT, 16 x 256, lengths 8..256
    python benchmarks/bench_variable.py --n-layer 2 --n-embd 128 --n-head 2
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from seqwarm.trainer.model import GPT, GPTConfig


def step_seconds(model, opt, tokens: torch.Tensor, steps: int) -> float:
    """Seconds per optimizer step on ``tokens`` (rows, L + 1): forward, backward, clip, AdamW."""
    start = time.perf_counter()
    for _ in range(steps):
        # next-token labels on random tokens keep the loss near ln(V) (no drift towards denormal gradients)
        loss = model(tokens[:, :-1], labels=tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16, help="full-length rows per step (B)")
    ap.add_argument("--length", type=int, default=256, help="the full length (S, the variable mode's maximum)")
    ap.add_argument("--lengths", default="8,16,32,64,128,256", help="comma-separated powers of 2 up to S")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (median over them)")
    ap.add_argument("--steps", type=int, default=2, help="steps per measurement")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.lengths.split(",")]
    full_tokens = args.batch * args.length
    if any(full_tokens % n for n in lengths):
        raise SystemExit(f"every length must divide {full_tokens} (B x S) for the variable mode's rows")
    cfg = GPTConfig(
        n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=8192, seq_length=args.length
    )
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    shapes = {("truncate", n): (args.batch, n) for n in lengths} | {
        ("variable", n): (full_tokens // n, n) for n in lengths
    }
    batches = {key: torch.randint(0, cfg.vocab_size, (rows, n + 1)) for key, (rows, n) in shapes.items()}
    for key in shapes:  # warm-up: allocator, kernels, optimizer state
        step_seconds(model, opt, batches[key], 1)
    per_token: dict[tuple[str, int], list[float]] = {key: [] for key in shapes}
    rng = random.Random(0)
    for _ in range(args.repeats):
        order = list(shapes)
        rng.shuffle(order)
        for key in order:
            rows, n = shapes[key]
            per_token[key].append(step_seconds(model, opt, batches[key], args.steps) / (rows * n) * 1e6)
    med = {key: statistics.median(v) for key, v in per_token.items()}
    ref = med[("truncate", args.length)]  # B rows of S: both modes' full-length step
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"GPT {args.n_layer} layers, d {args.n_embd}, {args.n_head} heads; B = {args.batch}, S = {args.length}")
    print(
        f"{'L':>5} {'truncate rows':>14} {'µs/token':>9} {'vs S':>6} {'variable rows':>14} {'µs/token':>9} {'vs S':>6}"
    )
    for n in lengths:
        t, v = med[("truncate", n)], med[("variable", n)]
        print(f"{n:>5} {args.batch:>14} {t:>9.1f} {t / ref:>5.2f}x {full_tokens // n:>14} {v:>9.1f} {v / ref:>5.2f}x")


if __name__ == "__main__":
    main()
