"""Length buckets (issue #14, item 2): cut to the length rounded up to a multiple, mask the loss past the
length, count only the length — the loss and gradients of the plain cut, on a few static shapes."""

import numpy as np
import pytest
import torch

from conftest import small_config
from seqwarm.config import ConfigError, load_config
from seqwarm.curriculum.batch import bucket_batch, bucket_length, truncate_batch
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.data.dataset import build_batch
from seqwarm.trainer.metrics import read_metrics
from seqwarm.trainer.model import GPT, GPTConfig


def _batch(rows=3, seq=20, **opts):
    return build_batch(np.random.default_rng(2).integers(0, 50, (rows, seq + 1)), **opts)


def test_bucket_batch_keeps_a_multiple_of_columns_and_masks_the_loss_past_the_length():
    batch = _batch(eod_id=0, eod_mask_loss=True)
    before = {k: v.clone() for k, v in batch.items()}
    out = bucket_batch(batch, 5, 8)
    assert all(v.shape == (3, 8) for v in out.values())
    assert torch.equal(out["input_ids"], batch["input_ids"][:, :8])
    assert torch.equal(out["labels"][:, :5], batch["labels"][:, :5]) and bool((out["labels"][:, 5:] == -100).all())
    assert torch.equal(out["loss_mask"][:, :5], batch["loss_mask"][:, :5]) and not out["loss_mask"][:, 5:].any()
    assert all(torch.equal(batch[k], v) for k, v in before.items())  # the input is not changed
    # a length on a bucket edge, or a multiple of 1, is the plain cut; the last bucket stops at the batch
    for seqlen, multiple in ((8, 8), (5, 1)):
        cut = truncate_batch(batch, seqlen)
        assert all(torch.equal(bucket_batch(batch, seqlen, multiple)[k], cut[k]) for k in cut)
    assert bucket_length(17, 8, 20) == 20 and bucket_batch(batch, 17, 8)["labels"].shape == (3, 20)
    assert bool((bucket_batch(batch, 17, 8)["labels"][:, 17:] == -100).all())
    assert bucket_length(30, 8, 20) == 20 and bucket_batch(batch, 30, 8)["labels"].equal(batch["labels"])


def test_bucket_batch_refuses_what_it_cannot_mask():
    batch = _batch()
    with pytest.raises(ValueError, match="no 'labels' tensor"):
        bucket_batch({"input_ids": batch["input_ids"]}, 5, 8)
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="bucket multiple must be an int >= 1"):
            bucket_batch(batch, 5, bad)


@pytest.mark.parametrize("with_mask", [True, False])
def test_a_bucket_gives_the_loss_and_gradients_of_the_plain_cut(with_mask, one_thread):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=50, seq_length=32, dropout=0.0))
    full = _batch(rows=4, seq=32, eod_id=0, eod_mask_loss=True)
    if not with_mask:
        full = {k: v for k, v in full.items() if k != "loss_mask"}
    for seqlen in (3, 9, 17):
        results = []
        for batch in (truncate_batch(full, seqlen), bucket_batch(full, seqlen, 16)):
            model.zero_grad()
            loss = model(**batch)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        (loss_cut, grads_cut), (loss_bucket, grads_bucket) = results
        assert torch.allclose(loss_cut, loss_bucket, rtol=1e-6, atol=1e-7), seqlen
        # equal up to the rounding of matmuls of another shape (about 1e-6 of each gradient's scale)
        assert all((a - b).abs().max() <= 1e-5 * a.abs().max() for a, b in zip(grads_cut, grads_bucket)), seqlen
    # and it can fail: without the mask past the length, the loss is another one
    plain = truncate_batch(full, 16)
    assert not torch.allclose(model(**truncate_batch(full, 9)), model(**plain))


def test_a_hugging_face_model_that_shifts_its_labels_gets_the_plain_cut_too(one_thread):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 50, (2, 32)))
    full = {"input_ids": ids, "labels": ids.clone()}  # Hugging Face layout: the model shifts
    cut = model(**truncate_batch(full, 11)).loss
    bucket = model(**bucket_batch(full, 11, 16)).loss
    assert torch.allclose(cut, bucket, rtol=1e-6, atol=1e-7)


