"""The engine's tokens/s against a bare PyTorch loop doing the same work, as a ratio in one run.

Both loops train the same model with the same optimizer on the same batches, cut to the same
curriculum length, with gradient clipping and a per-step LR write:

- bare: ``model(**{k: v[:, :L]})``, backward, ``clip_grad_norm_``, set the LR, ``opt.step()``,
  ``zero_grad``;
- engine: ``engine(batch)``, ``engine.backward``, ``engine.step()`` (scheduler, shaping, token
  counting, clock, LR schedule, clipping).

Steps alternate bare/engine one optimizer step at a time (the order flips every pair), so load from
other processes hits both alike; the table gives the median of the per-pair ratios and the ratio of
the total times. Goal: >= 0.97.

    python benchmarks/bench_engine.py                     # tiny model, batch 16, L = 8, 64, 256
    python benchmarks/bench_engine.py --lengths 32 --gas 4 --rounds 20 --mode inject
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from seqwarm.config import load_config
from seqwarm.curriculum.engine import CurriculumEngine
from seqwarm.trainer.model import GPT, GPTConfig


def make_batches(n: int, b: int, s: int, vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, vocab, (b, s + 1), generator=g)
        out.append(
            {
                "input_ids": tokens[:, :-1],
                "labels": tokens[:, 1:],
                "loss_mask": torch.ones(b, s),
                "position_ids": torch.arange(s).repeat(b, 1),
            }
        )
    return out


def bare_step(model, opt, batches, length: int, lr: float) -> float:
    """One optimizer step (len(batches) micro-batches) of the plain loop; returns seconds."""
    start = time.perf_counter()
    for batch in batches:
        loss = model(**{k: v[:, :length] for k, v in batch.items()})
        (loss / len(batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def engine_step(engine, batches) -> float:
    """One optimizer step through the engine; returns seconds."""
    start = time.perf_counter()
    for batch in batches:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=16, help="micro-batch sequences")
    ap.add_argument("--gas", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--lengths", default="8,64,256", help="curriculum lengths to measure at")
    ap.add_argument("--mode", default="truncate", choices=["truncate", "inject"])
    ap.add_argument("--rounds", type=int, default=30, help="interleaved bare/engine step pairs")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = GPTConfig.preset(args.preset)
    full = cfg.seq_length
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    batches = make_batches(args.gas, args.batch, full, cfg.vocab_size)
    print(
        f"# {args.preset}, micro-batch {args.batch}, gas {args.gas}, mode {args.mode}, "
        f"{torch.get_num_threads()} threads; {args.rounds} interleaved step pairs"
    )
    print(
        "| length | bare tokens/s | engine tokens/s | engine/bare (median of pairs) | engine/bare (totals) "
        "| interquartile |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for length in (int(x) for x in args.lengths.split(",")):
        raw = {
            "train_micro_batch_size_per_gpu": args.batch,
            "gradient_accumulation_steps": args.gas,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
            "curriculum_learning": {  # constant length: the engine still runs the scheduler
                "enabled": True,
                "curriculum_type": "seqlen",
                "min_difficulty": length,
                "max_difficulty": length,
                "schedule_type": "fixed_linear",
                "schedule_config": {"total_curriculum_step": 1000, "difficulty_step": 1},
            },
            "seqwarm": {"curriculum_mode": args.mode},
        }
        engine = CurriculumEngine(model, opt, load_config(raw))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # max_difficulty < full length on purpose
            bare_step(model, opt, batches, length, 1e-4)  # warm-up
            engine_step(engine, batches)
            pairs = []
            for r in range(args.rounds):  # one step each, order flipping every round
                if r % 2 == 0:
                    tb, te = bare_step(model, opt, batches, length, 1e-4), engine_step(engine, batches)
                else:
                    te, tb = engine_step(engine, batches), bare_step(model, opt, batches, length, 1e-4)
                pairs.append((tb, te))
        tokens = args.gas * args.batch * length  # the same tokens in both loops
        ratios = sorted(tb / te for tb, te in pairs)
        total_b, total_e = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        print(
            f"| {length} | {tokens * len(pairs) / total_b:,.0f} | {tokens * len(pairs) / total_e:,.0f} | "
            f"{statistics.median(ratios):.3f} | {total_b / total_e:.3f} | "
            f"{ratios[len(ratios) // 4]:.3f}..{ratios[(3 * len(ratios)) // 4]:.3f} |"
        )


if __name__ == "__main__":
    main()
