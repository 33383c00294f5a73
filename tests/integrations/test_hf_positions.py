"""A stage's rotary positions on Hugging Face models (seqwarm.integrations.hf.positions), checked against
Transformers itself: a tiny model built with θ0 whose positions are then set in place must give the logits
of the same weights in a model Transformers builds from a config holding the new settings."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from seqwarm.curriculum.stages import as_stages  # noqa: E402
from seqwarm.integrations.hf.positions import positions_hook, set_positions  # noqa: E402
from seqwarm.util.errors import UserError  # noqa: E402

VOCAB, POSITIONS, THETA0 = 64, 64, 1000.0


def _config(family, **rope):
    """A tiny config of ``family`` (two layers, width 32) with the rotary settings ``rope`` in the keywords a
    user writes (``rope_theta``, ``rope_scaling``)."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    common.update(num_attention_heads=4, max_position_embeddings=POSITIONS)
    if family == "llama":
        return transformers.LlamaConfig(**common, num_key_value_heads=2, **rope)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, num_key_value_heads=2, **rope)
    if family == "gpt_neox":  # half of each head rotated; θ under its own key
        theta = rope.pop("rope_theta", 10000.0)
        return transformers.GPTNeoXConfig(**common, rotary_pct=0.5, rotary_emb_base=theta, **rope)
    raise AssertionError(family)


def _model(config, seed=0):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _logits(model, length=POSITIONS):
    ids = torch.arange(2 * length).reshape(2, length) * 7 % VOCAB
    with torch.no_grad():
        return model(input_ids=ids).logits


def _built_by_transformers(family, weights, **rope):
    fresh = _model(_config(family, **rope), seed=1)
    fresh.load_state_dict(weights.state_dict())
    return fresh


