"""The flex (DeepEP / HybridEP) MoE dispatcher: one network copy per destination node.

Expected values are derived in each test from the dispatch rule of the DeepSeek-V3 report
(§3.2.2: a token crosses the network once to each node holding one of its experts and is
forwarded over NVLink there) and from combinatorics written here (binomial coefficients, not
the module's product form).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.cost import comm
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.emit import megatron_args
from autoparallel_cp.spec import (
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    MoESpec,
    NodeGroup,
)
from autoparallel_cp.spec.plan import parse_plan

NVL_GBPS, NET_GBPS, NVL_LAT, NET_LAT = 450.0, 50.0, 3.0, 8.0


def _node(nodes: int = 16) -> NodeGroup:
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, fp8_tflops=1979, hbm_gbps=3350)
    return NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=nodes,
                     intra_node=LinkSpec(bandwidth_gbps=NVL_GBPS, latency_us=NVL_LAT),
                     inter_node=LinkSpec(bandwidth_gbps=NET_GBPS, latency_us=NET_LAT))


def _remote_by_counting(nodes: int, top_k: int, experts: int) -> float:
    """(nodes - 1) x P(a given other node holds one of the token's experts), the complement
    counted as the top_k-subsets avoiding that node's experts: C(E - E/nodes, k) / C(E, k)."""
    per = experts // nodes
    return (nodes - 1) * (1 - math.comb(experts - per, top_k) / math.comb(experts, top_k))


@pytest.mark.parametrize(("nodes", "top_k", "experts"),
                         [(4, 8, 256), (8, 8, 256), (2, 2, 8), (16, 4, 128), (3, 6, 12)])
def test_remote_nodes_match_the_hypergeometric_count(nodes: int, top_k: int,
                                                     experts: int) -> None:
    got = float(comm.remote_nodes_per_token(nodes, top_k, experts))
    assert got == pytest.approx(_remote_by_counting(nodes, top_k, experts), rel=1e-12)


def test_remote_nodes_limits() -> None:
    # one node: nothing leaves it
    assert float(comm.remote_nodes_per_token(1, 8, 256)) == 0.0
    # one copy per token: it leaves with probability (n-1)/n, as in a flat all-to-all
    assert float(comm.remote_nodes_per_token(4, 1, 256)) == pytest.approx(3 / 4)
    # one expert per node: the k copies go to k distinct nodes, nothing to deduplicate,
    # k (n-1)/n copies leave the node as in a flat all-to-all
    assert float(comm.remote_nodes_per_token(16, 4, 16)) == pytest.approx(4 * 15 / 16)
    # more experts per token than other nodes: every other node is hit
    assert float(comm.remote_nodes_per_token(3, 6, 12)) < 2.0
    assert float(comm.remote_nodes_per_token(2, 6, 8)) == pytest.approx(1.0)


def test_within_one_node_flex_is_the_flat_all_to_all() -> None:
    nd = _node(1)
    s = 7.0e6  # one copy of the rank's tokens, bytes
    for ep in (2, 4, 8):
        flex = float(comm.flex_dispatch(nd, ep, 1, s, 4, 64))
        flat = float(comm.all_to_all(nd, ep, 1, 4 * s))
        assert flex == pytest.approx(flat, rel=1e-12)


def test_deepseek_v3_ep32_over_four_nodes_by_hand() -> None:
    """ep 32 at stride 1 over 4 nodes of 8 GPUs, E = 256, top_k = 8, 4096 tokens of h = 7168
    in bf16. Network: 3 (1 - C(192, 8)/C(256, 8)) copies per token over the NIC; NVLink: the
    8 copies' own-node share 7/32 plus the forwarded share 24/32 x 7/8. The two stages are
    pipelined, so the slower sets the time."""
    nd = _node(4)
    s = 4096 * 7168 * 2.0
    net_bw = NET_GBPS * 1e9 * comm.NETWORK_EFFICIENCY
    nvl_bw = NVL_GBPS * 1e9 * comm.NVLINK_EFFICIENCY
    remote = 3 * (1 - math.comb(192, 8) / math.comb(256, 8))
    t_net = remote * s / net_bw + NET_LAT * 1e-6
    t_nvl = 8 * (7 / 32 + 24 / 32 * 7 / 8) * s / nvl_bw + NVL_LAT * 1e-6
    assert float(comm.flex_dispatch(nd, 32, 1, s, 8, 256)) == pytest.approx(
        max(t_net, t_nvl), rel=1e-12)
    # the flat all-to-all sends 8 x 24/32 = 6 copies per token over the network instead of ~2.7
    flat = float(comm.all_to_all(nd, 32, 1, 8 * s))
    assert flat == pytest.approx(6 * s / net_bw + NET_LAT * 1e-6, rel=1e-12)
    assert float(comm.flex_dispatch(nd, 32, 1, s, 8, 256)) < 0.5 * flat


def test_flex_never_sends_more_over_the_network_than_the_flat_all_to_all() -> None:
    nd = _node(64)
    s = 1.0e7
    ep = np.array([16, 32, 64, 128, 256, 512], float)
    for top_k, experts in ((2, 8 * 64), (8, 256), (4, 128), (1, 512)):
        n = np.minimum(ep, experts)
        flex = comm.flex_dispatch(nd, n, 1, s, top_k, experts)
        flat = comm.all_to_all(nd, n, 1, top_k * s)
        assert np.all(flex <= flat * (1 + 1e-12))


def _moe_job(dispatcher: str, nodes: int = 8) -> Job:
    m = ModelSpec(name="toy-moe", num_layers=2, hidden_size=2048, ffn_hidden_size=8192,
                  num_attention_heads=16, num_kv_heads=16, vocab_size=32000,
                  moe=MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=1024))
    base = RECIPES["megatron-bf16"]
    rec = base.model_copy(update={"behaviour": base.behaviour.model_copy(
        update={"ep_dispatcher": dispatcher})})
    return Job(model=m, cluster=ClusterSpec(name="c", node_groups=[_node(nodes)]),
               recipe=rec, seq_len=4096, global_batch=64)


