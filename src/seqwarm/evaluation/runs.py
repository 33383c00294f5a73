"""Evaluating a checkpoint of a ``seqwarm train`` run folder and recording it in ``RUN/eval.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from seqwarm.data.prepared import open_prepared
from seqwarm.data.tokenizer import load_tokenizer
from seqwarm.evaluation.common import evaluate_val
from seqwarm.evaluation.lambada import evaluate_lambada, read_lambada
from seqwarm.evaluation.wikitext import evaluate_wikitext, read_wikitext
from seqwarm.trainer.checkpoint import checkpoint_path, list_checkpoints, load_checkpoint, load_newest, require_keys
from seqwarm.trainer.distributed import DistInfo, device_for
from seqwarm.trainer.model import GPT, GPTConfig
from seqwarm.util.atomic import write_json
from seqwarm.util.errors import UserError
from seqwarm.util.fsnames import recorded_path

EVAL_FILE = "eval.json"


def check_eval_files(wikitext: str | Path | None = None, lambada: str | Path | None = None) -> None:
    """Fail fast (UserError) on a missing, empty or malformed evaluation file, e.g. before training."""
    if wikitext is not None:
        read_wikitext(wikitext)
    if lambada is not None:
        read_lambada(lambada)


@dataclass
class LoadedRun:
    """A checkpoint of a run folder, ready to evaluate."""

    run_dir: Path
    step: int
    checkpoint: Path
    model: torch.nn.Module
    """seqwarm's GPT, or the Hugging Face model of a ``--model hf:PATH`` run."""
    tokenizer: Any
    data_dir: Path
    """The prepared folder (holding the tokenizer files), or the folder of a --data-path run's first source."""
    tokens: int | None
    device: torch.device
    seq_length: int = 0
    """The run's full length (what it is evaluated at)."""
    data: Any = None
    """The run's Megatron data (:class:`~seqwarm.data.megatron.MegatronData`) for a --data-path run, else
    None (the prepared folder ``data_dir`` is opened when needed)."""
    data_error: UserError | None = None
    """Why a --data-path run's sources could not be opened again (raised when the val split is asked for)."""
    stage: dict[str, Any] | None = None
    """The stage the checkpoint's weights trained in (``stage``, ``length``, ``rope_theta``,
    ``rope_scaling``), whose rotary settings are set on the model; None before any stage."""
    document_masking: bool = False
    """Whether the run trained with document masking (``run.document_masking``): its validation loss is
    then measured with attention inside each document, as training measured it."""

    @property
    def is_hf(self) -> bool:
        """Whether the model is a Hugging Face model (a ``--model hf:PATH`` run), not seqwarm's GPT."""
        return not isinstance(self.model, GPT)

    def val_data(self) -> Any:
        """The data whose val split the run was validated on."""
        if self.data_error is not None:
            raise self.data_error
        return self.data if self.data is not None else open_prepared(self.data_dir)

    def need_tokenizer(self) -> Any:
        """The tokenizer; UserError when the run has none (a --data-path run made without --tokenizer)."""
        if self.tokenizer is None:
            raise UserError(
                f"{self.run_dir} read --data-path data with --vocab-size/--eod-id and no --tokenizer: "
                "this needs the tokenizer; pass --data DIR, a prepared folder made with it"
            )
        return self.tokenizer


def _where_recorded(recorded: str, run: Path, resolved: dict[str, Any]) -> Path:
    """A path a run recorded as it was given: relative ones are read from the folder the run was started
    in (where the run folder's recorded --out leads back to), beside the run folder, then from here."""
    path = Path(recorded)
    if path.is_absolute():
        return path
    out = recorded_path(str((resolved.get("options") or {}).get("out") or ""))
    here, bases = run.resolve(), []
    n = len(out.parts)
    if n and not out.is_absolute() and n < len(here.parts) and here.parts[-n:] == out.parts:
        bases.append(Path(*here.parts[:-n]))  # the folder the run was started in
    for base in (*bases, run.parent, Path.cwd()):
        if (base / path).exists() or Path(f"{base / path}.bin").exists():
            return base / path
    return path


