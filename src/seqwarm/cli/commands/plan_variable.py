"""``seqwarm plan --curriculum-mode variable`` (or a config whose ``seqwarm`` block says ``"curriculum_mode":
"variable"``): the variable-length run ahead of time, from the training documents' offsets (the index of a
prepared folder, the embedded corpus or Megatron ``--data-path`` files; no token is read) and
:func:`seqwarm.curriculum.plan_variable.plan_variable`.

The length range is the curriculum block's ``min_difficulty`` / ``max_difficulty``; ``tokens_per_step`` is
the global batch x ``max_difficulty`` (the batch's rows at the longest length); the sampler's seed is
``--seed``. ``--variable-curriculum`` picks the curriculum (default: the block's schedule as the cap on the
length) and ``--num-cycles`` Grow-P2's cycles; both flags are the plan's own until ``train`` has them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from seqwarm.cli.commands.common import positive_int
from seqwarm.config.reader import read_config_dict
from seqwarm.curriculum.decompose import decompose, is_power_of_two
from seqwarm.curriculum.plan_variable import VariablePlan, plan_variable
from seqwarm.curriculum.schedule import CURRICULUM_MODES
from seqwarm.curriculum.variable import CURRICULA
from seqwarm.data.indexed import MEGATRON_FIX, PREPARE_FIX, MegatronIndexed
from seqwarm.data.meta import read_meta
from seqwarm.run.spec import RunSpec
from seqwarm.util.errors import UserError
from seqwarm.util.units import human_count

VARIABLE = "variable"


def add_variable_flags(p: argparse.ArgumentParser) -> None:
    """``--curriculum-mode variable`` accepted by the plan, and its curriculum flags (each added only where
    ``train``'s flags do not have it yet)."""
    mode = p._option_string_actions["--curriculum-mode"]
    if mode.choices is not None and VARIABLE not in mode.choices:
        mode.choices = (*mode.choices, VARIABLE)
    g = p.add_argument_group("variable sequence length (--curriculum-mode variable; docs/VARIABLE.md)")
    if "--variable-curriculum" not in p._option_string_actions:
        g.add_argument(
            "--variable-curriculum",
            choices=CURRICULA,
            help="which length each step trains: natural (in proportion to each bucket's tokens), grow_p2 "
            "(short to long, in cycles), linear (a cap growing to max_difficulty at the block's "
            "total_curriculum_step) or schedule (the block's schedule as the cap; the default)",
        )
    if "--num-cycles" not in p._option_string_actions:
        g.add_argument("--num-cycles", type=positive_int, help="grow_p2's cycles per epoch (default 8)")


def wants_variable(spec: RunSpec) -> bool:
    """Whether the run is in mode variable: the flag, or the config file's ``seqwarm`` block."""
    if spec.settings.get("curriculum_mode") is not None:
        return spec.settings["curriculum_mode"] == VARIABLE
    if not spec.config:
        return False
    raw, _ = read_config_dict(str(spec.config))
    block = raw.get("seqwarm")
    return isinstance(block, dict) and block.get("curriculum_mode") == VARIABLE


def run_variable(args: argparse.Namespace, spec: RunSpec, resolve: Callable[[RunSpec, int], tuple[Any, list]]) -> int:
    """Plan the variable-length run of ``spec`` and print it (``resolve``: the plan's config resolution)."""
    settings = dict(spec.settings)
    if VARIABLE not in CURRICULUM_MODES:  # until the config reader knows the mode, the rest of the config is read
        settings["curriculum_mode"] = "truncate"
    cfg, refused = resolve(replace(spec, settings=settings), args.world_size)
    cur = cfg.curriculum
    if cur is None:
        raise UserError(
            "--curriculum-mode variable takes its length range from the curriculum block's min_difficulty and "
            "max_difficulty, and this config has no enabled curriculum (drop --no-curriculum, or add a block)"
        )
    bad = [f"{k} {v}" for k, v in (("min_difficulty", cur.min_difficulty), ("max_difficulty", cur.max_difficulty))]
    bad = [b for b, v in zip(bad, (cur.min_difficulty, cur.max_difficulty)) if not is_power_of_two(v)]
    if bad:
        raise UserError(
            f"--curriculum-mode variable: the curriculum's {' and '.join(bad)} must be powers of 2 (the buckets' "
            "lengths, e.g. 64 and 1024)"
        )
    curriculum = args.variable_curriculum or getattr(cfg, "variable_curriculum", None) or "schedule"
    kwargs: dict[str, Any] = {"curriculum": curriculum, "seed": spec.seed, "world_size": args.world_size}
    if curriculum == "grow_p2":
        kwargs["num_cycles"] = args.num_cycles or getattr(cfg, "num_cycles", None) or 8
    elif args.num_cycles:
        raise UserError(f"--num-cycles is grow_p2's; --variable-curriculum is {curriculum}")
    if curriculum == "linear":
        if not cur.total_curriculum_step:
            raise UserError("--variable-curriculum linear grows the cap over the block's total_curriculum_step")
        kwargs["total_steps"] = cur.total_curriculum_step
    if curriculum == "schedule":
        kwargs["schedule"] = cur
    offsets, source, note = training_offsets(spec)
    chunks = decompose(offsets, cur.min_difficulty, cur.max_difficulty)
    budget = {k: getattr(cfg, k) for k in ("train_tokens", "train_iters", "train_samples")}
    plan = plan_variable(chunks, cfg.train_batch_size * cur.max_difficulty, **kwargs, **budget, lr=cfg.lr)
    if args.json:
        print(json.dumps({**plan.to_dict(), "data": source, "data_note": note}))
    else:
        print_variable_plan(plan, source, note)
    for problem in refused:
        print(f"warning: train refuses this run: {problem}", file=sys.stderr)
    for message in plan.warnings:
        print(f"warning: {message}", file=sys.stderr)
    return 0


def training_offsets(spec: RunSpec) -> tuple[np.ndarray, str, str | None]:
    """The training documents' offsets (one stream's worth: only their lengths matter to the plan), what
    they are, and a note (a blend's weights, which the plan does not apply)."""
    if spec.data_path:
        from seqwarm.data.blend import parse_data_path, split_documents  # imports torch: --data-path only

        sizes, names = [], []
        for _, prefix in parse_data_path(spec.data_path):
            indexed = MegatronIndexed(prefix, fix=MEGATRON_FIX)
            start, stop = split_documents(indexed.num_docs, spec.split, spec.split_rounding)[0]
            sizes.append(np.diff(indexed.doc_offsets[start : stop + 1]))
            names.append(f"{prefix} (its {stop - start:,} train documents)")
        note = None if len(sizes) == 1 else "a blend: its sources' documents planned together, without its weights"
        return _offsets(np.concatenate(sizes)), "--data-path " + ", ".join(names), note
    if spec.data:
        folder = Path(spec.data)
    else:
        from seqwarm.data.prepare import embedded_data_dir

        folder = embedded_data_dir()
    read_meta(folder)  # a clear error for a folder that is not prepared data
    indexed = MegatronIndexed(folder / "train", fix=PREPARE_FIX)
    what = f"{folder}/train" if spec.data else "the embedded corpus (train split)"
    return np.asarray(indexed.doc_offsets), what, None


def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def print_variable_plan(plan: VariablePlan, source: str, note: str | None, out=None) -> None:
    out = out or sys.stdout
    positions = plan.chunk_tokens + plan.dropped_tokens

    def say(text: str = "") -> None:
        print(text, file=out)

    say(f"mode:        variable sequence length (docs/VARIABLE.md), lengths {plan.min_length}..{plan.max_length}")
    say(f"data:        {source}" + (f" ({note})" if note else ""))
    say(
        f"documents:   {plan.documents:,}; {human_count(positions)} trainable positions, "
        f"{human_count(plan.chunk_tokens)} in chunks; dropped {human_count(plan.dropped_tokens)} "
        f"({plan.dropped_tokens / max(positions, 1):.1%}, remainders under {plan.min_length}); "
        f"{plan.empty_documents:,} documents shorter than {plan.min_length} give no chunk"
    )
    cycles = f", {plan.num_cycles} cycles an epoch" if plan.curriculum == "grow_p2" else ""
    say(
        f"steps:       {human_count(plan.tokens_per_step)} tokens each (world size {plan.world_size}); "
        f"curriculum {plan.curriculum}{cycles}, seed {plan.seed}"
    )
    say()
    head = f"{'length':>7} {'chunks':>9} {'tokens':>8} {'share':>6} {'rows/step':>9} {'steps/epoch':>11}"
    say(head + f" {'left over':>9} {'run steps':>9} {'run tokens':>10} {'run share':>9}")
    for b in plan.buckets:
        say(
            f"{b.length:>7} {b.chunks:>9,} {human_count(b.tokens):>8} {b.share:>6.1%} {b.rows_per_step:>9,} "
            f"{b.steps_per_epoch:>11,} {b.left_over_per_epoch:>9,} {b.steps:>9,} {human_count(b.run_tokens):>10} "
            f"{b.run_tokens / max(plan.total_tokens, 1):>9.1%}"
        )
    say()
    say(f"steps per epoch:  {plan.steps_per_epoch:,}")
    say(f"total steps:      {plan.total_steps:,}  ({plan.stop_reason}); {plan.epochs:.2f} epochs")
    say(f"total tokens:     {plan.total_tokens:,} ({human_count(plan.total_tokens)})")
    if plan.skipped_steps:
        say(f"skipped steps:    {plan.skipped_steps:,} (epochs ended early under the cap)")
    if plan.caps:
        shown = ", ".join(f"{cap} from step {step:,}" for step, cap in plan.caps)
        say(f"cap on the length: {shown}")
    if plan.curriculum == "grow_p2":
        shown = "; ".join(
            f"e{c.epoch}c{c.cycle} steps {c.first_step:,}-{c.last_step:,} mean {c.mean_length:.0f}"
            for c in plan.cycles[:8]
        )
        more = f" (+{len(plan.cycles) - 8} more; --json lists all)" if len(plan.cycles) > 8 else ""
        say(f"cycles:           {shown}{more}")
    say()
    say(
        f"{'step':>10} {'tokens':>10} {'epoch':>5} {'cycle':>5} {'cap':>5} {'lengths since the last row':>27} "
        f"{'lr':>10}"
    )
    for p in plan.points:
        lengths = f"{p.shortest}..{p.longest}, mean {p.mean_length:.0f}"
        lr = f"{p.lr:>10.3g}" if p.lr is not None else f"{'-':>10}"
        cap = p.cap if p.cap is not None else "-"
        say(f"{p.step:>10,} {human_count(p.tokens):>10} {p.epoch:>5} {p.cycle:>5} {cap:>5} {lengths:>27} {lr}")