def test_layer_ep_time_is_four_dispatches() -> None:
    """Forward dispatch + combine and their backward transposes: 4 flex dispatches of one copy
    of the micro-batch's tokens (tp = 1); nothing else in the layer moves."""
    flat, flex = _moe_job("alltoall"), _moe_job("flex")
    s = 4096 * 2048 * 2.0
    nd = flex.cluster.node_groups[0]
    for ep in (8, 32, 64):
        lf = layer_factors(flex, 0, 1, 1, ep, 0, 1, "none", moe=True)
        assert float(lf.ep_s) == pytest.approx(
            4 * float(comm.flex_dispatch(nd, ep, 1, s, 8, 64)), rel=1e-12)
        lf0 = layer_factors(flat, 0, 1, 1, ep, 0, 1, "none", moe=True)
        # the alltoall dispatcher alone re-sorts the received copies by local expert and back
        # (test_alltoall_resort_by_local_expert): the only compute difference
        resort = 2 * 4096 * 131072 / (0.87 * 3350e9) if 64 // ep > 1 else 0.0
        assert float(lf0.compute_s) - float(lf.compute_s) == pytest.approx(resort, rel=1e-9,
                                                                          abs=1e-15)
        if ep == 8:  # one node: the same time
            assert float(lf.ep_s) == pytest.approx(float(lf0.ep_s), rel=1e-12)
        else:
            assert float(lf.ep_s) < float(lf0.ep_s)


def test_alltoall_resort_by_local_expert() -> None:
    """Megatron's alltoall dispatcher regroups the received routed copies by local expert
    (`sort_chunks_by_idxs` in dispatch_postprocess) and back (combine_preprocess) when a rank
    holds more than one expert: top_k = 8 copies of h = 2048 bf16 values per token, read and
    written once by each of the two sorts = 2 x 2 x 8 x 2048 x 2 B = 131,072 B per token per
    pass; forward and backward (the inverse sorts) = 2 passes of 4,096 tokens at the memory
    rate 0.87 x 3,350 GB/s. One local expert (ep = 64 experts): no sort."""
    flat = _moe_job("alltoall")
    one = layer_factors(flat, 0, 1, 1, 64, 0, 1, "none", moe=True)
    for ep in (8, 32):
        lf = layer_factors(flat, 0, 1, 1, ep, 0, 1, "none", moe=True)
        # the flex dispatcher's layer has the same GEMMs and elementwise ops, no re-sort
        flex = layer_factors(_moe_job("flex"), 0, 1, 1, ep, 0, 1, "none", moe=True)
        expected = 2 * 4096 * (2 * 2 * 8 * 2048 * 2) / (0.87 * 3350e9)
        assert float(lf.compute_s - flex.compute_s) == pytest.approx(expected, rel=1e-9)
    flex64 = layer_factors(_moe_job("flex"), 0, 1, 1, 64, 0, 1, "none", moe=True)
    assert float(one.compute_s) == pytest.approx(float(flex64.compute_s), rel=1e-12)


