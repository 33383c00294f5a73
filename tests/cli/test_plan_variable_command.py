"""`seqwarm plan --curriculum-mode variable`: the variable-length run from the training documents' index."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import small_config
from seqwarm.cli import main
from seqwarm.curriculum.decompose import decompose
from seqwarm.curriculum.plan_variable import plan_variable
from seqwarm.data.indexed import IndexedWriter, MegatronIndexed


def plan_json(argv, capsys) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "--json prints one line"
    return json.loads(out)


def test_the_plan_reads_the_prepared_folders_train_documents(tmp_path, byte_data, capsys):
    config = small_config(tmp_path / "c.json", seq=64, batch=8, train_tokens=40_000)
    argv = [str(config), "--data", str(byte_data), "--curriculum-mode", "variable", "--variable-curriculum"]
    plan = plan_json([*argv, "grow_p2", "--variable-cycles", "2", "--seed", "7"], capsys)
    offsets = MegatronIndexed(byte_data / "train").doc_offsets
    expected = plan_variable(
        decompose(offsets, 8, 64), 8 * 64, curriculum="grow_p2", num_cycles=2, seed=7, train_tokens=40_000
    )
    assert plan["mode"] == "variable" and plan["tokens_per_step"] == 512 == expected.tokens_per_step
    assert [(b["length"], b["steps"], b["chunks"]) for b in plan["buckets"]] == [
        (b.length, b.steps, b.chunks) for b in expected.buckets
    ]
    assert plan["total_steps"] == expected.total_steps == 79 and plan["documents"] == len(offsets) - 1
    assert plan["data"].endswith("train") and plan["points"][-1]["lr"] == pytest.approx(0.0002)
    # the table says the same
    assert main(["plan", *argv, "grow_p2", "--variable-cycles", "2", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "curriculum grow_p2, 2 cycles an epoch, seed 7" in out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["64"])
    assert f"{expected.buckets[-1].steps:,}" in row.split()


def test_a_config_that_says_variable_is_planned_in_that_mode_with_the_blocks_schedule(tmp_path, byte_data, capsys):
    config = small_config(tmp_path / "c.json", seq=64, total_step=20, train_tokens=30_000, curriculum_mode="variable")
    plan = plan_json([str(config), "--data", str(byte_data)], capsys)
    # the block's fixed_linear from 8: the cap starts at the shortest length that has a step (8 and 16 have
    # fewer chunks than one step's rows here) and reaches 64 by step 20
    shortest = min(b["length"] for b in plan["buckets"] if b["steps_per_epoch"])
    assert plan["curriculum"] == "schedule" and plan["caps"][0] == [1, shortest] and shortest > 8
    assert plan["caps"][-1][1] == 64 and plan["caps"][-1][0] <= 20
    capped = [p for p in plan["points"] if p["cap"] is not None]
    assert all(p["longest"] <= p["cap"] for p in capped)


def test_the_variable_plans_mistakes_are_one_line_and_exit_2(tmp_path, byte_data, capsys, caplog):
    config = small_config(tmp_path / "c.json", seq=48)
    base = [str(config), "--data", str(byte_data), "--curriculum-mode", "variable"]
    assert main(["plan", *base]) == 2
    err = capsys.readouterr().err
    assert "max_difficulty" in err and "powers of 2" in err and "Traceback" not in err
    config = small_config(tmp_path / "d.json", seq=64)
    with pytest.raises(SystemExit) as exit_:  # the plan takes train's flags, and no flag of its own
        main(["plan", str(config), "--curriculum-mode", "variable", "--num-cycles", "3"])
    assert exit_.value.code == 2
    assert "--variable-cycles" in capsys.readouterr().err
    argv = [str(config), "--data", str(byte_data), "--curriculum-mode", "variable", "--variable-cycles", "3"]
    assert main(["plan", *argv]) == 0  # as train says it: cycles are grow_p2's
    assert "variable_cycles has no effect with variable_curriculum schedule" in capsys.readouterr().err + caplog.text
    assert main(["plan", str(config), "--curriculum-mode", "variable", "--data", str(tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_megatron_data_path_plans_its_train_split(tmp_path, capsys):
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 300, 200)
    writer = IndexedWriter(tmp_path / "corpus_text_document", np.dtype(np.uint16))
    writer.add_documents(rng.integers(0, 250, int(lengths.sum())).astype(np.uint16), lengths)
    writer.close()
    config = small_config(tmp_path / "c.json", seq=64, train_tokens=20_000)
    argv = [str(config), "--data-path", str(tmp_path / "corpus_text_document"), "--curriculum-mode", "variable"]
    plan = plan_json([*argv, "--variable-curriculum", "natural", "--split", "90,10,0"], capsys)
    assert plan["documents"] == 180 and "(--split 90,10,0; 180 documents)" in plan["data"]
    expected = decompose(np.concatenate([[0], np.cumsum(lengths[:180])]), 8, 64)
    assert [b["chunks"] for b in plan["buckets"]] == list(expected.chunks_per_bucket())


def _megatron_file(prefix, seed, docs=200):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(10, 300, docs)
    writer = IndexedWriter(prefix, np.dtype(np.uint16))
    writer.add_documents(rng.integers(0, 250, int(lengths.sum())).astype(np.uint16), lengths)
    writer.close()
    return str(prefix)


def test_a_blend_is_planned_per_source_with_its_weights(tmp_path, capsys):
    a, b = _megatron_file(tmp_path / "a_text_document", 1), _megatron_file(tmp_path / "b_text_document", 2, 400)
    config = small_config(tmp_path / "c.json", seq=64, train_tokens=100 * 512, curriculum_mode="variable")
    argv = [str(config), "--data-path", "1", a, "3", b, "--split", "1,0,0", "--variable-curriculum", "natural"]
    plan = plan_json(argv, capsys)
    assert [s["steps"] for s in plan["sources"]] == [25, 75]
    assert [s["weight"] for s in plan["sources"]] == [0.25, 0.75] and plan["documents"] == 600
    assert {b["source"] for b in plan["buckets"]} == {0, 1}
    assert main(["plan", *argv]) == 0
    out = capsys.readouterr().out
    assert "source 1:" in out and "weight 75.0%" in out and "one source a step, by its weight" in out


def test_the_variable_plan_imports_no_torch(tmp_path, byte_data):
    config = small_config(tmp_path / "c.json", seq=64)
    a, b = _megatron_file(tmp_path / "a_text_document", 1), _megatron_file(tmp_path / "b_text_document", 2)
    code = (
        "import sys; from seqwarm.cli import main; "
        f"assert main(['plan', {str(config)!r}, '--data', {str(byte_data)!r}, '--curriculum-mode', 'variable', "
        f"'--json']) == 0; assert main(['plan', {str(config)!r}, '--data-path', {a!r}, {b!r}, "
        "'--curriculum-mode', 'variable', '--json']) == 0; assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
