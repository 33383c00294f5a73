"""One optimizer step in one place (issue #35): the loop opens the step, draws each raw micro-batch, has
it cut, copied, run forward and backward, updates and ends the step itself; the feed never calls into the
curriculum; the precision and the curriculum mode are decided once, before anything is built, and never
written into the config; the engines the loop drives satisfy its Engine protocol."""

import inspect
import json
from dataclasses import replace

import pytest
import torch

from conftest import small_config
from helpers import tiny_run
from seqwarm import load_config
from seqwarm.curriculum.engine import CurriculumEngine
from seqwarm.trainer import backends
from seqwarm.trainer.backends import Engine, PipelineEngine, RunChoices, TorchEngineBuilder, curriculum_mode, decide


def _members(protocol) -> set[str]:
    """The names a Protocol declares (its own and its bases'), attributes and methods."""
    names = set()
    for cls in protocol.__mro__:
        if cls in (object,) or cls.__name__ in ("Protocol", "Generic"):
            continue
        names |= set(getattr(cls, "__annotations__", {}))
        names |= {n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
        names |= {"__call__"} if "__call__" in vars(cls) else set()
    return names


def test_both_backends_engines_have_every_member_of_the_loops_protocol():
    pytest.importorskip("deepspeed")
    from seqwarm.integrations.deepspeed.curriculum import DeepSpeedEngineAdapter
    from seqwarm.integrations.deepspeed.pipeline import PipelineEngineAdapter

    wanted = _members(Engine)
    assert {"begin_step", "cut", "run", "backward", "update", "end_step", "stop_reason", "progress"} <= wanted
    assert len(wanted) <= 16  # only what the loop (and the evaluator and metrics it hands the engine to) use
    for cls in (CurriculumEngine, DeepSpeedEngineAdapter, PipelineEngineAdapter):
        missing = {m for m in wanted - {"module"} if not hasattr(cls, m)}
        assert not missing, (cls.__name__, missing)  # `module` is an instance attribute of both
    assert hasattr(PipelineEngineAdapter, "train_batch") and "train_batch" in _members(PipelineEngine)
    assert not hasattr(CurriculumEngine, "train_batch")


def test_the_loop_opens_cuts_and_ends_each_step_itself(tmp_path, byte_data, one_thread):
    cfg = small_config(tmp_path / "c.json", train_tokens=1500, batch=8, micro=4)  # 2 micro-batches a step
    run = tiny_run(tmp_path / "r", byte_data, cfg, memory_probe=False)
    calls = []
    engine, feed = run.engine, run.feed

    def record(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            out = real(*args, **kwargs)
            if name == "draw":  # raw: full length, every key
                assert out["input_ids"].shape[1] == 64 and "loss_mask" in out
            return out

        setattr(owner, name, wrapper)

    for name in ("begin_step", "cut", "run", "backward", "update", "end_step", "step"):
        record(engine, name)
    for name in ("draw", "to_device"):
        record(feed, name)
    result = run.train()
    micro = ["draw", "cut", "to_device", "run", "backward", "update"]
    one_step = ["begin_step", *micro, *micro, "end_step"]
    assert result.steps >= 3 and calls == one_step * result.steps
    assert "step" not in calls  # the engine's own step() (which would end the step inside) is not used


def test_the_feed_does_not_call_back_into_the_curriculum():
    from seqwarm.trainer import feed

    source = inspect.getsource(feed)
    assert "cut(" not in source.replace("the loop cut", "") and "engine" not in source.split('"""', 2)[2]
    params = inspect.signature(feed.DeviceFeed.draw).parameters
    assert list(params) == ["self"]


def test_mode_and_precision_are_decided_once_before_the_build_and_not_written_into_the_config(
    tmp_path, byte_data, monkeypatch
):
    cfg_path = small_config(tmp_path / "c.json", train_tokens=1500)
    decided, built = [], []
    real_decide, real_build = backends.decide, TorchEngineBuilder.build

    def counting_decide(*args, **kwargs):
        decided.append(len(built))  # how many builds came before it
        return real_decide(*args, **kwargs)

    def counting_build(self, model_cfg, cfg, info, device, choices):
        built.append(choices)
        return real_build(self, model_cfg, cfg, info, device, choices)

    monkeypatch.setattr("seqwarm.trainer.loop.decide", counting_decide)
    monkeypatch.setattr(TorchEngineBuilder, "build", counting_build)
    run = tiny_run(tmp_path / "r", byte_data, cfg_path, memory_probe=False)
    assert decided == [0] and len(built) == 1  # once, before the build
    assert built[0] == RunChoices("fp32", "default on cpu", "inject")  # auto: the GPT takes curriculum_seqlen
    assert run.cfg == load_config(cfg_path) and run.cfg.curriculum.mode is None  # the config as given
    assert run.engine.slw.mode == "inject" and run.engine.precision == "fp32"  # what the engine was handed
    assert run.resolved["run"]["curriculum"]["mode"] == "inject"  # the record says what it trained in
    assert run.resolved["run"]["precision"] == "fp32" and run.resolved["run"]["precision_named"] is True


def test_the_precision_rule_probes_bf16_and_keeps_a_resumed_runs_precision(monkeypatch):
    cfg = load_config({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2})
    assert not cfg.precision_named
    builder, cuda, cpu = TorchEngineBuilder(), torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(backends, "bf16_supported", lambda kind: True)
    assert decide(cfg, builder, None, cuda) == RunChoices("bf16", "default on cuda", None)
    assert decide(cfg, builder, None, cuda, resumed="fp16") == RunChoices("fp16", "resumed run", None)
    named = replace(cfg, precision="fp16", precision_named=True)
    assert decide(named, builder, None, cpu, resumed="bf16").precision_source == "config"
    monkeypatch.setattr(backends, "bf16_supported", lambda kind: kind != "cuda")  # a GPU before Ampere
    assert decide(cfg, builder, None, cuda).precision == "fp32"


def test_one_mode_rule_for_every_backend():
    from seqwarm.trainer.model import GPT

    raw = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "seqwarm": {"seq_length": 64}}
    raw["curriculum_learning"] = {
        "enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
        "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 4, "difficulty_step": 8},
    }  # fmt: skip
    auto = load_config(raw)
    assert curriculum_mode(auto, GPT.forward) == "inject"
    assert curriculum_mode(auto, None, pipeline=True) == "truncate"
    bucket = load_config({**raw, "seqwarm": {"seq_length": 64, "length_bucket": 16}})
    assert curriculum_mode(bucket, GPT.forward) == "truncate"  # buckets are cut on the data, never injected
    assert (
        curriculum_mode(load_config({k: v for k, v in raw.items() if k != "curriculum_learning"}), GPT.forward) is None
    )
    inject = load_config({**raw, "seqwarm": {"seq_length": 64, "curriculum_mode": "inject"}})
    with pytest.raises(ValueError, match="pipeline"):
        curriculum_mode(inject, None, pipeline=True)
    # the engine, handed the mode, trains in it (and checks it against its model)
    model = GPT(__import__("seqwarm").GPTConfig.preset("tiny", vocab_size=50, seq_length=64))
    engine = CurriculumEngine(model, torch.optim.SGD(model.parameters(), lr=0.1), auto, mode="truncate")
    assert engine.mode == "truncate"


def test_the_run_records_the_options_the_run_layer_names(tmp_path, byte_data):
    from seqwarm.run.training import RECORDED_OPTIONS
    from seqwarm.trainer import loop
    from seqwarm.trainer.record import write_resolved_config

    assert not hasattr(loop, "RECORDED_OPTIONS")  # the trainer does not know the command's field names
    run = tiny_run(tmp_path / "r", byte_data, small_config(tmp_path / "c.json"), memory_probe=False)
    assert list(run.resolved["options"]) == [*RECORDED_OPTIONS, "memory_probe"]
    write_resolved_config(run)
    recorded = json.loads((tmp_path / "r" / "config.json").read_text())["options"]
    assert recorded["eval_iters"] == 1 and recorded["memory_probe"] is False
