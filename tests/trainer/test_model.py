"""The GPT model: shapes, parameter counts, curriculum_seqlen cut, rotary slicing, loss masks."""

from __future__ import annotations

import pytest
import torch

from seqwarm.config.defaults import PRESETS
from seqwarm.curriculum.batch import truncate_batch
from seqwarm.trainer.model import GPT, GPTConfig

SMALL = dict(vocab_size=97, seq_length=32, n_layer=2, n_head=2, n_embd=32)


def small(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**SMALL, **overrides}))


def batch(b=3, s=16, vocab=97, seed=1) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (b, s + 1), generator=g)
    mask = (torch.rand(b, s, generator=g) > 0.3).float()
    pos = torch.arange(s).repeat(b, 1)
    pos[:, s // 2 :] -= s // 2  # an EOD reset in the middle of every row
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": mask, "position_ids": pos}


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_shapes_and_logits_without_labels():
    model = small()
    b = batch()
    logits = model(b["input_ids"])
    assert logits.shape == (3, 16, 97)
    loss = model(**b)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_tiny_preset_and_published_sizes():
    tiny = GPT(GPTConfig.preset("tiny"))
    assert 5.0e6 < tiny.num_params() < 5.6e6
    assert tiny.num_params() == tiny.config.num_params()
    published = {
        "gpt2-124m": 124_439_808,
        "gpt2-350m": 354_823_168,
        "gpt2-774m": 774_030_080,
        "gpt2-1.5b": 1_557_611_200,
    }
    for name, count in published.items():
        padded = GPTConfig.preset(name)  # 50304 rows: 47 padded rows of the embedding more
        assert padded.num_params() == count + 47 * padded.n_embd, name
        cfg = GPTConfig.preset(name, vocab_multiple=1)  # the published sizes count 50257 rows
        assert cfg.num_params() == count, name
        with torch.device("meta"):
            assert GPT(cfg).num_params() == count, name
    for flags in (dict(bias=False), dict(rotary=True), dict(bias=False, rotary=True)):
        cfg = GPTConfig(**{**SMALL, **flags})
        assert GPT(cfg).num_params() == cfg.num_params()
        assert GPT(cfg).num_params(non_embedding=True) == cfg.num_params(non_embedding=True)


def test_preset_errors_and_overrides():
    with pytest.raises(ValueError, match="tiny, nano, gpt2-124m"):
        GPTConfig.preset("gpt5")
    assert GPTConfig.preset("gpt2-124m", vocab_size=50304).vocab_size == 50304
    assert set(PRESETS) == {"tiny", "nano", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"}
    assert GPTConfig.preset("nano").num_params() == 640_768  # the CPU-science model, mostly embedding
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(**{**SMALL, "n_head": 3})


def test_init_scales_residual_projections():
    cfg = GPTConfig.preset("tiny", n_layer=8)
    model = GPT(cfg)
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in model.blocks])
    fc = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.blocks])
    assert abs(fc.std().item() - 0.02) < 0.002
    assert abs(proj.std().item() - 0.02 / (2 * 8) ** 0.5) < 0.001
    assert model.lm_head.weight is model.wte.weight


@pytest.mark.parametrize("rotary", [False, True])
def test_curriculum_seqlen_equals_hand_truncated_batch(rotary):
    b = batch()
    model = small(rotary=rotary)
    loss_cut = model(**b, curriculum_seqlen=5)
    loss_cut.backward()
    g_cut = grads(model)
    model.zero_grad()
    loss_hand = model(**truncate_batch(b, 5))
    loss_hand.backward()
    assert torch.equal(loss_cut, loss_hand)
    for name, g in grads(model).items():
        assert torch.equal(g, g_cut[name]), name
    # a length at or above S is a no-op; a bad one is a ValueError
    assert torch.equal(model(**b, curriculum_seqlen=16), model(**b))
    with pytest.raises(ValueError, match="int >= 1"):
        model(**b, curriculum_seqlen=0)


def test_curriculum_seqlen_cuts_a_4d_mask():
    b = batch(s=12)
    b["attention_mask"] = torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()
    model = small()
    # an explicit causal mask gives the same loss as the implicit one
    assert torch.allclose(
        model(**b, curriculum_seqlen=6),
        model(**truncate_batch({k: v for k, v in b.items() if k != "attention_mask"}, 6)),
        atol=1e-6,
    )


def test_loss_mask_mean():
    b = batch()
    model = small()
    logits = model(b["input_ids"])
    per_token = torch.nn.functional.cross_entropy(logits.view(-1, 97), b["labels"].reshape(-1), reduction="none")
    mask = b["loss_mask"].reshape(-1)
    expected = (per_token * mask).sum() / mask.sum()
    assert torch.allclose(model(b["input_ids"], b["labels"], b["loss_mask"]), expected, atol=1e-6)
    assert torch.allclose(model(b["input_ids"], b["labels"]), per_token.mean(), atol=1e-6)
    assert model(b["input_ids"], b["labels"], torch.zeros(3, 16)).item() == 0.0  # no NaN


def test_rotary_uses_position_ids_and_slices_tables():
    model = small(rotary=True)
    ids = torch.randint(0, 97, (2, 10))
    default = model(ids)
    explicit = model(ids, position_ids=torch.arange(10).repeat(2, 1))
    assert torch.allclose(default, explicit, atol=1e-6)
    assert model.rope_cos.shape == (32, 8)
    # Rotary attention is relative: a uniform shift of the positions changes nothing ...
    shifted = model(ids, position_ids=torch.arange(10).repeat(2, 1) + 3)
    assert torch.allclose(default, shifted, atol=1e-5)
    # ... but a restart (EOD reset) does.
    restart = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]).repeat(2, 1)
    assert not torch.allclose(default, model(ids, position_ids=restart), atol=1e-4)
    # Tables sliced to the current length: a prefix gives the prefix's logits (causality).
    assert torch.allclose(model(ids[:, :4]), default[:, :4], atol=1e-5)
    assert "rope_cos" not in model.state_dict()  # recomputed, not checkpointed


