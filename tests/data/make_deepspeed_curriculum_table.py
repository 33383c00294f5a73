"""Write tests/data/deepspeed_curriculum_table.json: DeepSpeed's own curriculum schedule, recorded once.

Run from the repository root (needs the ``deepspeed`` extra; DeepSpeed's C++/CUDA ops are not used):

    .venv/bin/python tests/data/make_deepspeed_curriculum_table.py

It imports DeepSpeed's real scheduler class,
``deepspeed.runtime.data_pipeline.curriculum_scheduler.CurriculumScheduler``, builds a fresh one per
config below and drives it the way DeepSpeed's engine did (and seqwarm's engine does):
``update_difficulty(global_steps + 1)`` once per optimizer step from ``global_steps = 0``, i.e.
``update_difficulty(step)`` for every step 1, 2, ..., ``last_step`` in order (the method is stateful:
it stops recomputing once the value reaches ``max_difficulty``, so no step may be skipped).

Every step's value is recorded, run-length encoded to keep the file small: ``runs`` is a list of
``[first_step, last_step, value]`` covering 1..``last_step`` without gaps. ``last_step`` is 5 steps past
the later of ``total_curriculum_step`` (``max_step[-1]`` for fixed_discrete) and the step at which
DeepSpeed's value first reaches its final value.

Configs DeepSpeed cannot run (it raises) or runs pathologically (a length outside
[min_difficulty, max_difficulty], a schedule that is not non-decreasing, so the stateful update freezes
or inverts, or no multiple of difficulty_step in [min, max], so no length honours the step) are left out
of the table and listed under ``skipped`` with the error or the behaviour observed.

tests/curriculum/test_schedule.py reads the JSON only; it never imports DeepSpeed.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import sys
import traceback
from pathlib import Path

COMMAND = ".venv/bin/python tests/data/make_deepspeed_curriculum_table.py"
OUT = Path(__file__).resolve().with_name("deepspeed_curriculum_table.json")
MARGIN = 5
"""Steps recorded past the last change of value (and past total_curriculum_step)."""
SEARCH_LIMIT = 1_000_000
"""Give up (and skip the config) if DeepSpeed's value has not settled by this step."""


def linear(name, lo, hi, step, total):
    return name, {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": lo,
        "max_difficulty": hi,
        "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": total, "difficulty_step": step},
    }


def root(name, lo, hi, step, total, degree):
    return name, {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": lo,
        "max_difficulty": hi,
        "schedule_type": "fixed_root",
        "schedule_config": {"total_curriculum_step": total, "difficulty_step": step, "root_degree": degree},
    }


def discrete(name, lo, hi, levels, max_steps):
    return name, {
        "enabled": True,
        "curriculum_type": "seqlen",
        "min_difficulty": lo,
        "max_difficulty": hi,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": levels, "max_step": max_steps},
    }