def _core(tmp_path, **extra) -> SequenceLengthWarmup:
    cfg = load_config(small_config(tmp_path / "c.json", total_step=6, **extra))
    return SequenceLengthWarmup.from_config(cfg, GPT(GPTConfig.preset("tiny", vocab_size=50, seq_length=64)).forward)


def test_the_warmup_cuts_into_buckets_and_counts_the_length(tmp_path):
    core = _core(tmp_path, length_bucket=16)
    assert core.mode == "truncate" and _core(tmp_path).mode == "inject"  # the GPT takes curriculum_seqlen
    batch = build_batch(np.zeros((4, 65), dtype=np.int64))
    seen = []
    for _ in range(8):
        length = core.begin_step()
        out = core.cut(batch)
        assert out["input_ids"].shape == (4, min(64, -(-length // 16) * 16)) == core.micro_shape
        assert int((out["labels"] != -100).sum()) == 4 * length
        before = core.progress.tokens
        assert core.end_step().tokens - before == 4 * length  # counted at the length, not the bucket
        seen.append(length)
    assert len(set(seen)) > 4 and seen[-1] == 64


def test_a_length_bucket_is_refused_where_it_cannot_work(tmp_path):
    for value, match in ((0, "length_bucket = 0: must be positive"), (16.5, "length_bucket = 16.5")):
        with pytest.raises(ConfigError, match=match):
            load_config(small_config(tmp_path / "c.json", length_bucket=value))
    with pytest.raises(ConfigError, match="works only in curriculum mode truncate, not reshape"):
        load_config(small_config(tmp_path / "c.json", length_bucket=16, curriculum_mode="reshape"))
    cfg = load_config(small_config(tmp_path / "c.json", length_bucket=16))
    with pytest.raises(ValueError, match="works only in curriculum mode truncate, not inject"):
        SequenceLengthWarmup.from_config(
            cfg, GPT(GPTConfig.preset("tiny", vocab_size=50, seq_length=64)).forward, mode="inject"
        )
    assert load_config(small_config(tmp_path / "c.json"), overrides={"length_bucket": 32}).length_bucket == 32


def test_a_run_with_length_buckets_trains_the_numbers_of_the_plain_cut(tmp_path, byte_data, one_thread):
    from helpers import tiny_run

    rows = {}
    for name, extra in (("cut", {"curriculum_mode": "truncate"}), ("bucket", {"length_bucket": 16})):
        config = small_config(tmp_path / f"{name}.json", train_tokens=4000, total_step=7, **extra)
        run = tiny_run(tmp_path / name, byte_data, config, dropout=0.0)
        result = run.train()
        rows[name] = (
            [r for r in read_metrics(run.run_dir / "metrics.jsonl") if r["kind"] == "train"],
            result.final_val_loss,
        )
    (cut, cut_val), (bucket, bucket_val) = rows["cut"], rows["bucket"]
    assert len(cut) == len(bucket) > 4
    assert [(r["seqlen"], r["tokens"]) for r in cut] == [(r["seqlen"], r["tokens"]) for r in bucket]
    assert len({r["seqlen"] for r in cut}) > 3
    assert np.allclose([r["loss"] for r in cut], [r["loss"] for r in bucket], rtol=1e-4)
    assert bucket_val == pytest.approx(cut_val, rel=1e-4)


def test_the_pipeline_loss_of_a_bucket_is_the_loss_of_the_plain_cut(one_thread):
    from seqwarm.integrations.deepspeed.pipeline import gpt_pipeline_loss, to_pipe_batch

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=50, seq_length=32, dropout=0.0))
    full = {k: v for k, v in _batch(rows=2, seq=32).items() if k != "loss_mask"}  # the loop leaves a trivial one out
    (ids, pos), targets = to_pipe_batch(bucket_batch(full, 9, 16))
    assert ids.shape == (2, 16) and not targets[1][:, 9:].any() and bool(targets[1][:, :9].all())
    logits = model(input_ids=ids, position_ids=pos)
    assert torch.allclose(gpt_pipeline_loss(logits, targets), model(**truncate_batch(full, 9)), rtol=1e-6)


def test_a_length_bucket_without_a_curriculum_is_said_to_do_nothing(tmp_path):
    cfg = load_config(small_config(tmp_path / "c.json", length_bucket=16), overrides={"curriculum": False})
    assert any("length_bucket 16 has no effect without a curriculum" in w for w in cfg.warnings)
    assert SequenceLengthWarmup.from_config(cfg).bucket is None
