"""Per-call latency of FSDP's per-unit collectives, by hand.

Expected values follow NCCL's tuning model for ring all-gather / reduce-scatter (NVIDIA/nccl
src/graph/tuning.cc `ncclTopoTuneModel`: nRanks - 1 ring steps, nNodes - 1 of them over the
network) on the toy H100 cluster's links (NVLink 3 us, network 8 us per hop), and FSDP's call
pattern (one all-gather before each unit's forward and backward under FULL_SHARD, one
reduce-scatter per unit; SHARD_GRAD_OP gathers once and keeps the parameters).
"""

from __future__ import annotations

import numpy as np
import pytest
from toy_cluster import h100_cluster

from autoparallel_cp.cost import comm
from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.steptime import stage_times
from autoparallel_cp.cost.sync import fsdp_call_latency
from autoparallel_cp.spec import RECIPES, Job, ModelSpec
from autoparallel_cp.spec.plan import Plan

US = 1e-6


def _job(nodes: int, recipe: str = "pytorch-fsdp") -> Job:
    m = ModelSpec(name="mpt-like", num_layers=4, hidden_size=2048, ffn_hidden_size=8192,
                  num_attention_heads=16, num_kv_heads=16, vocab_size=50368,
                  position_embedding="alibi", mlp="gelu", norm="layernorm")
    return Job(model=m, cluster=h100_cluster(nodes), recipe=RECIPES[recipe], seq_len=2048,
               global_batch=8 * nodes * 2)


def _node():
    return h100_cluster(64).node_groups[0]


def test_ring_latency_within_one_node() -> None:
    """8 ranks on one node: 7 NVLink hops."""
    assert float(comm.ring_call_latency(_node(), 8, 1)) == pytest.approx(7 * 3.0 * US)


def test_ring_latency_over_sixty_four_nodes() -> None:
    """512 ranks, 8 per node: 511 ring steps, 63 of them between nodes -> 448 x 3 us
    + 63 x 8 us = 1,848 us."""
    assert float(comm.ring_call_latency(_node(), 512, 1)) == pytest.approx(1848.0 * US)


def test_ring_latency_with_a_stride() -> None:
    """16 ranks at stride 4: 2 per node on 8 nodes -> (16 - 8) x 3 us + 7 x 8 us = 80 us."""
    assert float(comm.ring_call_latency(_node(), 16, 4)) == pytest.approx(80.0 * US)


def test_one_rank_has_no_latency() -> None:
    assert float(comm.ring_call_latency(_node(), 1, 1)) == 0.0


def _step_reduce(job: Job) -> Job:
    """The job with ZeRO-3 reducing once per step (Megatron-style buffers)."""
    return job.model_copy(update={"recipe": job.recipe.with_behaviour(zero3_reduce="step")})


def test_fsdp_calls_by_sharding_strategy() -> None:
    """32 ranks on 4 nodes: one call = (32 - 4) x 3 + 3 x 8 = 108 us. FULL_SHARD: two gathers
    per layer per micro-batch and, as PyTorch FSDP runs it without no_sync, a reduce-scatter
    per layer per micro-batch too (3 x 108 us, none left per step); reducing once per step
    instead: 2 x 108 per micro-batch, 108 per step; SHARD_GRAD_OP: one gather and one
    reduce-scatter per layer per step; DDP-style (zero <= 1): no unit calls."""
    job = _job(4)
    assert job.recipe.behaviour.zero3_reduce == "microbatch"
    mb, st = (float(x) for x in fsdp_call_latency(job, 0, 1, 1, 32, 3))
    assert (mb, st) == (pytest.approx(324.0 * US), 0.0)
    mb, st = (float(x) for x in fsdp_call_latency(_step_reduce(job), 0, 1, 1, 32, 3))
    assert mb == pytest.approx(216.0 * US)
    assert st == pytest.approx(108.0 * US)
    mb, st = (float(x) for x in fsdp_call_latency(job, 0, 1, 1, 32, 2))
    assert (mb, st) == (0.0, pytest.approx(216.0 * US))
    for z in (0, 1):
        assert [float(x) for x in fsdp_call_latency(job, 0, 1, 1, 32, z)] == [0.0, 0.0]


def test_megatron_fsdp_pays_the_unit_calls_at_zero3() -> None:
    """Megatron's zero=3 is Megatron-FSDP optim_grads_params with one unit per transformer
    layer (mcore_fsdp_adapter.py:167-172): two gathers and a reduce-scatter per layer per
    micro-batch over the 32 ranks of 4 nodes, 3 x 108 us, none per step. Its zero=2 charges
    no unit call (only the per-micro-batch bandwidth, sync.microbatch_grad_factors)."""
    job = _job(4, "megatron-bf16")
    mb, st = fsdp_call_latency(job, 0, 1, 1, 32, np.array([2, 3]))
    assert float(mb[0]) == 0.0 and float(st[0]) == 0.0
    assert float(mb[1]) == pytest.approx(324.0 * US) and float(st[1]) == 0.0


def test_stage_sync_pays_one_reduce_scatter_latency_per_layer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4-layer model under FULL_SHARD over 32 ranks, reducing once per step: the stage's DP
    synchronisation grows by 4 layers x 108 us over the same step without unit calls."""
    job = _step_reduce(_job(4))
    plan = Plan(dp=32, zero=3, mbs=1, num_microbatches=2)
    with_calls = stage_times(job, plan)[0].dp_sync_s

    def none(job: Job, g: int, tp: object, cp: object, dp: object, zero: object,
             rep: object = 1) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(()), np.zeros(())

    monkeypatch.setattr(F, "fsdp_call_latency", none)
    without = stage_times(job, plan)[0].dp_sync_s
    assert with_calls - without == pytest.approx(4 * 108.0 * US, rel=1e-9)


def test_microbatch_reduce_scatter_moves_from_the_step_into_every_micro_batch() -> None:
    """FULL_SHARD over 32 ranks, 4 layers, 2 micro-batches: reducing in every micro-batch takes
    the dense reduce-scatter's bandwidth out of the step's DP sync (left: the fixed latency of
    one synchronisation, no per-layer call latency) and adds one reduce-scatter of each
    layer's gradients (fp32, reduce_dtype) to the per-micro-batch ZeRO-3 term."""
    job = _job(4)
    plan = Plan(dp=32, zero=3, mbs=1, num_microbatches=2)
    per = stage_times(job, plan)[0]
    once = stage_times(_step_reduce(job), plan)[0]
    _, _, _, fixed = F.dp_sync_factors(job, 0, 1, 1, 32, 1, 3)
    assert per.dp_sync_s == pytest.approx(float(fixed), rel=1e-9)
    assert once.dp_sync_s > 10 * per.dp_sync_s
    _, _, z3_step, _ = F.dp_sync_factors(_step_reduce(job), 0, 1, 1, 32, 1, 3)
    _, _, z3_mb, _ = F.dp_sync_factors(job, 0, 1, 1, 32, 1, 3)
    nd = job.cluster.node_groups[0]
    rs = (float(comm.reduce_scatter(nd, 32, 1, 4e9))
          - float(comm.reduce_scatter(nd, 32, 1, 0.0))) / 1e9
    assert float(z3_mb) - float(z3_step) == pytest.approx(rs, rel=1e-9)
    assert per.zero3_s > once.zero3_s
