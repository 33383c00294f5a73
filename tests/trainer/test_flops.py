"""Model FLOPs and MFU of the span a step trained (issue #38 item 3): the formula against hand-computed
values (a causal row, a windowed row, a row of three documents, a length bucket), the peak (given, known
by exact CUDA name, else none), the metrics row and console line, and a tiny run logging `mfu`."""

import json

import pytest
import torch
import torch.nn as nn

from conftest import small_config
from seqwarm import ConfigError, load_config
from seqwarm.curriculum.batch import truncate_batch, window_batch
from seqwarm.trainer.flops import FlopsMeter, attention_pairs, batch_flops, known_peak, matmul_params
from seqwarm.trainer.metrics import MetricsLogger, console_line

# a made-up model for the arithmetic: N = 100 parameters, 2 layers of width 4: 12 * 2 * 4 = 96 FLOPs a pair
N, LAYERS, D = 100, 2, 4


def _batch(rows: int, columns: int, document_ids=None) -> dict:
    batch = {"input_ids": torch.zeros(rows, columns, dtype=torch.long)}
    if document_ids is not None:
        batch["document_ids"] = torch.tensor(document_ids)
    return batch


def test_a_causal_row_counts_its_causal_pairs():
    # 8 tokens: 6 * 100 * 8 = 4800 for the matmuls; 1 + 2 + ... + 8 = 36 pairs x 96 = 3456 for attention
    assert attention_pairs(1, 8) == 36
    assert batch_flops(_batch(1, 8), N, LAYERS, D) == 4800 + 3456
    assert batch_flops(_batch(3, 8), N, LAYERS, D) == 3 * (4800 + 3456)  # rows add up


def test_a_short_step_counts_its_length_not_the_full_one():
    full = _batch(2, 10)
    short = truncate_batch(full, 4)  # what a truncate step at length 4 trains: 2 rows x 4 tokens, 10 pairs each
    assert batch_flops(short, N, LAYERS, D) == 6 * N * 8 + 96 * 20 == 6720
    assert batch_flops(full, N, LAYERS, D) == 6 * N * 20 + 96 * 110 == 22560


def test_a_windowed_row_counts_each_fragment_alone():
    # window 4 over a row of 10: fragments of 4, 4 and 2 tokens -> 10 + 10 + 3 = 23 pairs, every token trained
    cut = window_batch(_batch(1, 10), 4)
    assert attention_pairs(1, 10, cut["document_ids"]) == 23
    assert batch_flops(cut, N, LAYERS, D) == 6 * N * 10 + 96 * 23 == 8208
    assert batch_flops(window_batch(_batch(1, 10), 10), N, LAYERS, D) == 6000 + 96 * 55  # one fragment: causal


def test_a_row_of_three_documents_counts_each_document_alone():
    ids = [[0, 0, 0, 1, 1, 2, 2, 2, 2, 2]]  # documents of 3, 2 and 5 tokens: 6 + 3 + 15 = 24 pairs, not 55
    assert attention_pairs(1, 10, torch.tensor(ids)) == 24
    assert batch_flops(_batch(1, 10, ids), N, LAYERS, D) == 6000 + 96 * 24 == 8304
    # two rows: a block never runs on across the row boundary, even with the same id at the seam
    two = [[0, 0, 1, 1, 1], [1, 1, 1, 2, 2]]
    assert attention_pairs(2, 5, torch.tensor(two)) == (3 + 6) + (6 + 3)
    # documents and window fragments together (window_batch numbers the blocks): 3 | 1 | 1 | 3 | 2 tokens
    cut = window_batch(_batch(1, 10, ids), 4)
    assert attention_pairs(1, 10, cut["document_ids"]) == 6 + 1 + 1 + 6 + 3 == 17


def test_a_length_bucket_counts_the_columns_up_to_the_length():
    # the bucket keeps 8 columns but trains 5 (the rest is masked out of the loss): 5 tokens, 15 pairs
    assert batch_flops(_batch(1, 8, [[0] * 8]), N, LAYERS, D, columns=5) == 6 * N * 5 + 96 * 15
    meter = FlopsMeter(N, LAYERS, D, 100.0, window=False)
    meter.add(_batch(1, 8), 5)
    assert meter.take() == 6 * N * 5 + 96 * 15 and meter.take() == 0  # a step at a time


def test_the_meter_sums_a_steps_micro_batches_and_shares_them_over_devices():
    window = FlopsMeter(N, LAYERS, D, 100.0, window=True, share=0.5)  # e.g. two pipeline stages per replica
    for _ in range(2):
        cut = window.add(window_batch(_batch(1, 10), 4), 4)  # window mode: every column, whatever the length
        assert "document_ids" in cut
    assert window.take() == 0.5 * 2 * 8208
    off = FlopsMeter(0, 0, 0, None, window=False)
    off.add(_batch(1, 8), 8)
    assert off.take() == 0 and off.resolved == {}


def test_n_is_every_parameter_but_embedding_lookups():
    from seqwarm.trainer.model import GPT, GPTConfig

    for rotary in (False, True):  # learned positions (left out) or rotary; the tied LM head counted once
        cfg = GPTConfig.preset("tiny", vocab_size=300, seq_length=64, rotary=rotary)
        with torch.device("meta"):
            model = GPT(cfg)
        assert matmul_params(model) == cfg.num_params(non_embedding=True)
    untied = nn.ModuleDict({"embed": nn.Embedding(50, 8), "head": nn.Linear(8, 50, bias=False)})
    assert matmul_params(untied) == 8 * 50  # the input embedding is a lookup: no FLOPs


