"""A legacy file-system encoding (latin-1, ASCII with surrogate escapes) refuses only the arguments it cannot
turn back into bytes (issue #39); the runs under such a locale are in tests/e2e/test_legacy_locale.py."""

from __future__ import annotations

import sys

import pytest

from seqwarm.cli import _argument_encoding_problem
from seqwarm.util.fsnames import path_record, recorded_path, utf8_reachable


@pytest.mark.parametrize(
    ("encoding", "errors", "argv"),
    [
        ("iso8859-1", "surrogateescape", ["prepare", "--out", "données"]),  # latin-1: every byte a letter
        ("ascii", "surrogateescape", ["prepare", "--out", "donn\udcc3\udca9es"]),  # UTF-8 bytes, escaped
        ("utf-8", "surrogateescape", ["prepare", "--out", "données長"]),
    ],
)
def test_arguments_that_round_trip_are_accepted_in_any_encoding(monkeypatch, encoding, errors, argv):
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: encoding)
    monkeypatch.setattr(sys, "getfilesystemencodeerrors", lambda: errors)
    assert _argument_encoding_problem(argv) is None


def test_only_an_argument_the_encoding_has_no_bytes_for_is_refused(monkeypatch):
    """main(argv) from Python with letters latin-1 cannot write: named, with the fix."""
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "iso8859-1")
    monkeypatch.setattr(sys, "getfilesystemencodeerrors", lambda: "surrogateescape")
    problem = _argument_encoding_problem(["train", "--out", "café長"])
    assert problem is not None
    assert "'caf\\xe9\\u9577'" in problem and "iso8859-1" in problem and "PYTHONUTF8=1" in problem


def test_a_recorded_path_reads_back_to_the_same_bytes(monkeypatch):
    """path_record in this (UTF-8) process is the name itself; recorded_path inverts it for any bytes."""
    for raw in (b"/d/donn\xc3\xa9es", b"/d/donn\xe9es", b"/d/\xff\xfe"):
        name = recorded_path(path_record(raw.decode("utf-8", "surrogateescape")))
        assert name.__fspath__().encode("utf-8", "surrogateescape") == raw
    assert path_record("/d/données") == "/d/données"
    assert utf8_reachable("/d/données") and not utf8_reachable(b"/d/donn\xe9es".decode("utf-8", "surrogateescape"))
