"""Launch settings of MoE parallel folding (plan field `etp`), pinned to the frameworks' sources.

- Megatron-LM d98e8a64: `--expert-tensor-parallel-size` (ModelParallelConfig
  expert_tensor_parallel_size, model_parallel_config.py:130, default tp) and
  `--moe-token-dispatcher-type alltoall` (transformer_config.py:891; the default "allgather"
  is not the dispatcher the cost model prices);
- torchtitan 0.3.0: no expert tensor parallelism; with ep > 1 the experts are sharded over ep
  only, with ep laid over dp_shard * cp * tp (parallel_dims.py sparse mesh; MOE_SHARDING.md);
- torchtitan v0.2.2: `expert_tensor_parallel_degree` is tp or 1 when ep > 1, default 1
  (job_config.py:464-472, parallel_dims.py:58-59);
- DeepSpeed 0.19.8 AutoEP: no expert tensor parallelism (auto_ep_config.py:42-50).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import emit, megatron_args
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import parse_plan, plan_violations


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_megatron_writes_the_expert_grid_and_the_dispatcher() -> None:
    job = make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=1024)
    # Megatron-Bridge's DeepSeek-V3 H100 layout (tp 2, ep 64 = dp, etp 1), without the uneven
    # interleaving: pp 16 over the 61 layers + MTP as 3:4x14:2
    plan = parse_plan("tp=2,pp=16,ep=64,etp=1,sp=1,zero=1,mbs=1,stage_layers=3"
                      + ":4" * 14 + ":2", job)
    assert plan_violations(job, plan) == []
    args, _ = megatron_args(job, plan)
    assert _arg(args, "--tensor-model-parallel-size") == "2"
    assert _arg(args, "--expert-model-parallel-size") == "64"
    assert _arg(args, "--expert-tensor-parallel-size") == "1"
    assert _arg(args, "--moe-token-dispatcher-type") == "alltoall"
    assert "--sequence-parallel" in args  # folded with tp > 1 (moe_layer.py:636)


def test_megatron_default_layout_keeps_its_flags() -> None:
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    args, _ = megatron_args(job, parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1", job))
    assert "--expert-tensor-parallel-size" not in args  # Megatron's default (= tp)
    assert _arg(args, "--moe-token-dispatcher-type") == "alltoall"
    dense = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=8)
    args, _ = megatron_args(dense, parse_plan("tp=2,sp=1", dense))
    assert "--moe-token-dispatcher-type" not in args


def _no_mtp(job: Job) -> Job:
    """DeepSeek-V3 without its MTP module: torchtitan refuses MTP with pp > 1 (mtp.py:202)."""
    return job.model_copy(update={"model": job.model.model_copy(update={"mtp_layers": 0})})


def test_torchtitan_runs_ep_without_expert_tp() -> None:
    job = _no_mtp(make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096,
                           global_batch=1024, recipe="torchtitan-fsdp"))
    split = ",stage_layers=3" + ":4" * 14 + ":2"
    default = parse_plan("tp=2,pp=16,ep=32,sp=1,zero=3,mbs=1" + split, job)
    [bad] = [r for r in refusals(job, default, "torchtitan") if r.field == "etp"]
    assert bad.closest == {"etp": 1}
    with pytest.raises(UserError, match="etp: .*closest plan it runs: etp=1"):
        emit(job, default, "torchtitan")
    folded = parse_plan("tp=2,pp=16,ep=64,etp=1,sp=1,zero=3,mbs=1" + split, job)
    assert refusals(job, folded, "torchtitan") == []
    text = emit(job, folded, "torchtitan").text
    assert "expert_parallel_degree=64" in text and "tensor_parallel_degree=2" in text
    assert "expert_tensor_parallel_degree" not in text  # 0.3.0 has no such field


def test_torchtitan_v022_writes_its_expert_tp_degree() -> None:
    job = _no_mtp(make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096,
                           global_batch=1024, recipe="torchtitan-fsdp"))
    split = ",stage_layers=3" + ":4" * 14 + ":2"
    for etp, ep in (("", 32), (",etp=1", 64)):
        plan = parse_plan(f"tp=2,pp=16,ep={ep},sp=1,zero=3,mbs=1{etp}" + split, job)
        text = emit(job, plan, "torchtitan-toml").text
        assert f"expert_tensor_parallel_degree = {plan.expert_tp}" in text
    odd = parse_plan("tp=4,pp=16,ep=16,etp=2,sp=1,zero=3,mbs=1" + split, job)
    assert [r.closest for r in refusals(job, odd, "torchtitan-toml") if r.field == "etp"] == [
        {"etp": 1}]


def test_deepspeed_refuses_folded_plans() -> None:
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256,
                   recipe="megatron-bf16")
    folded = parse_plan("tp=2,ep=8,etp=1,sp=1,zero=1", job)
    with pytest.raises(UserError, match="deepspeed cannot run this plan"):
        emit(job, folded, "deepspeed")
    assert any(r.field == "etp" and r.closest == {"etp": 2}
               for r in refusals(job, folded, "deepspeed"))
    tp1 = parse_plan("ep=8,etp=1,zero=1", job)  # etp = tp = 1: nothing folded
    assert not [r for r in refusals(job, tp1, "deepspeed") if r.field == "etp"]
