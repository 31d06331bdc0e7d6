"""Schedules and offload per framework (spec/frameworks.py rows) and what `--emit` writes."""

from __future__ import annotations

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import megatron_args
from autoparallel_cp.emit.deepspeed import deepspeed_config
from autoparallel_cp.emit.torchtitan import torchtitan_settings
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import parse_plan


@pytest.mark.parametrize(("extra", "name"), [
    ("pp=4", "1F1B"), ("pp=4,vpp=2", "Interleaved1F1B"), ("pp=4,schedule=gpipe", "GPipe"),
    ("pp=4,vpp=2,schedule=zbv", "ZBVZeroBubble"),
    ("pp=4,vpp=2,schedule=dualpipev", "DualPipeV"),
])
def test_torchtitan_writes_the_schedule_class(extra: str, name: str) -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, global_batch=64, recipe="torchtitan-fsdp")
    plan = parse_plan(f"tp=2,zero=2,mbs=1,{extra}", job)
    sections, _ = torchtitan_settings(job, plan)
    assert sections["parallelism"]["pipeline_parallel_schedule"] == name


@pytest.mark.parametrize(("fw", "recipe", "text", "closest"), [
    ("torchtitan", "torchtitan-fsdp", "tp=2,pp=4,zero=2,schedule=zb-h1", "1f1b"),
    ("torchtitan", "torchtitan-fsdp", "tp=2,pp=4,zero=2,schedule=dualpipe", "1f1b"),
    ("megatron", "megatron-bf16", "tp=2,pp=4,vpp=2,schedule=zbv", "interleaved"),
    ("megatron", "megatron-bf16", "tp=2,pp=4,schedule=gpipe", "1f1b"),
    ("deepspeed", "deepspeed", "pp=4,zero=1,schedule=zb-h2", "1f1b"),
])
def test_frameworks_refuse_schedules_they_do_not_run(fw: str, recipe: str, text: str,
                                                     closest: str) -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, global_batch=64, recipe=recipe)
    bad = [r for r in refusals(job, parse_plan(text, job), fw) if r.field == "schedule"]
    assert bad and bad[0].closest == {"schedule": closest}


def test_emit_refuses_an_unrunnable_schedule() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, global_batch=64)
    with pytest.raises(UserError, match="schedule"):
        megatron_args(job, parse_plan("tp=2,pp=4,schedule=zb-h1", job))


def test_megatron_offload_flags() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, global_batch=64)
    args, _ = megatron_args(job, parse_plan(
        "tp=8,zero=1,optimizer_offload=0.25,activation_offload=4", job))
    text = " ".join(args)
    assert "--optimizer-cpu-offload --optimizer-offload-fraction 0.25" in text
    assert "--overlap-cpu-optimizer-d2h-h2d" in text
    assert "--cpu-offloading-num-layers 4" in text
    # the precision-aware optimizer the offload needs runs with the distributed optimizer only
    assert [r.closest for r in refusals(job, parse_plan("tp=8,zero=0,optimizer_offload=1", job),
                                        "megatron")] == [{"zero": 1}]
    # TE CPU offloading needs pp = 1 and no recompute
    assert any(r.field == "activation_offload" for r in refusals(
        job, parse_plan("tp=2,pp=4,activation_offload=2", job), "megatron"))


def test_deepspeed_offload_config() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, global_batch=64, recipe="deepspeed")
    cfg, _ = deepspeed_config(job, parse_plan("zero=1,optimizer_offload=1", job))
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu",
                                                             "pin_memory": True}
    cfg3, _ = deepspeed_config(job, parse_plan("zero=3,optimizer_offload=0.5", job))
    assert cfg3["zero_optimization"]["offload_optimizer"]["ratio"] == 0.5
    # a partial offload below ZeRO-3 and any offload without ZeRO are refused
    assert [r.closest for r in refusals(job, parse_plan("zero=1,optimizer_offload=0.5", job),
                                        "deepspeed")] == [{"optimizer_offload": 1}]
    assert [r.closest for r in refusals(job, parse_plan("zero=0,optimizer_offload=1", job),
                                        "deepspeed")] == [{"zero": 1}]