def _reopen_megatron(info: dict[str, Any], run: Path, resolved: dict[str, Any]) -> Any:
    """The Megatron --data-path sources a run recorded (its config.json "data" section), opened again."""
    from seqwarm.data.megatron import open_megatron

    try:
        megatron = info["megatron"]
        items = [
            x
            for s in megatron["sources"]
            for x in (repr(float(s["weight"])), str(_where_recorded(str(s["prefix"]), run, resolved)))
        ]
        split, eod_id = str(megatron["split"]), int(megatron["eod_id"])
        rounding = str(megatron.get("split_rounding", "megatron-core"))  # recorded before: megatron-core's
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{run / 'config.json'}: its data.megatron section is unusable ({err!r})") from None
    tokenizer = (info.get("tokenizer") or {}).get("name")
    if tokenizer and str(tokenizer).startswith("hf:"):
        tokenizer = f"hf:{_where_recorded(str(tokenizer)[3:], run, resolved)}"
    return open_megatron(
        items,
        split=split,
        split_rounding=rounding,
        tokenizer=tokenizer,
        vocab_size=info.get("vocab_size"),
        eod_id=eod_id,
    )


def _hf_model(section: dict[str, Any], run: Path, path: Path, resolved: dict[str, Any]) -> tuple[torch.nn.Module, int]:
    """The Hugging Face model of a ``--model hf:PATH`` run, built from the config.json it recorded."""
    from seqwarm.integrations.hf.run import HFModelConfig

    known = {f.name for f in fields(HFModelConfig)}
    try:
        cfg = HFModelConfig(**{k: v for k, v in section.items() if k in known})
    except TypeError as err:
        raise UserError(f"{path}: the run's model section is unusable ({err})") from None
    where = _where_recorded(cfg.path, run, resolved)
    if not where.exists():
        raise UserError(
            f"the run trained the Hugging Face model of {cfg.path!r}, which is not there any more "
            "(a relative path is looked for from where the run was started, beside the run folder and "
            "from here): put that config.json back to rebuild the model"
        )
    return replace(cfg, path=str(where)).build(), cfg.seq_length


