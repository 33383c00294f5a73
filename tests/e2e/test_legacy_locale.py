"""A legacy locale (issue #39, item 2), end to end with the real CLI: latin-1 file names, and ASCII with
surrogate escapes, run prepare, train, ``--resume``, eval and export on a folder whose name is not ASCII;
the run's JSON records the name so that it reads back to the same bytes in any locale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, make_corpus, small_config
from seqwarm.util.fsnames import recorded_path

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}


def latin1_env(tmp_path) -> dict[str, str]:
    """An ISO-8859-1 locale: the system's C.ISO-8859-1 when installed, else one compiled with localedef
    into a folder of the test (LOCPATH); skipped where neither exists."""
    names = (
        subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout.split()
        if shutil.which("locale")
        else []
    )
    env = {"LANG": "C.ISO-8859-1", "LC_ALL": "C.ISO-8859-1", "PYTHONUTF8": None, "PYTHONIOENCODING": None}
    if not any(n.lower().replace("-", "") in ("c.iso88591",) for n in names):
        if not shutil.which("localedef"):
            pytest.skip("no ISO-8859-1 locale here and no localedef to make one")
        where = tmp_path / "locales"
        where.mkdir()
        subprocess.run(["localedef", "-i", "POSIX", "-f", "ISO-8859-1", str(where / "C.ISO-8859-1")],
                       capture_output=True)  # fmt: skip
        env["LOCPATH"] = str(where)
    check = seqwarm_python("import sys; print(sys.getfilesystemencoding())", env)
    if check.stdout.strip() != "iso8859-1":
        pytest.skip(f"the ISO-8859-1 locale does not load here ({check.stdout.strip() or check.stderr[-200:]})")
    return env


def seqwarm_python(code, env):
    full = {k: v for k, v in {**ENV, **env}.items() if v is not None}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=60)


ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": None,
                "LANG": None, "LC_CTYPE": None}  # fmt: skip
"""ASCII file names with surrogate escapes (UTF-8 mode off)."""


@pytest.mark.parametrize("kind", ["latin-1", "ascii"])
def test_a_legacy_locale_runs_every_command_on_a_non_ascii_folder(tmp_path, kind):
    """Under latin-1 the folder is b'donn\\xe9es' (its latin-1 bytes); under ASCII it is the UTF-8 bytes of
    'données', which that Python reads as surrogate escapes. Each command exits as it does in UTF-8."""
    env = latin1_env(tmp_path) if kind == "latin-1" else ASCII_LOCALE
    raw = os.fsencode(tmp_path) + (b"/donn\xe9es" if kind == "latin-1" else "/données".encode())
    os.mkdir(raw)
    base = Path(os.fsdecode(raw))  # this (UTF-8) process's name for it: the same bytes
    make_corpus(base / "corpus", docs=20, words_per_doc=400)
    cfg = small_config(tmp_path / "c.json", train_tokens=100_000, total_step=2)
    # the arguments as bytes: the child decodes them in its own locale, as a shell would hand them over
    arg = {name: os.fsencode(base / name) for name in ("corpus", "data", "run", "hf")}

    def run(*args):
        full = {k: v for k, v in {**ENV, **env}.items() if v is not None}
        cmd = [sys.executable.encode(), b"-m", b"seqwarm", *(a if isinstance(a, bytes) else a.encode() for a in args)]
        return subprocess.run(cmd, capture_output=True, env=full, timeout=300)

    prep = run("prepare", "--no-progress", "--tokenizer", "bpe:300", "--input", arg["corpus"], "--out", arg["data"])
    assert prep.returncode == 0, prep.stderr[-2000:]
    train = [*FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", arg["data"], "--out", arg["run"],
             "--train-iters", "2", "--save-interval", "1"]  # fmt: skip
    stopped = run("train", *train, "--exit-duration-in-mins", "0.0001")
    assert stopped.returncode == 75, stopped.stderr[-2000:]
    resumed = run("train", *train, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert b"Traceback" not in resumed.stderr
    evaluated = run("eval", arg["run"], "--val")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    exported = run("export", arg["run"], "--hf", arg["hf"])
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert sorted(os.listdir(raw)) == [b"corpus", b"data", b"hf", b"run"]  # written under the bytes given
    assert (base / "data" / "tokenizer.json").is_file() and (base / "hf" / "model.safetensors").is_file()
    # the run's JSON records the names so that they read back to the same bytes, in this UTF-8 process
    recorded = json.loads((base / "run" / "config.json").read_text(encoding="utf-8"))
    assert os.fsencode(recorded_path(recorded["data"]["folder"])) == os.fsencode((base / "data").resolve())
    assert os.fsencode(recorded_path(recorded["options"]["out"])) == arg["run"]
    # ... and in the legacy locale
    code = (
        "import json, os, sys; from seqwarm.util.fsnames import recorded_path; "
        "r = json.load(open(sys.argv[1], encoding='utf-8')); "
        "sys.stdout.buffer.write(os.fsencode(recorded_path(r['data']['folder'])))"
    )
    full = {k: v for k, v in {**ENV, **env}.items() if v is not None}
    back = subprocess.run([sys.executable.encode(), b"-c", code.encode(), os.fsencode(base / "run" / "config.json")],
                          capture_output=True, env=full, timeout=60)  # fmt: skip
    assert back.stdout == os.fsencode((base / "data").resolve()), back.stderr
