"""Where a run's numbers go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, CSV files.

They are asked for the way DeepSpeed users already ask: the config's ``tensorboard``, ``wandb`` and
``csv_monitor`` blocks (``{"enabled": true, "output_path": ..., "job_name": ...}``;
``{"enabled": true, "project": ..., "group": ..., "team": ...}``), honoured in every engine — under
``--deepspeed`` seqwarm logs them itself and keeps them from DeepSpeed's own monitor, so nothing is
logged twice — or by flags (``--tensorboard-dir``, ``--wandb-project``, ``--wandb-run-name``).
TensorBoard is on by default (``RUN/tensorboard``) when installed.

A tool's own environment variables win over seqwarm's defaults (a flag or a config block still wins over
them): ``WANDB_PROJECT``, ``WANDB_NAME``, ``WANDB_DIR``, ``WANDB_RUN_GROUP`` and ``WANDB_ENTITY`` are left
to ``wandb.init`` to read, and TensorBoard writes to ``TENSORBOARD_LOGGING_DIR`` (Transformers' variable)
or ``AIP_TENSORBOARD_LOG_DIR`` (Vertex AI's) when set, instead of ``RUN/tensorboard``.

Every number is logged under seqwarm's tag (``train/loss``, ``curriculum/seqlen``) at the optimizer
step, and under Megatron-DeepSpeed's tag (``lm-loss-training/lm loss``, ``seqlen/curriculum_seqlen``,
``seqlen/actual_seq_length``, ``batch-size/batch-size``, ``loss-scale/loss-scale``,
``iteration-time/iteration-time``, ``lm-loss-validation/lm loss validation``, ...) three times: against
steps, and as ``TAG vs samples`` and ``TAG vs tokens`` against samples and tokens trained, so dashboards
built on Megatron-DeepSpeed runs keep working. Rows of kind ``step`` are the per-step points (every
``--tensorboard-log-interval`` steps, as Megatron-DeepSpeed's ``training_log`` writes them), with the
optimizer's state norms (``optimizer/variance_l2``, ..., against steps and as ``... vs tokens``) when
``--log-optimizer-states-to-tensorboard`` asks for them; a row of kind ``window`` is what the
``--log-interval`` row adds to them (grad norm, tokens/s, Adam statistics). A row of kind ``stage`` (a
stage of the length schedule begins, or is set again after a resume) gives :data:`STAGE_TAGS` only, at the
step it begins: ``train/stage`` (its number, from 1), ``train/rope_theta`` (when the stages set θ) and
``train/rope_scaling_factor`` (the scaling's factor; 1 for a stage that sets θ without scaling). A tracker
that is asked for and not installed gets one warning naming the extra.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqwarm.config.reader import TRACKER_DS_KEYS
from seqwarm.util.atomic import write_text
from seqwarm.util.fsnames import utf8_reachable

logger = logging.getLogger(__name__)

__all__ = [
    "SEQWARM_TAGS",
    "MEGATRON_TAGS",
    "STAGE_TAGS",
    "OPTIMIZER_STATE_TAGS",
    "optimizer_states",
    "TrackerConfig",
    "tracker_config",
    "scalars",
    "open_trackers",
    "TRACKER_BLOCKS",
]

SEQWARM_TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "seqlen": "curriculum/seqlen",
    "tokens_per_s": "perf/tokens_per_s",
    "model_tflops": "perf/model_tflops",
    "mfu": "perf/mfu",
    "tokens": "progress/tokens",
    "val_loss": "val/loss",
    "val_ppl": "val/ppl",
    "val_loss_pretrain": "val/loss_pretrain",
    "val_loss_stage": "val/loss_stage",
    "adam_v_l1": "stability/adam_v_l1",
    "adam_v_max": "stability/adam_v_max",
    "loss_ratio": "stability/loss_ratio",
}
"""metrics.jsonl key -> seqwarm's tag (x axis: optimizer steps)."""
MEGATRON_TAGS = {
    "loss": "lm-loss-training/lm loss",
    "lr": "learning-rate/learning-rate",
    "grad_norm": "grad-norm/grad-norm",
    "seqlen": "seqlen/curriculum_seqlen",
    "val_loss": "lm-loss-validation/lm loss validation",
    "val_ppl": "lm-loss-validation/lm loss validation ppl",
    "actual_seqlen": "seqlen/actual_seq_length",
    "batch_size": "batch-size/batch-size",
    "loss_scale": "loss-scale/loss-scale",
    "iteration_time": "iteration-time/iteration-time",
}
"""metrics.jsonl key -> Megatron-DeepSpeed's tag (also logged as ``TAG vs samples`` / ``TAG vs tokens``);
``actual_seqlen`` is the row's ``seqlen`` (the length trained: Megatron sets ``actual_seq_length`` to the
curriculum's length), ``iteration_time`` seconds per step."""
STAGE_TAGS = {"stage": "train/stage", "rope_theta": "train/rope_theta", "factor": "train/rope_scaling_factor"}
"""A ``stage`` row's key -> its tag (x axis: the optimizer step the stage begins at); ``factor`` is the
``rope_scaling``'s."""
OPTIMIZER_STATE_TAGS = tuple(
    f"optimizer/{what}_{norm}"
    for norm in ("l2", "l1", "abs_max")
    for what in ("variance", "variance_sqrt", "momentum", "weight")
)
"""Megatron-DeepSpeed's ``--log-optimizer-states-to-tensorboard`` tags (Adam's ``exp_avg_sq``, its square
root, ``exp_avg`` and the weights: l2 and l1 norms, largest absolute value), against steps and tokens."""