def test_learned_positions_follow_position_ids():
    model = small()
    ids = torch.randint(0, 97, (1, 8))
    restart = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    assert not torch.allclose(model(ids), model(ids, position_ids=restart))


def test_padding_mask_hides_pad_keys():
    model = small()
    ids = torch.randint(0, 97, (1, 8))
    pad = torch.ones(1, 8)
    pad[0, 6:] = 0  # right padding: the first 6 tokens are unaffected
    assert torch.allclose(model(ids, attention_mask=pad)[:, :6], model(ids[:, :6]), atol=1e-5)
    left = torch.cat([torch.zeros(1, 2), torch.ones(1, 6)], dim=1)
    out = model(ids, attention_mask=left)
    assert torch.isfinite(out).all()
    # real tokens after left padding see only real tokens (and no positions shift)
    other = ids.clone()
    other[0, :2] = (ids[0, :2] + 1) % 97
    assert torch.allclose(out[:, 2:], model(other, attention_mask=left)[:, 2:], atol=1e-5)


def test_too_long_input_is_a_clear_error():
    model = small()
    with pytest.raises(ValueError, match="exceeds the model's seq_length 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's seq_length 32"):
        small(rotary=True)(torch.zeros(1, 40, dtype=torch.long))


def test_flops_per_token():
    model = GPT(GPTConfig.preset("tiny"))
    cfg = model.config
    n = model.num_params(non_embedding=True)
    assert model.estimate_flops_per_token() == 6 * n + 12 * cfg.n_layer * cfg.n_embd * 256
    assert model.estimate_flops_per_token(8) < model.estimate_flops_per_token()


def test_dropout_only_in_training():
    model = small(dropout=0.5)
    ids = torch.randint(0, 97, (2, 8))
    model.eval()
    assert torch.equal(model(ids), model(ids))
    model.train()
    assert not torch.equal(model(ids), model(ids))


def test_vocab_padded_to_a_multiple_of_64_gets_no_probability():
    cfg = GPTConfig.preset("tiny", vocab_size=50257, seq_length=16, n_layer=1, n_embd=64, n_head=2)
    assert cfg.padded_vocab_size == 50304 and GPTConfig(**{**vars(cfg), "vocab_multiple": 1}).padded_vocab_size == 50257
    model = GPT(cfg)
    assert model.wte.weight.shape[0] == 50304 and model.num_params() == cfg.num_params()
    ids = torch.randint(0, 50257, (2, 16))
    logits = model(ids)
    assert logits.shape == (2, 16, 50257)  # generation and evaluation never see the padded rows
    loss = model(ids, labels=ids)
    loss.backward()
    assert model.wte.weight.grad[50257:].abs().sum() == 0  # the padded rows are never trained toward


def test_rotary_percent_rotates_megatrons_share_of_each_head():
    """Megatron-DeepSpeed's --rotary-percent p (its RotaryEmbedding over rotary_dim = int(head x p) and
    apply_rotary_pos_emb): the first rotary_dim channels are rotated as a head of that size would be
    (pairs i, i + rotary_dim/2, frequencies base ** (-2i / rotary_dim)); the others pass through."""
    from seqwarm.trainer.model import _apply_rotary, _rotary_tables

    cfg = GPTConfig(vocab_size=50, seq_length=16, n_layer=1, n_head=2, n_embd=32, rotary=True, rotary_percent=0.25)
    assert cfg.rotary_dim == 4
    cos, sin = _rotary_tables(cfg)
    x = torch.randn(1, 2, 16, 16)
    out = _apply_rotary(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:])
    pos = torch.arange(16, dtype=torch.float32)[:, None]
    freqs = pos * (10000.0 ** (-torch.arange(0, 4, 2, dtype=torch.float32) / 4))  # (T, 2)
    emb = torch.cat([freqs, freqs], dim=-1)  # Megatron: cat((freqs, freqs)), rotate_half
    head = x[..., :4]
    rotated = torch.cat([-head[..., 2:], head[..., :2]], dim=-1)
    torch.testing.assert_close(out[..., :4], head * emb.cos() + rotated * emb.sin())
    full = GPTConfig(vocab_size=50, seq_length=16, n_layer=1, n_head=2, n_embd=32, rotary=True)
    assert not torch.equal(_apply_rotary(x, *_rotary_tables(full))[..., 4:], x[..., 4:])
    for bad in (0.0, 0.05, 1.5):  # rotates 0, 0 (int(0.8)) or more than the head
        with pytest.raises(ValueError, match="rotary_percent"):
            GPTConfig(vocab_size=50, seq_length=16, n_layer=1, n_head=2, n_embd=32, rotary=True, rotary_percent=bad)


def test_init_std_sets_the_initialisation_as_megatrons_init_method_std():
    import math

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, seq_length=16, n_layer=2, n_head=4, n_embd=256, init_std=0.005)
    gpt = GPT(cfg)
    assert gpt.wte.weight.std().item() == pytest.approx(0.005, rel=0.05)
    proj = gpt.blocks[0].attn.c_proj.weight  # a residual output projection: std / sqrt(2 x layers)
    assert proj.std().item() == pytest.approx(0.005 / math.sqrt(4), rel=0.05)
    default = GPT(cfg.replace(init_std=0.02))
    assert default.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
