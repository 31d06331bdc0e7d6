"""Collective times (cost/comm.py) against hand derivations.

Every expected time below is written out from two published models, not from the module:

- nccl-tests `doc/PERFORMANCE.md`: a collective of S bytes over n ranks that takes t seconds has
  algorithm bandwidth algbw = S/t and bus bandwidth busbw = algbw·f, with f = 2(n-1)/n for
  all-reduce and (n-1)/n for reduce-scatter, all-gather (and all-to-all). A link that sustains
  `busbw` bytes/s therefore moves the collective in t = f·S/busbw.
- the ring alpha-beta model (Thakur, Rabenseifner & Gropp 2005) as the module documents it:
  a ring phase costs (n-1)·alpha; all-reduce is two phases (reduce-scatter + all-gather).

The achieved link bandwidth is the spec times the module's efficiency constant; the constants are
checked separately against published nccl-tests measurements (`test_efficiencies_...`), so that
a halved constant fails here too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.spec import GPUSpec, LinkSpec, NodeGroup
from autoparallel_cp.spec.loaders import load_cluster

NV_GBPS, NV_US = 450.0, 3.0  # intra-node (NVLink) per GPU per direction, latency
NET_GBPS, NET_US = 50.0, 8.0  # network per GPU per direction, latency
S = 1e9  # 1 GB message


def _node(gpus_per_node: int = 8) -> NodeGroup:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, hbm_gbps=3350)
    return NodeGroup(name="n", gpu=gpu, gpus_per_node=gpus_per_node, num_nodes=64,
                     intra_node=LinkSpec(bandwidth_gbps=NV_GBPS, latency_us=NV_US),
                     inter_node=LinkSpec(bandwidth_gbps=NET_GBPS, latency_us=NET_US))


def _nv_p2p() -> float:
    """One NCCL send/recv on NVLink (comm.P2P_NVLINK_EFFICIENCY: nccl-tests issue #268)."""
    return NV_GBPS * 1e9 * comm.P2P_NVLINK_EFFICIENCY


def _nv() -> float:
    """Achieved NVLink bus bandwidth, bytes/s."""
    return NV_GBPS * 1e9 * comm.NVLINK_EFFICIENCY


def _net() -> float:
    """Achieved per-GPU network bandwidth, bytes/s."""
    return NET_GBPS * 1e9 * comm.NETWORK_EFFICIENCY


def _f(x: object) -> float:
    return float(np.asarray(x))


# --------------------------------------------------------------------------------------------
# One node: the flat ring on NVLink
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_reduce_within_a_node(n: int) -> None:
    # busbw = algbw·2(n-1)/n  ->  t = 2(n-1)/n·S/busbw; two ring phases of (n-1) hops
    expect = 2 * (n - 1) * NV_US * 1e-6 + 2 * (n - 1) / n * S / _nv()
    assert _f(comm.all_reduce(_node(), n, 1, S)) == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_gather_and_reduce_scatter_within_a_node(n: int) -> None:
    # busbw = algbw·(n-1)/n, one ring phase
    expect = (n - 1) * NV_US * 1e-6 + (n - 1) / n * S / _nv()
    assert _f(comm.all_gather(_node(), n, 1, S)) == pytest.approx(expect, rel=1e-12)
    assert _f(comm.reduce_scatter(_node(), n, 1, S)) == pytest.approx(expect, rel=1e-12)


def test_all_reduce_moves_twice_the_bytes_of_all_gather() -> None:
    """nccl-tests: at equal busbw an all-reduce takes 2x the all-gather of the same buffer."""
    nd = _node(gpus_per_node=8)
    zero_lat = nd.model_copy(update={"intra_node": LinkSpec(bandwidth_gbps=NV_GBPS,
                                                              latency_us=0.0)})
    for n in (2, 8):
        assert _f(comm.all_reduce(zero_lat, n, 1, S)) == pytest.approx(
            2 * _f(comm.all_gather(zero_lat, n, 1, S)), rel=1e-12)


def test_single_rank_group_costs_nothing() -> None:
    for fn in (comm.all_reduce, comm.all_gather, comm.reduce_scatter, comm.all_to_all):
        assert _f(fn(_node(), 1, 1, S)) == 0.0


def test_latency_only_message() -> None:
    """A zero-byte all-reduce over 8 NVLink ranks costs the ring's 2·7 hops of alpha."""
    assert _f(comm.all_reduce(_node(), 8, 1, 0.0)) == pytest.approx(14 * NV_US * 1e-6)


# --------------------------------------------------------------------------------------------
# Which link a group crosses
# --------------------------------------------------------------------------------------------


def test_one_member_per_node_runs_on_the_network() -> None:
    """dp=4 with tp=8 (stride 8 on 8-GPU nodes): one member per node, a flat network ring."""
    expect_ar = 2 * 3 * NET_US * 1e-6 + 2 * 3 / 4 * S / _net()
    expect_ag = 3 * NET_US * 1e-6 + 3 / 4 * S / _net()
    assert _f(comm.all_reduce(_node(), 4, 8, S)) == pytest.approx(expect_ar, rel=1e-12)
    assert _f(comm.all_gather(_node(), 4, 8, S)) == pytest.approx(expect_ag, rel=1e-12)


def test_group_of_sixteen_over_two_nodes_is_hierarchical() -> None:
    """16 consecutive ranks on 8-GPU nodes: k = 8 per node, 2 nodes.

    All-reduce = NVLink reduce-scatter (7/8·S) + network all-reduce of S/8 on each of the 8
    rails (2·(2-1)/2 · S/8) + NVLink all-gather (7/8·S)."""
    intra = 7 * NV_US * 1e-6 + 7 / 8 * S / _nv()
    inter = 2 * 1 * NET_US * 1e-6 + 2 * (1 / 2) * (S / 8) / _net()
    assert _f(comm.all_reduce(_node(), 16, 1, S)) == pytest.approx(2 * intra + inter,
                                                                   rel=1e-12)
    # reduce-scatter / all-gather: the NVLink phase once, the network phase with (n-1)/n
    inter_rs = 1 * NET_US * 1e-6 + (1 / 2) * (S / 8) / _net()
    assert _f(comm.reduce_scatter(_node(), 16, 1, S)) == pytest.approx(intra + inter_rs,
                                                                       rel=1e-12)


def test_stride_four_puts_two_members_on_each_node() -> None:
    """dp=8 with tp=4 (stride 4): 2 members per node over 4 nodes."""
    intra = 1 * NV_US * 1e-6 + 1 / 2 * S / _nv()
    inter = 2 * 3 * NET_US * 1e-6 + 2 * (3 / 4) * (S / 2) / _net()
    assert _f(comm.members_per_node(8, 4, 8)) == 2.0
    assert _f(comm.all_reduce(_node(), 8, 4, S)) == pytest.approx(2 * intra + inter, rel=1e-12)


def test_a_group_that_fits_a_node_never_touches_the_network() -> None:
    """tp=4 inside an 8-GPU node: making the network 100x slower changes nothing."""
    slow = _node().model_copy(update={"inter_node": LinkSpec(bandwidth_gbps=0.5)})
    for fn in (comm.all_reduce, comm.all_gather, comm.all_to_all):
        assert _f(fn(slow, 4, 1, S)) == _f(fn(_node(), 4, 1, S))


def test_crosses_nodes() -> None:
    assert comm.crosses_nodes([1, 8, 9, 16], 8).tolist() == [0.0, 0.0, 1.0, 1.0]


# --------------------------------------------------------------------------------------------
# All-to-all and point-to-point
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_to_all_within_a_node(n: int) -> None:
    """Each rank keeps 1/n of its S bytes and sends (n-1)/n over NVLink (busbw factor), the
    pairwise exchanges concurrently: one alpha. With no bytes only that alpha is left (no
    network latency for a group inside one node)."""
    expect = NV_US * 1e-6 + (n - 1) / n * S / _nv()
    assert _f(comm.all_to_all(_node(), n, 1, S)) == pytest.approx(expect, rel=1e-12)
    assert _f(comm.all_to_all(_node(), n, 1, 0.0)) == pytest.approx(NV_US * 1e-6, rel=1e-12)


def test_all_to_all_across_nodes_is_bound_by_the_network_share() -> None:
    """ep=16 over two 8-GPU nodes: 7/16 of S stays on NVLink, 8/16 leaves over the network;
    the two run concurrently and the slower sets the time."""
    t_in = NV_US * 1e-6 + 7 / 16 * S / _nv()
    t_out = NET_US * 1e-6 + 8 / 16 * S / _net()
    assert _f(comm.all_to_all(_node(), 16, 1, S)) == pytest.approx(max(t_in, t_out), rel=1e-12)


def test_p2p_is_alpha_plus_bytes_over_bandwidth() -> None:
    """On NVLink at NCCL's send/recv share of the link (80 / 450: nccl-tests issue #268), not
    at the collectives' NVLINK_EFFICIENCY."""
    assert comm.P2P_NVLINK_EFFICIENCY == 80.0 / 450.0
    assert _f(comm.p2p(_node(), 1.0, S)) == pytest.approx(NV_US * 1e-6 + S / _nv_p2p(),
                                                          rel=1e-12)
    assert _f(comm.p2p(_node(), 1.0, S)) > NV_US * 1e-6 + S / _nv()  # slower than a ring step
    assert _f(comm.p2p(_node(), 0.0, S)) == pytest.approx(NET_US * 1e-6 + S / _net(),
                                                          rel=1e-12)
    assert _f(comm.p2p(_node(), 0.0, 0.0)) == 0.0


# --------------------------------------------------------------------------------------------
# The efficiency constants against published measurements (independent of the module)
# --------------------------------------------------------------------------------------------


def _busbw_all_reduce(cluster: str, n: int, stride: int) -> float:
    """Bus bandwidth (GB/s) the model implies for a 4 GB all-reduce, nccl-tests' definition."""
    nd = load_cluster(cluster).node_groups[0]
    size = 4e9
    nd0 = nd.model_copy(update={
        "intra_node": nd.intra_node.model_copy(update={"latency_us": 0.0}),
        "inter_node": nd.inter_node.model_copy(update={"latency_us": 0.0})})
    t = _f(comm.all_reduce(nd0, n, stride, size))
    return size / t * 2 * (n - 1) / n / 1e9


def test_nvlink_bus_bandwidth_in_the_published_range() -> None:
    """nccl-tests all_reduce_perf at large sizes on one DGX: A100 (300 GB/s NVLink 3) reaches
    ~230 GB/s busbw, H100 (450 GB/s NVLink 4) 360-480 GB/s (NVIDIA nccl-tests results; NVLS
    at the top). Model busbw must lie within 0.65-1.0 of the spec (calculon's NVLink
    efficiencies are 0.65-0.8) and within 20% of the A100 measurement."""
    a100 = _busbw_all_reduce("dgx-a100-40g", 8, 1)
    h100 = _busbw_all_reduce("dgx-h100", 8, 1)
    assert 0.65 * 300 <= a100 <= 300 and a100 == pytest.approx(230, rel=0.2)
    assert 0.65 * 450 <= h100 <= 450 and 360 * 0.9 <= h100 <= 480


def test_network_bus_bandwidth_in_the_published_range() -> None:
    """One GPU per node over InfiniBand (stride 8): nccl-tests all-reduce reaches 85-95% of the
    NIC line rate at large sizes (HDR 200 Gb/s -> ~22-24 GB/s; NDR 400 Gb/s -> ~45-48 GB/s).
    The model's busbw must be 75-100% of the per-GPU line rate."""
    for cluster, line in (("dgx-a100-40g", 25.0), ("dgx-h100", 50.0)):
        bus = _busbw_all_reduce(cluster, 4, 8)
        assert 0.75 * line <= bus <= line, (cluster, bus)


def test_hbm_time_matches_the_h200_copy_measurement() -> None:
    """The H200 copy microbenchmark (benchmarks/data/h200_microbench.jsonl, `kind: copy`,
    read+write GB/s) measured the achieved HBM rate; streaming 100 GB takes 100/rate s."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200_microbench.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rate = next(r["gbps"] for r in rows if r.get("kind") == "copy")
    h200 = GPUSpec(name="H200", memory_gib=141, bf16_tflops=989, hbm_gbps=4800)
    assert _f(hbm_time(h200, 100e9)) == pytest.approx(100e9 / (rate * 1e9), rel=0.02)
    # and the model scales with the GPU's datasheet bandwidth (H100 SXM 3.35 TB/s)
    h100 = h200.model_copy(update={"hbm_gbps": 3350.0})
    assert _f(hbm_time(h100, 100e9)) == pytest.approx(_f(hbm_time(h200, 100e9)) * 4800 / 3350,
                                                      rel=1e-12)


# --------------------------------------------------------------------------------------------
# Pipeline send/recv per micro-batch (cost/sync.p2p_factor)
# --------------------------------------------------------------------------------------------


def test_pipeline_p2p_bytes_and_link() -> None:
    """Narayanan et al. 2021 §3.2/§4.1: a stage sends b·s·h activations forward and receives as
    many gradients back per micro-batch (2 transfers), in activation dtype (bf16, 2 B), split
    over the tp ranks (scatter/gather) and over cp (each cp rank holds s/cp); interleaving sends
    vpp times as often (§2.2). Adjacent stages are tp·cp·dp ranks apart (pp outermost): rank r
    and r + 8 are never on one 8-GPU node, so a stride of 8 or more sends over the network;
    a smaller stride keeps a pipeline inside one node on NVLink. Every send exposed here
    (`overlap_p2p_comm` off; the megatron-bf16 preset's interleaved overlap:
    test_pipeline_p2p_overlap.py); node boundaries inside a pipeline: test_pipeline_links."""
    from autoparallel_cp.cost.sync import p2p_factor
    from autoparallel_cp.spec import RECIPES, ClusterSpec, Job, ModelSpec

    nd = _node()
    model = ModelSpec(name="m", num_layers=8, hidden_size=4096, ffn_hidden_size=14336,
                      num_attention_heads=32, num_kv_heads=8, vocab_size=32000)
    job = Job(model=model, cluster=ClusterSpec(name="c", node_groups=[nd]),
              recipe=RECIPES["megatron-bf16"].with_behaviour(overlap_p2p_comm=False),
              seq_len=8192, global_batch=64)
    b, s, h = 2, 8192, 4096
    tp, cp = 4, 2
    nbytes = b * (s / cp) * h * 2 / tp
    # (tp, cp, sp, mbs, pp, vpp, dp)
    net = NET_US * 1e-6 + nbytes / _net()
    got = _f(p2p_factor(job, 0, tp, cp, 1, b, 4, 1, 1))  # stride 4·2·1 = 8: ranks 0 and 8
    assert got == pytest.approx(2 * net, rel=1e-12)      # are on two nodes: network
    got = _f(p2p_factor(job, 0, tp, cp, 1, b, 4, 2, 1))  # vpp = 2
    assert got == pytest.approx(2 * 2 * net, rel=1e-12)
    got = _f(p2p_factor(job, 0, tp, cp, 1, b, 4, 1, 2))  # stride 16 > 8: network
    assert got == pytest.approx(2 * net, rel=1e-12)
    got = _f(p2p_factor(job, 0, 2, 1, 1, b, 4, 1, 1))    # stride 2, pp 4: one node, NVLink
    assert got == pytest.approx(2 * (NV_US * 1e-6 + b * s * h * 2 / 2 / _nv_p2p()), rel=1e-12)
    assert _f(p2p_factor(job, 0, tp, cp, 1, b, 1, 1, 1)) == 0.0  # no pipeline, no sends


@settings(max_examples=200, deadline=None, derandomize=True)
@given(n=st.lists(st.integers(1, 4096), min_size=2, max_size=6),
       stride=st.integers(1, 512), nbytes=st.floats(0.0, 1e11),
       reduce_all=st.booleans(), preset=st.sampled_from(["dgx-h100", "dgx-a100", "dgx-h800"]))
def test_one_group_in_floats_is_the_array_path_bit_for_bit(n: list[int], stride: int,
                                                          nbytes: float, reduce_all: bool,
                                                          preset: str) -> None:
    node = load_cluster(preset).node_groups[0]
    arr = comm._hierarchical(node, np.array(n, float), np.full(len(n), float(stride)),
                             np.full(len(n), nbytes), reduce_all)
    one = [comm._hierarchical(node, g, stride, nbytes, reduce_all) for g in n]
    assert all(np.ndim(x) == 0 for x in one)
    assert [float(x) for x in one] == arr.tolist()

def test_pipeline_links() -> None:
    """The worst stage's network links (cost/comm.py `pipeline_links`), by hand on 8-GPU
    nodes with stage j on ranks [j·S, (j+1)·S): S = 1, pp 16 (the Zero Bubble paper's pure
    pipelines, arXiv 2401.10241 §5.1): ranks 7 and 8 are on two nodes, so stage 7 has one
    network link (to 8) and one NVLink link (to 6); pp 8 fits one node; S = 4, pp 4: the
    boundary between stages 1 and 2; S = 8 or 16: every neighbour is on another node; S = 6,
    pp 2: stage 0's ranks 2-5 pair with 8-11 across the boundary (a stage straddles it)."""
    from autoparallel_cp.cost.comm import pipeline_links

    cases = [(1, 16, 1.0), (1, 8, 0.0), (1, 32, 1.0), (4, 4, 1.0), (4, 2, 0.0), (2, 4, 0.0),
             (8, 2, 2.0), (16, 4, 2.0), (6, 2, 2.0), (3, 2, 0.0), (3, 3, 2.0)]
    for stride, pp, want in cases:
        assert float(pipeline_links(stride, pp, 8)) == want, (stride, pp)
    # by rank pairs: a link crosses if any rank r of stage j and r + S sit on two nodes; a
    # stage counts the links it has (pp 2: its one link twice, p2p_factor's two transfers)
    for stride in range(1, 20):
        for pp in range(2, 12):
            worst = 0
            for j in range(pp):
                links = [ln for ln in (j - 1, j) if 0 <= ln < pp - 1]
                cross = sum(any((ln * stride + k) // 8 != (ln * stride + k + stride) // 8
                                for k in range(stride)) for ln in links)
                worst = max(worst, 2 * cross if pp == 2 else cross)
            got = float(pipeline_links(stride, pp, 8))
            if stride >= 8 or 8 % stride == 0:
                assert got == worst, (stride, pp)
            else:  # a stage straddles a node boundary: 2 bounds it from above
                assert got >= worst, (stride, pp)
    # vectorised as the solver's tables call it
    vec = pipeline_links(np.array([1.0, 8.0, 2.0]), np.array([16.0, 2.0, 4.0]), 8)
    assert vec.tolist() == [1.0, 2.0, 0.0]


def test_a_node_boundary_inside_the_pipeline_costs_one_network_send() -> None:
    """tp = cp = dp = 1, pp 16 on two 8-GPU nodes: per micro-batch the worst stage (7 or 8)
    exchanges once over NVLink and once over the network, b·s·h fp16 bytes each."""
    from autoparallel_cp.cost.sync import p2p_factor
    from autoparallel_cp.spec import RECIPES, ClusterSpec, Job, ModelSpec

    nd = _node().model_copy(update={"num_nodes": 2})
    model = ModelSpec(name="m", num_layers=48, hidden_size=5120, ffn_hidden_size=20480,
                      num_attention_heads=40, num_kv_heads=40, vocab_size=32000)
    job = Job(model=model, cluster=ClusterSpec(name="c", node_groups=[nd]),
              recipe=RECIPES["megatron-bf16"].with_behaviour(overlap_p2p_comm=False),
              seq_len=1024, global_batch=48)
    nbytes = 1 * 1024 * 5120 * 2
    want = NV_US * 1e-6 + nbytes / _nv_p2p() + NET_US * 1e-6 + nbytes / _net()
    assert _f(p2p_factor(job, 0, 1, 1, 0, 1, 16, 1, 1)) == pytest.approx(want, rel=1e-12)
    # pp 8 on one node: both exchanges on NVLink
    assert _f(p2p_factor(job, 0, 1, 1, 0, 1, 8, 1, 1)) == pytest.approx(
        2 * (NV_US * 1e-6 + nbytes / _nv_p2p()), rel=1e-12)
