"""``seqwarm tune``: the paper's recipe (appendix A.1) for ``total_curriculum_step``.

Binary-search the largest ``total_curriculum_step`` (T) whose short probe run — the first
``probe_multiple`` x LR-warmup steps of the real run — shows no significant fluctuation of the
full-length validation perplexity. "Significant": some evaluation is more than ``fluctuation_pct``
percent above the best (lowest) earlier one (see :func:`seqwarm.experiments.curves.fluctuation`), or
the probe diverged.

The search alone (:func:`~seqwarm.experiments.tune_search.search_largest_passing`, which takes any
``probe(T) -> ProbeResult``) is in :mod:`seqwarm.experiments.tune_search`. This module is the rest of the
command: :func:`run_probe` is the real probe, a short ``seqwarm train`` run (:func:`process_runner` runs
several at a time in their own processes); :func:`setup_tune` checks the options and works out the probes'
length and the search range; :func:`run_tune` wires the search to a folder with a resumable state file,
prints each probe and writes ``tune.json`` and ``tuned_config.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seqwarm.curriculum.plan import make_plan
from seqwarm.experiments.launch import read_raw_config, total_curriculum_step_of, with_total_curriculum_step
from seqwarm.experiments.runner import read_arm, refuse_run_flags, require_out, train_arm
from seqwarm.experiments.tune_search import Probe, ProbeResult, Runner, run_sequentially, search_largest_passing
from seqwarm.run.command import command_line, train_argv
from seqwarm.run.spec import RunSpec, resolve_config, with_changes
from seqwarm.util.atomic import write_json
from seqwarm.util.errors import UserError

DEFAULT_PROBE_MULTIPLE = 4.0
DEFAULT_FLUCTUATION_PCT = 2.0
DEFAULT_PROBE_EVALS = 10
STATE_FILE = "tune_state.json"


# --------------------------------------------------------------------------------------------------
# the real probe


@dataclass(frozen=True)
class ProbeSpec:
    """Everything a probe process needs (plain data, so it crosses process boundaries)."""

    folder: str
    raw_config: dict[str, Any]
    run: RunSpec
    """The probe's run (config and out are set per value)."""
    threads: int = 0
    """torch threads in a probe process (0: leave torch's default)."""


def probe_paths(folder: Path, value: int) -> tuple[Path, Path, Path]:
    """(config file, run folder, log file) of the probe for ``value``."""
    base = Path(folder) / "probes"
    return base / f"T{value}.json", base / f"T{value}", base / f"T{value}.log"


def read_probe(run_dir: Path, value: int) -> ProbeResult | None:
    """A finished probe's evidence from its run folder (None when it did not finish)."""

    if not (Path(run_dir) / "summary.json").is_file():
        return None
    arm = read_arm(run_dir)
    evals = arm.evals
    wall = arm.summary.get("wall_time_s", 0.0)
    return ProbeResult(value, [r["step"] for r in evals], [r["val_ppl"] for r in evals], elapsed_s=wall)


def run_probe(spec: ProbeSpec, value: int) -> ProbeResult:
    """Train the probe for ``value`` on the experiments' runner (:func:`~seqwarm.experiments.runner.train_arm`,
    from scratch; output to its log file) and return its evidence."""
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    cfg_path, run_dir, log_path = probe_paths(Path(spec.folder), value)
    if run_dir.exists():  # a probe the state file does not record (unfinished, or from an older search)
        shutil.rmtree(run_dir)
    write_json(cfg_path, with_total_curriculum_step(spec.raw_config, value))
    run = replace(spec.run, config=cfg_path, out=run_dir, resume=False)
    t0 = time.perf_counter()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log, contextlib.redirect_stdout(log), _logs_to(log):
        outcome = train_arm(run)  # a new folder: trained from scratch, never reused or resumed
    if outcome["status"] == "diverged":
        evals = [r for r in read_arm(run_dir).rows if r.get("kind") == "eval"]
        return ProbeResult(
            value,
            [r["step"] for r in evals],
            [r["val_ppl"] for r in evals],
            diverged=True,
            message=outcome["message"].split(";")[0],
            elapsed_s=time.perf_counter() - t0,
        )
    result = read_probe(run_dir, value)
    if result is None:
        raise RuntimeError(f"probe T={value} finished without {run_dir}/summary.json")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # probes are never resumed: save the disk
    return result