def load_run(
    run_dir: str | Path, *, checkpoint: int | None = None, device: str = "auto", data: str | Path | None = None
) -> LoadedRun:
    """The GPT of ``run_dir``'s checkpoint ``checkpoint`` (default: the newest that loads), its tokenizer
    (from the run's prepared data folder, or ``data``) and the step; UserError on anything missing."""
    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"run folder {str(run)!r} does not exist")
    folder = run / "checkpoints"
    found = list_checkpoints(folder)
    if not found:
        raise UserError(f"{run} has no checkpoint (expected {folder}/step_XXXXXXXX.pt, written by seqwarm train)")
    if checkpoint is None:
        path, state = load_newest(folder)  # CheckpointError naming each file when none loads
    else:
        steps = [s for s, _ in found]
        if checkpoint not in steps:
            raise UserError(
                f"{run} has no checkpoint of step {checkpoint}; available: {', '.join(str(s) for s in steps)}"
            )
        path = checkpoint_path(folder, checkpoint)
        state = load_checkpoint(path)  # CheckpointError (exit 2) naming the file and why
    require_keys(path, state, {"model": dict})
    resolved = state.get("config")
    if not isinstance(resolved, dict):
        try:
            resolved = json.loads((run / "config.json").read_text())
        except (OSError, ValueError) as err:
            raise UserError(f"{path} has no config and {run / 'config.json'} is unreadable ({err})") from None
    section = resolved.get("model")
    if not isinstance(section, dict):
        raise UserError(f"{path}: the run records no model section")
    if str(section.get("preset", "")).startswith("hf:"):
        model, seq_length = _hf_model(section, run, path, resolved)
        vocab = int(section.get("vocab_size") or 0)
    else:
        names = {f.name for f in GPTConfig.__dataclass_fields__.values()}
        try:
            model_cfg = GPTConfig(**{k: v for k, v in section.items() if k in names})
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{path}: the run's model section is unusable ({err})") from None
        model, seq_length, vocab = GPT(model_cfg), model_cfg.seq_length, model_cfg.vocab_size
    info = resolved.get("data") or {}
    megatron, data_error = None, None
    if isinstance(info.get("megatron"), dict):  # a --data-path run: the val split is its sources' again
        try:
            megatron = _reopen_megatron(info, run, resolved)
        except UserError as err:
            if data is None:
                raise
            data_error = err  # --data gives the tokenizer; only --val needs the sources
    if data is None and megatron is not None:  # the tokenizer it named (None without --tokenizer)
        tokenizer = megatron.tokenizer if (info.get("tokenizer") or {}).get("name") else None
        data_dir = Path(megatron.folder)
    else:
        data_dir = Path(data) if data is not None else recorded_path(str(info.get("folder", "")))
        if not str(data_dir) or not (data_dir / "meta.json").is_file():
            raise UserError(
                f"the run's prepared data folder {str(data_dir)!r} (it holds the tokenizer) is missing; "
                "pass --data DIR to point at it"
            )
        tokenizer = load_tokenizer(data_dir)
    if tokenizer is not None and tokenizer.vocab_size > vocab:
        raise UserError(
            f"the tokenizer of {data_dir} has {tokenizer.vocab_size} tokens but the model only "
            f"{vocab}: not the data this run was trained on"
        )
    dev = device_for(DistInfo(), device)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        raise UserError(f"checkpoint {path}: its weights do not fit the model it records ({first})") from None
    stage = _stage_positions(model, state, path, resolved)
    model.to(dev).eval()
    tokens = (state.get("engine") or {}).get("progress", {}).get("tokens")
    return LoadedRun(
        run,
        int(state.get("step", 0)),
        path,
        model,
        tokenizer,
        data_dir,
        tokens,
        dev,
        seq_length=int(seq_length),
        data=megatron,
        data_error=data_error,
        document_masking=bool((resolved.get("run") or {}).get("document_masking", False)),
        stage=stage,
    )


def _stage_positions(model: torch.nn.Module, state: dict, path: Path, resolved: dict) -> dict[str, Any] | None:
    """Set on the model (seqwarm's GPT, or an ``hf:`` run's Transformers model) the rotary settings of the
    stage its weights trained in (the checkpoint's ``positions``, written by ``seqwarm train``); that stage
    (None: before any, or a run without stages)."""
    stages = (resolved.get("run") or {}).get("stages") or []
    if not stages:
        return None
    if "positions" not in state:
        if any(s.get("rope_theta") is not None or s.get("rope_scaling") is not None for s in stages):
            raise UserError(
                f"checkpoint {path} records no stage positions (written before seqwarm saved them): its rotary "
                "settings are unknown; train it again, or resume it for a step, to write a checkpoint that has them"
            )
        return None
    stage = state["positions"]
    if stage is None or (stage.get("rope_theta") is None and stage.get("rope_scaling") is None):
        return stage
    if isinstance(model, GPT):
        if model.config.rotary:
            model.set_positions(stage.get("rope_theta"), stage.get("rope_scaling"))
    else:  # the config saved by an export then holds them too (and the stage's length)
        from seqwarm.integrations.hf.positions import set_positions

        set_positions(model, stage["rope_theta"], stage["rope_scaling"], max_position_embeddings=stage.get("length"))
    return stage


def _val_model(loaded: LoadedRun) -> torch.nn.Module:
    """The model that ``--val`` calls: a run trained with document masking gets ``document_ids`` (an HF
    model through the same block positions as in training, checked to mask them on this machine)."""
    if not (loaded.document_masking and loaded.is_hf):
        return loaded.model
    from seqwarm.integrations.hf.blocks import check_block_attention
    from seqwarm.integrations.hf.run import CausalLMLoss

    check_block_attention(
        loaded.model,
        "--document-masking (the run's setting)",
        type(loaded.model).__name__,
        instead="evaluate with --wikitext / --lambada only, or on a machine where the model's attention "
        "implementation masks the documents (as where it trained)",
    )
    return CausalLMLoss(loaded.model)


