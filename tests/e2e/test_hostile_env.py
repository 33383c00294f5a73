"""Hostile environments (issue #26.6): a read-only home or cache, a full disk during ``prepare``, no usable
``TMPDIR``, a locale that is not UTF-8, paths with spaces and non-ASCII letters. Each is a correct result
or an exit 2 naming the folder and the fix, never a traceback, and nothing half-written is left.

Subprocesses of the real CLI. Two ``prepare`` runs into one folder at once are tested in
tests/e2e/test_data_faults.py (``test_two_prepares_into_one_folder_the_second_names_the_first``); a full
disk during ``prepare --force`` in tests/trainer/test_fault_checks.py.

A read-only folder is made with ``chmod`` for a normal user; root writes through permission bits, so
under root the folder is bind-mounted read-only in a user and mount namespace (``unshare -Urm``), and
the test is skipped where the kernel does not allow one.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_TRAIN_FLAGS, make_corpus, small_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC}
ASCII_LOCALE = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None, "LANG": None, "LC_CTYPE": None}
"""A locale whose encoding is ASCII: the C locale with Python's UTF-8 mode turned off (``LC_ALL=C`` alone
turns it on, PEP 540)."""


def seqwarm(*args, env=None, prefix=(), timeout=120, limit_bytes=None):
    """``python -m seqwarm ARGS``; ``env`` entries set to None are removed; ``prefix``: a command to run it
    under; ``limit_bytes``: the largest file it may write (a full disk, without root)."""
    full = {**ENV, **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [*prefix, sys.executable, "-m", "seqwarm", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=timeout,
        preexec_fn=limit if limit_bytes else None,
    )


@pytest.fixture
def read_only():
    """``read_only(folder)`` -> the command prefix under which ``folder`` cannot be written."""
    changed: list[Path] = []

    def make(folder: Path) -> list[str]:
        folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            folder.chmod(0o555)
            changed.append(folder)
            return []
        if not shutil.which("unshare") or subprocess.run(["unshare", "-Urm", "true"]).returncode != 0:
            pytest.skip("running as root without user namespaces: no way to make a folder read-only")
        script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
        return ["unshare", "-Urm", "sh", "-c", script, str(folder)]

    yield make
    for folder in changed:
        folder.chmod(0o755)  # so that pytest can remove it


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name]


# -- a read-only home or cache --------------------------------------------------------------------------

EMBEDDED = """
import json, sys
from seqwarm.data import corpus, prepare
def fake_prepare(folder, inputs, **kw):  # the embedded corpus takes ~10 s to prepare; its meta.json suffices
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"format_version": 2, "corpus": {"packages": corpus.corpus_identity()}}
    (folder / "meta.json").write_text(json.dumps(meta))
