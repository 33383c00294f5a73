"""The memory check before the model is built (seqwarm.trainer.memory): the estimate's arithmetic, the
limit from SEQWARM_MEMORY_LIMIT, and the refusal naming the sizes and the fix."""

import pytest

from seqwarm.trainer.memory import LIMIT_ENV, check_memory, estimate_memory, host_available, parse_bytes
from seqwarm.trainer.model import GPTConfig
from seqwarm.util.errors import UserError


def test_parse_bytes_units():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("512MB") == 512 * 10**6
    assert parse_bytes("1.5e9") == 1_500_000_000
    assert parse_bytes("4096") == 4096
    for bad in ("lots", "12XB", "-1GiB", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_estimate_counts_weights_gradients_adamw_and_activations():
    est = estimate_memory(1000, vocab_rows=50, n_embd=8, n_layer=2, micro_batch=4, seq_length=16)
    assert (est.weights, est.gradients, est.optimizer) == (4000, 4000, 8000)
    # residual stream: 4*16 tokens x 8 x 4 bytes x (2 layers + embedding); logits + fp32 log-probs
    assert est.activations == 64 * 8 * 4 * 3 + 64 * 50 * 8
    assert est.total == 16000 + est.activations
    half = estimate_memory(1000, vocab_rows=50, n_embd=8, n_layer=2, micro_batch=4, seq_length=16, half=True)
    assert half.activations == 64 * 8 * 2 * 3 + 64 * 50 * 6
    sharded = estimate_memory(1000, vocab_rows=50, n_embd=8, n_layer=2, micro_batch=4, seq_length=16, shards=4)
    assert (sharded.weights, sharded.optimizer) == (1000, 2000)


def test_the_issue_model_is_about_200_gib():
    """64 layers x 4096 (about 12.9B parameters) needs over 190 GiB for weights, gradients and AdamW alone."""
    cfg = GPTConfig(vocab_size=50257, seq_length=1024, n_layer=64, n_head=32, n_embd=4096)
    est = estimate_memory(
        cfg.num_params(), vocab_rows=cfg.padded_vocab_size, n_embd=4096, n_layer=64, micro_batch=1, seq_length=1024
    )
    assert est.weights + est.gradients + est.optimizer > 190 * 2**30


def test_refusal_names_sizes_source_and_fix(monkeypatch):
    est = estimate_memory(10**9, vocab_rows=50257, n_embd=2048, n_layer=24, micro_batch=8, seq_length=1024)
    monkeypatch.setenv(LIMIT_ENV, "2GiB")
    with pytest.raises(UserError) as err:
        check_memory(est, "cpu")
    text = str(err.value)
    assert "not enough memory on cpu" in text and "1,000,000,000 parameters" in text
    assert "AdamW states 7.5 GiB" in text and f"{LIMIT_ENV}=2GiB" in text and "2.0 GiB is available" in text
    assert "smaller --model" in text and "train_micro_batch_size_per_gpu" in text
    monkeypatch.setenv(LIMIT_ENV, "1TiB")
    check_memory(est, "cpu")  # fits
    monkeypatch.setenv(LIMIT_ENV, "off")
    check_memory(estimate_memory(10**15, vocab_rows=1, n_embd=1, n_layer=1, micro_batch=1, seq_length=1), "cpu")


def test_processes_of_one_machine_share_its_memory(monkeypatch):
    est = estimate_memory(10**6, vocab_rows=256, n_embd=64, n_layer=2, micro_batch=2, seq_length=32)
    monkeypatch.setenv(LIMIT_ENV, str(est.total * 3))
    check_memory(est, "cpu", local_processes=2)
    with pytest.raises(UserError, match="for each of 4 processes"):
        check_memory(est, "cpu", local_processes=4)


def test_bad_limit_names_the_variable(monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "plenty")
    est = estimate_memory(10, vocab_rows=2, n_embd=2, n_layer=1, micro_batch=1, seq_length=2)
    with pytest.raises(UserError, match=rf"{LIMIT_ENV}=plenty: .*not a size.*or to off"):
        check_memory(est, "cpu")


def test_the_machine_reports_free_memory(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    found = host_available()
    assert found is not None and found[0] > 0
    huge = estimate_memory(10**15, vocab_rows=1, n_embd=1, n_layer=1, micro_batch=1, seq_length=1)
    with pytest.raises(UserError, match="not enough memory on cpu"):
        check_memory(huge, "cpu")
