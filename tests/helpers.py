"""Helpers shared by several test files: ``from helpers import ...`` (pytest puts tests/ on
sys.path for conftest.py, and so for this module too)."""

from __future__ import annotations

import glob
import json
import re
import struct
import time
from pathlib import Path

import pytest

# --------------------------------------------------------------------------------------------------
# W&B offline: the run's transaction log (RUN/wandb/offline-run-*/run-*.wandb) read back


def _wandb_records(path):
    """Records of a W&B transaction log: a 7-byte header, then 32 KiB blocks of (crc, length, type, data)."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (kind == 0 and length == 0):
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 2):  # full, first
            buf = chunk
        else:  # middle, last
            buf += chunk
        if kind in (1, 4):
            yield buf


def wandb_summary(run_dir) -> dict:
    """The summary of the offline W&B run under ``run_dir`` (every summary update folded in order)."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    for _ in range(100):  # wandb's service may still be writing the end of the log
        summary: dict = {}
        kinds = []
        for raw in _wandb_records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kinds.append(record.WhichOneof("record_type"))
            if kinds[-1] == "summary":
                for item in record.summary.update:
                    summary[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
        if "exit" in kinds:
            return summary
        time.sleep(0.1)
    raise AssertionError(f"{path} has no exit record")


# --------------------------------------------------------------------------------------------------
# a training run of the tiny GPT in-process, as run_training sets one up (tests reach into its parts)


def tiny_run(folder, data_dir, config, *, builder=None, model=None, dropout=0.1, memory_probe=None, **options):
    """A :class:`seqwarm.trainer.loop.Run` of the tiny GPT (length 64) in ``folder`` on the prepared data in
    ``data_dir`` with the config file ``config``; quiet, CPU, no evaluations or checkpoints unless
    ``options`` (RunSpec fields) say otherwise; the run folder created unless resuming."""
    from seqwarm import load_config
    from seqwarm.data import open_prepared
    from seqwarm.run.spec import RunSpec
    from seqwarm.run.training import run_options
    from seqwarm.trainer.loop import Run
    from seqwarm.trainer.model import GPTConfig
    from seqwarm.trainer.run_folder import prepare_run_dir

    data = open_prepared(data_dir)
    model_cfg = GPTConfig.preset("tiny", vocab_size=data.vocab_size, seq_length=64, dropout=dropout, **(model or {}))
    spec = RunSpec(**{"out": folder, "eval_interval": 0, "eval_iters": 1, "save_interval": 0, "log_interval": 1,
                      "progress_bar": False, "tensorboard": False, "device": "cpu", **options})  # fmt: skip
    if not spec.resume:
        prepare_run_dir(spec)
    return Run(load_config(config), run_options(spec), data, model_cfg, builder=builder, memory_probe=memory_probe)


# --------------------------------------------------------------------------------------------------
# document masking (issue #25): the offline validation of a masked run


def offline_val_masks_documents_as_training_did(run):
    """`seqwarm eval RUN --val` of a run trained with document masking: the loss training's last
    validation measured (the same windows), and over every window exactly the masked evaluation (for an
    HF model, through the same block positions as training), not the unmasked one."""
    from seqwarm.evaluation import evaluate_val, load_run, run_paper_evals

    resolved = json.loads((run / "config.json").read_text())
    assert resolved["precision"]["precision"] == "fp32"  # under autocast the two differ by the rounding
    windows = resolved["options"]["eval_iters"] * resolved["run"]["micro_batch_size"]  # what training validated
    val = run_paper_evals(run, val=True, val_windows=windows, progress=False, write=False)["val"]
    final = json.loads((run / "summary.json").read_text())["final_val_loss"]
    assert val["document_masking"] is True and val["loss"] == pytest.approx(final, rel=1e-5)
    everything = run_paper_evals(run, val=True, progress=False, write=False)["val"]
    loaded = load_run(run)
    style = "hf" if loaded.is_hf else "megatron"  # the same targets as the masked evaluation
    if loaded.is_hf:
        from seqwarm.integrations.hf.run import CausalLMLoss

        masked_model = CausalLMLoss(loaded.model)
    else:
        masked_model = loaded.model
    direct = {
        masking: evaluate_val(
            masked_model if masking else loaded.model,
            loaded.val_data(),
            seq_length=loaded.seq_length,
            progress=False,
            label_style=style,
            document_masking=masking,
        )
        for masking in (True, False)
    }
    assert direct[False]["num_windows"] == everything["num_windows"] and not direct[False]["document_masking"]
    # the same arithmetic gives the same bits; the windows that hold a boundary change the unmasked loss
    assert everything["loss"] == direct[True]["loss"] != direct[False]["loss"]


# --------------------------------------------------------------------------------------------------
# tiny Hugging Face models, built from configs (nothing is downloaded)


def tiny_llama_config(vocab_size: int, **overrides):
    """A ``LlamaConfig`` of one layer, width 16, two heads and 64 positions; ``overrides``: any field."""
    import transformers

    fields = dict(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaConfig(**{**fields, **overrides})


def save_tiny_llama(folder, vocab_size: int = 260, **extra_json):
    """``folder/config.json`` of a tiny Llama (what ``--model hf:folder`` reads); ``extra_json``: keys added
    to the file as written (``save_pretrained`` leaves ``attn_implementation`` out)."""
    tiny_llama_config(vocab_size).save_pretrained(folder)
    if extra_json:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **extra_json}))
    return folder


# --------------------------------------------------------------------------------------------------
# a prepared folder as seqwarm before 0.2.0 wrote it (its own SEQWIDX index, meta.json format_version 1)


def make_seqwarm_v1_folder(folder):
    """Rewrite a prepared folder in place as seqwarm < 0.2.0 wrote the same documents: each ``SPLIT.idx``
    in the SEQWIDX layout (magic, version 1, item size, documents, tokens, then the D+1 document offsets),
    ``.bin`` unchanged (int32 was uint32 then), meta.json format_version 1 with the new files' sizes and
    checksums. Returns the folder."""
    import hashlib

    from seqwarm.data.indexed import MegatronIndexed

    meta = json.loads((folder / "meta.json").read_text())
    for split in ("train", "val"):
        indexed = MegatronIndexed(folder / split)
        offsets = indexed.doc_offsets.astype("<i8")
        idx = struct.pack("<8sIIQQ", b"SEQWIDX\x00", 1, indexed.dtype.itemsize, len(indexed), indexed.num_tokens)
        del indexed  # its memory maps
        (folder / f"{split}.idx").write_bytes(idx + offsets.tobytes())
        meta["files"][f"{split}.idx"] = {"bytes": len(idx) + 8 * len(offsets), "sha256": ""}
        meta["files"][f"{split}.idx"]["sha256"] = hashlib.sha256((folder / f"{split}.idx").read_bytes()).hexdigest()
    meta.update(format_version=1, dtype={"int32": "uint32"}.get(meta["dtype"], meta["dtype"]))
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
    return folder


def doc_block(page: str, test_file: str) -> str:
    """The Python block of docs/``page`` followed by ``<!-- runs in tests/.../test_file ...-->``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text(encoding="utf-8")
    found = re.findall(r"```python\n((?:(?!```).)*)```\n<!-- runs in tests/\S*?" + re.escape(test_file), text, re.S)
    assert len(found) == 1, f"docs/{page} has {len(found)} blocks marked to run in {test_file}"
    return found[0]
