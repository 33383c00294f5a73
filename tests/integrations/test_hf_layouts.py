"""CurriculumTrainer on the batches Hugging Face pipelines really produce: right- and left-padded rows
(``DataCollatorForLanguageModeling`` with either ``padding_side``), padding-free rows
(``DataCollatorWithFlattening``), and TRL's ``SFTTrainer`` through ``with_curriculum``. Tiny Llama models
and a word-level tokenizer built here (nothing downloaded)."""

from __future__ import annotations

import logging

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from helpers import tiny_llama_config  # noqa: E402
from seqwarm.config import load_config  # noqa: E402
from seqwarm.curriculum.schedule import difficulty_at  # noqa: E402
from seqwarm.integrations.hf.trainer import CurriculumTrainer, with_curriculum  # noqa: E402

VOCAB, MICRO, GAS, STEPS = 64, 2, 2, 6
CURRICULUM = {
    "enabled": True,
    "curriculum_type": "seqlen",
    "min_difficulty": 8,
    "max_difficulty": 48,
    "schedule_type": "fixed_linear",
    "schedule_config": {"total_curriculum_step": 5, "difficulty_step": 8},
}
SCHEDULE = load_config({"train_micro_batch_size_per_gpu": MICRO, "curriculum_learning": CURRICULUM}).curriculum
LENGTHS = [difficulty_at(step, SCHEDULE) for step in range(1, STEPS + 1)]
RAW = {"curriculum_learning": CURRICULUM, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}


def tokenizer(side):
    from tokenizers import Tokenizer, models

    vocab = {"<pad>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")), pad_token="<pad>"
    )
    tok.padding_side = side
    return tok


def examples(n=STEPS * MICRO * GAS):
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(3, 45, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(1, VOCAB, (k,), generator=g).tolist()} for k in lengths]


def llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(tiny_llama_config(VOCAB, pad_token_id=0))


def sequences_in(kwargs):
    """The real sequences of a forward's batch, whatever its layout."""
    ids, mask, pos = kwargs["input_ids"], kwargs.get("attention_mask"), kwargs.get("position_ids")
    if mask is not None:
        return [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    if ids.shape[0] == 1 and pos is not None:
        starts = [i for i, p in enumerate(pos[0].tolist()) if p == 0] + [ids.shape[1]]
        return [ids[0, a:b].tolist() for a, b in zip(starts, starts[1:])]
    return [row.tolist() for row in ids]


def recorder(seen):
    """A forward pre-hook that appends the real sequences of every training forward to ``seen``."""

    def hook(module, args, kwargs):
        if module.training:
            seen.append(sequences_in(kwargs))

    return hook


def train(tmp_path, collator, trainer_class=CurriculumTrainer, curriculum=RAW, **overrides):
    model = llama()
    seen = []
    model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(sequences_in(kw)) if m.training else None, with_kwargs=True
    )
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=GAS,
        max_steps=STEPS,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        remove_unused_columns=False,
        **overrides,
    )
    trainer = trainer_class(
        model=model, args=targs, train_dataset=examples(), data_collator=collator, curriculum=curriculum
    )
    trainer.train()
    return trainer, seen


