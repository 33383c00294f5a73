"""Coming from Megatron-DeepSpeed: its indexed data read in place (--data-path, blends), its launcher's
and its scripts' flags (--local_rank, --deepspeed_config, Megatron setting names), the built-in recipe
following --seq-length.

The Megatron files are written here from the published ``MMIDIDX`` layout (see seqwarm.data.megatron),
and, when megatron-core is installed (it installs on CPU with the CPU torch), by its own builder too.

The slow, end-to-end tests of this file are in tests/e2e/test_megatron_runs.py.
"""

from __future__ import annotations

import shlex
import struct
from pathlib import Path

import numpy as np
import pytest

from seqwarm.cli import main
from seqwarm.data import open_prepared
from seqwarm.data.blend import BlendedBatches, parse_data_path, split_documents
from seqwarm.data.dataset import TokenWindows
from seqwarm.data.megatron import MEGATRON_DTYPES, MEGATRON_MAGIC, MegatronData, MegatronIndexed
from seqwarm.util.errors import UserError

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


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_files_give_the_prepared_token_stream(tmp_path, byte_data, dtype):
    prepared, docs, n_train, n_val = prepared_documents(byte_data)
    prefix = write_megatron(tmp_path / "corpus_text_document", docs, dtype)
    data = MegatronData([prefix], split=f"{n_train},{n_val},0", tokenizer="byte")
    assert (data.vocab_size, data.eod_id) == (prepared.vocab_size, prepared.eod_id)
    assert data.meta["splits"]["train"]["tokens"] == prepared.split("train").num_tokens
    for split, index in (("train", 0), ("val", 1)):
        np.testing.assert_array_equal(data.sources[0].stream(index), prepared.split(split).tokens)
    mine = data.train_batches(64, 4, seed=7)
    theirs = prepared.train_batches(64, 4, seed=7)
    for _ in range(5):
        a, b = mine.next_batch(), theirs.next_batch()
        assert all((a[k] == b[k]).all() for k in a)
    val_a = list(data.val_batches(64, 4, num_windows=8))
    val_b = list(prepared.val_batches(64, 4, num_windows=8))
    assert all((x["input_ids"] == y["input_ids"]).all() for x, y in zip(val_a, val_b))


def _small(tmp_path, name="d", n=20, dtype=np.uint16):
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(0, 256, 200), BYTE_EOD) for _ in range(n)]
    return write_megatron(tmp_path / name, docs, dtype)


def _corrupt(prefix, where, data):
    path = f"{prefix}.{where}"
    raw = bytearray(open(path, "rb").read())
    if isinstance(data, int):  # truncate to that many bytes
        raw = raw[:data]
    else:
        offset, value = data
        raw[offset : offset + len(value)] = value
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize(
    "where,data,fragment",
    [
        ("idx", (0, b"SEQWIDX\x00\x00"), "bad magic bytes"),
        ("idx", (0, b"XXXXXXXXX"), "not a Megatron index"),
        ("idx", (9, struct.pack("<Q", 2)), "index version 2"),
        ("idx", (17, b"\x09"), "unknown dtype code 9"),
        ("idx", (17, b"\x07"), "must be integers"),
        ("idx", 20, "truncated"),
        ("idx", 100, "truncated"),
        ("bin", 1000, "truncated"),
        ("idx", (34 + 4 * 20 + 8, struct.pack("<q", 5)), "sequence pointers"),
    ],
)
def test_a_damaged_megatron_file_is_refused_naming_it(tmp_path, where, data, fragment):
    prefix = _small(tmp_path)
    _corrupt(prefix, where, data)
    with pytest.raises(UserError) as err:
        MegatronIndexed(prefix)
    assert fragment in str(err.value) and str(tmp_path / "d") in str(err.value)


def test_ids_outside_the_vocabulary_are_refused(tmp_path):
    prefix = write_megatron(tmp_path / "big", [[1, 2, 70000, 3]], np.int32)
    with pytest.raises(UserError, match=r"big\.bin.*token id 70000"):
        MegatronData([prefix], vocab_size=50304, eod_id=3)
    with pytest.raises(UserError, match="needs the vocabulary"):
        MegatronData([prefix])
    with pytest.raises(UserError, match="trains a new tokenizer"):
        MegatronData([prefix], tokenizer="bpe:8192")


