"""Launching training runs for experiments: ``seqwarm train`` flags in, run folders out.

``compare`` and ``tune`` accept every ``seqwarm train`` flag and start runs exactly as the CLI does
(:func:`seqwarm.commands.train.execute`). This module builds those runs' flag sets, writes the
config files they need (e.g. a different ``total_curriculum_step``), renders each run as the
``seqwarm train ...`` command line that reproduces it, and decides whether a run folder can be
reused, resumed or started.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seqwarm.errors import UserError

# `seqwarm train` flags the experiment commands set themselves.
MANAGED_DESTS = ("out", "resume", "no_curriculum", "allow_config_change")
# Files `seqwarm train` writes into a run folder (a folder holding only these, with no checkpoint and
# no summary, is a run that died before its first checkpoint and can be started again).
RUN_FILES = ("config.json", "metrics.jsonl", "tensorboard", "checkpoints", "curves.png", "summary.json")


def train_parser() -> argparse.ArgumentParser:
    """A fresh parser of ``seqwarm train`` (its actions can be shared with other commands' parsers)."""
    from seqwarm.commands.train import register

    holder = argparse.ArgumentParser(add_help=False)
    sub = holder.add_subparsers(dest="command")
    register(sub)
    return sub.choices["train"]


def train_defaults() -> dict[str, Any]:
    return {a.dest: a.default for a in train_parser()._actions if a.dest != "help"}


def train_namespace(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """The ``seqwarm train`` Namespace holding ``args``' train flags (None = the train default), with changes."""
    values = {}
    for dest, default in train_defaults().items():
        value = getattr(args, dest, None)
        values[dest] = default if value is None else value
    for key in changes:
        if key not in values:
            raise KeyError(f"{key!r} is not a `seqwarm train` flag")
    values.update(changes)
    values["command"] = "train"
    return argparse.Namespace(**values)


def train_argv(ns: argparse.Namespace) -> list[str]:
    """The ``seqwarm train`` arguments that rebuild ``ns`` (only flags that differ from the defaults)."""
    argv: list[str] = []
    for action in train_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(ns, action.dest, action.default)
        if value is None or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def command_line(ns: argparse.Namespace) -> str:
    return shlex.join(["seqwarm", "train", *train_argv(ns)])


# --------------------------------------------------------------------------------------------------
# configs


def read_raw_config(path: str | None) -> dict[str, Any]:
    """The DeepSpeed JSON of ``--config`` (or the built-in default recipe), as a dict."""
    from seqwarm.defaults import default_train_config

    if not path:
        return default_train_config()
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"--config {path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise UserError(f"--config {path}: must hold a JSON object")
    return raw


def _schedule_blocks(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The enabled curriculum blocks (legacy block, or data_efficiency seqlen metrics) of a raw config."""
    blocks = []
    legacy = raw.get("curriculum_learning")
    if isinstance(legacy, dict) and legacy.get("enabled"):
        blocks.append(legacy)
    de = raw.get("data_efficiency")
    try:
        metrics = de["data_sampling"]["curriculum_learning"]["curriculum_metrics"]
    except (KeyError, TypeError):
        metrics = None
    if isinstance(metrics, dict):
        blocks += [m for name, m in metrics.items() if name.startswith("seqlen") and isinstance(m, dict)]
    return blocks


def total_curriculum_step_of(raw: Mapping[str, Any]) -> int:
    """The config's ``total_curriculum_step`` (fixed_linear / fixed_root schedules only)."""
    blocks = _schedule_blocks(raw)
    if not blocks:
        raise UserError("the config has no enabled sequence-length curriculum (curriculum_learning or "
                        "data_efficiency block)")
    sc = blocks[0].get("schedule_config") or {}
    if blocks[0].get("schedule_type") not in ("fixed_linear", "fixed_root") or "total_curriculum_step" not in sc:
        raise UserError(f"schedule_type {blocks[0].get('schedule_type')!r} has no total_curriculum_step: "
                        "only fixed_linear and fixed_root schedules can be tuned or rescaled")
    return int(sc["total_curriculum_step"])


def with_total_curriculum_step(raw: Mapping[str, Any], value: int) -> dict[str, Any]:
    """A copy of ``raw`` whose curriculum rises over ``value`` steps (every seqlen block is changed)."""
    total_curriculum_step_of(raw)  # checks there is one
    out = copy.deepcopy(dict(raw))
    for block in _schedule_blocks(out):
        block.setdefault("schedule_config", {})["total_curriculum_step"] = int(value)
    return out


def scale_schedule_steps(raw: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A copy of ``raw`` with the curriculum's step counts multiplied by ``factor`` (at least 1).

    fixed_linear / fixed_root: ``total_curriculum_step``; fixed_discrete: every ``max_step``.
    """
    out = copy.deepcopy(dict(raw))
    for block in _schedule_blocks(out):
        sc = block.get("schedule_config")
        if not isinstance(sc, dict):
            continue
        if isinstance(sc.get("total_curriculum_step"), (int, float)):
            sc["total_curriculum_step"] = max(1, round(sc["total_curriculum_step"] * factor))
        if isinstance(sc.get("max_step"), list):
            steps, last = [], 0
            for s in sc["max_step"]:
                last = max(last + 1, round(s * factor))  # keep them strictly increasing
                steps.append(last)
            sc["max_step"] = steps
    return out


def write_json(path: Path, obj: Any) -> Path:
    """Write atomically (a killed process leaves the old file or the new one, never half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
    return path


# --------------------------------------------------------------------------------------------------
# run folders


def run_state(run_dir: Path) -> str:
    """``new`` (absent/empty), ``finished`` (summary.json), ``resumable`` (checkpoints), ``stale``
    (only files a run writes, killed before its first checkpoint) or ``foreign`` (anything else)."""
    run_dir = Path(run_dir)
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return "new"
    if (run_dir / "summary.json").is_file():
        return "finished"
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(p.suffix == ".pt" for p in ckpts.iterdir()):
        return "resumable"
    if all(p.name in RUN_FILES for p in run_dir.iterdir()):
        return "stale"
    return "foreign"


def clear_stale(run_dir: Path) -> None:
    """Remove what a run killed before its first checkpoint left (only seqwarm's own file names)."""
    for name in RUN_FILES:
        p = Path(run_dir) / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def check_same_run(run_dir: Path, ns: argparse.Namespace) -> None:
    """Refuse to reuse a run folder whose recorded settings differ from what this experiment asks for."""
    from seqwarm.commands.train import resolve_config
    from seqwarm.train import RESUME_KEYS

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text())
    new_run = json.loads(json.dumps(resolve_config(ns).to_dict(), default=lambda o: str(o)))
    changed = [k for k in RESUME_KEYS if old.get("run", {}).get(k) != new_run.get(k)]
    opts = old.get("options", {})
    if opts.get("model") not in (None, ns.model):
        changed.append("model")
    if opts.get("seed") not in (None, ns.seed):
        changed.append("seed")
    if changed:
        raise UserError(f"{run_dir} holds a run with a different {', '.join(changed)} than this experiment asks "
                        "for; choose another --out, or delete that folder to run it again")


def run_or_reuse(ns: argparse.Namespace, *, check: bool = True) -> tuple[str, Any]:
    """Start, resume or reuse the run in ``ns.out``. Returns (what happened, TrainResult or None)."""
    from seqwarm.commands.train import execute

    run_dir = Path(ns.out)
    state = run_state(run_dir)
    if state == "foreign":
        raise UserError(f"{run_dir} holds files that are not a seqwarm run; choose another --out")
    if state in ("finished", "resumable") and check:
        check_same_run(run_dir, ns)
    if state == "finished":
        return "reused", None
    if state == "stale":
        clear_stale(run_dir)
    ns = argparse.Namespace(**{**vars(ns), "resume": state == "resumable"})
    result = execute(ns)
    return ("resumed" if state == "resumable" else "trained"), result


def add_parser_with_train_flags(sub: argparse._SubParsersAction, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A sub-command parser that accepts every ``seqwarm train`` flag (its own flags may replace some).

    Flags the experiment sets itself (``--resume``, ``--no-curriculum``, ``--allow-config-change``) are
    hidden from --help and refused when given; ``--eval-interval``, ``--eval-iters`` and
    ``--log-interval`` default to None so the experiment can tell "not given" from the train default.
    """
    p = sub.add_parser(name, parents=[train_parser()], conflict_handler="resolve", **kwargs)
    for flag in ("--resume", "--no-curriculum", "--allow-config-change"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(eval_interval=None, eval_iters=None, log_interval=None)
    return p
