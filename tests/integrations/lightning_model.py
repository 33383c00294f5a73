"""A tiny LightningModule and its data, shared by the Lightning tests and their DDP script (no pytest here).

The module records what it sees: the (global step, batch shape) of every training micro-batch, the
optimizer's LR at every optimizer step, and the callback's clock after every step.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

SEQ = 32
VOCAB = 50


class Windows(Dataset):
    """``n`` dict samples of ``SEQ`` tokens, the same for a seed."""

    def __init__(self, n: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.tokens[i]
        return {"input_ids": row[:-1], "labels": row[1:]}


class TinyLM(pl.LightningModule):
    def __init__(self, lr: float = 1e-2, scheduler: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)
        self.lr, self.scheduler = lr, scheduler
        self.seen: list[tuple[int, tuple[int, ...]]] = []
        self.lrs: list[tuple[int, float]] = []
        self.clock: list[tuple[int, int]] = []
        self.first_rows: list[int] | None = None

    def training_step(self, batch, batch_idx):
        self.seen.append((self.global_step, tuple(batch["input_ids"].shape)))
        if self.first_rows is None:
            self.first_rows = batch["input_ids"][0].tolist()
        logits = self.head(self.emb(batch["input_ids"]))  # (B, L, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def validation_step(self, batch, batch_idx):
        self.seen.append((-1, tuple(batch["input_ids"].shape)))

    def on_before_optimizer_step(self, optimizer):
        self.lrs.append((self.global_step, optimizer.param_groups[0]["lr"]))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        slw = curriculum_of(self.trainer)
        if slw is not None and not slw.step_open:
            self.clock.append((slw.progress.step, slw.progress.tokens))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.lr)
        if self.scheduler:
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]
        return opt


class RotaryLM(pl.LightningModule):
    """seqwarm's rotary GPT in a LightningModule: records (global step, length, the GPT's rotary settings, loss)
    of every training micro-batch (its rotary tables as their sum), and the tables when training starts."""

    def __init__(self, rotary: bool = True):
        super().__init__()
        from seqwarm import GPT, GPTConfig

        torch.manual_seed(0)
        self.gpt = GPT(GPTConfig(vocab_size=VOCAB, seq_length=SEQ, n_layer=1, n_head=2, n_embd=16, rotary=rotary))
        self.seen: list[tuple[int, int, float, float]] = []
        self.at_start: float | None = None

    def on_train_start(self):
        self.at_start = float(self.gpt.rope_cos.sum()) if self.gpt.config.rotary else None

    def training_step(self, batch, batch_idx):
        loss = self.gpt(batch["input_ids"], batch["labels"])
        rope = getattr(self.gpt, "rope_cos", None)  # what the forward used, not only what was recorded
        tables = float(rope.sum()) if rope is not None else 0.0
        self.seen.append((self.global_step, batch["input_ids"].shape[1], tables, loss.item()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def curriculum_of(trainer):
    for cb in trainer.callbacks:
        if type(cb).__name__ == "SequenceLengthWarmupCallback":
            return cb.curriculum
    return None


def loader(n: int, batch_size: int = 2, seed: int = 0) -> DataLoader:
    return DataLoader(Windows(n, seed), batch_size=batch_size, shuffle=False)


def trainer(tmp, callbacks, **kwargs) -> pl.Trainer:
    opts = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        default_root_dir=str(tmp),
    )
    opts.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **opts)