@contextlib.contextmanager
def _logs_to(stream) -> Iterator[None]:
    """Send seqwarm's log records (config warnings of every probe, ...) to the probe's log, not the console."""

    pkg = logging.getLogger("seqwarm")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    old_propagate = pkg.propagate
    pkg.addHandler(handler)
    pkg.propagate = False
    try:
        yield
    finally:
        pkg.removeHandler(handler)
        pkg.propagate = old_propagate


def _probe_in_process(args: tuple[ProbeSpec, int]) -> ProbeResult:
    return run_probe(*args)


def process_runner(spec: ProbeSpec, jobs: int) -> Runner:
    """Run up to ``jobs`` probes at a time in fresh processes (spawned: no forked torch thread pools)."""

    def runner(probe: Probe, values: list[int]) -> Iterator[tuple[int, ProbeResult]]:
        if not values:
            return
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(values)), mp_context=ctx) as pool:
            futures = {pool.submit(_probe_in_process, (spec, v)): v for v in values}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()

    return runner


# --------------------------------------------------------------------------------------------------
# the command


@dataclass
class TuneSetup:
    folder: Path
    raw_config: dict[str, Any]
    probe: RunSpec
    """The probes' run (config and out are set per value)."""
    probe_steps: int
    warmup_steps: int
    eval_interval: int
    lo: int
    hi: int
    resolution: int
    fluctuation_pct: float
    jobs: int
    current: int
    """The config's own total_curriculum_step."""

    def fingerprint(self) -> dict[str, Any]:
        """What a probe's verdict depends on besides T and the threshold (resume needs it unchanged)."""
        raw = with_total_curriculum_step(self.raw_config, 0)
        argv = train_argv(replace(self.probe, config=None, out=None))
        return {"config": raw, "train_argv": argv, "probe_steps": self.probe_steps, "eval_interval": self.eval_interval}


@dataclass(frozen=True)
class TuneOptions:
    """What ``seqwarm tune`` takes besides the probes' shared spec."""

    out: Path | None = None
    """Folder for the probes, state and results (required)."""
    probe_multiple: float = DEFAULT_PROBE_MULTIPLE
    """Probes train this many times the LR warmup steps."""
    probe_steps: int | None = None
    """Probes train this many steps instead (None: probe_multiple x warmup)."""
    probe_evals: int = DEFAULT_PROBE_EVALS
    """Evaluations per probe when eval_interval is None."""
    fluctuation: float = DEFAULT_FLUCTUATION_PCT
    """A probe fails when a full-length validation perplexity is more than this percentage above the lowest
    earlier one, or when it diverges."""
    lo: int | None = None
    """Smallest value to consider (None: the LR warmup steps)."""
    hi: int | None = None
    """Largest value to consider (None: the run's planned steps)."""
    resolution: int = 0
    """Stop when the passing and failing values are at most this far apart (0: 5% of hi)."""
    jobs: int = 1
    """Probes at a time, each in its own process."""
    eval_interval: int | None = None
    """Validate every N steps in a probe (None: from probe_evals)."""