def test_left_right_and_padding_free_batches_train_the_same_real_tokens(tmp_path):
    runs = {
        "right": train(tmp_path / "r", transformers.DataCollatorForLanguageModeling(tokenizer("right"), mlm=False)),
        "left": train(tmp_path / "l", transformers.DataCollatorForLanguageModeling(tokenizer("left"), mlm=False)),
        "flat": train(tmp_path / "f", transformers.DataCollatorWithFlattening()),
    }
    lengths = LENGTHS
    per_step = {name: [sorted(map(tuple, seqs)) for seqs in seen] for name, (_, seen) in runs.items()}
    assert per_step["right"] == per_step["left"] == per_step["flat"]
    for i, seqs in enumerate(per_step["right"]):  # each sequence: its first L tokens, L of that step
        assert max(len(s) for s in seqs) <= lengths[i // GAS]
    assert any(len(s) == lengths[i // GAS] for i, seqs in enumerate(per_step["right"]) for s in seqs)  # cut
    real = [sum(len(s) for seqs in per_step["right"][k * GAS : (k + 1) * GAS] for s in seqs) for k in range(STEPS)]
    for name, (trainer, _) in runs.items():
        assert trainer.curriculum.progress.tokens == sum(real), name  # padding is not counted
        logs = [e for e in trainer.state.log_history if "curriculum/seqlen" in e]
        longest = [max(len(s) for seqs in per_step[name][k * GAS : (k + 1) * GAS] for s in seqs) for k in range(STEPS)]
        assert [e["curriculum/seqlen"] for e in logs] == longest  # what trained, not the schedule's length
        assert [e["progress/tokens"] for e in logs] == [sum(real[: k + 1]) for k in range(STEPS)]
        assert not any("curriculum/seqlen" in e for e in trainer.state.log_history if "train_runtime" in e)
        assert trainer.lr_scheduler.last_epoch == STEPS  # stepped once per optimizer step


def test_the_trainers_lr_arguments_are_honoured_and_said(tmp_path, caplog):
    collator = transformers.DataCollatorForLanguageModeling(tokenizer("right"), mlm=False)
    with caplog.at_level(logging.WARNING, logger="seqwarm"):
        trainer, _ = train(tmp_path, collator, lr_scheduler_type="cosine", warmup_steps=2)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "peak 0.001 (TrainingArguments learning_rate), warmup 2 steps, cosine decay to 0 at step 6" in said
    lrs = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = transformers.get_cosine_schedule_with_warmup(opt, 2, STEPS)
    theirs = []
    for _ in range(STEPS):
        opt.step()
        sched.step()
        theirs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx(theirs, abs=1e-12)  # step k at transformers' LR of step k + 1


def test_sft_trainer_with_the_curriculum_packed_and_not(tmp_path):
    trl = pytest.importorskip("trl", reason="trl is not installed")
    datasets = pytest.importorskip("datasets")
    SFT = with_curriculum(trl.SFTTrainer)
    assert issubclass(SFT, trl.SFTTrainer) and with_curriculum(trl.SFTTrainer) is SFT
    data = datasets.Dataset.from_list(examples())
    for packing in (False, True):
        model = llama()
        seen = []
        model.register_forward_pre_hook(recorder(seen), with_kwargs=True)
        config = trl.SFTConfig(
            output_dir=str(tmp_path / str(packing)),
            per_device_train_batch_size=MICRO,
            gradient_accumulation_steps=GAS,
            max_steps=3,
            learning_rate=1e-3,
            max_length=48,
            packing=packing,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            logging_steps=1,
        )
        trainer = SFT(model=model, args=config, train_dataset=data, processing_class=tokenizer("right"), curriculum=RAW)
        trainer.train()
        longest = [max(len(s) for s in seqs) for seqs in seen]
        assert all(n <= LENGTHS[i // GAS] for i, n in enumerate(longest)) and longest[0] == LENGTHS[0]
        assert trainer.curriculum.progress.step == 3
        assert trainer.curriculum.progress.tokens == sum(len(s) for seqs in seen for s in seqs)


def test_the_start_says_when_max_steps_ends_the_run_before_the_token_budget(tmp_path, caplog):
    """max_steps = 6 but train_tokens needs more steps: the LR decays over the tokens, so the run would end
    with the LR well above its floor; the start of the run says so, with that LR."""
    raw = {
        **RAW,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "seqwarm": {"train_tokens": 100_000, "lr_decay_style": "cosine", "min_lr": 1e-5},
    }
    collator = transformers.DataCollatorForLanguageModeling(tokenizer("right"), mlm=False)
    with caplog.at_level(logging.WARNING, logger="seqwarm"):
        trainer, _ = train(tmp_path, collator, curriculum=raw)
    said = [r.getMessage() for r in caplog.records if "before train_tokens" in r.getMessage()]
    assert len(said) == 1 and "the Trainer stops after 6 steps (max_steps / num_train_epochs)" in said[0]
    planned = sum(MICRO * GAS * length for length in LENGTHS)  # the plan's count: full rows (padding aside)
    lr_end = float(said[0].split("the LR is then ")[1].split(" ")[0])
    assert lr_end > 0.9e-3 and f"about {planned:,} tokens" in said[0]
    assert trainer.curriculum.progress.tokens < 100_000
