"""Launch settings of hybrid sharding (plan field `dp_replicate`), pinned to the frameworks'
sources (spec/hybrid_sharding.py): torchtitan `data_parallel_replicate_degree` x
`data_parallel_shard_degree`, Megatron `--num-distributed-optimizer-instances`; DeepSpeed
0.19.8 has none (MiCS removed): refused with the reason."""

from __future__ import annotations

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import deepspeed_config, emit, megatron_args
from autoparallel_cp.emit.torchtitan import torchtitan_settings
from autoparallel_cp.errors import InfeasibleError, UserError
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import parse_plan, plan_violations


def _job(recipe: str = "megatron-bf16"):
    return make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=4096, global_batch=128,
                    recipe=recipe)


def test_torchtitan_replicates_the_shard_mesh() -> None:
    job = _job("torchtitan-fsdp")
    for zero, reshard in ((3, "always"), (2, "never")):
        plan = parse_plan(f"tp=2,zero={zero},mbs=1,dp_replicate=4", job)
        assert plan_violations(job, plan) == [] and refusals(job, plan, "torchtitan") == []
        sections, _ = torchtitan_settings(job, plan)
        par = sections["parallelism"]
        assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"],
                par["fsdp_reshard_after_forward"]) == (4, 4, reshard)
    plain, _ = torchtitan_settings(job, parse_plan("tp=2,zero=3,mbs=1", job))
    assert plain["parallelism"]["data_parallel_replicate_degree"] == 1
    assert plain["parallelism"]["data_parallel_shard_degree"] == 16


def test_megatron_writes_optimizer_instances() -> None:
    job = _job()
    args, _ = megatron_args(job, parse_plan("tp=2,zero=1,mbs=1,dp_replicate=2", job))
    i = args.index("--num-distributed-optimizer-instances")
    assert args[i + 1] == "2" and "--use-distributed-optimizer" in args
    args, _ = megatron_args(job, parse_plan("tp=2,zero=3,mbs=1,dp_replicate=2", job))
    assert "--use-megatron-fsdp" in args and "--num-distributed-optimizer-instances" in args
    args, _ = megatron_args(job, parse_plan("tp=2,zero=1,mbs=1", job))
    assert "--num-distributed-optimizer-instances" not in args


def test_deepspeed_refuses_it() -> None:
    """DeepSpeed 0.19.8 removed MiCS: its config raises on `mics_shard_size`
    (runtime/config.py:119-125, 133-141), so --emit deepspeed refuses a replicated plan,
    naming the plain-sharding plan it runs, and the search with --emit deepspeed proves none
    fits, naming the row."""
    job = _job("deepspeed")
    for text in ("zero=3,mbs=1,dp_replicate=4", "zero=1,mbs=1,dp_replicate=4",
                 "tp=2,zero=3,mbs=1,dp_replicate=4"):
        bad = parse_plan(text, job)
        with pytest.raises(UserError, match="dp_replicate: .*MiCS.*closest plan it runs: "
                                            "dp_replicate=1"):
            emit(job, bad, "deepspeed")
    cfg, _ = deepspeed_config(job, parse_plan("zero=3,mbs=1", job))
    assert cfg["zero_optimization"] == {"stage": 3}
    from autoparallel_cp.search.solve import solve
    from autoparallel_cp.search.space import SearchSpace

    space = SearchSpace.for_job(job, fix="dp_replicate=2", emit="deepspeed")
    with pytest.raises(InfeasibleError, match="no plan that deepspeed runs.*deepspeed "
                                              "dp_replicate .*MiCS is removed"):
        solve(job, space, top_k=3, time_limit=30, workers=1)
