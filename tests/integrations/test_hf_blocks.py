"""Document masking and the window mode on a Hugging Face model (issue #25): a packed row gives every
document the logits and losses it has alone, for each attention implementation seqwarm claims on CPU;
what would attend across documents is refused."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from conftest import FAST_TRAIN_FLAGS, small_config  # noqa: E402
from helpers import offline_val_masks_documents_as_training_did, save_tiny_llama, tiny_llama_config  # noqa: E402
from seqwarm.curriculum.batch import window_batch  # noqa: E402
from seqwarm.data.dataset import build_batch  # noqa: E402
from seqwarm.integrations.hf import blocks  # noqa: E402
from seqwarm.integrations.hf.run import CausalLMLoss  # noqa: E402
from seqwarm.util.errors import UserError  # noqa: E402

VOCAB, EOD = 64, 0


def llama(impl: str = "sdpa", cls=None):
    torch.manual_seed(0)
    config = tiny_llama_config(
        VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        attn_implementation=impl,
    )
    return (cls or transformers.LlamaForCausalLM)(config).eval()


def packed_batch():
    """Two HF-style rows of 12 tokens (labels = input_ids), documents ending at EOD: 3 and 2 per row."""
    rng = np.random.default_rng(0)
    windows = rng.integers(1, VOCAB, (2, 13))
    windows[0, [4, 8]] = EOD  # row 0: documents of 5, 4 and 3 tokens
    windows[1, [6]] = EOD  # row 1: 7 and 5
    return build_batch(windows, eod_id=EOD, label_style="hf", document_masking=True)


def alone(lm, batch):
    """Each block of ``batch["document_ids"]`` run on its own: logits (B, S, V) laid back in place."""
    ids, docs = batch["input_ids"], batch["document_ids"]
    out = torch.empty(*ids.shape, VOCAB)
    with torch.no_grad():
        for r in range(ids.shape[0]):
            for d in docs[r].unique():
                cols = (docs[r] == d).nonzero().view(-1)
                assert torch.equal(cols, torch.arange(int(cols[0]), int(cols[-1]) + 1))  # a block is one run
                out[r, cols] = lm(input_ids=ids[r : r + 1, cols]).logits[0]
    return out


def hf_loss(logits, labels):
    """The mean loss an HF model gives: logits[t] predicts labels[t + 1], -100 ignored."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)


def check_matches_alone(lm, batch):
    wrapped = CausalLMLoss(lm)
    expected = alone(lm, batch)
    with torch.no_grad():
        logits = wrapped(**{k: v for k, v in batch.items() if k != "labels"})
        loss = wrapped(**batch)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    # The same targets as seqwarm's GPT: an EOD still predicts the next document's first token
    torch.testing.assert_close(loss, hf_loss(expected, batch["labels"]), atol=1e-5, rtol=0)
    full = lm(input_ids=batch["input_ids"]).logits  # what the model does without the blocks
    assert (full - expected).abs().max() > 1e-2  # the comparison can tell attention across documents apart


def gpt2(impl: str):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=EOD, eos_token_id=EOD
    )
    config._attn_implementation = impl
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("build", [llama, gpt2], ids=["llama", "gpt2"])
def test_packed_documents_give_the_logits_and_loss_of_each_document_alone(build, impl):
    batch = packed_batch()
    assert len(batch["document_ids"].unique()) == 5
    check_matches_alone(build(impl), batch)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("documents", [True, False])
def test_window_fragments_attend_only_inside_themselves(impl, documents):
    batch = packed_batch()
    if not documents:
        batch = {k: v for k, v in batch.items() if k != "document_ids"}
    cut = window_batch(batch, 4)  # fragments of 4 tokens, cut again at each document when masking
    assert cut["input_ids"].shape == (2, 12)
    assert len(cut["document_ids"].unique()) == (9 if documents else 6)
    check_matches_alone(llama(impl), cut)


def test_rows_laid_end_to_end_keep_the_blocks_and_the_loss(monkeypatch):
    # flash-attention's path (one row of B*S), run here on sdpa, which masks a single row the same way
    monkeypatch.setattr(blocks, "BY_ROW", ("eager",))
    monkeypatch.setattr(blocks, "AS_ONE_ROW", ("sdpa",))
    check_matches_alone(llama("sdpa"), packed_batch())


