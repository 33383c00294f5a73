"""SequenceLengthWarmupCallback in Lightning's own Trainer (CPU): lengths per optimizer step with gradient
accumulation, the token clock, the LR from it, the loggers, the budget, an exact resume from Lightning's
checkpoints, and DDP with two processes."""

from __future__ import annotations

import csv
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning_model import SEQ, RotaryLM, TinyLM, loader, trainer  # noqa: E402

from helpers import doc_block  # noqa: E402
from seqwarm.curriculum.lr import LRConfig  # noqa: E402
from seqwarm.curriculum.warmup import SequenceLengthWarmup  # noqa: E402
from seqwarm.integrations.lightning import SequenceLengthWarmupCallback  # noqa: E402
from seqwarm.util.errors import UserError  # noqa: E402
from seqwarm.util.problems import ConfigError  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KW = dict(min_length=8, max_length=SEQ, steps=6, multiple_of=8)
LR = LRConfig(lr=0.1, min_lr=0.01, warmup_tokens=200, decay_style="cosine", decay_tokens=1500)


def replay(n: int, micro: int, rows: int, seq: int = SEQ, **kw) -> list[tuple[int, int, float | None]]:
    """(length, tokens, LR) of each step, from a SequenceLengthWarmup in a plain loop on the same shapes."""
    slw, out = SequenceLengthWarmup(**kw), []
    batch = {"input_ids": torch.zeros(rows, seq, dtype=torch.long), "labels": torch.zeros(rows, seq, dtype=torch.long)}
    for _ in range(n):
        length = slw.begin_step()
        for _ in range(micro):
            slw.cut(batch)
        lr = slw.step_lr()
        out.append((length, slw.end_step().tokens, lr))
    return out


def per_step(model: TinyLM) -> dict[int, set[tuple[int, ...]]]:
    shapes: dict[int, set[tuple[int, ...]]] = {}
    for step, shape in model.seen:
        if step >= 0:
            shapes.setdefault(step, set()).add(shape)
    return shapes


def test_accumulated_steps_get_one_length_and_the_clock_and_lr_of_a_plain_loop(tmp_path):
    cb = SequenceLengthWarmupCallback(**KW, lr=LR)
    model = TinyLM()
    trainer(tmp_path, [cb], max_steps=8, accumulate_grad_batches=3).fit(model, loader(60))
    want = replay(8, micro=3, rows=2, **KW, lr=LR)
    shapes = per_step(model)
    assert sorted(shapes) == list(range(8))
    assert [shapes[s] for s in range(8)] == [{(2, length)} for length, _, _ in want]  # one length per step
    assert len(model.seen) == 24  # 3 micro-batches a step
    assert [lr for _, lr in model.lrs] == pytest.approx([lr for _, _, lr in want], rel=1e-12)
    assert model.clock == [(s + 1, tokens) for s, (_, tokens, _) in enumerate(want)]
    assert want[0][0] == 8 and want[-1][0] == SEQ  # the ramp was really walked
    assert len({lr for _, _, lr in want}) == 8


def test_validation_batches_keep_their_full_length(tmp_path):
    model = TinyLM()
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**KW)], max_steps=2, val_check_interval=2, limit_val_batches=1)
    t.fit(model, loader(8), loader(4))
    assert (-1, (2, SEQ)) in model.seen and (0, (2, 8)) in model.seen


def test_curriculum_values_reach_lightnings_loggers(tmp_path):
    cb = SequenceLengthWarmupCallback(**KW)
    logger = CSVLogger(tmp_path, name="csv", version=0)
    trainer(tmp_path, [cb], max_steps=5, logger=logger, accumulate_grad_batches=2).fit(TinyLM(), loader(40))
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    got = [(int(r["step"]), float(r["curriculum/seqlen"]), float(r["progress/tokens"])) for r in rows]
    want = replay(5, micro=2, rows=2, **KW)
    assert got == [(s, float(length), float(tokens)) for s, (length, tokens, _) in enumerate(want)]


