"""``seqwarm train --deepspeed [--pipeline-stages K]``: :class:`seqwarm.trainer.loop.Run` on a DeepSpeed engine.

The loop, logging, budget and full-length evaluation are Run's; this module supplies its engine builder
(:class:`DeepSpeedEngineBuilder`) and checkpointer (:class:`DeepSpeedCheckpointer`): the engine (ZeRO via
``deepspeed.initialize`` with seqwarm's torch optimizer, or a GPT ``PipelineModule``), driven through
:class:`~seqwarm.integrations.deepspeed.curriculum.DeepSpeedEngineAdapter`, and the checkpoints: DeepSpeed's own
``save_checkpoint`` / ``load_checkpoint`` under ``RUN/checkpoints/deepspeed/step_XXXXXXXX/`` with
seqwarm's state (clock, curriculum, data position, RNG, resolved config) in ``client_state["seqwarm"]``.
At the end of the run the model weights are also written as ``RUN/checkpoints/step_XXXXXXXX.pt`` (the
format ``seqwarm eval`` reads; it is marked ``"deepspeed": true`` and cannot be resumed from).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import torch

from seqwarm.integrations.deepspeed.curriculum import (
    DeepSpeedEngineAdapter,
    build_deepspeed_optimizer,
    deepspeed_config,
    require_deepspeed,
    skip_cpu_shm_comm,
)
from seqwarm.trainer.backends import Built, RunChoices, curriculum_mode
from seqwarm.trainer.checkpoint import list_checkpoints, save_checkpoint, save_due
from seqwarm.trainer.distributed import DistInfo, barrier
from seqwarm.trainer.record import jsonable
from seqwarm.util.errors import UserError

__all__ = ["DeepSpeedEngineBuilder", "DeepSpeedCheckpointer", "deepspeed_process_group", "DS_SUBDIR"]

logger = logging.getLogger(__name__)

DS_SUBDIR = "deepspeed"
STATE_FORMAT = "seqwarm.deepspeed_run/1"
_TAG = re.compile(r"^step_(\d{8})$")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def deepspeed_process_group(device: str = "auto"):
    """The process group DeepSpeed needs: torchrun's / the deepspeed launcher's when there is one,
    else a one-process group of our own (DeepSpeed would otherwise look for MPI), torn down after."""
    require_deepspeed()
    dist = torch.distributed
    if dist.is_initialized():
        yield
        return
    defaults = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in (*defaults, "MASTER_PORT")}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    dist.init_process_group(backend, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class DeepSpeedEngineBuilder:
    """The engine builder of ``seqwarm train --deepspeed``: ZeRO (stage, offload, precision from the
    config) or, with ``pipeline_stages`` K, a K-stage pipeline of the GPT (data parallel over world
    size / K). Hand it to :class:`seqwarm.trainer.loop.Run` as ``builder``."""

    def __init__(self, pipeline_stages: int = 0):
        self.deepspeed = require_deepspeed()
        skip_cpu_shm_comm(self.deepspeed)
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its INFO lines would drown the console
        self.pipeline_stages = int(pipeline_stages or 0)

    def data_parallel(self, info: DistInfo) -> tuple[int, int]:
        if not self.pipeline_stages:
            return info.rank, info.world_size
        stages, world = self.pipeline_stages, info.world_size
        if world % stages:
            raise UserError(f"--pipeline-stages {stages} must divide the number of processes ({world})")
        from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

        coord = PipeDataParallelTopology(num_pp=stages, num_dp=world // stages).get_coord(info.rank)
        return int(coord.data), world // stages

    def curriculum_mode(self, cfg, model_cfg) -> str | None:
        from seqwarm.trainer.model import GPT

        pipeline = self.pipeline_stages > 0
        if pipeline and (cfg.document_masking or cfg.curriculum is not None and cfg.curriculum.mode == "window"):
            what = "--document-masking" if cfg.document_masking else "curriculum mode 'window'"
            raise UserError(
                f"--pipeline-stages {self.pipeline_stages} with {what}: the pipeline stages pass only the "
                "hidden states, not the document_ids the attention mask is built from; drop "
                "--pipeline-stages, or use curriculum mode truncate / reshape without document masking"
            )
        return curriculum_mode(cfg, None if pipeline else GPT.forward, pipeline=pipeline)

    def build(self, model_cfg, cfg, info: DistInfo, device: torch.device, choices: RunChoices) -> Built:
        from deepspeed.accelerator import get_accelerator

        from seqwarm.trainer.model import GPT

        accel = get_accelerator().device_name()
        if accel != device.type:
            raise UserError(
                f"DeepSpeed runs on its {accel} accelerator but --device is {device}: drop --device, "
                f"or choose DeepSpeed's accelerator with DS_ACCELERATOR={device.type}"
            )
        pipeline = self.pipeline_stages > 0
        ds_config = deepspeed_config(cfg, pipeline=pipeline, precision=choices.precision)
        # deepspeed.comm wraps the torch.distributed group already set up (the PipelineModule needs it)
        self.deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
        if pipeline:
            from seqwarm.integrations.deepspeed.pipeline import PipelineEngineAdapter, gpt_pipeline_module

            model = GPT(model_cfg)  # on the CPU: the PipelineModule moves this stage's layers to the device
            net = gpt_pipeline_module(model, self.pipeline_stages)
            adapter = PipelineEngineAdapter
        else:
            model = net = GPT(model_cfg).to(device)
            adapter = DeepSpeedEngineAdapter
        optimizer = build_deepspeed_optimizer(net, cfg, ds_config)
        ds, *_ = self.deepspeed.initialize(model=net, optimizer=optimizer, config=ds_config)
        stage = int(ds.zero_optimization_stage())
        parallelism = f"deepspeed-pipeline{self.pipeline_stages}-zero{stage}" if pipeline else f"deepspeed-zero{stage}"
        return Built(
            model,
            optimizer,
            adapter(ds, cfg, mode=choices.mode),
            parallelism,
            resolved={"deepspeed": jsonable(ds_config)},
            whole_steps=pipeline,
        )

    def checkpointer(
        self, built: Built, folder: Path, info: DistInfo, keep: int, interval: int = 0
    ) -> DeepSpeedCheckpointer:
        return DeepSpeedCheckpointer(
            folder,
            built,
            info=info,
            keep=keep,
            interval=interval,
            deepspeed=self.deepspeed,
            pipeline_stages=self.pipeline_stages,
        )


class DeepSpeedCheckpointer:
    """DeepSpeed's own checkpoints under ``RUN/checkpoints/deepspeed/step_XXXXXXXX/`` (every rank writes its
    part; seqwarm's loop state in ``client_state["seqwarm"]``), the newest ``keep`` kept; at the end of the
    run the whole model as ``RUN/checkpoints/step_XXXXXXXX.pt`` for ``seqwarm eval``."""

    def __init__(
        self,
        folder: Path,
        built: Built,
        *,
        info: DistInfo,
        keep: int,
        deepspeed,
        pipeline_stages: int,
        interval: int = 0,
    ):
        self.folder, self.ds_dir = Path(folder), Path(folder) / DS_SUBDIR
        self.model, self.engine, self.ds = built.model, built.engine, built.engine.module
        self.info, self.keep, self.deepspeed, self.pipeline_stages = info, keep, deepspeed, pipeline_stages
        self.interval = interval
        self.positions: dict[str, Any] | None = None  # the last save's stage positions, for the export

    def due(self, step: int, last: bool) -> bool:
        return save_due(self.interval, step, last)

    def _tags(self) -> list[str]:
        if not self.ds_dir.is_dir():
            return []
        return sorted(p.name for p in self.ds_dir.iterdir() if p.is_dir() and _TAG.match(p.name))

    def save(self, step: int, loop_state: dict[str, Any]) -> Path | None:
        """DeepSpeed's checkpoint of this step (every rank writes its part), seqwarm's state inside."""
        tag = f"step_{step:08d}"
        self.positions = loop_state.get("positions")  # the loop saves at the end, before finish()
        state = {"format": STATE_FORMAT, "engine": self.engine.state_dict(), **loop_state}
        self.ds.save_checkpoint(str(self.ds_dir), tag=tag, client_state={"seqwarm": state})
        if self.info.is_main and self.keep > 0:
            for old in self._tags()[: -self.keep]:
                if old != tag:
                    shutil.rmtree(self.ds_dir / old, ignore_errors=True)
        barrier(self.info)
        return self.ds_dir / tag

    def load(self, check) -> tuple[Any, dict[str, Any]] | None:
        if not (self.ds_dir / "latest").is_file():
            if list_checkpoints(self.folder):
                raise UserError(f"{self.folder.parent} was trained without --deepspeed; resume it without --deepspeed")
            return None
        try:
            path, client = self.ds.load_checkpoint(str(self.ds_dir))
        except (RuntimeError, KeyError, ValueError) as err:
            raise UserError(
                f"the DeepSpeed checkpoint in {self.ds_dir} does not load into this run ({err}); "
                "resume with the same model, ZeRO stage and number of processes"
            ) from None
        if path is None or not isinstance(client, dict) or "seqwarm" not in client:
            raise UserError(f"{self.ds_dir} holds no seqwarm DeepSpeed checkpoint to resume from")
        state = client["seqwarm"]
        check(path, state["config"])
        self.engine.load_state_dict(state["engine"])
        return path, state

    def finish(self, progress, config: dict[str, Any], last_val: float | None) -> None:
        self.export_model(progress, config, last_val)

    # -- the model for `seqwarm eval` ---------------------------------------------------------------
    def _gathered_model_state(self) -> dict[str, torch.Tensor] | None:
        """The whole GPT's weights (fp32, CPU) on rank 0, None elsewhere; a collective."""

        def plain(sd: dict[str, Any], keep=lambda name: True) -> dict[str, torch.Tensor]:
            return {k: v.detach().float().cpu().clone() for k, v in sd.items() if keep(k)}

        is_main = self.info.is_main
        if self.pipeline_stages:
            from seqwarm.integrations.deepspeed.pipeline import pipeline_param_prefixes

            module = self.ds.module
            parts, stage = module.parts, module.stage_id
            prefixes = pipeline_param_prefixes(self.model.config.n_layer)[parts[stage] : parts[stage + 1]]
            owned = tuple(p for group in prefixes for p in group)
            mine = plain(self.model.state_dict(), lambda name: name.startswith(owned))
            everyone: list[Any] = [None] * self.info.world_size
            torch.distributed.all_gather_object(everyone, mine)
            merged: dict[str, torch.Tensor] = {}
            for part in everyone:
                merged.update(part)
            merged["lm_head.weight"] = merged["wte.weight"]  # tied
            return merged if is_main else None
        if int(self.ds.zero_optimization_stage()) == 3:
            params = list(self.model.parameters())
            with self.deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                state = plain(self.model.state_dict()) if is_main else None
            return state
        return plain(self.model.state_dict()) if is_main else None

    def export_model(self, progress, config: dict[str, Any], last_val: float | None) -> Path | None:
        """Write the trained weights as ``RUN/checkpoints/step_XXXXXXXX.pt`` for ``seqwarm eval``."""
        state = self._gathered_model_state()
        path = None
        if self.info.is_main:
            payload = {
                "model": state,
                "engine": {"progress": progress.to_dict()},
                "config": config,
                "deepspeed": True,
                "last_val": last_val,
                "positions": self.positions,  # the stage the weights trained in: eval / export set it
            }
            path = save_checkpoint(self.folder, progress.step, payload, keep=self.keep)
        barrier(self.info)
        return path