def test_a_corrupt_index_exits_2(tmp_path, capsys):
    prefix = _small(tmp_path)
    _corrupt(prefix, "idx", 50)
    code = main(["train", *FAST, "--data-path", prefix, "--tokenizer", "byte", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "truncated" in err and "d.idx" in err and "Traceback" not in err


def test_data_path_parsing_and_split():
    assert parse_data_path(["A"]) == [(1.0, "A")]
    assert parse_data_path(["3", "A", "7", "B"]) == [(0.3, "A"), (0.7, "B")]
    for bad in (["0.3", "A", "B"], ["x", "A", "1", "B"], ["0", "A", "1", "B"]):
        with pytest.raises(UserError, match="--data-path"):
            parse_data_path(bad)
    assert split_documents(1000, "969,30,1") == [(0, 969), (969, 999), (999, 1000)]
    assert split_documents(10, "8,2") == [(0, 8), (8, 10), (10, 10)]


def _windows(n, seq=8, base=0):
    return TokenWindows(np.arange(base, base + n * seq + 1) % 250, seq)


def test_blend_draws_each_source_by_its_weight_and_resumes_exactly():
    a, b = _windows(50), _windows(80, base=3)

    def make():
        return BlendedBatches([a, b], [0.3, 0.7], 4, seed=5)

    blend = make()
    picks = [k for _ in range(250) for k, _ in blend.next_indices()]
    assert len(picks) == 1000
    share = picks.count(0) / len(picks)
    assert abs(share - 0.3) <= 0.02
    again = make()
    assert [k for _ in range(250) for k, _ in again.next_indices()] == picks  # deterministic
    first = make()
    for _ in range(37):
        first.next_batch()
    state = first.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    for _ in range(20):
        x, y = first.next_batch(), resumed.next_batch()
        assert (x["input_ids"] == y["input_ids"]).all()
    with pytest.raises(UserError, match="another --data-path blend"):
        BlendedBatches([a, b], [0.5, 0.5], 4).load_state_dict(state)
    from seqwarm.data.dataset import TrainBatches

    with pytest.raises(UserError, match="other training data"):
        TrainBatches(a, 4).load_state_dict(state)
    with pytest.raises(UserError, match="another --data-path blend"):
        resumed.load_state_dict(TrainBatches(a, 4).state_dict())


def test_blend_ranks_take_disjoint_blocks_of_the_same_global_batch():
    a, b = _windows(50), _windows(80, base=3)
    ranks = [BlendedBatches([a, b], [0.3, 0.7], 2, rank=r, world_size=2, seed=1) for r in range(2)]
    single = BlendedBatches([a, b], [0.3, 0.7], 4, seed=1)
    for _ in range(5):
        both = np.concatenate([r.next_batch()["input_ids"].numpy() for r in ranks])
        np.testing.assert_array_equal(both, single.next_batch()["input_ids"].numpy())


def test_megatron_data_blends_two_files(tmp_path):
    p1, p2 = _small(tmp_path, "a"), _small(tmp_path, "b", dtype=np.int32)
    data = MegatronData(["0.3", p1, "0.7", p2], split="8,2,0", vocab_size=BYTE_VOCAB, eod_id=BYTE_EOD)
    assert [s["weight"] for s in data.meta["sources"]] == pytest.approx([0.3, 0.7])
    assert isinstance(data.train_batches(32, 4), BlendedBatches)
    assert sum(b["input_ids"].shape[0] for b in data.val_batches(32, 4)) > 0
    assert len(data.windows("val", 32)) == sum(len(w) for w in data._windows(1, 32))
    for batch in (
        next(data.val_batches(32, 4, label_style="hf")),
        data.train_batches(32, 4, label_style="hf").next_batch(),
    ):  # Hugging Face models shift
        assert (batch["labels"] == batch["input_ids"]).all() and "loss_mask" not in batch


# --------------------------------------------------------------------------------------------------
# flags


def _spec(argv):
    import argparse

    from seqwarm.cli.commands.spec_flags import spec_from_args
    from seqwarm.cli.commands.train import add_train_flags

    p = argparse.ArgumentParser()
    add_train_flags(p)
    return spec_from_args(p.parse_args(argv))


def test_launcher_and_megatron_flag_spellings(tmp_path):
    cfg = tmp_path / "ds.json"
    assert _spec(["--local_rank=0"]).local_rank == 0
    assert _spec(["--local-rank", "1"]).local_rank == 1
    spec = _spec(
        ["--deepspeed", "--deepspeed_config", str(cfg), "--save", "out", "--pipeline-model-parallel-size", "2"]
    )
    assert (spec.deepspeed, spec.config, str(spec.out), spec.pipeline_stages) == (True, cfg, "out", 2)
    spec = _spec(
        [
            "--data-path",
            "0.3",
            "A",
            "0.7",
            "B",
            "--adam-beta1",
            "0.8",
            "--adam-beta2",
            "0.99",
            "--adam-eps",
            "1e-6",
            "--clip-grad",
            "0.5",
            "--weight-decay",
            "0.01",
            "--eval-iters",
            "3",
        ]
    )
    assert spec.data_path == ("0.3", "A", "0.7", "B") and spec.eval_iters == 3
    assert _spec(["--fp16"]).settings == {"precision": "fp16"} and _spec(["--bf16"]).settings == {"precision": "bf16"}
    assert spec.settings == {
        "adam_beta1": 0.8,
        "adam_beta2": 0.99,
        "adam_eps": 1e-6,
        "gradient_clipping": 0.5,
        "weight_decay": 0.01,
    }
    from seqwarm.run.command import train_argv

    assert "--local-rank" not in train_argv(_spec(["--local_rank=3"]))  # a launcher's flag is not the run's
    assert train_argv(spec)[:5] == ["--data-path", "0.3", "A", "0.7", "B"]


def test_adam_settings_reach_the_optimizer():
    from seqwarm.config import load_config
    from seqwarm.config.defaults import default_train_config

    cfg = load_config(default_train_config(), overrides={"adam_beta1": 0.8, "adam_beta2": 0.99, "adam_eps": 1e-6})
    assert cfg.optimizer.betas == (0.8, 0.99) and cfg.optimizer.eps == 1e-6


def test_local_rank_must_agree_with_the_launcher(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert main(["train", *FAST, "--local_rank=0", "--out", str(tmp_path / "r")]) == 2
    assert "LOCAL_RANK=1" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "compare", "tune"])
def test_data_path_flags_without_data_path_exit_2_before_any_work(tmp_path, capsys, command):
    # each names a property of Megatron indexed files; without --data-path it would be silently ignored
    argv = [
        command,
        *FAST,
        "--split",
        "1,1,1",
        "--tokenizer",
        "gpt2",
        "--vocab-size",
        "300",
        "--eod-id",
        "0",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for flag in ("--split", "--tokenizer", "--vocab-size", "--eod-id"):
        assert f"{flag} = " in err, (flag, err)
    assert "only applies with --data-path" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # refused before the experiment wrote its folder


@pytest.mark.parametrize("command", ["train", "compare", "tune", "sweep"])
def test_data_and_data_path_together_exit_2_before_any_work(tmp_path, capsys, command):
    argv = [
        command,
        *FAST,
        "--data",
        str(tmp_path / "prepared"),
        "--data-path",
        str(tmp_path / "megatron"),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--data (a seqwarm prepared folder) and --data-path (Megatron indexed files) both name" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------------------------------
# end to end (tiny CPU runs)


def test_built_in_recipe_follows_seq_length():
    from seqwarm.run.spec import RunSpec, resolve_config

    cfg = resolve_config(RunSpec(settings={"seq_length": 128}))
    assert (cfg.seq_length, cfg.curriculum.max_difficulty) == (128, 128)
    assert cfg.curriculum.schedule_config["total_curriculum_step"] == 260  # twice the recipe's 130 at 256
    assert resolve_config(RunSpec()).curriculum.schedule_config["total_curriculum_step"] == 130
    assert resolve_config(RunSpec(model="gpt2-124m")).curriculum.max_difficulty == 1024
    assert resolve_config(RunSpec(settings={"seq_length": 4})).curriculum.min_difficulty == 4


# --------------------------------------------------------------------------------------------------
# docs/MIGRATING.md


MIGRATING = (Path(__file__).resolve().parents[2] / "docs" / "MIGRATING.md").read_text()


def _tiny_command() -> str:
    block = MIGRATING.split("<!-- tiny -->", 1)[1]
    return block.split("```bash\n", 1)[1].split("```", 1)[0].strip()


def _launcher_argv(line: str) -> list[str]:
    """What the deepspeed launcher runs for ``... --module seqwarm ARGS``: ``-m seqwarm --local_rank=N ARGS``."""
    args = shlex.split(line.replace("\\\n", " ").split("--module seqwarm", 1)[1])
    return ["--local_rank=1", *[a for a in args if a != "..."]]


def test_the_launcher_recipes_parse_as_the_deepspeed_launcher_passes_them(monkeypatch):
    from seqwarm.cli import build_parser

    block = MIGRATING.split("## The launcher", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [c.strip() for c in block.replace("\\\n", " ").splitlines() if "--module seqwarm" in c]
    assert len(lines) == 2 and "--hostfile hostfile" in lines[1]
    for line in lines:
        args = build_parser().parse_args(_launcher_argv(line))
        assert (args.command, args.launcher_local_rank, args.deepspeed) == ("train", 1, True)
        assert str(args.config) == "ds_config.json"
    args = build_parser().parse_args(shlex.split(_tiny_command())[1:])
    assert args.launcher_local_rank == 0 and args.data_path == [
        "0.3",
        "data/a_text_document",
        "0.7",
        "data/b_text_document",
    ]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_files_from_megatron_cores_own_builder(tmp_path, dtype):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (optional cross-check)")
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    docs = [[1, 2, 3, BYTE_EOD], [5, 6, BYTE_EOD], [7, 8, 9, 10, 11, BYTE_EOD]]
    prefix = tmp_path / "mcore"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    builder.add_document(torch.tensor(docs[0]), [2, 2])  # a document of two sequences (sentences)
    for d in docs[1:]:
        builder.add_document(torch.tensor(d), [len(d)])
    builder.finalize(f"{prefix}.idx")
    indexed = MegatronIndexed(prefix)
    assert (indexed.num_sequences, len(indexed), indexed.dtype) == (4, 3, np.dtype(dtype))
    np.testing.assert_array_equal(indexed.tokens, np.concatenate(docs))
    assert [list(indexed.document(i)) for i in range(3)] == docs
    ours = write_megatron(tmp_path / "ours", docs, dtype)  # the fixture writer: byte for byte the same .bin
    assert open(f"{ours}.bin", "rb").read() == open(f"{prefix}.bin", "rb").read()
    data = MegatronData([str(prefix)], split="2,1,0", tokenizer="byte")
    assert data.meta["splits"]["train"] == {"tokens": 7, "documents": 2}


"""How the launched process's TCPStore (or a plain bind) says another process holds the port (any case)."""


def test_megatron_data_fingerprint_follows_its_sources():
    """Megatron files carry no checksums: the fingerprint describes the sources, so other data differs."""
    from seqwarm.data.meta import data_fingerprint

    meta = {
        "format": "megatron",
        "sources": [{"prefix": "/d/a", "weight": 1.0, "dtype": "uint16", "documents": 9}],
        "split": "969,30,1",
        "splits": {"train": {"tokens": 90}},
        "vocab_size": 100,
        "eod_id": 0,
    }
    other = {**meta, "sources": [{**meta["sources"][0], "prefix": "/d/b"}]}
    assert data_fingerprint(meta) == data_fingerprint(dict(meta)) != data_fingerprint(other)


def test_blend_weights_are_relative():
    from seqwarm.data.blend import blend_choices

    counts = []
    for weights in ([1, 2], [1 / 3, 2 / 3]):
        served = [0, 0]
        blend_choices(weights, 0, 300, served)
        counts.append(served)
    assert counts[0] == counts[1] == [100, 200]
