"""docs/MIGRATING.md's table of the flags of Megatron-DeepSpeed's two curriculum example scripts says of
each flag whether `seqwarm train` handles it or refuses it: the parser must agree, row by row."""

from __future__ import annotations

import re
from pathlib import Path

from seqwarm.cli import build_parser

MIGRATING = (Path(__file__).resolve().parents[1] / "docs" / "MIGRATING.md").read_text()


def _rows() -> list[tuple[list[str], str]]:
    section = MIGRATING.split("## The two curriculum example scripts, flag by flag", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        flags = [f for f in re.findall(r"--[a-z][\w-]*", cells[0])]
        rows.append((flags, cells[3]))
    return rows


def test_every_row_of_the_table_says_what_the_parser_does():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    known = set(sub.choices["train"]._option_string_actions)
    rows = _rows()
    assert len(rows) >= 45
    seen = set()
    for flags, status in rows:
        assert status.startswith(("handled", "refused")), (flags, status)
        for flag in flags:
            if flag in ("--num_nodes", "--num_gpus", "--module"):  # the deepspeed launcher's own
                continue
            seen.add(flag)
            if status.startswith("handled"):
                assert flag in known, f"the table says {flag} is handled, but seqwarm train does not take it"
            else:
                assert flag not in known, f"the table says {flag} is refused, but seqwarm train takes it"
    # the flags of both scripts (microsoft/Megatron-DeepSpeed examples_deepspeed/curriculum_learning)
    for flag in (
        "--init-method-std",
        "--rotary-percent",
        "--use-rotary-position-embeddings",
        "--log-optimizer-states-to-tensorboard",
        "--no-pipeline-parallel",
        "--exit-duration-in-mins",
        "--hysteresis",
        "--num-workers",
        "--no-async-tensor-model-parallel-allreduce",
        "--lr-warmup-tokens",
        "--train-samples",
        "--adam-beta1",
        "--adam-beta2",
        "--max-position-embeddings",
        "--override-opt_param-scheduler",
        "--load",
        "--zero-stage",
    ):
        assert flag in seen, flag