def test_the_token_budget_stops_the_trainer(tmp_path):
    cb = SequenceLengthWarmupCallback(**KW, train_tokens=100)
    model = TinyLM()
    trainer(tmp_path, [cb], max_steps=50).fit(model, loader(100))
    assert cb.curriculum.done and cb.curriculum.progress.tokens >= 100
    assert model.trainer.global_step == cb.curriculum.progress.step < 50


def fit_with_checkpoints(tmp, steps: int, ckpt_path: str | None = None) -> tuple[TinyLM, SequenceLengthWarmupCallback]:
    cb = SequenceLengthWarmupCallback(**KW, lr=LR)
    saver = ModelCheckpoint(dirpath=tmp / "ckpt", filename="{step}", every_n_train_steps=1, save_top_k=-1)
    model = TinyLM()
    t = trainer(tmp, [cb, saver], max_steps=steps, accumulate_grad_batches=2, enable_checkpointing=True)
    t.fit(model, loader(14), ckpt_path=ckpt_path)  # 7 micro-batches an epoch: steps straddle the epochs
    return model, cb


def test_a_resume_from_lightnings_checkpoint_continues_exactly(tmp_path):
    full, full_cb = fit_with_checkpoints(tmp_path / "full", 9)
    ckpt = tmp_path / "full" / "ckpt" / "step=4.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (tmp_path / "full" / "ckpt").iterdir())
    resumed, cb = fit_with_checkpoints(tmp_path / "resumed", 9, str(ckpt))
    assert resumed.lrs and resumed.lrs[0][0] == 4
    assert resumed.lrs == full.lrs[4:]
    assert resumed.clock == full.clock[4:]
    assert per_step(resumed) == {s: v for s, v in per_step(full).items() if s >= 4}
    assert cb.curriculum.state_dict() == full_cb.curriculum.state_dict()
    assert len({shape for shapes in per_step(full).values() for shape in shapes}) > 2  # lengths changed


STAGED = dict(min_length=8, max_length=16, steps=2, multiple_of=8)
ROPE_STAGE = {"start_tokens": 100, "length": SEQ, "rope_theta": 500_000.0}


def rotary_tables(theta: float | None) -> float:
    """The sum of the tables of RotaryLM's GPT at base θ ``theta`` (None: its own)."""
    gpt = RotaryLM().gpt
    if theta is not None:
        gpt.set_positions(theta, None)
    return float(gpt.rope_cos.sum())


def fit_staged(tmp, steps: int, ckpt_path: str | None = None) -> RotaryLM:
    cb = SequenceLengthWarmupCallback(**STAGED, stages=[ROPE_STAGE])
    saver = ModelCheckpoint(dirpath=tmp / "ckpt", filename="{step}", every_n_train_steps=1, save_top_k=-1)
    model = RotaryLM()
    t = trainer(tmp, [cb, saver], max_steps=steps, enable_checkpointing=True)
    t.fit(model, loader(2), ckpt_path=ckpt_path)  # one batch an epoch: a checkpoint resumes where it stopped
    return model


def test_a_rope_stage_sets_the_positions_on_the_model_at_its_first_step_and_after_a_resume(tmp_path):
    base, stage = rotary_tables(None), rotary_tables(ROPE_STAGE["rope_theta"])
    assert base != stage
    full = fit_staged(tmp_path / "full", 8)
    first = next(step for step, length, _, _ in full.seen if length == SEQ)  # the stage's first step
    assert 2 < first < 7  # after the warmup (8 -> 16), before the end
    # the clock reached start_tokens before the stage's first step, not before the one ahead of it
    assert {(length, tables) for step, length, tables, _ in full.seen if step < first} <= {(8, base), (16, base)}
    assert {(length, tables) for step, length, tables, _ in full.seen if step >= first} == {(SEQ, stage)}
    # a resume inside the stage: the positions set when the checkpoint loads, before any step; the same losses
    resumed = fit_staged(tmp_path / "resumed", 8, str(tmp_path / "full" / "ckpt" / f"step={first + 1}.ckpt"))
    assert resumed.at_start == stage
    assert resumed.seen == [row for row in full.seen if row[0] > first]


