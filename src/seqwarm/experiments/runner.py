"""The one runner of ``seqwarm compare``, ``tune`` and ``sweep``: train a list of arms, each a run in a
folder of its own, and keep what happened to each.

An *arm* is one training run of an experiment, :class:`Arm`: its key names it on the console and in the
state file (``baseline``, ``seed-6/window``, ``CELL/seed-S/curriculum``) and its
:class:`~seqwarm.run.spec.RunSpec` says what it trains and where (``spec.out``). :class:`ArmRunner`
trains the arms it is handed, in order, one after the other:

- a finished run folder with the same settings is reused and one with checkpoints resumed
  (:func:`~seqwarm.experiments.launch.run_or_reuse`, which holds the run folder's lock while it looks);
- an arm that diverged is recorded as such (the experiment goes on) and not trained again while its
  command line is the same;
- the state file (``compare_state.json``, ``sweep_state.json``) is written after every arm, so a killed
  experiment continues where it stopped.

The commands differ in their grid and their report only. ``compare`` hands the runner one seed's arms
at a time (the baseline first, trained once per seed and shared by every curriculum arm of that seed);
``sweep`` one cell's seed (cells that differ only in mode name the same baseline); ``tune``'s probes,
decided one round at a time by its search, train through :func:`train_arm`, each from scratch.

Also here, in one place for the three commands: the train flags they refuse (:func:`refuse_run_flags`),
the options of the commands that train arms over seeds (:class:`ArmOptions`, :func:`check_arm_options`),
the check of every arm before anything trains (:func:`check_arms`) and the reading of an arm's folder
(:func:`read_arm`, :func:`eval_rows`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from seqwarm.experiments.launch import run_or_reuse
from seqwarm.run.command import command_line, train_argv
from seqwarm.run.spec import RunSpec, resolve_config
from seqwarm.trainer.metrics import read_metrics
from seqwarm.util.atomic import write_json
from seqwarm.util.errors import UserError

DEFAULT_SPIKE_THRESHOLD = 1.2
DEFAULT_SMOOTH_STEPS = 8


# --------------------------------------------------------------------------------------------------
# what the experiment commands share


def refuse_run_flags(base: RunSpec, command: str, why: str | None = None) -> None:
    """Refuse the train flags an experiment decides itself for each of its runs (``--no-curriculum``,
    ``--resume``, ``--allow-config-change``; its parser hides them from ``--help``): UserError, exit 2.
    ``why`` says what the command does instead (default: what compare and sweep do)."""
    why = why or f"{command} runs the baseline with --no-curriculum itself and resumes or reuses runs found in --out"
    for given, flag in (
        (base.settings.get("curriculum") is False, "--no-curriculum"),
        (base.resume, "--resume"),
        (base.allow_config_change, "--allow-config-change"),
    ):
        if given:
            raise UserError(f"{flag} is not a {command} flag: {why}")


def require_out(out: Any, what: str) -> None:
    """Refuse an experiment without ``--out DIR``, naming what the folder is for."""
    if not out:
        raise UserError(f"--out DIR is required: the folder for {what}")


@dataclass(frozen=True)
class ArmOptions:
    """What every experiment that trains arms over seeds takes (``compare``, ``sweep``)."""

    out: Path | None = None
    """Folder for the runs and the report (required)."""
    seeds: int = 1
    """Seeds per arm: the spec's seed S, then S+1, ... (the first seed's runs in DIR/<arm>, the others in
    DIR/seed-S/<arm>); the report gives each seed and the median and min–max over them."""
    spike_threshold: float = DEFAULT_SPIKE_THRESHOLD
    """A spike is an excursion of the smoothed loss ratio above this."""
    smooth_steps: int = DEFAULT_SMOOTH_STEPS
    """Trailing-mean window of the loss ratio, in logged steps (1 = raw)."""
    eval_interval: int | None = None
    """Validate every N steps (None: the experiment chooses)."""
    eval_iters: int | None = None
    """Validation micro-batches per evaluation (None: the experiment chooses)."""
    log_interval: int | None = None
    """A train row every N steps (None: every step)."""


def arm_options(options: ArmOptions) -> dict[str, Any]:
    """The :class:`ArmOptions` fields of ``options`` (one of its subclasses), as keywords for another."""
    return {f.name: getattr(options, f.name) for f in fields(ArmOptions)}


def check_arm_options(options: ArmOptions) -> None:
    """Refuse a spike threshold, smoothing window or seed count that measures nothing (UserError)."""
    if not options.spike_threshold > 1:
        raise UserError(
            f"--spike-threshold {options.spike_threshold}: must be above 1 (a ratio to the minimum "
            "loss so far), e.g. 1.2"
        )
    if options.smooth_steps < 1:
        raise UserError(f"--smooth-steps {options.smooth_steps}: must be >= 1 (1 = no smoothing)")
    if options.seeds < 1:
        raise UserError(f"--seeds {options.seeds}: must be a whole number >= 1 (3 or more to measure the spread)")


def check_arms(runs: Mapping[str, RunSpec], what: str = "comparison") -> None:
    """Resolve every arm's settings before any trains: a mode that refuses a setting (a length bucket
    outside truncate, window under a pipeline) is one error naming each arm, not an exit after the other
    arms trained."""
    problems = []
    for arm, spec in runs.items():
        try:
            resolve_config(spec)
        except UserError as err:
            problems.append(f"{arm}: {err}")
    if problems:
        raise UserError(f"an arm of this {what} cannot run as set:\n  " + "\n  ".join(problems))


# --------------------------------------------------------------------------------------------------
# training


@dataclass(frozen=True)
class Arm:
    """One run of an experiment: ``key`` names it (console, state file), ``spec`` trains it in ``spec.out``."""

    key: str
    spec: RunSpec


def train_arm(spec: RunSpec) -> dict[str, Any]:
    """Train, resume or reuse the run in ``spec.out``; what happened: ``status`` (``trained``, ``resumed``,
    ``reused`` or ``diverged``), ``argv``, ``message`` (why it diverged) and ``session_s``. A diverged run
    is a result, not an error: the experiment goes on."""
    from seqwarm.trainer.loop import TrainingDiverged

    t0 = time.perf_counter()
    try:
        what, _ = run_or_reuse(spec)
        result: dict[str, Any] = {"status": what, "argv": train_argv(spec)}
    except TrainingDiverged as err:
        result = {"status": "diverged", "argv": train_argv(spec), "message": str(err)}
    result["session_s"] = round(time.perf_counter() - t0, 1)
    return result


class ArmRunner:
    """Trains arms one after the other and keeps what happened to each in ``state_file`` (a killed
    experiment continues: finished runs are reused, an arm that diverged is not trained again)."""

    def __init__(self, state_file: Path, *, echo=print):
        self.state_file = Path(state_file)
        self.state: dict[str, Any] = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        self.echo = echo

    def run(self, arms: Iterable[Arm]) -> dict[str, dict[str, Any]]:
        """Train (or reuse, resume) each arm in order; what happened to each, by key."""
        done: dict[str, dict[str, Any]] = {}
        for arm in arms:
            done[arm.key] = self.state[arm.key] = self._one(arm)
            write_json(self.state_file, self.state)
        return done

    def _one(self, arm: Arm) -> dict[str, Any]:
        self.echo(f"\n=== {arm.key}: {command_line(arm.spec)}")
        known = self.state.get(arm.key, {})
        if known.get("status") == "diverged" and known.get("argv") == train_argv(arm.spec):
            self.echo(f"{arm.key}: diverged before ({known.get('message')}); not run again")
            return known
        result = train_arm(arm.spec)
        if result["status"] == "diverged":
            self.echo(f"{arm.key}: diverged: {result['message']}")
        elif result["status"] == "reused":
            self.echo(f"{arm.key}: reusing the finished run in {arm.spec.out}")
        return result


# --------------------------------------------------------------------------------------------------
# reading an arm's folder


def eval_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluation rows in order, one per step (a resumed run may log the final step twice)."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") == "eval":
            by_step[r["step"]] = r
    return [by_step[s] for s in sorted(by_step)]


@dataclass(frozen=True)
class ArmFiles:
    """What an arm's run folder holds (empty where a file is missing: a run that diverged early)."""

    run_dir: Path
    rows: list[dict[str, Any]]
    """``metrics.jsonl``'s rows."""
    summary: dict[str, Any]
    """``summary.json`` (written when the run finished)."""
    config: dict[str, Any]
    """``config.json`` (the run's resolved settings, model and data)."""

    @property
    def train(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("kind") == "train"]

    @property
    def evals(self) -> list[dict[str, Any]]:
        return eval_rows(self.rows)

    @property
    def run(self) -> dict[str, Any]:
        """The recorded run settings (``config.json``'s ``run``)."""
        return self.config.get("run", {})

    def finite_losses(self) -> list[float]:
        """The training losses logged, NaN and infinities left out."""
        losses = [float(r["loss"]) for r in self.train if isinstance(r.get("loss"), (int, float))]
        return [v for v in losses if math.isfinite(v)]


def read_arm(run_dir: Path | str) -> ArmFiles:
    """The metrics, summary and config of the run in ``run_dir``."""
    run_dir = Path(run_dir)

    def load(name: str) -> dict[str, Any]:
        path = run_dir / name
        return json.loads(path.read_text()) if path.is_file() else {}

    return ArmFiles(run_dir, read_metrics(run_dir / "metrics.jsonl"), load("summary.json"), load("config.json"))
