"""What a contiguous cut costs: ``SequenceLengthWarmup.cut`` hands back contiguous tensors (so a model may
``.view()`` them, as nanoGPT's loss does), where a bare slice ``x[:, :L]`` is a free strided view.

For a nanoGPT-style micro-batch ``(X, Y)`` of ``B x S`` int64 tokens cut to each length ``L``, in one run:

- view: ``X[:, :L], Y[:, :L]`` (no copy; ``.view(-1)`` on it fails);
- contiguous: the same two slices ``.contiguous()`` (one copy of ``2 x B x L`` tokens);
- slw.cut: the whole call, ``slw.cut((X, Y))`` (form handling, layout read, the copy, the token count);
- a training step (forward + backward) of a tiny GPT on the cut micro-batch, the scale the copy is paid at.

The cuts alternate in rounds (so load from other processes hits all alike); each figure is the median
over rounds. Printed side by side: the copy's cost against the view, and the cut's share of a step.

    python benchmarks/bench_cut.py                         # B 16, S 1024, L = 64, 256, 1024
    python benchmarks/bench_cut.py --batch 8 --lengths 128,512 --rounds 400
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.trainer.model import GPT, GPTConfig


def timed(fn, reps: int) -> float:
    """Seconds per call of ``fn``, over ``reps`` calls."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--rounds", type=int, default=200, help="rounds of the three cuts (each 20 calls)")
    p.add_argument("--steps", type=int, default=3, help="training steps timed per length")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    b, s = args.batch, args.seq
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 512, (b, s + 1), generator=g)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # what nanoGPT's get_batch builds
    model = GPT(GPTConfig(vocab_size=512, seq_length=s, n_layer=2, n_head=2, n_embd=64))
    print(f"# bench_cut: B={b} S={s} int64, torch {torch.__version__}, {args.threads} thread(s)")
    print("| length | view µs | contiguous µs | slw.cut µs | contiguous/view | step ms | slw.cut / step |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for length in (int(v) for v in args.lengths.split(",")):
        slw = SequenceLengthWarmup(min_length=length, max_length=s, steps=10**9, multiple_of=1)
        slw.begin_step()
        assert slw.cut((x, y))[0].shape == (b, length)
        cuts = {
            "view": lambda n=length: (x[:, :n], y[:, :n]),
            "contiguous": lambda n=length: (x[:, :n].contiguous(), y[:, :n].contiguous()),
            "slw.cut": lambda s=slw: s.cut((x, y)),
        }
        times: dict[str, list[float]] = {name: [] for name in cuts}
        for r in range(args.rounds):
            order = list(cuts) if r % 2 == 0 else list(reversed(cuts))
            for name in order:
                times[name].append(timed(cuts[name], 20))
        med = {name: statistics.median(v) for name, v in times.items()}
        cx, cy = slw.cut((x, y))
        steps = []
        for _ in range(args.steps):
            start = time.perf_counter()
            model(input_ids=cx, labels=cy).backward()
            steps.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
        step = statistics.median(steps)
        print(
            f"| {length} | {med['view'] * 1e6:.1f} | {med['contiguous'] * 1e6:.1f} | {med['slw.cut'] * 1e6:.1f} | "
            f"{med['contiguous'] / med['view']:.1f}x | {step * 1e3:.0f} | {med['slw.cut'] / step:.2%} |"
        )


if __name__ == "__main__":
    main()
