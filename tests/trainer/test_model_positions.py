"""GPT.set_positions: the rotary tables a stage's settings give, against Transformers' own numbers."""

from __future__ import annotations

import pytest
import torch

from seqwarm.trainer.model import GPT, GPTConfig


def _gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, seq_length=64, rotary=True, **kw))


@pytest.mark.parametrize(
    "theta, scaling",
    [
        (40000.0, None),
        (None, {"type": "linear", "factor": 2.0}),
        (10000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ],
)
def test_tables_follow_transformers(theta, scaling):
    pytest.importorskip("transformers")
    from tests.curriculum.test_stages import _transformers_rope

    model = _gpt()
    x = torch.randint(0, 64, (2, 64))
    before = model(x)
    model.set_positions(theta, scaling)
    inv, factor = _transformers_rope(theta or 10000.0, 16, scaling, 64)
    angles = torch.outer(torch.arange(64, dtype=torch.float32), torch.tensor(inv))
    torch.testing.assert_close(model.rope_cos, angles.cos() * factor, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.rope_sin, angles.sin() * factor, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(model(x), before)  # the positions changed what the model computes
    model.set_positions()  # back to the config's base: the first logits again
    torch.testing.assert_close(model(x), before)


def test_learned_positions_refuse():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, seq_length=16))
    with pytest.raises(ValueError, match="learns its positions"):
        model.set_positions(50000.0)