def test_megatron_emits_the_flex_dispatcher() -> None:
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    base = job.recipe
    flex = job.model_copy(update={"recipe": base.model_copy(update={
        "behaviour": base.behaviour.model_copy(update={"ep_dispatcher": "flex"})})})
    args, _ = megatron_args(flex, parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1", flex))
    i = args.index("--moe-token-dispatcher-type")
    assert args[i + 1] == "flex"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "deepep"


# ---- EP overlap (Megatron-Core --overlap-moe-expert-parallel-comm) ----------------------------

def _overlap_job(net_gbps: float, overlap: bool = True, modules: tuple[str, ...] = ("core_attn",),
                 nvl_gbps: float = NVL_GBPS) -> Job:
    job = _moe_job("alltoall")
    nd = job.cluster.node_groups[0].model_copy(update={
        "inter_node": LinkSpec(bandwidth_gbps=net_gbps, latency_us=NET_LAT),
        "intra_node": LinkSpec(bandwidth_gbps=nvl_gbps, latency_us=NVL_LAT)})
    beh = job.recipe.behaviour.model_copy(update={"ep_overlap": overlap,
                                                  "recompute_modules": modules})
    return job.model_copy(update={"cluster": ClusterSpec(name="c", node_groups=[nd]),
                                  "recipe": job.recipe.model_copy(update={"behaviour": beh})})


def test_ep_overlap_limits() -> None:
    """Each of the four all-to-alls of a combined-1F1B node hides behind one compute window,
    and the four windows (attention-block and expert-MLP forward and backward) add up to the
    layer's compute. So on a network so slow that every all-to-all outlasts its window, the
    overlap saves exactly the layer's compute; on one so fast that every window outlasts its
    all-to-all, only the SMs the all-to-alls hold are charged (COMM_SM_SHARE of them)."""
    from autoparallel_cp.cost.constants import COMM_SM_SHARE
    for mode in ("none", "selective"):
        slow_on = layer_factors(_overlap_job(0.01), 0, 1, 1, 64, 0, 1, mode, moe=True)
        slow_off = layer_factors(_overlap_job(0.01, False), 0, 1, 1, 64, 0, 1, mode, moe=True)
        assert float(slow_on.ep_s) == pytest.approx(
            float(slow_off.ep_s) - float(slow_off.compute_s - slow_off.host_s), rel=1e-9)
        fast_on = layer_factors(_overlap_job(1e5, nvl_gbps=1e5), 0, 1, 1, 64, 0, 1, mode,
                                moe=True)
        fast_off = layer_factors(_overlap_job(1e5, False, nvl_gbps=1e5), 0, 1, 1, 64, 0, 1,
                                 mode, moe=True)
        assert float(fast_on.ep_s) == pytest.approx(COMM_SM_SHARE * float(fast_off.ep_s),
                                                    rel=1e-9)


def test_ep_overlap_is_off_where_megatron_refuses_it() -> None:
    """Full recompute, or "moe" among the selective modules (transformer_config.py:3021-3032):
    Megatron will not run the overlap, so the all-to-alls stay exposed."""
    full_on = layer_factors(_overlap_job(50), 0, 1, 1, 64, 0, 1, "full", moe=True)
    full_off = layer_factors(_overlap_job(50, False), 0, 1, 1, 64, 0, 1, "full", moe=True)
    assert float(full_on.ep_s) == float(full_off.ep_s) > 0
    moe_on = layer_factors(_overlap_job(50, modules=("moe",)), 0, 1, 1, 64, 0, 1, "selective",
                           moe=True)
    moe_off = layer_factors(_overlap_job(50, False, ("moe",)), 0, 1, 1, 64, 0, 1, "selective",
                            moe=True)
    assert float(moe_on.ep_s) == float(moe_off.ep_s) > 0


def test_megatron_emits_or_refuses_the_ep_overlap() -> None:
    from autoparallel_cp.spec.frameworks import refusals
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    base = job.recipe
    ov = job.model_copy(update={"recipe": base.model_copy(update={
        "behaviour": base.behaviour.model_copy(update={"ep_overlap": True})})})
    inter = parse_plan("tp=2,pp=4,vpp=2,ep=8,sp=1,zero=1", ov)
    args, _ = megatron_args(ov, inter)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    # pp > 1 without interleaving: Megatron asserts (transformer_config.py:3007-3011)
    flat = parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1", ov)
    [r] = [r for r in refusals(ov, flat, "megatron") if r.field == "vpp"]
    assert r.closest == {"vpp": 2}
    # full recompute: the flag is left out (Megatron refuses the pair), as the cost leaves EP
    # exposed
    full = parse_plan("tp=2,pp=4,vpp=2,ep=8,sp=1,zero=1,recompute=full", ov)
    args, _ = megatron_args(ov, full)
    assert "--overlap-moe-expert-parallel-comm" not in args
    # without the recipe flag nothing is written
    args, _ = megatron_args(job, inter)
    assert "--overlap-moe-expert-parallel-comm" not in args