def setup_tune(base: RunSpec, args: TuneOptions) -> TuneSetup:
    """Check the options and work out the probes' length, evaluation interval and the search range."""

    require_out(args.out, "the probes, tune.json and tuned_config.json")
    refuse_run_flags(
        base, "tune", "tune searches the curriculum's length and resumes a search found in --out by itself"
    )
    if not args.probe_multiple > 0:
        raise UserError(f"--probe-multiple {args.probe_multiple}: must be > 0 (probes last this many LR warmups)")
    if not args.fluctuation > 0:
        raise UserError(f"--fluctuation {args.fluctuation}: must be a positive percentage, e.g. 2")
    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: must be >= 1")
    if args.probe_evals < 2:
        raise UserError(f"--probe-evals {args.probe_evals}: a fluctuation needs at least 2 evaluations")
    folder = Path(args.out)
    raw = read_raw_config(base)
    current = total_curriculum_step_of(raw)
    cfg = resolve_config(replace(base, out=folder / "probes" / "check"))
    if cfg.curriculum is not None and cfg.curriculum.mode == "variable" and cfg.variable_curriculum != "schedule":
        raise UserError(  # every probe would train the same run, and the search pick a value that changes nothing
            f"curriculum mode variable with variable_curriculum {cfg.variable_curriculum} does not read "
            "total_curriculum_step: there is nothing to tune; use --variable-curriculum schedule (its cap follows it)"
        )
    plan = make_plan(cfg)
    warmup = plan.warmup_end_step or 0
    if args.probe_steps:
        probe_steps = args.probe_steps
    elif warmup:
        probe_steps = max(2, math.ceil(args.probe_multiple * warmup))
    else:
        raise UserError(
            "the run has no LR warmup, and probes last --probe-multiple x the warmup steps: set "
            "lr_warmup_iters (or --lr-warmup-iters), or give --probe-steps N"
        )
    if args.eval_interval is not None and not 0 < args.eval_interval < probe_steps:
        raise UserError(
            f"--eval-interval {args.eval_interval}: probes need at least 2 evaluations in their "
            f"{probe_steps} steps (leave it out to use --probe-evals)"
        )
    eval_interval = args.eval_interval if args.eval_interval is not None else max(1, probe_steps // args.probe_evals)
    lo = args.lo if args.lo is not None else max(1, warmup)
    hi = args.hi if args.hi is not None else plan.total_steps
    if not 1 <= lo <= hi:
        raise UserError(
            f"the search range needs 1 <= --lo <= --hi (got lo {lo}, hi {hi}; without flags lo is "
            f"the warmup ({warmup} steps) and hi the run's planned steps ({plan.total_steps}))"
        )
    resolution = args.resolution or max(1, round(0.05 * hi))
    # Probes keep the full run's LR schedule: decay is pinned to what the full run resolves to, and the
    # probe stops by a step cap (train_iters) rather than by shrinking the token budget.
    pinned: dict[str, Any] = {f"lr_decay_{u}": None for u in ("tokens", "iters", "samples")}
    if cfg.lr.decay_unit:
        pinned[f"lr_decay_{cfg.lr.decay_unit}"] = getattr(cfg.lr, f"decay_{cfg.lr.decay_unit}")
    pinned["lr_decay_style"] = cfg.lr.decay_style
    probe = with_changes(
        base,
        **pinned,
        train_iters=probe_steps,
        eval_interval=eval_interval,
        save_interval=0,
        progress_bar=False,
        eval_wikitext=None,
        eval_lambada=None,
    )
    return TuneSetup(
        folder, raw, probe, probe_steps, warmup, eval_interval, lo, hi, resolution, args.fluctuation, args.jobs, current
    )


def load_state(setup: TuneSetup) -> dict[int, ProbeResult]:
    """Finished probes recorded in ``DIR/tune_state.json`` (or in finished probe folders)."""
    path = setup.folder / STATE_FILE
    done: dict[int, ProbeResult] = {}
    if path.is_file():
        state = json.loads(path.read_text())
        if state.get("fingerprint") != json.loads(json.dumps(setup.fingerprint())):
            raise UserError(
                f"{path} records a search with different settings (config, flags, probe length or "
                "evaluation interval); use another --out, or delete it to start over"
            )
        done = {int(k): ProbeResult.from_dict(v) for k, v in state.get("probes", {}).items()}
    probes = setup.folder / "probes"
    if probes.is_dir():  # probes that finished after the state was last written
        for run_dir in probes.iterdir():
            if run_dir.is_dir() and run_dir.name[1:].isdigit() and int(run_dir.name[1:]) not in done:
                found = read_probe(run_dir, int(run_dir.name[1:]))
                if found is not None and path.is_file():
                    done[found.value] = found
    return done


def save_state(setup: TuneSetup, done: Mapping[int, ProbeResult]) -> None:
    write_json(
        setup.folder / STATE_FILE,
        {"fingerprint": setup.fingerprint(), "probes": {str(v): r.to_dict() for v, r in sorted(done.items())}},
    )


def run_tune(
    base: RunSpec, args: TuneOptions, *, probe: Probe | None = None, runner: Runner | None = None, echo=print
) -> dict[str, Any]:
    """Search, print each probe, write ``tune.json`` and ``tuned_config.json``; return tune.json's dict."""
    setup = setup_tune(base, args)
    setup.folder.mkdir(parents=True, exist_ok=True)
    done = load_state(setup)
    save_state(setup, done)
    threads = max(1, (os.cpu_count() or 1) // setup.jobs) if setup.jobs > 1 else 0
    spec = ProbeSpec(str(setup.folder), setup.raw_config, setup.probe, threads)
    if probe is None:
        probe = lambda value: run_probe(spec, value)  # noqa: E731
        if runner is None and setup.jobs > 1:
            runner = process_runner(spec, setup.jobs)
    length = (
        "--probe-steps" if args.probe_steps else f"{args.probe_multiple:g} x the {setup.warmup_steps}-step LR warmup"
    )
    echo(
        f"tune: probes train {setup.probe_steps} steps ({length}) and evaluate every {setup.eval_interval} steps; "
        f"a probe fails when a full-length val ppl is more "
        f"than {setup.fluctuation_pct:g}% above the best earlier one, or it diverges"
    )
    echo(
        f"tune: searching total_curriculum_step in [{setup.lo}, {setup.hi}] to within {setup.resolution} "
        f"(config has {setup.current}), {setup.jobs} probe(s) at a time"
        + (f"; {len(done)} probe(s) already done in {setup.folder}" if done else "")
    )

    def on_result(value: int, result: ProbeResult, reused: bool) -> None:
        done[value] = result
        save_state(setup, done)
        tag = " (done before)" if reused else f" ({result.elapsed_s:.0f}s)"
        echo(f"probe T={value:>6}: {result.verdict():<15} {result.evidence()}{tag}")

    outcome = search_largest_passing(
        probe,
        setup.lo,
        setup.hi,
        fluctuation_pct=setup.fluctuation_pct,
        jobs=setup.jobs,
        resolution=setup.resolution,
        done=done,
        runner=runner or run_sequentially,
        on_result=on_result,
    )
    for w in outcome.warnings:
        echo(f"warning: {w}")
    report = {
        "chosen": outcome.chosen,
        "lowest_failing": outcome.lowest_failing,
        "reason": outcome.reason,
        "config_value": setup.current,
        "range": [setup.lo, setup.hi],
        "resolution": setup.resolution,
        "fluctuation_pct": setup.fluctuation_pct,
        "probe_steps": setup.probe_steps,
        "probe_multiple": args.probe_multiple,
        "warmup_steps": setup.warmup_steps,
        "eval_interval": setup.eval_interval,
        "jobs": setup.jobs,
        "definition": (
            "a probe trains the first probe_steps steps of the run with the candidate "
            "total_curriculum_step and evaluates full-length validation perplexity every "
            "eval_interval steps; it fails when an evaluation is more than fluctuation_pct percent "
            "above the lowest earlier one, or when training diverges"
        ),
        "probe_command": command_line(
            replace(
                setup.probe, config=setup.folder / "probes" / "T<value>.json", out=setup.folder / "probes" / "T<value>"
            )
        ),
        "probes": [outcome.results[v].to_dict() for v in sorted(outcome.results)],
        "warnings": outcome.warnings,
    }
    if outcome.chosen is None:
        echo(f"no value passes: {outcome.reason}")
        report["tuned_config"] = None
    else:
        path = write_json(
            setup.folder / "tuned_config.json", with_total_curriculum_step(setup.raw_config, outcome.chosen)
        )
        report["tuned_config"] = str(path)
        echo(f"chosen total_curriculum_step = {outcome.chosen} ({outcome.reason})")
        echo(f"written: {path}")
    write_json(setup.folder / "tune.json", report)
    return report