YARN = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32}
CASES = [
    ("theta", 500_000.0, None),
    ("linear", None, {"type": "linear", "factor": 4.0}),
    ("yarn", None, YARN),
    ("theta+yarn", 40_000.0, {**YARN, "beta_fast": 16.0, "beta_slow": 2.0}),
    ("yarn attention_factor", None, {**YARN, "factor": 3.0, "attention_factor": 1.5}),
    ("yarn mscale", 20_000.0, {**YARN, "mscale": 0.8, "mscale_all_dim": 0.5, "truncate": False}),
]


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("name, theta, scaling", CASES, ids=[c[0] for c in CASES])
def test_positions_set_in_place_give_the_logits_of_a_model_transformers_builds_with_them(family, name, theta, scaling):
    model = _model(_config(family, rope_theta=THETA0))
    before = _logits(model)
    set_positions(model, theta, scaling)
    rope = {"rope_theta": theta or THETA0}
    if scaling:
        rope["rope_scaling"] = {"rope_type": scaling["type"], **{k: v for k, v in scaling.items() if k != "type"}}
    reference = _built_by_transformers(family, model, **rope)
    after = _logits(model)
    assert torch.allclose(after, _logits(reference), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(after, before, atol=1e-4)  # the positions really changed
    mine, theirs = model.base_model.rotary_emb, reference.base_model.rotary_emb
    assert torch.equal(mine.inv_freq, theirs.inv_freq) and mine.attention_scaling == theirs.attention_scaling
    assert mine.rope_type == theirs.rope_type
    if family == "gpt_neox":  # the partial rotary factor is the model's own, kept
        assert model.config.rope_parameters["partial_rotary_factor"] == 0.5


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_save_pretrained_after_a_stage_describes_the_positions_the_weights_trained_with(family, tmp_path):
    model = _model(_config(family, rope_theta=THETA0))
    set_positions(model, 80_000.0, None)  # a θ stage, then YaRN keeping that θ
    params = set_positions(model, 80_000.0, {**YARN, "factor": 4.0}, max_position_embeddings=128)
    assert params["rope_type"] == "yarn" and params["rope_theta"] == 80_000.0 and params["factor"] == 4.0
    assert model.config.max_position_embeddings == 128  # raised to the stage's length
    set_positions(model, 80_000.0, {**YARN, "factor": 4.0}, max_position_embeddings=96)
    assert model.config.max_position_embeddings == 128  # never lowered
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.rope_parameters["rope_type"] == "yarn"
    assert torch.allclose(_logits(loaded, 128), _logits(model, 128), rtol=1e-6, atol=1e-6)


def test_no_settings_return_to_the_models_own_and_stages_follow_each_other():
    model = _model(_config("llama", rope_theta=THETA0))
    own = _logits(model)
    set_positions(model, 7_000.0, {"type": "linear", "factor": 2.0})
    set_positions(model, None, YARN)  # θ None: the model's own θ, not the last stage's
    assert model.config.rope_parameters["rope_theta"] == THETA0
    reference = _built_by_transformers("llama", model, rope_theta=THETA0, rope_scaling=dict(YARN))  # it edits it
    assert torch.allclose(_logits(model), _logits(reference), rtol=1e-6, atol=1e-6)
    set_positions(model)
    assert torch.allclose(_logits(model), own, rtol=0, atol=1e-6)
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": THETA0}


def _recurrent_gemma(theta):
    """RecurrentGemma keeps a rotary module in each attention layer (not one for the model)."""
    return transformers.RecurrentGemmaConfig(
        num_hidden_layers=3,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=1,
        lru_width=32,
        attention_window_size=16,
        block_types=["recurrent", "attention", "attention"],
        rope_theta=theta,
    )


def test_a_rotary_module_in_every_attention_layer_is_updated_and_what_transformers_refuses_is_refused():
    model = _model(_recurrent_gemma(THETA0))
    rotary = [m for n, m in model.named_modules() if n.endswith("rotary_emb")]
    assert len(rotary) == 2
    set_positions(model, 90_000.0)
    reference = _model(_recurrent_gemma(90_000.0), seed=1)
    reference.load_state_dict(model.state_dict())
    assert torch.allclose(_logits(model, 32), _logits(reference, 32), rtol=1e-6, atol=1e-6)
    assert all(torch.equal(m.inv_freq, rotary[0].inv_freq) for m in rotary)
    with pytest.raises(UserError, match="does not support RoPE types other than `default`"):
        set_positions(model, None, YARN)  # this family takes θ only: nothing changes
    assert model.config.rope_parameters["rope_type"] == "default" and model.config.rope_parameters["rope_theta"] == 9e4
    assert torch.allclose(_logits(model, 32), _logits(reference, 32), rtol=1e-6, atol=1e-6)


def test_models_whose_positions_cannot_be_set_are_refused_and_left_as_they_were():
    gpt2 = _model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(UserError, match="GPT2LMHeadModel has no rotary embedding"):
        set_positions(gpt2, 5000.0)
    codegen = transformers.CodeGenConfig(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, rotary_dim=4, n_positions=64)
    with pytest.raises(UserError, match="CodeGenRotaryEmbedding .* is a rotary module seqwarm cannot set"):
        positions_hook(_model(codegen))  # the engine's hook refuses it when built, before any step
    scaled = _config("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(UserError, match="already has rope_type 'dynamic'"):
        set_positions(_model(scaled), 5000.0)
    assert positions_hook(torch.nn.Linear(2, 2)) is None  # not a Transformers model: another hook's, or none


def _deepseek():
    return transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        kv_lora_rank=8,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        max_position_embeddings=POSITIONS,
    )


def test_an_attention_that_keeps_a_value_of_the_rotary_settings_is_refused_rather_than_left_stale():
    """DeepSeek's attention folds YaRN's mscale_all_dim into its softmax scale when built: seqwarm would not
    update it, so that stage is refused; a θ stage (which it does not read) goes through."""
    model = _model(_deepseek())
    before = _logits(model)
    with pytest.raises(UserError, match=r"self_attn\.scaling also depend"):
        set_positions(model, None, {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0})
    assert model.config.rope_parameters["rope_type"] == "default"
    assert torch.equal(_logits(model), before)  # nothing changed
    set_positions(model, 123_000.0)
    assert model.base_model.rotary_emb.inv_freq[1] == pytest.approx(123_000.0 ** (-2 / 8), rel=1e-6)
    # the engine's hook checks every stage when the engine is built, before any step
    stages = as_stages([
        {"start_tokens": 10, "length": 32, "rope_theta": 5e5},
        {"start_tokens": 20, "length": 64, "rope_scaling": {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}},
    ])  # fmt: skip
    with pytest.raises(UserError, match=r"self_attn\.scaling also depend"):
        positions_hook(model, stages)
    assert positions_hook(model, stages[:1]) is not None
    assert model.config.rope_parameters["rope_theta"] == 123_000.0  # checked, not set


def test_curriculum_engine_sets_a_stages_positions_on_a_transformers_model_and_again_after_a_load():
    """CurriculumEngine (as the facade gives it, with the integration's hook) on a Llama: the θ stage's
    positions from the step it begins, and on a fresh model when the engine's state is loaded."""
    from seqwarm import CurriculumEngine

    stage = {"start_tokens": 200, "length": 32, "rope_theta": 500_000.0}
    config = {
        "train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "seqwarm": {"seq_length": 32, "train_tokens": 1000, "stages": [stage]},
    }
    model = _model(_config("llama", rope_theta=THETA0)).train()
    base = model.model.rotary_emb.inv_freq.clone()
    engine = CurriculumEngine(model, torch.optim.AdamW(model.parameters(), lr=1e-3), config)
    while engine.slw.stage is None:
        tokens = torch.randint(0, VOCAB, (2, 32))
        engine.backward(engine({"input_ids": tokens, "labels": tokens}).loss)
        engine.step()
        if engine.slw.stage is None:
            assert torch.equal(model.model.rotary_emb.inv_freq, base)
    wanted = _model(_config("llama", rope_theta=500_000.0)).model.rotary_emb.inv_freq
    assert torch.equal(model.model.rotary_emb.inv_freq, wanted)
    assert model.config.rope_parameters["rope_theta"] == 500_000.0

    fresh = _model(_config("llama", rope_theta=THETA0))
    again = CurriculumEngine(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-3), config)
    again.load_state_dict(engine.state_dict())
    assert torch.equal(fresh.model.rotary_emb.inv_freq, wanted)

    gpt2 = _model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(UserError, match="GPT2LMHeadModel has no rotary embedding"):
        CurriculumEngine(gpt2, torch.optim.AdamW(gpt2.parameters(), lr=1e-3), config)


def test_without_the_integrations_hook_the_engine_refuses_rope_stages_on_a_transformers_model_saying_why():
    """The curriculum does not import the integration: with only seqwarm.curriculum.engine imported, nothing
    sets a Transformers model's positions, and the refusal names the import that would."""
    import subprocess
    import sys

    script = (
        "import torch, transformers\n"
        "from seqwarm.curriculum.engine import CurriculumEngine\n"
        "from seqwarm.util.errors import UserError\n"
        "model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=64, hidden_size=16,"
        " intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64))\n"
        "cfg = {'train_batch_size': 2, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}, 'seqwarm':"
        " {'seq_length': 32, 'train_tokens': 1000, 'stages': [{'start_tokens': 200, 'length': 32,"
        " 'rope_theta': 5e5}]}}\n"
        "try:\n"
        "    CurriculumEngine(model, torch.optim.AdamW(model.parameters()), cfg)\n"
        "except UserError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "import seqwarm.integrations.hf.positions" in out.stdout, out.stderr[-2000:]
    assert "CurriculumEngine" in out.stdout and "rope_theta" in out.stdout
