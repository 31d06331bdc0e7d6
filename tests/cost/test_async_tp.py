"""PyTorch async TP (cost/async_tp.py): which collectives Inductor's micro-pipeline TP fuses,
how much of each its matmul hides, and the float8 / op-SAC all-gathers around it.

Expected values are worked by hand from the schedule in torch/distributed/_symmetric_memory
(`_pipelined_all_gather_and_consume`: tp matmul chunks, tp-1 shard copies, the first chunk has
no copy beside it) and the fusion rules of torch/_inductor/fx_passes/micro_pipeline_tp.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.cost import async_tp as A
from autoparallel_cp.cost import comm, layer_ops
from autoparallel_cp.cost import factors as F
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
)


def _f(x: float) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def test_fused_exposed_hides_behind_all_but_the_first_chunk() -> None:
    """C = 8 s of copies beside G = 4 s of matmul in 8 chunks: 7 chunks (3.5 s) hide copies,
    4.5 s stay exposed; a matmul 10x the copies hides them all."""
    assert float(A.fused_exposed(_f(8.0), _f(4.0), _f(8.0))) == pytest.approx(4.5)
    assert float(A.fused_exposed(_f(1.0), _f(10.0), _f(8.0))) == 0.0
    # two ranks: half the matmul runs beside the single copy
    assert float(A.fused_exposed(_f(3.0), _f(2.0), _f(2.0))) == pytest.approx(2.0)


def test_layer_fuses_all_forward_and_half_the_backward_collectives() -> None:
    """Forward: AG->QKV, out_proj->RS, AG->fc1, fc2->RS all fuse; backward: the gradient AGs
    before the out_proj / fc2 dgrad fuse, the RS after the summed QKV / fc1 dgrads do not."""
    c, tp = _f(2.0), _f(8.0)
    fwd = {"qkv": _f(1.0), "out_proj": _f(1.0), "mlp_fc1": _f(10.0), "mlp_fc2": _f(5.0)}
    dgrad = {"qkv": _f(1.0), "out_proj": _f(1.0), "mlp_fc1": _f(10.0), "mlp_fc2": _f(5.0)}
    stage, red = _f(0.1), _f(0.3)
    got = A.async_tp_layer(c, c, tp, fwd, dgrad, stage, red, (_f(0.5), _f(3.0)), 7.0)
    # exposed 2 - 7/8 = 1.125 behind the 1 s matmuls, 0 behind fc1 / fc2
    assert float(got.fwd_s) == pytest.approx((1.125 + 0.1) + (1.125 + 0.3) + 0.1 + 0.3)
    assert float(got.bwd_s) == pytest.approx((1.125 + 0.1) + 0.1 + 2 * 2.0)
    # op-SAC replays: behind wk (0.5 s: 2 - 0.4375 exposed) and w3 (3 s: none)
    assert float(got.replay_s) == pytest.approx((2.0 - 0.4375 + 0.1) + 0.1)
    assert got.bwd_copy_bytes == 14.0  # the two unfused reduce-scatters' copies


def test_moe_block_collectives_stay_plain() -> None:
    """A layer without the dense MLP GEMMs (MoE): its MLP-side collectives are not fused."""
    c, tp = _f(2.0), _f(8.0)
    fwd = {"qkv": _f(100.0), "out_proj": _f(100.0), "expert_fc1": _f(100.0)}
    got = A.async_tp_layer(c, c, tp, fwd, fwd, _f(0.0), _f(0.0), (_f(0.0), _f(0.0)), 0.0)
    assert float(got.fwd_s) == pytest.approx(2 * 2.0)  # the MLP's AG and RS
    assert float(got.bwd_s) == pytest.approx(2.0 + 2 * 2.0)  # fc2's AG and the two RS


def _titan(dtype: str = "bf16", overlap: float = 0.0, recipe: str = "torchtitan-fsdp") -> Job:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, fp8_tflops=1979, hbm_gbps=3350)
    cl = ClusterSpec(name="c", node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=8, num_nodes=1,
        intra_node=LinkSpec(bandwidth_gbps=450), inter_node=LinkSpec(bandwidth_gbps=50))])
    m = ModelSpec(name="llama8b", num_layers=32, hidden_size=4096, ffn_hidden_size=14336,
                  num_attention_heads=32, num_kv_heads=8, vocab_size=128256)
    r = RECIPES[recipe]
    r = r.model_copy(update={"compute_dtype": dtype, "behaviour": r.behaviour.model_copy(
        update={"fused": True, "tp_comm_overlap": overlap, "selective_policy": "op"})})
    return Job(model=m, cluster=cl, recipe=r, seq_len=8192, global_batch=8)


def test_float8_tensorwise_gathers_one_byte() -> None:
    """torchao casts before every all-gather (PrepareFloat8ModuleInput the input,
    Float8RowwiseParallel's backward hook the gradient): 1 byte per element in a torchao fp8
    recipe; bf16 and Megatron (TE) recipes keep the activation dtype."""
    assert layer_ops.sp_gather_bytes(_titan("fp8")) == 1.0
    assert layer_ops.sp_gather_bytes(_titan("bf16")) == 2.0
    assert layer_ops.sp_gather_bytes(_titan("fp8", recipe="megatron-bf16")) == 2.0
    h = 4096
    job, tp, sp = _titan("fp8"), _f(8.0), _f(1.0)
    # 2 gathers x (read + write) x 1 byte + 2 scatters x (read + write) x 2 bytes, per h
    got = layer_ops.dtensor_sp_copy_bytes(job, tp, sp, F.CostOptions(), 1.0)
    assert float(got) == pytest.approx(2 * 2 * 1 * h + 2 * 2 * 2 * h)


def test_op_sac_replays_both_all_gathers() -> None:
    """Vanilla TP under torchtitan's op SAC: backward replays the layer's two forward
    all-gathers (not in `_save_list`); the reduce-scatters' outputs are saved."""
    job = _titan()
    opts = F.CostOptions(fused=True, selective_policy="op")
    none = F.layer_factors(job, 0, 8, 1, 1, 1, 1, "none", options=opts)
    sel = F.layer_factors(job, 0, 8, 1, 1, 1, 1, "selective", options=opts)
    nd = job.cluster.node_groups[0]
    one_ag = float(comm.all_gather(nd, _f(8.0), 1, _f(8192.0 * 4096 * 2)))
    assert float(sel.tp_s) - float(none.tp_s) == pytest.approx(2 * one_ag, rel=1e-9)


def test_float8_gathers_halve_plain_tp_all_gathers() -> None:
    """Plain TP, no recompute: 4 all-gathers + 4 reduce-scatters a layer; in float8 the
    all-gathers carry half the bytes (comm.all_gather at 1 byte/element)."""
    nd = _titan().cluster.node_groups[0]
    n = 8192.0 * 4096
    ag1, ag2 = (float(comm.all_gather(nd, _f(8.0), 1, _f(n * b))) for b in (1, 2))
    rs2 = float(comm.reduce_scatter(nd, _f(8.0), 1, _f(n * 2)))
    opts = F.CostOptions(fused=True)
    bf = F.layer_factors(_titan("bf16"), 0, 8, 1, 1, 1, 1, "none", options=opts)
    f8 = F.layer_factors(_titan("fp8"), 0, 8, 1, 1, 1, 1, "none", options=opts)
    assert float(bf.tp_s) == pytest.approx(4 * (ag2 + rs2), rel=1e-9)
    assert float(f8.tp_s) == pytest.approx(4 * (ag1 + rs2), rel=1e-9)


def test_async_tp_bounds() -> None:
    """Async TP exposes less TP time than plain TP and at least the two backward
    reduce-scatters it cannot fuse; the fraction in tp_comm_overlap is not used as one."""
    plain = F.layer_factors(_titan(), 0, 8, 1, 1, 1, 1, "none",
                            options=F.CostOptions(fused=True))
    on = F.layer_factors(_titan(overlap=1.0), 0, 8, 1, 1, 1, 1, "none",
                         options=F.CostOptions(fused=True, tp_comm_overlap=1.0))
    half = F.layer_factors(_titan(overlap=0.5), 0, 8, 1, 1, 1, 1, "none",
                           options=F.CostOptions(fused=True, tp_comm_overlap=0.5))
    nd = _titan().cluster.node_groups[0]
    one = float(comm.reduce_scatter(nd, _f(8.0), 1, _f(8192.0 * 4096 * 2)))
    assert 2 * one <= float(on.tp_s) < float(plain.tp_s)
    assert float(half.tp_s) == pytest.approx(float(on.tp_s))
    # no sequence parallelism: nothing to fuse, the all-reduces stay as they are
    plain_ar = F.layer_factors(_titan(), 0, 8, 1, 1, 0, 1, "none",
                               options=F.CostOptions(fused=True))
    on_ar = F.layer_factors(_titan(overlap=1.0), 0, 8, 1, 1, 0, 1, "none",
                            options=F.CostOptions(fused=True, tp_comm_overlap=1.0))
    assert float(on_ar.tp_s) == pytest.approx(float(plain_ar.tp_s))
