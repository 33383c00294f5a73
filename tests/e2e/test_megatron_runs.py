"""Coming from Megatron-DeepSpeed: its indexed data read in place (--data-path, blends), its launcher's
and its scripts' flags (--local_rank, --deepspeed_config, Megatron setting names), the built-in recipe
following --seq-length.

The Megatron files are written here from the published ``MMIDIDX`` layout (see seqwarm.data.megatron),
and, when megatron-core is installed (it installs on CPU with the CPU torch), by its own builder too.

The slow, end-to-end part; the fast tests are in tests/data/test_megatron.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from seqwarm.cli import main
from seqwarm.data import open_prepared
from seqwarm.data.megatron import MEGATRON_DTYPES, MEGATRON_MAGIC

FAST = ["--no-progress", "--device", "cpu", "--no-tensorboard"]
BYTE_VOCAB, BYTE_EOD = 257, 256


def write_megatron(prefix, documents, dtype=np.uint16, *, version=1):
    """PREFIX.bin + PREFIX.idx as megatron-core's builder lays them out: one sequence per document."""
    dtype = np.dtype(dtype)
    code = {np.dtype(v): k for k, v in MEGATRON_DTYPES.items()}[dtype]
    lengths = np.array([len(d) for d in documents], dtype="<i4")
    pointers = (np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]) * dtype.itemsize).astype("<i8")
    doc_index = np.arange(len(documents) + 1, dtype="<i8")
    with open(f"{prefix}.bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype.newbyteorder("<")).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(MEGATRON_MAGIC + struct.pack("<Q", version) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(documents)) + struct.pack("<Q", len(documents) + 1))
        f.write(lengths.tobytes() + pointers[: len(documents)].tobytes() + doc_index.tobytes())
    return str(prefix)


def prepared_documents(folder):
    """Train then val documents of a seqwarm prepared folder (each ends with EOD), and the split counts."""
    data = open_prepared(folder)
    train, val = data.split("train"), data.split("val")
    docs = [np.asarray(train.document(i)) for i in range(len(train))]
    docs += [np.asarray(val.document(i)) for i in range(len(val))]
    return data, docs, len(train), len(val)


@pytest.mark.slow
def test_data_path_trains_like_the_prepared_folder(tmp_path, byte_data, monkeypatch):
    """`seqwarm train --seq-length 128` with no config, on Megatron files under the deepspeed launcher's
    --local_rank, logging to W&B offline: step for step the run on the same documents prepared by
    seqwarm, never longer than 128."""
    _, docs, n_train, n_val = prepared_documents(byte_data)
    prefix = write_megatron(tmp_path / "corpus_text_document", docs, np.uint16)
    common = [
        *FAST,
        "--seq-length",
        "128",
        "--train-tokens",
        "5000",
        "--eval-interval",
        "2",
        "--eval-iters",
        "2",
        "--log-interval",
        "1",
    ]
    assert main(["train", *common, "--data", str(byte_data), "--out", str(tmp_path / "prepared")]) == 0
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb = ["--wandb-project", "seqwarm-test"] if _has("wandb") else []
    assert (
        main(
            [
                "train",
                *common,
                "--data-path",
                prefix,
                "--tokenizer",
                "byte",
                "--split",
                f"{n_train},{n_val},0",
                "--local_rank=0",
                *wandb,
                "--out",
                str(tmp_path / "megatron"),
            ]
        )
        == 0
    )
    from conftest import train_rows

    ref, got = train_rows(tmp_path / "prepared"), train_rows(tmp_path / "megatron")
    assert [(r["step"], r["seqlen"], r["tokens"], r["loss"]) for r in got] == [
        (r["step"], r["seqlen"], r["tokens"], r["loss"]) for r in ref
    ]
    assert max(r["seqlen"] for r in got) <= 128 and got[-1]["seqlen"] == 128
    resolved = json.loads((tmp_path / "megatron" / "config.json").read_text())["data"]["megatron"]
    assert resolved["sources"][0]["prefix"] == prefix and resolved["split"] == f"{n_train},{n_val},0"
    summary = json.loads((tmp_path / "megatron" / "summary.json").read_text())
    assert (
        summary["final_val_loss"] == json.loads((tmp_path / "prepared" / "summary.json").read_text())["final_val_loss"]
    )
    if wandb:
        from helpers import wandb_summary

        wb = wandb_summary(tmp_path / "megatron")
        assert wb["curriculum/seqlen"] == 128 and wb["progress/tokens"] == got[-1]["tokens"]
        assert wb["train/loss"] == pytest.approx(got[-1]["loss"]) and wb["final_val_loss"] == summary["final_val_loss"]
        assert wb["val/loss"] == pytest.approx(summary["final_val_loss"])
    # eval and export read the run's Megatron sources again (they hold no meta.json): the same val loss as
    # the same model on the prepared folder
    from seqwarm.evaluation import run_paper_evals

    vals = [
        run_paper_evals(tmp_path / name, val=True, val_windows=6, write=False, progress=False)["val"]
        for name in ("prepared", "megatron")
    ]
    assert vals[0] == vals[1] and vals[0]["num_windows"] == 6
    if _has("transformers"):
        assert main(["export", str(tmp_path / "megatron"), "--hf", str(tmp_path / "hf")]) == 0
        assert (tmp_path / "hf" / "model.safetensors").is_file()  # the byte tokenizer has no Hugging Face form


def _has(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


# --------------------------------------------------------------------------------------------------
# docs/MIGRATING.md


MIGRATING = (Path(__file__).resolve().parents[2] / "docs" / "MIGRATING.md").read_text()


def _tiny_command() -> str:
    block = MIGRATING.split("<!-- tiny -->", 1)[1]
    return block.split("```bash\n", 1)[1].split("```", 1)[0].strip()


@pytest.mark.slow
@pytest.mark.deepspeed
def test_the_tiny_migrating_command_runs_on_deepspeed(tmp_path, byte_data):
    pytest.importorskip("deepspeed", reason="needs the deepspeed extra")
    _, docs, _, _ = prepared_documents(byte_data)
    (tmp_path / "data").mkdir()
    write_megatron(tmp_path / "data" / "a_text_document", docs[: len(docs) // 2], np.uint16)
    write_megatron(tmp_path / "data" / "b_text_document", docs[len(docs) // 2 :], np.int32)
    ds = json.loads((Path(__file__).resolve().parents[2] / "examples" / "ds_config_gpt2.json").read_text())
    ds.pop("fp16")  # CPU: fp32
    ds.update(
        train_batch_size=8,
        gradient_accumulation_steps=2,
        tensorboard={"enabled": True, "output_path": "runs/tiny/ignored", "job_name": "x"},
        csv_monitor={"enabled": True, "output_path": "runs/csv", "job_name": "tiny"},
    )
    ds["curriculum_learning"].update(max_difficulty=64)
    ds["curriculum_learning"]["schedule_config"]["total_curriculum_step"] = 4
    (tmp_path / "ds_tiny.json").write_text(json.dumps(ds))
    argv = shlex.split(_tiny_command())
    assert argv[0] == "seqwarm"
    paths = [str(Path(__file__).resolve().parents[2] / "src")]  # absolute: the run's folder is tmp_path
    paths += [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOCAL_RANK": "0", "PYTHONPATH": os.pathsep.join(paths)}
    launcher = Path(sys.executable).parent / "deepspeed"
    if launcher.exists():  # the real launcher: it runs `python -u -m seqwarm --local_rank=0 train ...`
        assert argv[1:3] == ["--local_rank=0", "train"]
        env.pop("LOCAL_RANK")
        proc = run_on_a_free_port(
            lambda port: [
                str(launcher),
                "--num_gpus",
                "1",
                "--master_port",
                str(port),
                "--module",
                "seqwarm",
                *argv[2:],
            ],
            cwd=tmp_path,
            env=env,
            timeout=600,
            before_retry=lambda: shutil.rmtree(tmp_path / "runs", ignore_errors=True),
        )
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "seqwarm", *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if launcher.exists():
        assert "'-m', 'seqwarm', '--local_rank=0', 'train'" in proc.stdout + proc.stderr
    from conftest import train_rows

    run = tmp_path / "runs" / "tiny"
    rows = train_rows(run)
    assert [r["seqlen"] for r in rows][:4] == [16, 32, 48, 64] and rows[-1]["tokens"] >= 3000
    assert json.loads((run / "config.json").read_text())["parallelism"].startswith("deepspeed")
    csv = tmp_path / "runs" / "csv" / "tiny" / "seqlen_curriculum_seqlen_vs_tokens.csv"
    assert csv.read_text().splitlines()[1].startswith(f"{rows[0]['tokens']},16")
    if _has("tensorboard"):  # --tensorboard-dir wins over the config's block
        assert (
            list((run / "tb").glob("events.out.tfevents.*")) and not (tmp_path / "runs" / "tiny" / "ignored").exists()
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_TAKEN = "address already in use"
"""How the launched process's TCPStore (or a plain bind) says another process holds the port (any case)."""


def run_on_a_free_port(make_cmd, *, ports=None, attempts=4, before_retry=lambda: None, **run_kwargs):
    """``subprocess.run(make_cmd(port))`` on a port that was free when picked. A picked port is let go
    before the launched process binds it, so another process may take it in between (torchrun's
    ``--standalone``, which the other distributed tests use, binds port 0 itself; the deepspeed launcher
    needs a number): a failure that says the address is in use is run again on a new port."""
    ports = iter(ports) if ports is not None else iter(_free_port, None)
    for attempt in range(attempts):
        proc = subprocess.run(make_cmd(next(ports)), capture_output=True, text=True, **run_kwargs)
        if proc.returncode == 0 or PORT_TAKEN not in (proc.stdout + proc.stderr).lower():
            return proc
        if attempt + 1 < attempts:
            before_retry()
    return proc


@pytest.mark.slow
def test_a_port_taken_before_the_launch_is_retried_on_another():
    with socket.socket() as held:  # another process took the picked port first
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        tried = []

        def store_on(port):
            tried.append(port)
            return [sys.executable, "-c", f"import torch.distributed as d; d.TCPStore('127.0.0.1', {port}, 1, True)"]

        proc = run_on_a_free_port(store_on, ports=[taken, _free_port()], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert tried[0] == taken and len(tried) == 2
    tried.clear()
    proc = run_on_a_free_port(
        lambda port: tried.append(port) or [sys.executable, "-c", "raise SystemExit('other')"], timeout=60
    )
    assert proc.returncode == 1 and "other" in proc.stderr and len(tried) == 1  # not about the port: not retried