prepare.prepare_dataset = fake_prepare
print(prepare.embedded_data_dir())
print(prepare.embedded_data_dir())
"""


def embedded(env, prefix=()):
    full = {k: v for k, v in {**ENV, **env}.items() if v is not None}
    cmd = [*prefix, sys.executable, "-c", EMBEDDED]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=120)


def test_a_read_only_home_keeps_the_embedded_corpus_in_a_temporary_folder(tmp_path, read_only):
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    tmp.mkdir()
    env = {"HOME": str(home), "XDG_CACHE_HOME": None, "SEQWARM_CACHE": None, "TMPDIR": str(tmp)}
    res = embedded(env, read_only(home))
    assert res.returncode == 0, res.stderr
    fallback = tmp / f"seqwarm-cache-{os.getuid()}"
    first, second = res.stdout.split()
    assert first == second and Path(first).parent == fallback and Path(first).name.startswith("embedded-")
    # said once, naming the folder it could not write, the one it uses and the variable that moves it
    assert res.stderr.count("cannot be written") == 1, res.stderr
    assert str(home / ".cache" / "seqwarm") in res.stderr and "SEQWARM_CACHE=DIR" in res.stderr
    assert not any(home.iterdir())


def test_a_read_only_cache_that_holds_the_corpus_is_used_as_it_is(tmp_path, read_only):
    cache = tmp_path / "cache"
    env = {"SEQWARM_CACHE": str(cache), "TMPDIR": str(tmp_path)}
    first = embedded(env)  # prepared once (a container image's cache, say) ...
    assert first.returncode == 0, first.stderr
    before = sorted(p.name for p in cache.rglob("*"))
    again = embedded(env, read_only(cache))  # ... then read-only: no lock file, no fallback
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout and "cannot be written" not in again.stderr
    assert sorted(p.name for p in cache.rglob("*")) == before


def test_a_read_only_seqwarm_cache_is_an_exit_2_naming_it(tmp_path, read_only):
    cache = tmp_path / "cache"
    prefix = read_only(cache)
    res = seqwarm("train", "--model", "tiny", "--out", str(tmp_path / "run"), env={"SEQWARM_CACHE": str(cache)},
                  prefix=prefix)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert f"SEQWARM_CACHE='{cache}': cannot write there" in res.stderr and "--data DIR" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_run_with_a_read_only_home_and_no_tmpdir(tmp_path, byte_data, read_only):
    home = tmp_path / "home"
    cfg = small_config(tmp_path / "c.json", train_tokens=4000, total_step=2)
    run = tmp_path / "run"
    args = ["train", *FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", str(byte_data), "--out", str(run)]
    env = {"HOME": str(home), "TMPDIR": str(tmp_path / "missing"), "MPLCONFIGDIR": None, "XDG_CONFIG_HOME": None}
    res = seqwarm(*args, "--train-iters", "2", env=env, prefix=read_only(home))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert {"summary.json", "curves.png", "config.json"} <= {p.name for p in run.iterdir()}
    assert not any(home.iterdir()) and not (tmp_path / "missing").exists()


# -- a full disk during prepare -------------------------------------------------------------------------


def test_a_full_disk_during_prepare_leaves_nothing_behind(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", docs=6, words_per_doc=200)
    out = tmp_path / "data"
    args = ["prepare", "--no-progress", "--tokenizer", "bpe:300", "--input", str(corpus), "--out", str(out)]
    full = seqwarm(*args, limit_bytes=4096)  # the tokenizer file alone is larger
    assert full.returncode == 2, full.stderr
    assert "File too large" in full.stderr and f"'{out}' was not written" in full.stderr
    assert "Free some space" in full.stderr and "Traceback" not in full.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no folder a later run would accept
    ok = seqwarm(*args)  # space again: the same command
    assert ok.returncode == 0, ok.stderr
    assert "val:   1 document, " in ok.stdout and "train: 5 documents, " in ok.stdout  # plurals


# -- no usable TMPDIR -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tmpdir", ["missing", "a-file", ""])
def test_prepare_without_a_usable_tmpdir(tmp_path, tmpdir):
    (tmp_path / "a-file").write_text("x")
    corpus = make_corpus(tmp_path / "corpus", docs=6, words_per_doc=200)
    env = {"TMPDIR": str(tmp_path / tmpdir) if tmpdir else None}
    args = ["--tokenizer", "bpe:300", "--input", str(corpus), "--out", str(tmp_path / "data"), "--no-progress"]
    res = seqwarm("prepare", *args, "--workers", "2", env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["vocab_size"] == 300


# -- a locale that is not UTF-8 -------------------------------------------------------------------------


@pytest.mark.parametrize("locale", [{"LC_ALL": "C"}, {"LC_ALL": "POSIX"}, ASCII_LOCALE])
def test_prepare_reads_utf8_text_as_utf8_in_any_locale(tmp_path, locale):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):  # non-ASCII text: the byte tokens show how it was decoded and encoded
        (corpus / f"d{i}.txt").write_text(f"café {i} – naïve → 長い文脈 " * 40, encoding="utf-8")
    common = ["prepare", "--tokenizer", "byte", "--input", str(corpus), "--no-progress"]
    ref = seqwarm(*common, "--out", str(tmp_path / "ref"), env={"LC_ALL": "C.UTF-8", "PYTHONUTF8": None})
    assert ref.returncode == 0, ref.stderr
    res = seqwarm(*common, "--out", str(tmp_path / "data"), env=locale)
    assert res.returncode == 0, res.stderr
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "data" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_a_non_ascii_path_in_an_ascii_locale_is_written_under_its_own_bytes(tmp_path):
    """Python reads the UTF-8 bytes of 'données' as surrogate escapes in an ASCII locale and writes them back
    unchanged (issue #39: it used to be refused; a whole run under a legacy locale is in
    tests/e2e/test_legacy_locale.py)."""
    folder = tmp_path / "données"
    corpus = make_corpus(folder / "corpus", docs=4, words_per_doc=50)
    res = seqwarm("prepare", "--tokenizer", "byte", "--input", str(corpus), "--out", str(folder / "data"),
                  env=ASCII_LOCALE)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and sorted(p.name for p in folder.iterdir()) == ["corpus", "data"]
    assert (folder / "data" / "meta.json").is_file()


def test_output_an_ascii_console_cannot_show_is_escaped(tmp_path):
    cfg = small_config(tmp_path / "c.json")
    code = (
        "import sys; from seqwarm.cli import main\n"
        f"code = main(['check-config', {str(cfg)!r}])\n"
        "print('median (min\\u2013max) \\u2192 done'); sys.exit(code)"
    )
    env = {k: v for k, v in {**ENV, **ASCII_LOCALE}.items() if v is not None}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "median (min\\u2013max) \\u2192 done" in res.stdout and "Traceback" not in res.stderr


# -- paths with spaces and non-ASCII letters ------------------------------------------------------------


@pytest.mark.slow
def test_paths_with_spaces_and_accents_and_the_printed_resume_command(tmp_path):
    base = tmp_path / "dir with space" / "données d'été"
    corpus = make_corpus(base / "my corpus", docs=8, words_per_doc=300)
    (corpus / "doc é 1.txt").write_text("un café – naïve → 長い文脈 " * 100, encoding="utf-8")
    data, run = base / "data ü", base / "run ü"
    cfg = small_config(base / "config ü.json", train_tokens=4000, total_step=2)
    prep = seqwarm("prepare", "--no-progress", "--tokenizer", "bpe:300", "--input", str(corpus), "--out", str(data))
    assert prep.returncode == 0, prep.stderr
    assert seqwarm("check-config", str(cfg)).returncode == 0
    args = [*FAST_TRAIN_FLAGS, "--config", str(cfg), "--data", str(data), "--out", str(run), "--train-iters", "2"]
    # stopped at once by the clock: the run prints the command that continues it
    stopped = seqwarm("train", *args, "--save-interval", "1", "--exit-duration-in-mins", "0.0001")
    assert stopped.returncode == 75, stopped.stderr
    command = stopped.stderr.split("continue with: ")[1].strip()
    words = shlex.split(command)  # the shell reads back exactly the paths given
    assert [str(cfg), str(data), str(run)] == [words[words.index(f) + 1] for f in ("--config", "--data", "--out")]
    words.remove("--exit-duration-in-mins")
    words.remove("0.0001")
    env = {**ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{ENV.get('PATH', '')}"}
    resumed = subprocess.run(["bash", "-c", shlex.join(words)], capture_output=True, text=True, env=env, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["steps"] == 2
    assert not leftovers(tmp_path)