def test_block_positions_restart_at_each_run_of_ids():
    docs = torch.tensor([[3, 3, 3, 7, 7, 9], [4, 4, 4, 4, 4, 4]])
    assert blocks.block_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_the_probe_passes_a_model_that_masks_and_restores_its_mode():
    lm = llama("sdpa").train()
    blocks.check_block_attention(lm, "--document-masking", "LlamaForCausalLM")
    assert lm.training


def test_a_model_that_attends_across_documents_is_refused():
    class IgnoresPositions(transformers.LlamaForCausalLM):  # a model that masks by its own rules
        def forward(self, *args, position_ids=None, **kwargs):
            return super().forward(*args, **kwargs)

    lm = llama("sdpa", IgnoresPositions)
    with pytest.raises(UserError, match="attends across documents.*--document-masking"):
        blocks.check_block_attention(lm, "--document-masking", "IgnoresPositions")


def test_a_kv_cache_would_turn_the_blocks_off():
    # why block_forward passes use_cache=False: with the config's default a cache is built and
    # transformers then ignores the restarting positions
    lm, batch = llama("sdpa"), packed_batch()
    positions = blocks.block_positions(batch["document_ids"])
    with torch.no_grad():
        cached = lm(input_ids=batch["input_ids"], position_ids=positions).logits
    assert (cached - alone(lm, batch)).abs().max() > 1e-2


def test_an_implementation_that_does_not_mask_is_refused_naming_what_works():
    lm = llama("paged|eager")  # continuous batching's: transformers builds no mask for it
    with pytest.raises(UserError, match=r"'paged\|eager'.*'sdpa' \(the default\) or 'eager'"):
        blocks.check_block_attention(lm, "curriculum_mode 'window'", "LlamaForCausalLM")
    with pytest.raises(ValueError, match="does not mask blocks"):
        CausalLMLoss(lm)(**packed_batch())


# -- seqwarm train --model hf:PATH ------------------------------------------------------------------


def _hf_model(tmp_path, **extra):
    return save_tiny_llama(tmp_path / "llama", **extra)


def _train(tmp_path, byte_data, name, model, *extra):
    from seqwarm.cli import main

    cfg = small_config(tmp_path / f"{name}.json", train_tokens=600, seq=64, batch=4, micro=2)
    out = tmp_path / name
    args = ["train", *FAST_TRAIN_FLAGS, "--device", "cpu", "--log-interval", "1", "--config", str(cfg)]
    args += ["--data", str(byte_data)]  # on CPU in fp32: the offline evaluation matches it to 1e-5
    return main([*args, "--out", str(out), "--model", f"hf:{model}", *extra]), out


@pytest.mark.slow  # two short runs of a 1-layer Llama, about 20 s on two busy cores
def test_seqwarm_train_hf_with_document_masking_and_in_window_mode(tmp_path, byte_data, caplog):
    caplog.set_level(logging.INFO, logger="seqwarm.integrations.hf.run")
    model = _hf_model(tmp_path)
    code, masked = _train(tmp_path, byte_data, "masked", model, "--document-masking")
    assert code == 0
    assert "restarting at each document, use_cache=False" in caplog.text  # said at the start of the run
    assert "still predicts the next one's first token" in caplog.text
    assert json.loads((masked / "config.json").read_text())["run"]["document_masking"] is True
    offline_val_masks_documents_as_training_did(masked)  # `seqwarm eval --val` through the same blocks
    code, window = _train(tmp_path, byte_data, "window", model, "--curriculum-mode", "window")
    assert code == 0
    rows = [json.loads(line) for line in (window / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    assert train[0]["seqlen"] < 64 and train[0]["tokens"] == 4 * 64  # full rows, the attention span cut
    assert json.loads((window / "config.json").read_text())["run"]["curriculum"]["mode"] == "window"


def test_seqwarm_train_hf_refuses_what_would_attend_across_documents(tmp_path, byte_data, capsys):
    code, _ = _train(
        tmp_path, byte_data, "r", _hf_model(tmp_path, attn_implementation="paged|eager"), "--document-masking"
    )
    err = capsys.readouterr().err
    assert code == 2 and "'paged|eager'" in err and "Traceback" not in err