CONFIGS = [
    # fixed_linear: aligned min and max, small and large totals, difficulty_step 1, 8, 16, 64
    linear("linear 8-1024 q8 T15000 (paper GPT-2)", 8, 1024, 8, 15000),
    linear("linear 8-1024 q8 T10", 8, 1024, 8, 10),
    linear("linear 8-256 q8 T130 (demo)", 8, 256, 8, 130),
    linear("linear 64-2048 q64 T5000", 64, 2048, 64, 5000),
    linear("linear 1-64 q1 T200", 1, 64, 1, 200),
    linear("linear 8-64 q8 T1", 8, 64, 8, 1),
    linear("linear 8-64 q8 T2", 8, 64, 8, 2),
    linear("linear 8-8 q8 T10 (min = max)", 8, 8, 8, 10),
    # min not a multiple of difficulty_step (or below it): starts at the first multiple >= min
    linear("linear 8-1024 q16 T15000 (min < step)", 8, 1024, 16, 15000),
    linear("linear 10-1024 q8 T100 (min unaligned)", 10, 1024, 8, 100),
    linear("linear 5-77 q1 T30", 5, 77, 1, 30),
    # max not a multiple of difficulty_step: DeepSpeed reaches it only after total_curriculum_step
    linear("linear 16-1000 q16 T15000 (max unaligned)", 16, 1000, 16, 15000),
    linear("linear 16-1000 q16 T20 (max unaligned)", 16, 1000, 16, 20),
    linear("linear 3-20 q8 T7 (min and max unaligned)", 3, 20, 8, 7),
    linear("linear 8-1000 q64 T50 (min and max unaligned)", 8, 1000, 64, 50),
    linear("linear 100-1000 q64 T3000 (min and max unaligned)", 100, 1000, 64, 3000),
    linear("linear 8-100 q64 T4 (one aligned length below max)", 8, 100, 64, 4),
    # fixed_root
    root("root2 8-1024 q8 T15000", 8, 1024, 8, 15000, 2),
    root("root2 10-1000 q16 T40 (min and max unaligned)", 10, 1000, 16, 40, 2),
    root("root2 8-512 q64 T300", 8, 512, 64, 300, 2),
    root("root3 8-1024 q16 T5000 (min < step)", 8, 1024, 16, 5000, 3),
    root("root3 7-100 q1 T25", 7, 100, 1, 25, 3),
    root("root3 16-1000 q16 T60 (max unaligned)", 16, 1000, 16, 60, 3),
    root("root1.5 8-256 q8 T64", 8, 256, 8, 64, 1.5),
    root("root1 8-128 q8 T16 (= linear)", 8, 128, 8, 16, 1),
    root("root0.5 8-128 q8 T16 (convex)", 8, 128, 8, 16, 0.5),
    # fixed_discrete
    discrete("discrete [1,2,3] / [5,10]", 1, 3, [1, 2, 3], [5, 10]),
    discrete("discrete [8,64,256,1024] / [100,1000,5000]", 8, 1024, [8, 64, 256, 1024], [100, 1000, 5000]),
    discrete("discrete [16,32] / [3] (last level below max)", 8, 64, [16, 32], [3]),
    discrete("discrete [8,64,64] / [2,4] (max twice)", 8, 64, [8, 64, 64], [2, 4]),
    # expected to be skipped: DeepSpeed raises, or its values are pathological
    linear("linear q0 (difficulty_step 0)", 8, 64, 0, 10),
    linear("linear T0 (total_curriculum_step 0)", 8, 64, 8, 0),
    linear("linear min > max", 128, 64, 8, 10),
    linear("linear q64 8-32 (no multiple of the step in [min, max])", 8, 32, 64, 10),
    linear("linear q64 100-100 (min = max, not a multiple of the step)", 100, 100, 64, 10),
    root("root -1 (negative root_degree)", 8, 64, 8, 10, -1),
    (
        "root without root_degree",
        {
            "enabled": True,
            "curriculum_type": "seqlen",
            "min_difficulty": 8,
            "max_difficulty": 64,
            "schedule_type": "fixed_root",
            "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8},
        },
    ),
    ("no schedule_type", {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64}),
    discrete("discrete empty max_step", 64, 64, [64], []),
    discrete("discrete lengths mismatch", 8, 64, [8, 64], [5, 10]),
    discrete("discrete unsorted levels", 8, 64, [64, 8], [5]),
    discrete("discrete level above max", 8, 64, [8, 128], [5]),
]


def schedule_end(block) -> int:
    """total_curriculum_step, or the last step of the last-but-one level for fixed_discrete."""
    sc = block.get("schedule_config", {})
    if block.get("schedule_type") == "fixed_discrete":
        return int(sc["max_step"][-1]) if sc.get("max_step") else 0
    return int(sc.get("total_curriculum_step", 0))