def test_rope_stages_on_a_module_nothing_can_set_them_on_are_refused(tmp_path):
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**STAGED, stages=[ROPE_STAGE])], max_steps=1)
    with pytest.raises(UserError, match="SequenceLengthWarmupCallback.*rope_theta"):
        t.fit(RotaryLM(rotary=False), loader(4))
    length_only = {"start_tokens": 100, "length": SEQ}  # nothing to set: any model trains it as asked
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**STAGED, stages=[length_only])], max_steps=1)
    t.fit(RotaryLM(rotary=False), loader(4))


def test_a_resume_from_a_checkpoint_without_the_callbacks_state_is_refused(tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{step}", every_n_train_steps=2)
    trainer(tmp_path, [saver], max_steps=2, enable_checkpointing=True).fit(TinyLM(), loader(8))
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**KW)], max_steps=4)
    with pytest.raises(UserError, match="holds no SequenceLengthWarmupCallback state"):
        t.fit(TinyLM(), loader(8), ckpt_path=str(tmp_path / "ckpt" / "step=2.ckpt"))


def test_an_lr_scheduler_next_to_lr_is_refused_and_a_tuple_batch_is_named(tmp_path):
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**KW, lr=LR)], max_steps=1)
    with pytest.raises(UserError, match="return no LR scheduler"):
        t.fit(TinyLM(scheduler=True), loader(4))
    tuples = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, SEQ, dtype=torch.long)))
    t = trainer(tmp_path, [SequenceLengthWarmupCallback(**KW)], max_steps=1)
    with pytest.raises(UserError, match="needs a dict of tensors"):
        t.fit(TinyLM(), tuples)


def test_the_callback_takes_the_keywords_of_sequence_length_warmup():
    want = inspect.signature(SequenceLengthWarmup.__init__)
    assert inspect.signature(SequenceLengthWarmupCallback.__init__) == want
    cb = SequenceLengthWarmupCallback(
        min_length=16, max_length=64, steps=10, mode="reshape", count_tokens_by="loss_mask"
    )
    assert (cb.curriculum.mode, cb.curriculum.count_tokens_by) == ("reshape", "loss_mask")
    with pytest.raises(ConfigError, match="steps"):
        SequenceLengthWarmupCallback(min_length=16, max_length=64, steps=0)


def test_importing_the_integration_imports_no_lightning_and_its_absence_names_the_extra():
    code = (
        "import sys\n"
        "import seqwarm.integrations.lightning as m\n"
        "assert not any(k.split('.')[0] in ('lightning', 'pytorch_lightning') for k in sys.modules), 'imported'\n"
        "sys.modules['lightning'] = sys.modules['lightning.pytorch'] = sys.modules['pytorch_lightning'] = None\n"
        "try:\n"
        "    m.SequenceLengthWarmupCallback\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MissingDependencyError" in out.stdout and "pip install 'seqwarm[lightning]'" in out.stdout


@pytest.mark.slow
@pytest.mark.dist
def test_ddp_with_two_cpu_processes_sums_the_tokens_over_ranks(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [sys.executable, str(HERE / "lightning_ddp.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    want = replay(6, micro=2, rows=2 * 2, **KW, lr=LR)  # two ranks: the clock counts both ranks' rows
    for rank in ranks:
        assert rank["world_size"] == 2
        assert rank["lengths"] == [[length] for length, _, _ in want]
        assert [tokens for _, tokens in rank["clock"]] == [tokens for _, tokens, _ in want]
        assert rank["lrs"] == pytest.approx([lr for _, _, lr in want], rel=1e-12)
    assert ranks[0]["first_rows"] != ranks[1]["first_rows"]  # each rank trained its own shard


def test_the_snippet_of_frameworks_md_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(doc_block("FRAMEWORKS.md", "test_lightning.py"), "FRAMEWORKS.md", "exec"), namespace)
    slw = namespace["curriculum"].curriculum
    assert (slw.progress.step, slw.current_seqlen) == (10, 128)
    want = replay(10, micro=2, rows=4, seq=128, min_length=16, max_length=128, steps=8)
    assert slw.progress.tokens == want[-1][1] and len({length for length, _, _ in want}) > 5
    assert 3e-4 < slw.lr < 3e-3
