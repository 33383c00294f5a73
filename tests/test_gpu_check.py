"""benchmarks/gpu_check.py --smoke on CPU (so the GPU check cannot rot), from a plain checkout."""

import json
import os
import subprocess
import sys

from conftest import ROOT


def test_gpu_check_smoke_runs_from_a_plain_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script finds src/ itself
    env["OMP_NUM_THREADS"] = "1"
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "measured matmul ceiling" in proc.stdout and "| eager | reshape | 32 |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {(r["mode"], r["length"]) for r in rows} == {(m, n) for m in ("truncate", "reshape") for n in (16, 32)}
    assert all(r["tokens_per_s"] > 0 and r["loop_vs_bare"] > 0 for r in rows)
    attention = {r["case"]: r for r in json.loads(out.read_text())["attention"]}  # issue #38: window, documents
    assert {"full causal", "window S/8 (4)", "window S/2 (16)", "documents, 16 a row"} <= set(attention)
    assert attention["full causal"]["vs_causal"] == 1.0 and all(r["step_ms"] > 0 for r in attention.values())
    assert "| eager | window S/8 (4) |" in proc.stdout


def test_gpu_throughput_imports_from_a_plain_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0 and "MFU" in proc.stdout, proc.stderr[-2000:]