def run_one(cls, block):
    """Drive a fresh DeepSpeed scheduler step by step; return (values for steps 1..last_step, problem)."""
    sched = cls(json.loads(json.dumps(block)))  # a private copy: DeepSpeed keeps the dict
    lo, hi = block["min_difficulty"], block["max_difficulty"]
    end = schedule_end(block)
    values, last_change, step = [], 0, 0
    while step < SEARCH_LIMIT:
        step += 1
        value = sched.update_difficulty(step)  # the engine's update_difficulty(global_steps + 1)
        if not isinstance(value, int) or isinstance(value, bool):
            return values, f"update_difficulty({step}) returned {value!r} ({type(value).__name__}), not an int"
        if values and value != values[-1]:
            last_change = step
        values.append(value)
        if value > hi or value < min(lo, hi) or value <= 0:
            return values, (
                f"update_difficulty({step}) = {value}: outside [min_difficulty, max_difficulty] = "
                f"[{lo}, {hi}] (values from step 1: {compress(values)[:4]} ...)"
            )
        # settled: at max (update_difficulty stops there), or past a discrete schedule's last threshold
        settled = value == hi or (block["schedule_type"] == "fixed_discrete" and step > end)
        if settled and step >= max(end, last_change) + MARGIN:
            break
    else:
        return values, f"value still changing at step {SEARCH_LIMIT}"
    # the pure schedule must not decrease, or the stateful update freezes at the first max / inverts
    pure = [sched.get_difficulty(s) for s in range(1, len(values) + 1)]
    drops = [s for s in range(2, len(pure) + 1) if pure[s - 1] < pure[s - 2]]
    if drops:
        s = drops[0]
        return values, (
            f"get_difficulty decreases: get_difficulty({s - 1}) = {pure[s - 2]} > "
            f"get_difficulty({s}) = {pure[s - 1]}; update_difficulty gives {compress(values)}"
        )
    if block["schedule_type"] in ("fixed_linear", "fixed_root"):
        q = block["schedule_config"]["difficulty_step"]
        if -(-lo // q) * q > hi:
            return values, (
                f"no multiple of difficulty_step {q} lies in [min_difficulty, max_difficulty] = "
                f"[{lo}, {hi}]: no length honours difficulty_step; update_difficulty gives "
                f"{compress(values)}"
            )
    return values, None


def describe(err: BaseException) -> str:
    """``Type: message``; for a bare ``assert`` (no message), the asserting source line instead."""
    text = str(err).strip()
    if not text:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        text = f"{frame.line} ({Path(frame.filename).name}:{frame.lineno})"
    return f"{type(err).__name__}: {text}"


def compress(values):
    """[[first_step, last_step, value], ...] for steps 1..len(values)."""
    runs = []
    for step, value in enumerate(values, start=1):
        if runs and runs[-1][2] == value:
            runs[-1][1] = step
        else:
            runs.append([step, step, value])
    return runs


def main() -> int:
    import deepspeed
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)  # the difficulty_step % 8 warnings
    table, skipped = [], []
    for name, block in CONFIGS:
        try:
            values, problem = run_one(CurriculumScheduler, block)
        except Exception as err:  # noqa: BLE001 - recording it is the point
            skipped.append({"name": name, "block": block, "error": describe(err)})
            continue
        if problem is not None:
            skipped.append({"name": name, "block": block, "error": f"pathological: {problem}"})
            continue
        table.append({"name": name, "block": block, "last_step": len(values), "runs": compress(values)})

    doc = {
        "description": (
            "DeepSpeed's legacy curriculum scheduler, recorded step by step. For each config, a fresh "
            "scheduler was called update_difficulty(step) for step = 1..last_step in order (the "
            "engine's update_difficulty(global_steps + 1) from global_steps = 0); runs is "
            "[first_step, last_step, value] covering 1..last_step."
        ),
        "command": COMMAND,
        "deepspeed_version": deepspeed.__version__,
        "scheduler_class": f"{CurriculumScheduler.__module__}.{CurriculumScheduler.__qualname__}",
        "python_version": platform.python_version(),
        "configs": table,
        "skipped": skipped,
    }
    OUT.write_text(format_json(doc) + "\n")
    steps = sum(c["last_step"] for c in table)
    print(
        f"wrote {OUT} ({OUT.stat().st_size} bytes): {len(table)} configs, {steps} steps, "
        f"{sum(len(c['runs']) for c in table)} runs; {len(skipped)} skipped",
        file=sys.stderr,
    )
    for item in skipped:
        print(f"  skipped {item['name']}: {item['error'][:160]}", file=sys.stderr)
    return 0


def format_json(doc) -> str:
    """Indented JSON with each list of numbers (a run, a runs list) on one line: small, still diffable."""
    text = json.dumps(doc, indent=2)
    # collapse [a, b, c] triples and the innermost lists of numbers onto one line
    text = re.sub(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    text = re.sub(
        r"\[\s*((?:\[[^\[\]]*\],?\s*)+)\]", lambda m: "[" + re.sub(r"\],\s*\[", "], [", m.group(1).strip()) + "]", text
    )
    return text


if __name__ == "__main__":
    sys.exit(main())
