"""seqwarm.integrations.torchtitan: the micro-batches of torchtitan's train step cut to the curriculum length.

torchtitan's Trainer needs a GPU (it calls ``torch.cuda.set_device``; its language models' FlexAttention
has no CPU backward), so the recipe is tested here in a plain loop on torchtitan's own components, where
torchtitan is installed: its text dataloader (a local JSON dataset, a tokenizer made here), its Llama 3
debug model forward (no backward on CPU), its loss and its optimizer container. The adapter itself is
also tested on plain tensors, always.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from helpers import doc_block
from seqwarm.curriculum.lr import LRConfig
from seqwarm.curriculum.warmup import SequenceLengthWarmup
from seqwarm.integrations.torchtitan import cut_batch, step_batches

KW = dict(min_length=8, max_length=32, steps=4, multiple_of=8)
LR = LRConfig(lr=1e-3, warmup_tokens=256, decay_style="linear", decay_tokens=2048, min_lr=1e-4)


def titan_batches(rows: int = 2, seq: int = 32, seed: int = 0):
    """torchtitan's batch form: ({"input": ids, "positions": per-document positions}, labels)."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(0, 100, (rows, seq + 1), generator=g)
        positions = torch.arange(seq).repeat(rows, 1) % 12  # documents of 12 tokens
        yield {"input": ids[:, :-1], "positions": positions}, ids[:, 1:]


def test_step_batches_cuts_every_micro_batch_of_a_step_to_one_length_and_sets_the_lr():
    slw, opt = SequenceLengthWarmup(**KW, lr=LR), torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    ref = SequenceLengthWarmup(**KW, lr=LR)
    data, seen = titan_batches(), []
    for _ in range(6):
        batches = list(step_batches(slw, data, 3, opt))
        assert len(batches) == 3
        for input_dict, labels in batches:
            width = input_dict["input"].shape[1]
            assert labels.shape == input_dict["input"].shape == input_dict["positions"].shape == (2, width)
        seen.append(({d["input"].shape[1] for d, _ in batches}, opt.param_groups[0]["lr"]))
        slw.end_step()
        length = ref.begin_step()
        for _ in range(3):
            ref.record(2, 32)
        assert seen[-1] == ({length}, ref.step_lr())
        ref.end_step()
    assert [s[0] for s in seen] == [{8}, {16}, {24}, {32}, {32}, {32}]
    assert slw.progress.tokens == ref.progress.tokens == 3 * 2 * (8 + 16 + 24 + 32 * 3)


def test_cut_batch_keeps_the_prefix_of_inputs_labels_and_positions_and_refuses_other_forms():
    slw = SequenceLengthWarmup(**KW)
    input_dict, labels = next(titan_batches())
    slw.begin_step()
    out, cut_labels = cut_batch(slw, input_dict, labels)
    assert torch.equal(out["input"], input_dict["input"][:, :8]) and torch.equal(cut_labels, labels[:, :8])
    assert torch.equal(out["positions"], input_dict["positions"][:, :8]) and set(out) == {"input", "positions"}
    with pytest.raises(ValueError, match="input_dict\\['input'\\]"):
        cut_batch(slw, {"tokens": labels}, labels)
    with pytest.raises(ValueError, match="micro_batches must be >= 1"):
        step_batches(slw, titan_batches(), 0)


def test_data_running_out_mid_step_begins_no_step():
    slw = SequenceLengthWarmup(**KW)
    short = iter([next(titan_batches())])
    with pytest.raises(StopIteration):
        step_batches(slw, short, 2)
    assert not slw.step_open


# -- on torchtitan's own components ------------------------------------------------------------------


@pytest.fixture
def titan_loader(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("triton")  # torchtitan's models import it (it comes with CUDA builds of torch)
    tokenizers = pytest.importorskip("tokenizers")
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    words = "the model learns short context first and long context later while the curriculum grows".split()
    texts = [" ".join(words[i % 7 :] + words[: i % 7]) * 3 for i in range(40)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.json").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<bos>", "<eos>"])
    tok.train_from_iterator(texts, trainer)
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    config = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(data))
    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(folder))
    return HuggingFaceTextDataLoader(
        config, dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=32, local_batch_size=2
    )


@pytest.mark.slow  # about 15 s: FlexAttention compiles its masks and kernels on CPU
def test_the_recipe_on_torchtitans_dataloader_model_loss_and_optimizers(titan_loader):
    from torchtitan.components.loss import IGNORE_INDEX, CrossEntropyLoss
    from torchtitan.components.optimizer import OptimizersContainer, default_adamw
    from torchtitan.models.llama3 import model_registry

    torch.manual_seed(0)
    spec = model_registry("debugmodel")
    model = spec.model.build()
    model.init_states(buffer_device=torch.device("cpu"))
    loss_fn = CrossEntropyLoss.Config(global_vocab_size=spec.model.vocab_size).build()
    optimizers = default_adamw(lr=8e-4).build(model_parts=[model])
    assert isinstance(optimizers, OptimizersContainer)
    slw, ref = SequenceLengthWarmup(**KW, lr=LR), SequenceLengthWarmup(**KW, lr=LR)
    data, lengths, losses, lrs = iter(titan_loader), [], [], []
    for _ in range(5):
        batches = list(step_batches(slw, data, 2, optimizers))
        lrs.append({g["lr"] for opt in optimizers for g in opt.param_groups})
        ref.begin_step()
        ref.record(2, 32), ref.record(2, 32)
        assert lrs[-1] == {ref.step_lr()}
        ref.end_step()
        for input_dict, labels in batches:
            positions = input_dict["positions"]
            masks = model.get_attention_masks(positions=positions)
            with torch.no_grad():  # FlexAttention has no backward on CPU
                pred = model(input_dict["input"], positions=positions, attention_masks=masks)
            valid = (labels != IGNORE_INDEX).sum()
            loss, _ = loss_fn(pred, labels, valid)
            assert pred.shape[:2] == labels.shape and torch.isfinite(loss)
            lengths.append(labels.shape[1])
            losses.append(float(loss))
        slw.end_step()
    assert lengths == [8, 8, 16, 16, 24, 24, 32, 32, 32, 32]
    assert slw.progress.tokens == 2 * 2 * (8 + 16 + 24 + 32 + 32)
    assert len({lr for step in lrs for lr in step}) == 5  # warmup, then decay: a new LR every step


def test_the_trainer_subclass_of_frameworks_md_is_defined_against_torchtitan():
    """Only defined (torchtitan's Trainer needs CUDA): its imports and base class are torchtitan's own."""
    pytest.importorskip("torchtitan")
    pytest.importorskip("triton")
    from torchtitan.trainer import Trainer

    namespace: dict = {}
    exec(compile(doc_block("FRAMEWORKS.md", "test_torchtitan.py"), "FRAMEWORKS.md", "exec"), namespace)
    cls = namespace["CurriculumTrainer"]
    assert issubclass(cls, Trainer)
    for name in ("train_step", "state_dict", "load_state_dict"):
        assert getattr(Trainer, name) is not getattr(cls, name) and hasattr(Trainer, name)
    source = inspect.getsource(Trainer)  # what the subclass reads of the trainer, set by its __init__
    for attribute in ("gradient_accumulation_steps", "num_pipeline_parallel_microbatches", "optimizers"):
        assert f"self.{attribute} =" in source
    from torchtitan.distributed.parallel_dims import ParallelDims

    assert {"dp_replicate", "dp_shard"} <= set(inspect.get_annotations(ParallelDims))
