"""`seqwarm prepare` of a single .txt file: split into documents at blank lines, or at --split-on; the hint
for a --data folder that is not prepared names --input."""

import json

import pytest

from seqwarm.cli import main
from seqwarm.data import open_prepared
from seqwarm.util.errors import UserError

PARAGRAPH = "the curriculum grows the sequence length while the model learns short context first\n" * 3


def _documents(out) -> int:
    meta = json.loads((out / "meta.json").read_text())
    return meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]


def _prepare(*argv) -> int:
    return main(["prepare", "--tokenizer", "byte", "--no-progress", "--workers", "1", *argv])


def test_a_single_txt_file_is_split_at_blank_lines(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join([PARAGRAPH] * 9) + "\n \n\n" + PARAGRAPH)  # 10 paragraphs, one gap of 3 lines
    assert _prepare("--input", str(book), "--out", str(tmp_path / "p")) == 0
    assert _documents(tmp_path / "p") == 10
    assert json.loads((tmp_path / "p" / "meta.json").read_text())["corpus"]["split_on"] == "blank lines"
    # several .txt files stay one document each
    (tmp_path / "two").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "two" / name).write_text(book.read_text())
    assert _prepare("--input", str(tmp_path / "two"), "--out", str(tmp_path / "q")) == 0
    assert _documents(tmp_path / "q") == 2


def test_split_on_a_separator_of_the_users(tmp_path, capsys):
    text = tmp_path / "dump.txt"
    text.write_text("<|endoftext|>".join([PARAGRAPH.replace("\n", " ")] * 6))  # no blank lines
    assert _prepare("--input", str(text), "--out", str(tmp_path / "one-paragraph")) == 2
    err = capsys.readouterr().err
    assert "1 non-empty document(s)" in err and "--split-on TEXT" in err and "Traceback" not in err
    assert _prepare("--input", str(text), "--split-on", "<|endoftext|>", "--out", str(tmp_path / "p")) == 0
    assert _documents(tmp_path / "p") == 6


def test_the_hint_for_an_unprepared_data_folder_names_input(tmp_path):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text(PARAGRAPH)
    with pytest.raises(UserError, match=r"seqwarm prepare --input \S*texts --out \S*texts-prepared"):
        open_prepared(tmp_path / "texts")
    with pytest.raises(UserError, match="seqwarm prepare --input TEXT --out"):
        open_prepared(tmp_path / "missing")
