"""torch ring attention as torchtitan 2024-12 runs it: the compiled ring's exposed exchange and
the fp32 merge traffic (cost/cp_ring.py), with expected values derived by hand."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.comm import NETWORK_EFFICIENCY
from autoparallel_cp.cost.cp_ring import torch_ring_merge_bytes
from autoparallel_cp.cost.efficiency import hbm_time
from tests.cost.test_steptime import _llama8b_fsdp


def _job_over_nodes():
    """Llama 8B at 128k tokens on 4 nodes: with tp 8 filling a node the cp ranks are on
    different nodes, so every ring transfer uses the 50 GB/s network link."""
    job = _llama8b_fsdp().model_copy(update={"seq_len": 131072})
    cl = job.cluster.model_copy(update={"node_groups": [job.cluster.node_groups[0].model_copy(
        update={"num_nodes": 4})]})
    return job.model_copy(update={"cluster": cl})


def _one_transfer_s() -> float:
    """One rank's K and V at cp 4, tp 8: 131072/4 tokens x 32 heads (repeat_kv) / 8 x 128 x
    2 (K, V) x 2 B = 67,108,864 B, over 50 GB/s at the network efficiency, + 5 us latency."""
    nbytes = 131072 / 4 * 32 / 8 * 128 * 2 * 2
    assert nbytes == 67_108_864
    return 5e-6 + nbytes / (50e9 * NETWORK_EFFICIENCY)


def test_compiled_torch_ring_hides_no_transfer() -> None:
    """Compiled (torch.compile traces the ring; waits follow their collectives): forward =
    the gather of the 3 other chunks; backward = the gather again + 4 fp32 dK, dV shifts
    (2 transfers each) = 3 + 8; the full-recompute replay repeats the forward's 3."""
    t = _one_transfer_s()
    lf = F.layer_factors(_job_over_nodes(), 0, 8, 4, 1, 1, 1, "full",
                         options=F.CostOptions(fused=True, gqa_repeat_kv=True,
                                               cp_ring="torch-allgather"))
    assert float(lf.cp_s) == pytest.approx(3 * t + (3 * t + 8 * t), rel=1e-9)
    assert float(lf.rc_cp_s) == pytest.approx(3 * t, rel=1e-9)


def test_eager_torch_ring_hides_more_than_compiled() -> None:
    """Eager, the gather waits at the second step and each shift at the next one: less exposed
    than compiled, more than nothing; the p2p ring (Megatron / TE) is the same either way."""
    job = _job_over_nodes()

    def cp_s(ring: str, fused: bool) -> float:
        return float(F.layer_factors(job, 0, 8, 4, 1, 1, 1, "none", options=F.CostOptions(
            fused=fused, gqa_repeat_kv=True, cp_ring=ring)).cp_s)

    assert 0 < cp_s("torch-allgather", False) < cp_s("torch-allgather", True)
    assert cp_s("p2p", False) == pytest.approx(cp_s("p2p", True), rel=1e-12)


def test_torch_ring_merge_bytes_by_hand() -> None:
    """1000 tokens, 4096 output and 4096 K elements per token, cp 4: 3 steps update the fp32
    accumulators at 10 B per element (read fp32 + read bf16 + write fp32), then one 6 B cast:
    forward 36 B x 4.096e6 output elements; backward 36 B x (dQ 4.096e6 + dK, dV 8.192e6)."""
    fwd, bwd = torch_ring_merge_bytes(np.float64(1000), np.float64(4096), np.float64(4096),
                                      np.array([1.0, 2.0, 4.0]))
    assert fwd.tolist() == pytest.approx([0.0, 16 * 4.096e6, 147_456_000.0])
    assert bwd.tolist() == pytest.approx([0.0, 16 * 12.288e6, 442_368_000.0])


def test_merge_traffic_of_each_ring_enters_compute() -> None:
    """At cp 4, tp 8, 32768 tokens per rank: output elements per token 32 heads / 8 x 128 = 512,
    K elements (repeat_kv) the same. The torch ring moves (36 x 512 + 36 x 3 x 512) B per
    token (fp32 merge), Transformer Engine's p2p ring (6 + 3 x 10 + 12) x 512 forward and
    3 x 6 x (512 + 512) backward; the same attention kernels otherwise, so the compute times
    differ by the HBM time of the difference."""
    job = _job_over_nodes()
    gpu = job.cluster.node_groups[0].gpu
    p2p = F.layer_factors(job, 0, 8, 4, 1, 1, 1, "none",
                          options=F.CostOptions(fused=True, gqa_repeat_kv=True))
    ag = F.layer_factors(job, 0, 8, 4, 1, 1, 1, "none",
                         options=F.CostOptions(fused=True, gqa_repeat_kv=True,
                                               cp_ring="torch-allgather"))
    per_token = (36 * 512 + 36 * 3 * 512) - (48 * 512 + 36 * 512)
    extra = float(hbm_time(gpu, per_token * 32768))
    assert float(ag.compute_s) - float(p2p.compute_s) == pytest.approx(extra, rel=1e-9)


def test_te_p2p_ring_merge_bytes_by_hand() -> None:
    """Transformer Engine's p2p ring (context_parallel.py @d0067d0da), 1000 tokens, 512 output
    elements and 128 K elements per token. cp 8 on the last rank: forward = init 6 + 7 steps
    x 10 + two casts 12 = 88 B per output element; backward = 7 adds x 6 B over dQ and K's
    worth of dK, dV = 42 x (512 + 128). cp 2: 6 + 10 + 12 = 28 and 6 x 640. cp 1: no ring."""
    from autoparallel_cp.cost.cp_ring import te_ring_merge_bytes

    tok, q, kv = np.array(1000.0), np.array(512.0), np.array(128.0)
    f8, b8 = te_ring_merge_bytes(tok, q, kv, np.array(8.0))
    assert float(f8) == 88 * 512 * 1000
    assert float(b8) == 42 * (512 + 128) * 1000
    f2, b2 = te_ring_merge_bytes(tok, q, kv, np.array(2.0))
    assert (float(f2), float(b2)) == (28 * 512 * 1000, 6 * 640 * 1000)
    assert [float(x) for x in te_ring_merge_bytes(tok, q, kv, np.array(1.0))] == [0.0, 0.0]