def _read_eval_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        existing = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not valid JSON ({err}); move it away to start a new one") from None
    if not isinstance(existing, dict):
        raise UserError(f"{path} is not a JSON object keyed by step; move it away to start a new one")
    return existing


def record_results(run_dir: str | Path, step: int, results: dict[str, Any]) -> Path:
    """Merge ``results`` into ``RUN/eval.json`` under ``str(step)`` (sections replaced, others kept)."""
    path = Path(run_dir) / EVAL_FILE
    existing = _read_eval_file(path)
    entry = dict(existing.get(str(step), {}))
    entry.update(results)
    existing[str(step)] = entry
    # steps in numeric order ("8" before "16"); any key that is not a step goes last
    ordered = dict(sorted(existing.items(), key=lambda kv: (0, int(kv[0]), "") if kv[0].isdigit() else (1, 0, kv[0])))
    write_json(path, ordered)
    return path


def run_paper_evals(
    run_dir: str | Path,
    wikitext: str | Path | None = None,
    lambada: str | Path | None = None,
    *,
    val: bool = False,
    val_windows: int | None = None,
    checkpoint: int | None = None,
    overlapping_eval: int | None = None,
    batch_size: int = 8,
    device: str = "auto",
    strict: bool = True,
    data: str | Path | None = None,
    progress: bool = True,
    write: bool = True,
) -> dict[str, Any]:
    """Evaluate a run's checkpoint on the files given and record it in ``RUN/eval.json``.

    Returns ``{"step": ..., "tokens": ..., "checkpoint": ..., "wikitext": {...}, "lambada": {...},
    "val": {...}}`` with only the evaluations asked for. Files are checked before the model loads.
    """
    if wikitext is None and lambada is None and not val:
        raise UserError("nothing to evaluate: give a WikiText file, a LAMBADA file or ask for val")
    if batch_size < 1:
        raise UserError(f"batch size must be at least 1, got {batch_size}")
    raw = read_wikitext(wikitext) if wikitext is not None else None
    texts = read_lambada(lambada) if lambada is not None else None
    if write:
        _read_eval_file(Path(run_dir) / EVAL_FILE)  # a broken eval.json fails now, not after the work
    loaded = load_run(run_dir, checkpoint=checkpoint, device=device, data=data)
    seq = loaded.seq_length
    common = dict(batch_size=batch_size, device=loaded.device, progress=progress, seq_length=seq)
    # what --val needs is checked before any evaluation runs: a refusal then loses no finished work
    val_model, val_data = (_val_model(loaded), loaded.val_data()) if val else (None, None)
    results: dict[str, Any] = {}
    if raw is not None:
        try:
            res = evaluate_wikitext(
                loaded.model, loaded.need_tokenizer(), raw, overlapping_eval=overlapping_eval, **common
            )
        except UserError as err:
            raise UserError(f"WikiText file {wikitext}: {err}") from None
        results["wikitext"] = {"file": str(wikitext), **res}
    if texts is not None:
        res = evaluate_lambada(
            loaded.model, loaded.need_tokenizer(), texts, strict=strict, source=str(lambada), **common
        )
        results["lambada"] = {"file": str(lambada), **res}
    if val:
        results["val"] = evaluate_val(
            val_model,
            val_data,
            num_windows=val_windows,
            document_masking=loaded.document_masking,
            label_style="hf" if loaded.is_hf else "megatron",
            **common,
        )
    if write:
        record_results(loaded.run_dir, loaded.step, {"tokens": loaded.tokens, **results})
    return {
        "step": loaded.step,
        "tokens": loaded.tokens,
        "checkpoint": str(loaded.checkpoint),
        "seq_length": seq,
        **results,
    }