def test_the_peak_is_given_or_known_by_its_exact_cuda_name(monkeypatch):
    cuda = torch.device("cuda", 0)
    assert known_peak(torch.device("cpu"), "bf16") is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert known_peak(cuda, "bf16") == (989.5, "NVIDIA H200, dense bf16")
    assert known_peak(cuda, "fp32") is None  # no fp32 / TF32 table: no guess
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert known_peak(cuda, "bf16") is None  # a slice of a device is not the device


def test_peak_tflops_is_a_setting_checked_like_the_others():
    from seqwarm.cli import build_parser
    from seqwarm.cli.commands.common import overrides_from_args

    base = {"train_batch_size": 8, "curriculum_learning": {"enabled": False}}
    assert load_config({**base, "seqwarm": {"peak_tflops": 312}}).peak_tflops == 312.0
    assert load_config(base).peak_tflops is None
    for bad in (0, -1, "312"):
        with pytest.raises(ConfigError, match="peak_tflops"):
            load_config({**base, "seqwarm": {"peak_tflops": bad}})
    args = build_parser().parse_args(["train", "--peak-tflops", "989.5"])
    assert overrides_from_args(args) == {"peak_tflops": 989.5}


def test_a_train_row_gets_model_tflops_and_mfu_only_with_a_peak(tmp_path):
    rows = {}
    for peak in (None, 50.0):
        log = MetricsLogger(tmp_path / str(peak), budget_tokens=None, is_main=True, log_interval=1, peak_tflops=peak)
        log.step(100, 100, 3.0, 2.0, flops=40e12)
        log.step(200, 100, 3.0, 2.0, flops=60e12)
        rows[peak] = log.train_row({"step": 2, "tokens": 200, "samples": 2, "seqlen": 8, "lr": 1e-3}, {}, None)
    assert "mfu" not in rows[None] and "model_tflops" not in rows[None]
    assert rows[50.0]["model_tflops"] == pytest.approx(25.0) and rows[50.0]["mfu"] == pytest.approx(0.5)
    assert "| mfu 50.0% | eta" in console_line(rows[50.0], None, None, 10.0)
    assert "mfu" not in console_line(rows[None], None, None, 10.0)


@pytest.mark.parametrize("mode", ["truncate", "window"])
def test_a_tiny_run_logs_the_mfu_of_the_span_each_step_trained(tmp_path, byte_data, capsys, one_thread, mode):
    from helpers import tiny_run

    config = small_config(tmp_path / "c.json", train_tokens=600, peak_tflops=0.5, curriculum_mode=mode)
    run = tiny_run(tmp_path / "run", byte_data, config, memory_probe=False)
    run.train()
    cfg = run.model_cfg
    n, per_pair = cfg.num_params(non_embedding=True), 12 * cfg.n_layer * cfg.n_embd
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "train"]
    before = 0
    for row in rows:  # one step a row: its FLOPs = TFLOP/s x its seconds (its tokens over tokens/s)
        length, seconds = row["seqlen"], (row["tokens"] - before) / row["tokens_per_s"]
        before = row["tokens"]
        if mode == "truncate":  # 8 rows of `length` tokens
            expected = 6 * n * 8 * length + per_pair * 8 * length * (length + 1) // 2
        else:  # 8 rows of 64 tokens, in fragments of `length`
            q, r = divmod(64, length)
            expected = 6 * n * 8 * 64 + per_pair * 8 * (q * length * (length + 1) // 2 + r * (r + 1) // 2)
        assert row["model_tflops"] * 1e12 * seconds == pytest.approx(expected, rel=1e-6)
        assert row["mfu"] == pytest.approx(row["model_tflops"] / 0.5)
    assert rows[0]["seqlen"] < 64  # short steps were counted at their span
    assert run.resolved["mfu"]["peak_tflops"] == 0.5 and run.resolved["mfu"]["n_params"] == n  # config.json's
    assert "| mfu " in capsys.readouterr().out
    from seqwarm.trainer.record import format_start

    assert "mfu:         of 0.5 TFLOP/s per device (--peak-tflops)" in format_start(run)


def test_a_hugging_face_models_n_leaves_its_position_table_out(tmp_path):
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from seqwarm.integrations.hf.run import HFModelConfig

    gpt2 = {"model_type": "gpt2", "n_positions": 64, "n_embd": 16, "n_layer": 1, "n_head": 2, "vocab_size": 300}
    (tmp_path / "config.json").write_text(json.dumps({**gpt2, "bos_token_id": 0, "eos_token_id": 0}))
    model = HFModelConfig.from_path(tmp_path / "config.json", vocab_size=300, seq_length=64)
    choices = SimpleNamespace(precision="fp32", mode="truncate")
    meter = FlopsMeter.for_run(model, SimpleNamespace(peak_tflops=1.0), torch.device("cpu"), choices, 1.0)
    # GPT-2's LM head is tied to wte (counted once); wpe (64 x 16) is a lookup
    assert (meter.n_params, meter.n_layer, meter.d_model) == (model.total_params - 64 * 16, 1, 16)
    assert meter.resolved["mfu"]["source"] == "--peak-tflops"
    no_peak = FlopsMeter.for_run(model, SimpleNamespace(peak_tflops=None), torch.device("cpu"), choices, 1.0)
    assert no_peak.peak_tflops is None  # a CPU has no known peak: no MFU