def optimizer_states(optimizer) -> dict[str, float]:
    """Megatron-DeepSpeed's ``--log-optimizer-states-to-tensorboard`` numbers (its ``training_log``): over
    every parameter with Adam state, the l2 and l1 norms and the largest absolute value of the variance
    (``exp_avg_sq``), its square root, the momentum (``exp_avg``) and the weight, keyed by their tags
    (:data:`~seqwarm.trainer.trackers.OPTIMIZER_STATE_TAGS`). Empty for an optimizer without Adam state."""
    import torch

    parts = {"variance": [], "variance_sqrt": [], "momentum": [], "weight": []}
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "exp_avg_sq" not in state or "exp_avg" not in state:
                continue
            v = state["exp_avg_sq"].detach().float()
            for name, t in (
                ("variance", v),
                ("variance_sqrt", v.sqrt()),
                ("momentum", state["exp_avg"]),
                ("weight", param),
            ):
                t = t.detach().float()
                parts[name].append(torch.stack([t.square().sum(), t.abs().sum(), t.abs().max()]))
    if not parts["variance"]:
        return {}
    out: dict[str, float] = {}
    for name, rows in parts.items():
        sq, l1, top = torch.stack(rows).double().T.tolist() if len(rows) else ([], [], [])
        out[f"optimizer/{name}_l2"] = math.sqrt(sum(sq))
        out[f"optimizer/{name}_l1"] = sum(l1)
        out[f"optimizer/{name}_abs_max"] = max(top)
    return out


TRACKER_BLOCKS = TRACKER_DS_KEYS
"""The DeepSpeed config blocks seqwarm's trackers take over."""


def scalars(row: Mapping[str, Any]) -> Iterator[tuple[str, float, int]]:
    """``(tag, value, x)`` of every number a metrics row holds, under every tag it is logged as."""
    step, samples, tokens = int(row["step"]), row.get("samples"), row.get("tokens")
    kind = row.get("kind")
    if kind == "stage":  # its own tags only: its tokens are those before the step, the train row's after it
        yield from _stage_scalars(row, step)
        return
    # an eval row's seqlen is the evaluation length (full), not the curriculum's; a window row's position
    # (tokens) is its step point's
    skip = {"eval": ("seqlen", "actual_seqlen"), "window": ("tokens",)}.get(kind, ())
    if kind != "eval" and "seqlen" in row:
        row = {**row, "actual_seqlen": row["seqlen"]}
    for key, tag in SEQWARM_TAGS.items():
        value = row.get(key)
        if key not in skip and isinstance(value, (int, float)) and math.isfinite(value):
            yield tag, float(value), step
    for key, tag in MEGATRON_TAGS.items():
        value = None if key in skip else row.get(key)
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            continue
        yield tag, float(value), step
        if isinstance(samples, int):
            yield f"{tag} vs samples", float(value), samples
        if isinstance(tokens, int):
            yield f"{tag} vs tokens", float(value), tokens
    for tag in OPTIMIZER_STATE_TAGS:
        value = row.get(tag)
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield tag, float(value), step
            if isinstance(tokens, int):
                yield f"{tag} vs tokens", float(value), tokens
    if kind in ("train", "step") and isinstance(samples, int) and isinstance(tokens, int):
        yield "steps-vs-samples/y=steps,x=samples", float(step), samples
        yield "steps-vs-samples/y=samples,x=steps", float(samples), step
        yield "steps-vs-tokens/y=steps,x=tokens", float(step), tokens
        yield "steps-vs-tokens/y=tokens,x=steps", float(tokens), step


