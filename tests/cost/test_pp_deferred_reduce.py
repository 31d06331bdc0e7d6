"""PyTorch pipelining defers FSDP's gradient reduction to the step's last backward.

torch v2.13.0 torch/distributed/pipelining/stage.py:843-848 runs every micro-batch's backward
of an FSDP2 stage with `set_requires_gradient_sync(False)`; `perform_reduce_grad`
(stage.py:1164-1195, after all micro-batches: schedules.py:960, 1177, 2605-2607) reduces
once. torchtitan (recipe `torchtitan-fsdp`, behaviour `pp_defers_reduce`) with pp > 1 then
reduce-scatters once per step at ZeRO-2 and ZeRO-3 and keeps whole gradients until then.
Hand-derived on dp = 8 ranks inside one NVLink node (ring: (n-1)/n of the bytes).
"""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.model_state import state_bytes_per_param
from autoparallel_cp.cost.pp_grad_sync import pp_deferred
from autoparallel_cp.cost.sync import (
    dp_sync_factors,
    fsdp_call_latency,
    microbatch_grad_factors,
)
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
)

NV = 450e9 * comm.NVLINK_EFFICIENCY


def _job(nodes: int, recipe: str = "torchtitan-fsdp") -> Job:
    """`nodes` x 8 H100; dp = 8 at tp = cp = 1 gives pp = nodes."""
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    nd = NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=nodes,
                   intra_node=LinkSpec(bandwidth_gbps=450, latency_us=3.0),
                   inter_node=LinkSpec(bandwidth_gbps=50, latency_us=8.0))
    m = ModelSpec(name="llama8b-like", num_layers=4, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    return Job(model=m, cluster=ClusterSpec(name="c", node_groups=[nd]),
               recipe=RECIPES[recipe], seq_len=4096, global_batch=64)


def _sync(job: Job, zero: int) -> list[float]:
    return [float(np.asarray(x)) for x in dp_sync_factors(job, 0, 1, 1, 8, 1, zero)]


def _mb(job: Job, zero: int) -> float:
    return float(np.asarray(microbatch_grad_factors(job, 0, 1, 1, 8, 1, zero)[0]))


def test_deferral_needs_pp_above_one_and_the_behaviour() -> None:
    assert not bool(pp_deferred(_job(1), 1, 1, 8))  # pp = 1
    assert bool(pp_deferred(_job(2), 1, 1, 8))  # pp = 16 / 8 = 2
    assert not bool(pp_deferred(_job(2, "pytorch-fsdp"), 1, 1, 8))  # FSDP1 trainers: no pp
    assert not bool(pp_deferred(_job(2, "megatron-bf16"), 1, 1, 8))


def test_zero2_with_pp_reduces_once_per_step() -> None:
    """pp = 1: 4·7/8 B per parameter reduce-scattered every micro-batch (fp32 reduce_dtype),
    the step keeps the bf16 all-gather, 2·7/8. pp = 2: nothing per micro-batch, the step
    pays the reduce-scatter and the all-gather, (4 + 2)·7/8, as ZeRO-1."""
    one, two = _job(1), _job(2)
    assert _mb(one, 2) == pytest.approx(4 * 7 / 8 / NV, rel=1e-9)
    assert _sync(one, 2)[0] == pytest.approx(2 * 7 / 8 / NV, rel=1e-9)
    assert _mb(two, 2) == 0.0
    assert _sync(two, 2)[0] == pytest.approx((4 + 2) * 7 / 8 / NV, rel=1e-9)
    assert _sync(two, 2)[0] == pytest.approx(_sync(two, 1)[0], rel=1e-12)


def test_zero3_with_pp_moves_the_reduce_scatter_to_the_step() -> None:
    """pp = 1: two bf16 gathers and the fp32 reduce-scatter per micro-batch, (2·2 + 4)·7/8;
    pp = 2: the gathers stay per micro-batch (2·2·7/8), the reduce-scatter (4·7/8) moves to
    the step; its per-unit call latency moves from the micro-batch to the step too."""
    one, two = _job(1), _job(2)
    per, _, z3, _ = _sync(one, 3)
    assert (per, z3) == (0.0, pytest.approx((2 * 2 + 4) * 7 / 8 / NV, rel=1e-9))
    per, _, z3, _ = _sync(two, 3)
    assert per == pytest.approx(4 * 7 / 8 / NV, rel=1e-9)
    assert z3 == pytest.approx(2 * 2 * 7 / 8 / NV, rel=1e-9)
    mb1, st1 = (float(np.asarray(x)) for x in fsdp_call_latency(one, 0, 1, 1, 8, 3))
    mb2, st2 = (float(np.asarray(x)) for x in fsdp_call_latency(two, 0, 1, 1, 8, 3))
    assert st1 == 0.0 and mb1 > 0.0
    assert mb2 == pytest.approx(mb1 * 2 / 3, rel=1e-9)  # AG fwd + AG bwd of the three calls
    assert st2 == pytest.approx(mb1 / 3, rel=1e-9)  # one RS per unit per step


def test_deferred_gradients_stay_whole_in_memory() -> None:
    """FSDP2 accumulates unsharded gradients while gradient sync is off: 4 B per parameter at
    pp > 1, 4/8 at pp = 1 (dp·cp = 8)."""
    rec = RECIPES["torchtitan-fsdp"]
    for zero in (2, 3):
        assert float(state_bytes_per_param(rec, zero, 8)[1]) == 0.5
        assert float(state_bytes_per_param(rec, zero, 8, pp=2)[1]) == 4.0
    assert float(state_bytes_per_param(RECIPES["pytorch-fsdp"], 2, 8, pp=2)[1]) == 0.5


def test_torchtitan_pipelined_zero2_costs_as_zero1() -> None:
    """llama3-8b on 16 H100, torchtitan, pp 2, dp 8, 32 micro-batches: ZeRO-2 now reduces once
    per step, so its DP time is ZeRO-1's plus only the per-unit call latencies, and its
    gradients are as large; at pp 1 it still pays a reduce-scatter per micro-batch."""
    from autoparallel_cp.api import evaluate, make_job

    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=8192, global_batch=64,
                   recipe="torchtitan-fsdp")
    plan = "tp=1,pp={},cp=1,zero={},mbs=1,recompute=full"
    z1, z2 = (evaluate(job, plan.format(2, z)) for z in (1, 2))
    assert z1.time.dp_comm_s <= z2.time.dp_comm_s < 1.05 * z1.time.dp_comm_s
    assert z2.memory.grads_bytes == pytest.approx(z1.memory.grads_bytes, rel=1e-9)
    p1, p2 = (evaluate(job, plan.format(1, z)) for z in (1, 2))
    assert p2.time.dp_comm_s > 5 * p1.time.dp_comm_s
    assert p2.memory.grads_bytes < p1.memory.grads_bytes / 4
