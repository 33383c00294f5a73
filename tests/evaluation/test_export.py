"""``seqwarm export RUN --hf OUT``: the Transformers model computes seqwarm's logits, loads with
``from_pretrained``, generates, carries the tokenizer; rotary runs export as GPT-NeoX; bad input exits 2.

The slow, end-to-end tests of this file are in tests/e2e/test_export_runs.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from conftest import make_corpus
from seqwarm.cli import main
from seqwarm.data.prepare import prepare_dataset
from seqwarm.data.tokenizer import load_tokenizer
from seqwarm.trainer.checkpoint import save_checkpoint
from seqwarm.trainer.model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (conftest)

transformers = pytest.importorskip("transformers", reason="transformers (the hf extra) is not installed")


@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory):
    base = tmp_path_factory.mktemp("exportdata")
    out = base / "prepared"
    prepare_dataset(
        out, [make_corpus(base / "corpus", docs=8, words_per_doc=200)], tokenizer="bpe:300", workers=1, progress=False
    )
    return out


def fake_run(folder, data_dir, *, step=3, deepspeed=False, **model):
    """A run folder holding one checkpoint of a GPT with random (non-initial) weights."""
    vocab = load_tokenizer(data_dir).vocab_size
    cfg = GPTConfig(**{"vocab_size": vocab, "seq_length": 32, "n_layer": 2, "n_head": 4, "n_embd": 32, **model})
    torch.manual_seed(step)
    gpt = GPT(cfg)
    with torch.no_grad():  # biases and LayerNorms away from 0 and 1, so a mapping slip shows
        for p in gpt.parameters():
            p.add_(0.1 * torch.randn_like(p))
    resolved = {"model": {"preset": None, **dataclasses.asdict(cfg)}, "data": {"folder": str(data_dir)}}
    payload = {"model": gpt.state_dict(), "config": resolved, "engine": {"progress": {"tokens": 1000}}}
    if deepspeed:  # what a --deepspeed run's weight export (checkpoints/step_*.pt) holds
        payload.update(deepspeed=True, last_val=None)
    save_checkpoint(folder / "checkpoints", step, payload)
    return gpt.eval()


def export(capsys, run, out, *extra):
    code = main(["export", str(run), "--hf", str(out), *extra])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def greedy(gpt, ids, n):
    for _ in range(n):
        with torch.no_grad():
            nxt = gpt(ids)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    return ids


@pytest.mark.parametrize(
    "rotary,bias,pad,arch",
    [
        (False, True, True, "GPT2LMHeadModel"),
        (False, False, False, "GPT2LMHeadModel"),
        (True, True, True, "GPTNeoXForCausalLM"),
    ],
)
def test_round_trip_logits_generate_and_tokenizer(tmp_path, capsys, bpe_data, rotary, bias, pad, arch):
    # pad: 3 padded rows of the embedding, which the export drops
    extra = {"vocab_multiple": load_tokenizer(bpe_data).vocab_size + 3} if pad else {}
    gpt = fake_run(tmp_path / "run", bpe_data, rotary=rotary, bias=bias, **extra)
    assert (gpt.wte.weight.shape[0] - gpt.config.vocab_size) == (3 if pad else 0)
    code, out, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 0, err
    assert arch in out and "step 3" in out
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert type(hf).__name__ == arch
    ids = torch.randint(
        0, gpt.config.vocab_size, (3, gpt.config.seq_length), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ours, theirs = gpt(ids), hf(input_ids=ids).logits
    assert theirs.shape == ours.shape and (ours - theirs).abs().max().item() < 1e-5
    # generate() runs, and greedy decoding picks seqwarm's tokens.
    prompt = ids[:1, :6]
    got = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)
    assert got.tolist() == greedy(gpt, prompt, 6).tolist()
    # The tokenizer comes along: AutoTokenizer gives the ids seqwarm trained on, EOD is eos.
    tok = load_tokenizer(bpe_data)
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = "the curriculum grows the sequence length"
    assert auto.encode(text, add_special_tokens=False) == tok.encode(text)
    assert auto.eos_token_id == tok.eod_id == hf.config.eos_token_id


def test_deepspeed_weight_export_and_hf_tokenizer_files(tmp_path, capsys):
    """A --deepspeed run's checkpoints/step_*.pt exports too; an hf: tokenizer's own files travel."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(
        {
            w
            for w in open(make_corpus(tmp_path / "c", docs=4, words_per_doc=50) / "doc000.txt")
            .read()
            .replace(".", " ")
            .lower()
            .split()
        }
        | {"</s>", "<unk>"}
    )
    hf_tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    hf_tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    hf_tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "tok" / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    data = tmp_path / "data"
    prepare_dataset(data, [tmp_path / "c"], tokenizer=f"hf:{tmp_path / 'tok'}", workers=1, progress=False)
    gpt = fake_run(tmp_path / "run", data, step=5, deepspeed=True)
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 0, err
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["eos_token"] == "</s>"
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.arange(20).reshape(1, 20) % gpt.config.vocab_size
    with torch.no_grad():
        assert (gpt(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-5
    assert hf.config.eos_token_id == words.index("</s>")


def test_bad_input_exits_2(tmp_path, capsys, bpe_data, monkeypatch):
    (tmp_path / "empty_run").mkdir()
    code, _, err = export(capsys, tmp_path / "empty_run", tmp_path / "hf")
    assert code == 2 and "has no checkpoint" in err and not (tmp_path / "hf").exists()
    code, _, err = export(capsys, tmp_path / "nowhere", tmp_path / "hf")
    assert code == 2 and "does not exist" in err
    fake_run(tmp_path / "run", bpe_data)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "full")
    assert code == 2 and "--force" in err and (tmp_path / "full" / "keep.txt").exists()
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "full", "--force")
    assert code == 0 and not (tmp_path / "full" / "keep.txt").exists()
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "hf2", "--checkpoint", "9")
    assert code == 2 and "no checkpoint of step 9" in err
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the hf extra were not installed
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "hf3")
    assert code == 2 and "seqwarm[hf]" in err and "transformers" in err and not (tmp_path / "hf3").exists()
    assert "Traceback" not in err