def _stage_scalars(row: Mapping[str, Any], step: int) -> Iterator[tuple[str, float, int]]:
    scaling = row.get("rope_scaling")
    factor = scaling.get("factor") if isinstance(scaling, Mapping) else None
    if factor is None and row.get("rope_theta") is not None:
        factor = 1.0  # positions set, no scaling
    for key, value in (("stage", row.get("stage")), ("rope_theta", row.get("rope_theta")), ("factor", factor)):
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield STAGE_TAGS[key], float(value), step


@dataclass(frozen=True)
class TrackerConfig:
    """The trackers of one run (rank 0 writes them)."""

    tensorboard_dir: Path | None = None
    """TensorBoard event files go here (None: no TensorBoard)."""
    tensorboard_asked: bool = False
    """Asked for explicitly (a config block or --tensorboard-dir): warn when tensorboard is missing."""
    wandb: Mapping[str, Any] | None = None
    """``wandb.init`` arguments (project, name, group, entity, dir), or None; one left None is read by W&B
    from its environment variable."""
    wandb_id_dir: Path | None = None
    """The run folder that keeps the W&B run id (a resumed run logs into the same W&B run)."""
    csv_dir: Path | None = None
    """One ``TAG.csv`` per tag here (DeepSpeed's csv_monitor), or None."""


def _block(ds: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    block = ds.get(name)
    return block if isinstance(block, Mapping) and block.get("enabled") else None


def _monitor_dir(block: Mapping[str, Any], default: Path) -> Path:
    base = Path(str(block["output_path"])).expanduser() if block.get("output_path") else default
    return base / str(block["job_name"]) if block.get("job_name") else base


TENSORBOARD_DIR_VARIABLES = ("TENSORBOARD_LOGGING_DIR", "AIP_TENSORBOARD_LOG_DIR")
"""Environment variables naming a TensorBoard log folder (Transformers', Vertex AI's), first set wins over
``RUN/tensorboard``."""

WANDB_VARIABLES = {"project": "WANDB_PROJECT", "name": "WANDB_NAME", "dir": "WANDB_DIR"}
"""The ``wandb.init`` arguments seqwarm has a default for, and the W&B variable that replaces that default."""


def _env_tensorboard_dir() -> Path | None:
    return next((Path(os.environ[v]).expanduser() for v in TENSORBOARD_DIR_VARIABLES if os.environ.get(v)), None)


def tracker_config(
    ds: Mapping[str, Any],
    run_dir: Path,
    *,
    tensorboard: bool = True,
    tensorboard_dir: Path | None = None,
    wandb_project: str | None = None,
    wandb_run_name: str | None = None,
) -> TrackerConfig:
    """The trackers a run's DeepSpeed config blocks and flags ask for (flags win over blocks, blocks over
    the tools' environment variables, which win over seqwarm's defaults)."""
    run_dir = Path(run_dir)
    tb_block = _block(ds, "tensorboard")
    tb_dir = None
    if tensorboard:
        default = _env_tensorboard_dir() or run_dir / "tensorboard"
        tb_dir = Path(tensorboard_dir) if tensorboard_dir else _monitor_dir(tb_block, default) if tb_block else default
    wb_block = _block(ds, "wandb")
    wandb = None
    if wb_block or wandb_project or wandb_run_name:
        wb = wb_block or {}
        defaults = {"project": "seqwarm", "name": run_dir.name, "dir": str(run_dir)}
        for key, variable in WANDB_VARIABLES.items():
            if os.environ.get(variable):  # wandb.init reads it
                defaults[key] = None
        wandb = {
            "project": wandb_project or wb.get("project") or defaults["project"],
            "name": wandb_run_name or defaults["name"],
            "group": wb.get("group"),
            "entity": wb.get("team"),
            "dir": defaults["dir"],
        }
    csv_block = _block(ds, "csv_monitor")
    return TrackerConfig(
        tensorboard_dir=tb_dir,
        tensorboard_asked=bool(tensorboard_dir or tb_block),
        wandb=wandb,
        wandb_id_dir=run_dir if wandb is not None else None,
        csv_dir=_monitor_dir(csv_block, run_dir / "csv") if csv_block else None,
    )


# --------------------------------------------------------------------------------------------------
# the trackers


class _TensorBoard:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # raises ImportError without tensorboard

        self.writer = SummaryWriter(str(log_dir))

    def log(self, row: Mapping[str, Any]) -> None:
        for tag, value, x in scalars(row):
            self.writer.add_scalar(tag, value, x)

    def flush(self) -> None:
        self.writer.flush()

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self.writer.close()


WANDB_ID_FILE = "wandb_run_id"
"""The run folder's file that holds its W&B run id, so a resumed run logs into the same W&B run."""


def wandb_run_id(run_dir: str | Path | None) -> str | None:
    """The W&B run id of the run folder: the one recorded in ``RUN/wandb_run_id``, else a new one, recorded
    there (None without a folder: W&B picks one)."""
    if run_dir is None:
        return None
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    write_text(path, run_id + "\n")
    return run_id


def forget_wandb_run(run_dir: str | Path) -> None:
    """Drop the run folder's W&B run id: a run that starts again from step 1 (nothing to resume) is a new
    W&B run (the old one would drop every row up to the last step it had)."""
    (Path(run_dir) / WANDB_ID_FILE).unlink(missing_ok=True)


class _Wandb:
    def __init__(self, init: Mapping[str, Any], id_dir: Path | None = None):
        import wandb

        args = dict(init)
        id_dir = id_dir or init.get("dir")
        if id_dir and not os.environ.get("WANDB_RUN_ID"):  # the user's (or a sweep agent's) id wins
            # one W&B run per run folder: a resumed run continues it
            args.update(id=wandb_run_id(id_dir), resume="allow")
        self.run = wandb.init(**{k: v for k, v in args.items() if v is not None})
        for key in ("samples", "tokens"):  # the "TAG vs samples" / "vs tokens" curves use their own x axis
            for tag in MEGATRON_TAGS.values():
                self.run.define_metric(f"{tag} vs {key}", step_metric=f"progress/{key}")

    def log(self, row: Mapping[str, Any]) -> None:
        values = {tag: value for tag, value, _ in scalars(row) if not tag.startswith("steps-vs-")}
        for key in ("samples", "tokens"):
            if isinstance(row.get(key), int) and row.get("kind") != "stage":  # the stage's: before its step
                values[f"progress/{key}"] = row[key]
        self.run.log(values, step=int(row["step"]))

    def flush(self) -> None:
        pass  # wandb streams on its own

    def close(self, summary: Mapping[str, Any] | None) -> None:
        if summary:
            self.run.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool))})
        self.run.finish()


