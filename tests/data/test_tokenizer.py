"""Tokenizers: round trips, exactly one EOD per document, names, save/load."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from seqwarm.data.tokenizer import (
    EOD_TOKEN,
    ByteTokenizer,
    build_tokenizer,
    gpt2_tokenizer,
    load_tokenizer,
    parse_tokenizer_name,
    tokenizer_from_payload,
    train_bpe,
)
from seqwarm.util.errors import UserError

TEXTS = [
    "Hello world. To be, or not to be: that is the question.",
    "Unicode: café, naïve, 日本語, emoji 😀 and tabs\tand\nnewlines\n",
    f"A literal {EOD_TOKEN} inside the text is not an end of document.",
    "  leading and trailing spaces  ",
]

CORPUS = [
    "In the beginning God created the heaven and the earth. " * 20,
    "And the earth was without form, and void; and darkness was upon the face of the deep. " * 20,
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 20,
]


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_tokenizer()


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(CORPUS, 300)


def _check_roundtrip_and_eod(tok):
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert tok.eod_id not in ids, "a literal <|endoftext|> must not become EOD"
        doc = tok.encode_document(text)
        assert doc[:-1] == ids and doc[-1] == tok.eod_id
        assert doc.count(tok.eod_id) == 1
        arr = tok.encode_array(text, np.dtype("<u4"))
        assert arr.tolist() == doc
        assert max(doc) < tok.vocab_size
    assert tok.decode(tok.encode_document("x")) == "x" + EOD_TOKEN


def test_byte_tokenizer():
    tok = ByteTokenizer()
    assert (tok.name, tok.vocab_size, tok.eod_id) == ("byte", 257, 256)
    assert tok.encode("Aé") == [65, 0xC3, 0xA9]
    _check_roundtrip_and_eod(tok)
    with pytest.raises(ValueError):
        tok.decode([300])


def test_gpt2_tokenizer_is_the_original_bpe(gpt2):
    assert (gpt2.name, gpt2.vocab_size, gpt2.eod_id) == ("gpt2", 50257, 50256)
    # Reference ids of the original GPT-2 encoder.
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the") == [262]
    _check_roundtrip_and_eod(gpt2)


def test_bpe_tokenizer_trains_with_eod(bpe):
    assert bpe.name == "bpe:300"
    assert bpe.eod_id == 0
    assert 258 <= bpe.vocab_size <= 300
    _check_roundtrip_and_eod(bpe)
    # It learned merges: fewer tokens than bytes on text like its training corpus.
    text = "and the earth was without form"
    assert len(bpe.encode(text)) < len(text.encode()) * 0.7


def test_payload_rebuilds_the_same_tokenizer(gpt2, bpe):
    for tok in (gpt2, bpe, ByteTokenizer()):
        clone = tokenizer_from_payload(tok.worker_payload())
        for text in TEXTS:
            assert clone.encode_document(text) == tok.encode_document(text)


@pytest.mark.parametrize(
    "name,expected",
    [("gpt2", ("gpt2", None)), ("byte", ("byte", None)), ("bpe:8192", ("bpe", 8192)), ("BPE:300", ("bpe", 300))],
)
def test_parse_tokenizer_name(name, expected):
    assert parse_tokenizer_name(name) == expected


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("gpt3", "unknown tokenizer"),
        ("bpe:", "unknown tokenizer"),
        ("bpe:100", "at least 258"),
        ("bpe:x", "unknown tokenizer"),
    ],
)
def test_bad_tokenizer_names(name, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_tokenizer_name(name)


def test_vocab_files_only_with_gpt2(tmp_path):
    with pytest.raises(UserError, match="only apply to --tokenizer gpt2"):
        build_tokenizer("byte", vocab_file=tmp_path / "v.json", merges_file=tmp_path / "m.txt")
    with pytest.raises(UserError, match="go together"):
        gpt2_tokenizer(vocab_file=tmp_path / "v.json")
    with pytest.raises(UserError, match="does not exist"):
        gpt2_tokenizer(tmp_path / "v.json", tmp_path / "m.txt")
    (tmp_path / "v.json").write_text(json.dumps({"a": 0, "b": 1}))
    (tmp_path / "m.txt").write_text("#version: 0.2\n")
    with pytest.raises(UserError, match="no '<\\|endoftext\\|>'"):
        gpt2_tokenizer(tmp_path / "v.json", tmp_path / "m.txt")


def test_save_and_load_from_meta(tmp_path, bpe):
    files = bpe.save(tmp_path)
    meta = {"tokenizer": {**bpe.describe(), "files": files}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    again = load_tokenizer(tmp_path)
    for text in TEXTS:
        assert again.encode_document(text) == bpe.encode_document(text)
    assert (again.vocab_size, again.eod_id, again.name) == (bpe.vocab_size, bpe.eod_id, bpe.name)
    assert isinstance(load_tokenizer({"tokenizer": {"name": "byte"}}), ByteTokenizer)
    # A meta.json that disagrees with the tokenizer file is caught.
    meta["tokenizer"]["vocab_size"] = bpe.vocab_size + 1
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="vocab_size"):
        load_tokenizer(tmp_path)
    with pytest.raises(UserError, match="not a prepared data folder"):
        load_tokenizer(tmp_path / "nowhere")


def test_a_bpe_smaller_than_asked_says_so_and_why(caplog):
    """`prepare --tokenizer bpe:16384` on a small folder learns fewer tokens: a warning gives the size
    learned and the reason; a vocabulary learned in full gives none."""
    with caplog.at_level(logging.WARNING, logger="seqwarm.data.tokenizer"):
        small = train_bpe(CORPUS, 16384)
    assert small.vocab_size < 16384
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"bpe:16384 learned a vocabulary of only {small.vocab_size:,} tokens" in message
    assert "seen at least 2 times" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="seqwarm.data.tokenizer"):
        full = train_bpe(CORPUS, 300)
    assert full.vocab_size == 300 and not caplog.records
