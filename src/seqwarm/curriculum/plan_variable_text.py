"""The variable-length plan as text: ``seqwarm plan --curriculum-mode variable``'s report
(:func:`plan_lines`) and the bucket table ``seqwarm train`` prints at the start of a run in that mode
(:func:`bucket_lines`, the short form). Plain Python: no torch."""

from __future__ import annotations

from seqwarm.curriculum.plan_variable import VariablePlan
from seqwarm.util.units import human_count

__all__ = ["bucket_lines", "plan_lines"]


def _sources(plan: VariablePlan) -> list[str]:
    if len(plan.sources) < 2:
        return []
    return [
        f"source {k}:    {s.name}: weight {s.weight:.1%}, {s.documents:,} documents, {s.steps:,} run steps "
        f"({s.epochs:.2f} epochs of its {s.steps_per_epoch:,} steps)"
        for k, s in enumerate(plan.sources)
    ]


def bucket_lines(plan: VariablePlan, *, short: bool = False) -> list[str]:
    """The bucket table: per length (per source of a blend) its chunks and share, rows and steps, and over
    the run its steps, share of the tokens and how many times its chunks are trained. ``short``: the
    columns ``seqwarm train`` prints."""
    blend = len(plan.sources) > 1
    head = ("source " if blend else "") + f"{'length':>7} {'chunks':>9} "
    head += ("" if short else f"{'tokens':>8} ") + f"{'share':>6} {'rows/step':>9} {'steps/epoch':>11} "
    head += ("" if short else f"{'left over':>9} ") + f"{'run steps':>9} {'run share':>9} {'passes':>7}"
    head += "" if short else f" {'epochs':>6}"
    lines = [head]
    for b in plan.buckets:
        row = (f"{b.source:>6} " if blend else "") + f"{b.length:>7} {b.chunks:>9,} "
        row += ("" if short else f"{human_count(b.tokens):>8} ") + f"{b.share:>6.1%} {b.rows_per_step:>9,} "
        row += f"{b.steps_per_epoch:>11,} " + ("" if short else f"{b.left_over_per_epoch:>9,} ")
        row += f"{b.steps:>9,} {b.run_tokens / max(plan.total_tokens, 1):>9.1%} {b.passes:>7.2f}"
        row += "" if short else f" {b.epochs_used:>6,}"
        lines.append(row)
    return lines


def plan_lines(plan: VariablePlan, source: str, note: str | None = None) -> list[str]:
    """``seqwarm plan``'s report of a variable-length run (``source``: what the documents are)."""
    positions = plan.chunk_tokens + plan.dropped_tokens
    out = [
        f"mode:        variable sequence length (docs/VARIABLE.md), lengths {plan.min_length}..{plan.max_length}",
        f"data:        {source}" + (f" ({note})" if note else ""),
        *_sources(plan),
        f"documents:   {plan.documents:,}; {human_count(positions)} trainable positions, "
        f"{human_count(plan.chunk_tokens)} in chunks; dropped {human_count(plan.dropped_tokens)} "
        f"({plan.dropped_tokens / max(positions, 1):.1%}, remainders under {plan.min_length}); "
        f"{plan.empty_documents:,} documents shorter than {plan.min_length} give no chunk",
    ]
    cycles = f", {plan.num_cycles} cycles an epoch" if plan.curriculum == "grow_p2" else ""
    out.append(
        f"steps:       {human_count(plan.tokens_per_step)} tokens each (world size {plan.world_size}); "
        f"curriculum {plan.curriculum}{cycles}, seed {plan.seed}"
    )
    out += ["", *bucket_lines(plan), "(passes: the times a bucket's chunks are trained over the run; epochs: "]
    out[-1] += "its source's epochs in which it trains)"
    out += [
        "",
        f"steps per epoch:  {plan.steps_per_epoch:,}",
        f"total steps:      {plan.total_steps:,}  ({plan.stop_reason}); {plan.epochs:.2f} epochs",
        f"total tokens:     {plan.total_tokens:,} ({human_count(plan.total_tokens)})",
    ]
    if plan.skipped_steps:
        out.append(f"skipped steps:    {plan.skipped_steps:,} (epochs ended early under the cap)")
    if plan.caps:
        out.append("cap on the length: " + ", ".join(f"{cap} from step {step:,}" for step, cap in plan.caps))
    if plan.curriculum == "grow_p2" and plan.cycles:
        shown = "; ".join(
            f"e{c.epoch}c{c.cycle} steps {c.first_step:,}-{c.last_step:,} mean {c.mean_length:.0f}"
            for c in plan.cycles[:8]
        )
        more = f" (+{len(plan.cycles) - 8} more; --json lists all)" if len(plan.cycles) > 8 else ""
        out.append(f"cycles:           {shown}{more}")
    out += ["", f"{'step':>10} {'tokens':>10} {'epoch':>5} {'cycle':>5} {'cap':>5} {'lengths since the last row':>27}"]
    out[-1] += f" {'lr':>10}"
    for p in plan.points:
        lengths = f"{p.shortest}..{p.longest}, mean {p.mean_length:.0f}"
        lr = f"{p.lr:>10.3g}" if p.lr is not None else f"{'-':>10}"
        cap = p.cap if p.cap is not None else "-"
        out.append(f"{p.step:>10,} {human_count(p.tokens):>10} {p.epoch:>5} {p.cycle:>5} {cap:>5} {lengths:>27} {lr}")
    return out