class _CSV:
    """DeepSpeed's csv_monitor layout: ``DIR/TAG.csv`` (``/`` and spaces as ``_``), rows ``x,value``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, Any] = {}

    def log(self, row: Mapping[str, Any]) -> None:
        for tag, value, x in scalars(row):
            fh = self.files.get(tag)
            if fh is None:
                path = self.folder / (tag.replace("/", "_").replace(" ", "_").replace(",", "_") + ".csv")
                new = not path.exists()
                fh = self.files[tag] = open(path, "a", buffering=1)
                if new:
                    fh.write(f"step,{tag}\n")
            fh.write(f"{x},{value!r}\n")

    def flush(self) -> None:
        for fh in self.files.values():
            fh.flush()

    def close(self, summary: Mapping[str, Any] | None) -> None:
        for fh in self.files.values():
            fh.close()


def open_trackers(cfg: TrackerConfig) -> list[Any]:
    """The trackers of ``cfg`` that can run here; one warning for each asked for and not installed."""
    out: list[Any] = []
    if cfg.tensorboard_dir is not None and not utf8_reachable(cfg.tensorboard_dir.absolute()):
        logger.warning(
            "warning: no TensorBoard event files: its writer encodes file names as UTF-8, and %s is not "
            "UTF-8 in this locale (%s); metrics.jsonl holds the same scalars. A UTF-8 locale "
            "(LC_ALL=C.UTF-8) or PYTHONUTF8=1 writes them",
            ascii(str(cfg.tensorboard_dir))[1:-1],
            sys.getfilesystemencoding(),
        )
    elif cfg.tensorboard_dir is not None:
        try:
            out.append(_TensorBoard(cfg.tensorboard_dir))
        except ImportError:
            log = logger.warning if cfg.tensorboard_asked else logger.debug
            log(
                "warning: TensorBoard was asked for but tensorboard is not installed, so no event files are "
                "written: pip install 'seqwarm[tensorboard]'"
            )
    if cfg.wandb is not None:
        try:
            out.append(_Wandb(cfg.wandb, cfg.wandb_id_dir))
        except ImportError:
            logger.warning(
                "warning: Weights & Biases was asked for (wandb block or --wandb-project) but wandb is "
                "not installed, so nothing is sent: pip install 'seqwarm[wandb]'"
            )
    if cfg.csv_dir is not None:
        out.append(_CSV(cfg.csv_dir))
    return out