def test_a_partial_rotary_run_exports_with_its_rotary_pct(tmp_path, capsys, bpe_data):
    """--rotary-percent 0.5: GPT-NeoX's rotary_pct rotates the same first half of each head's channels."""
    gpt = fake_run(tmp_path / "run", bpe_data, rotary=True, rotary_percent=0.5)
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 0, err
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, gpt.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (gpt(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-5


def _stage_run(folder, data_dir, positions, *, rotary_percent=1.0, record=True):
    """A run folder whose checkpoint trained in a stage with ``positions`` (``record``: the checkpoint says so)."""
    gpt = fake_run(folder, data_dir, rotary=True, rotary_percent=rotary_percent)
    path = next((folder / "checkpoints").glob("step_*.pt"))
    state = torch.load(path, weights_only=False)
    stage = {"start_tokens": 500, "length": 32, **{k: v for k, v in positions.items() if v is not None}}
    state["config"]["run"] = {"stages": [stage]}
    if record:
        state["positions"] = {"stage": 1, "length": 32, **positions}
    path.unlink()
    save_checkpoint(folder / "checkpoints", 3, state)
    return gpt


YARN = {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}


@pytest.mark.parametrize(
    "scaling,percent", [(YARN, 1.0), (YARN | {"attention_factor": 1.3}, 0.5), ({"type": "linear", "factor": 4.0}, 1.0)]
)
def test_a_stage_run_exports_its_rope_settings_with_the_same_logits(tmp_path, capsys, bpe_data, scaling, percent):
    """The stage's θ and scaling go into the Transformers config (rope_parameters in Transformers 5,
    rope_theta / rope_scaling before), max_position_embeddings the stage's length; the logits are seqwarm's
    with those positions, which differ from the model's own."""
    positions = {"rope_theta": 40000.0, "rope_scaling": scaling}
    gpt = _stage_run(tmp_path / "run", bpe_data, positions, rotary_percent=percent)
    code, out, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 0, err
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    rope = saved.get("rope_parameters") or {**(saved.get("rope_scaling") or {}), "rope_theta": saved.get("rope_theta")}
    assert (
        rope["rope_theta"] == 40000.0 and rope["rope_type"] == scaling["type"] and rope["factor"] == scaling["factor"]
    )
    assert saved["max_position_embeddings"] == 32
    if scaling["type"] == "yarn":
        assert rope["original_max_position_embeddings"] == 16
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = torch.randint(0, gpt.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        own = gpt(ids)
        gpt.set_positions(positions["rope_theta"], scaling)
        staged, theirs = gpt(ids), hf(input_ids=ids).logits
    assert (staged - theirs).abs().max().item() < 1e-5
    assert (own - theirs).abs().max().item() > 1e-3  # the positions matter: the model's own would not match


def test_a_stage_checkpoint_without_its_positions_exits_2(tmp_path, capsys, bpe_data):
    _stage_run(tmp_path / "run", bpe_data, {"rope_theta": 40000.0, "rope_scaling": None}, record=False)
    code, _, err = export(capsys, tmp_path / "run", tmp_path / "hf")
    assert code == 2 and "records no stage positions" in err and not (tmp_path / "hf").exists()
