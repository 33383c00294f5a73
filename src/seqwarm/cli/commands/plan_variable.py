"""``seqwarm plan --curriculum-mode variable`` (or a config whose ``seqwarm`` block says ``"curriculum_mode":
"variable"``): the variable-length run ahead of time, from the training documents' offsets (the index of a
prepared folder, the embedded corpus or Megatron ``--data-path`` files; no token is read, no torch imported)
and :func:`seqwarm.data.variable_sources.variable_plan`, the plan ``seqwarm train`` prints at its start.

Everything comes from the run's own settings, read as training reads them
(:class:`~seqwarm.data.variable_sources.VariableSettings`): the length range (the curriculum block's
``min_difficulty`` / ``max_difficulty``), the tokens per step (the full-length global batch), the
curriculum (``--variable-curriculum`` / ``variable_curriculum``), Grow-P2's cycles (``--variable-cycles``
/ ``variable_cycles``), the schedule's cap, ``linear``'s steps (the budget's) and the seed (``--seed``);
a ``--data-path`` blend is planned per source with its weights, one source a step, as training draws it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from seqwarm.config.reader import read_config_dict
from seqwarm.curriculum.plan_variable_text import plan_lines
from seqwarm.data.variable_sources import VariableSettings, decompose_sources, read_sources, variable_plan
from seqwarm.run.spec import RunSpec
from seqwarm.util.errors import UserError

VARIABLE = "variable"


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
    cfg, refused = resolve(spec, args.world_size)
    if cfg.curriculum is None or cfg.curriculum.mode != VARIABLE:  # the reader refuses it first; in case
        raise UserError("--curriculum-mode variable needs an enabled curriculum block (drop --no-curriculum)")
    sources = read_sources(data=spec.data, data_path=spec.data_path, split=spec.split, rounding=spec.split_rounding)
    chunks = decompose_sources(sources, VariableSettings.of(cfg))
    names = [s.name for s in sources]
    plan = variable_plan(
        cfg, chunks, [s.weight for s in sources], names=names, seed=spec.seed, world_size=args.world_size
    )
    if len(sources) == 1:
        data, note = names[0], None
    else:
        data = f"a --data-path blend of {len(sources)} sources (the source lines below)"
        note = "one source a step, by its weight, as training draws them"
    if args.json:
        print(json.dumps({**plan.to_dict(), "data": data, "data_note": note}))
    else:
        for line in plan_lines(plan, data, note):
            print(line)
    for problem in refused:
        print(f"warning: train refuses this run: {problem}", file=sys.stderr)
    for message in plan.warnings:
        print(f"warning: {message}", file=sys.stderr)
    return 0
