"""Alpha-beta collectives on the device mesh: which link each parallel group crosses.

Mesh order (Megatron-LM `RankGenerator` default "tp-cp-ep-dp-pp"): tp is innermost (consecutive
ranks), then cp, then ep (carved out of dp·cp for the MoE layers), then dp, then pp outermost.
A group whose members lie within `gpus_per_node` consecutive ranks stays on NVLink; otherwise
it crosses the network, where each GPU drives its own NIC (`inter_node.bandwidth_gbps` is per
GPU per direction).

Bus-bandwidth factors are those of nccl-tests `doc/PERFORMANCE.md`: all-reduce 2(n-1)/n,
reduce-scatter and all-gather (n-1)/n, all-to-all (n-1)/n; ring latency (n-1)·alpha per phase
(Thakur, Rabenseifner & Gropp 2005). Hierarchical all-reduce for a group spread over nodes with
`k` members per node: intra-node reduce-scatter, inter-node all-reduce of S/k on each of the k
rails, intra-node all-gather.

All functions are vectorized over numpy arrays of the group sizes / strides.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.constants import COMM_SM_SHARE
from autoparallel_cp.spec import NodeGroup

FloatArray = npt.NDArray[np.float64]

#: Achieved fraction of the NVLink/NVSwitch spec bandwidth by NCCL collectives at large messages
#: (nccl-tests on DGX A100/H100 report ~230/300 and ~360-480/450 GB/s bus bandwidth; calculon's
#: a100_80g.json uses 0.65-0.8 for NVLink).
NVLINK_EFFICIENCY = 0.80
#: Achieved fraction of the NVLink/NVSwitch spec bandwidth by one NCCL send/recv between two GPUs
#: of a node (pipeline sends, the context-parallel KV ring: `p2p`). NCCL runs a send/recv on
#: the few channels it gives each peer ("send/recv operations are currently optimized for
#: alltoall", NVIDIA/nccl issue #1272), not on every channel as a collective does: nccl-tests
#: `sendrecv_perf` between two NVLink-connected H100s reaches ~80 GB/s in the default
#: configuration against 260 GB/s for nvbandwidth's SM copy, rising to a ~180 GB/s plateau
#: only for messages of gigabytes (NVIDIA/nccl-tests issue #268): 80 / 450 GB/s per direction.
#: Check, not fit: the Zero Bubble paper's profiled T_comm on DGX-class A100s, pipeline sends
#: of 25-28 MB within one node in 0.53-0.76 ms (arXiv 2401.10241 Appendix D Table 9, p = 8), is
#: 37-53 GB/s, 0.12-0.18 of A100's 300 GB/s.
P2P_NVLINK_EFFICIENCY = 80.0 / 450.0
#: Achieved fraction of the per-GPU network bandwidth (calculon a100_80g.json IB efficiency 0.9;
#: nccl-tests all-reduce over 8x HDR reaches ~85-90% of line rate).
NETWORK_EFFICIENCY = 0.85


def _arr(x: npt.ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def members_per_node(group: npt.ArrayLike, stride: npt.ArrayLike, gpus_per_node: int) -> FloatArray:
    """How many members of a group of size `group` and rank stride `stride` share one node."""
    g = _arr(group)
    st = _arr(stride)
    per = np.maximum(np.floor(gpus_per_node / np.maximum(st, 1.0)), 1.0)
    return np.minimum(g, per)


def _link(node: NodeGroup, intra: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(bytes/s, latency s) for members on NVLink (intra=1) or on the network (intra=0)."""
    bw = np.where(
        intra > 0,
        node.intra_node.bandwidth_gbps * 1e9 * NVLINK_EFFICIENCY,
        node.inter_node.bandwidth_gbps * 1e9 * NETWORK_EFFICIENCY,
    )
    lat = np.where(intra > 0, node.intra_node.latency_us, node.inter_node.latency_us) * 1e-6
    return bw, lat


def _ring(node: NodeGroup, n: FloatArray, nbytes: FloatArray, factor: FloatArray,
          phases: float, intra: FloatArray) -> FloatArray:
    bw, lat = _link(node, intra)
    t = phases * (n - 1.0) * lat + factor * nbytes / bw
    return np.where(n > 1, t, 0.0)


def _hierarchical(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
                  nbytes: npt.ArrayLike, reduce_all: bool) -> FloatArray:
    """Ring collective over `group` ranks, hierarchical when it spans several nodes.

    All-reduce: intra-node reduce-scatter, inter-node all-reduce of 1/k of the data, intra-node
    all-gather (nccl-tests bus factors 2(n-1)/n and (n-1)/n). Reduce-scatter / all-gather: the
    intra-node phase once and the inter-node phase with factor (n-1)/n.
    """
    if np.ndim(group) == np.ndim(stride) == np.ndim(nbytes) == 0:
        return np.asarray(_hierarchical_one(node, float(_arr(group)), float(_arr(stride)),
                                            float(_arr(nbytes)), reduce_all))
    n = _arr(group)
    s = _arr(nbytes)
    k = members_per_node(n, stride, node.gpus_per_node)
    nodes = np.maximum(n / k, 1.0)
    one = np.ones_like(n)
    mult = 2.0 if reduce_all else 1.0
    intra = _ring(node, k, s, (k - 1) / np.maximum(k, 1), 1.0, one)
    inter = _ring(node, nodes, s / k, mult * (nodes - 1) / nodes, mult, np.zeros_like(n))
    flat = _ring(node, n, s, mult * (n - 1) / np.maximum(n, 1), mult, one)
    return np.where(nodes > 1, mult * intra + inter, flat)


def _hierarchical_one(node: NodeGroup, n: float, stride: float, s: float,
                      reduce_all: bool) -> float:
    """`_hierarchical` of one group in Python floats: the same operations in the same order
    (so the same float bit for bit, tests/cost/test_comm.py), without numpy's per-call cost
    (the cost model asks for one group at a time, tens of times per plan)."""
    k = min(n, max(float(math.floor(node.gpus_per_node / max(stride, 1.0))), 1.0))
    nodes = max(n / k, 1.0)
    mult = 2.0 if reduce_all else 1.0
    nvl = (node.intra_node.bandwidth_gbps * 1e9 * NVLINK_EFFICIENCY,
           node.intra_node.latency_us * 1e-6)
    net = (node.inter_node.bandwidth_gbps * 1e9 * NETWORK_EFFICIENCY,
           node.inter_node.latency_us * 1e-6)

    def ring(m: float, nbytes: float, factor: float, phases: float,
             link: tuple[float, float]) -> float:
        return phases * (m - 1.0) * link[1] + factor * nbytes / link[0] if m > 1 else 0.0

    if nodes > 1:
        return mult * ring(k, s, (k - 1) / max(k, 1.0), 1.0, nvl) \
            + ring(nodes, s / k, mult * (nodes - 1) / nodes, mult, net)
    return ring(n, s, mult * (n - 1) / max(n, 1.0), mult, nvl)


def all_reduce(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
               nbytes: npt.ArrayLike) -> FloatArray:
    """All-reduce of `nbytes` per rank; hierarchical when the group spans several nodes."""
    return _hierarchical(node, group, stride, nbytes, reduce_all=True)


def _rs_or_ag(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
              nbytes: npt.ArrayLike) -> FloatArray:
    return _hierarchical(node, group, stride, nbytes, reduce_all=False)


def reduce_scatter(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
                   nbytes: npt.ArrayLike) -> FloatArray:
    """Reduce-scatter of an `nbytes` buffer (unsharded size) over the group."""
    return _rs_or_ag(node, group, stride, nbytes)


def all_gather(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
               nbytes: npt.ArrayLike) -> FloatArray:
    """All-gather producing an `nbytes` buffer (unsharded size) on every member."""
    return _rs_or_ag(node, group, stride, nbytes)


def replica_all_reduce(node: NodeGroup, shard: npt.ArrayLike, replicas: npt.ArrayLike,
                       stride: npt.ArrayLike, nbytes: npt.ArrayLike) -> FloatArray:
    """All-reduce across the `replicas` of hybrid sharding of each rank's 1/`shard` share of
    an `nbytes` buffer (unsharded size), after the reduce-scatter within its shard group.

    The shard group is the inner `shard` ranks at rank stride `stride` (torchtitan's mesh
    ["pp", "dp_replicate", "dp_shard", "cp", "tp"], parallel_dims.py:239; Megatron's
    consecutive intra-instance slice of the dp-cp ranks, parallel_state.py:987), so the
    replicas sit `stride·shard` ranks apart: on NVLink only while the replicas of a shard
    fit in one node, else hierarchical over the network (`all_reduce`). 0 for one replica.
    """
    sh = np.maximum(_arr(shard), 1.0)
    return all_reduce(node, replicas, _arr(stride) * sh, _arr(nbytes) / sh)


def ring_call_latency(node: NodeGroup, group: npt.ArrayLike,
                      stride: npt.ArrayLike) -> FloatArray:
    """Latency of one NCCL ring all-gather or reduce-scatter over `group` ranks (0 for one).

    NCCL runs these two collectives as a flat ring over every rank of the communicator (no
    hierarchical phase), and its tuning model charges a call (NVIDIA/nccl src/graph/tuning.cc
    `ncclTopoTuneModel`, ring branch) `nsteps - nInterSteps` intra-node hops plus
    `nInterSteps` network hops, with nsteps = nRanks - 1 and nInterSteps = nNodes - 1 for
    AllGather / ReduceScatter. With k members per node that is (n - nodes) hops at the
    NVLink latency and (nodes - 1) at the network latency of the node group. A pipelined
    ring pays them once per call whatever the message size, so a framework that issues one
    call per module (FSDP units) pays them once per module.
    """
    n = _arr(group)
    k = members_per_node(n, stride, node.gpus_per_node)
    nodes = np.maximum(n / k, 1.0)
    _, lat_in = _link(node, np.ones_like(n))
    _, lat_out = _link(node, np.zeros_like(n))
    t = (n - nodes) * lat_in + (nodes - 1.0) * lat_out
    return np.where(n > 1, t, 0.0)


def all_to_all(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
               nbytes: npt.ArrayLike) -> FloatArray:
    """All-to-all where each rank sends `nbytes` in total ((n-1)/n of it leaves the rank).

    When the group spans nodes the off-node share (n-k)/n goes over the network.
    """
    n = _arr(group)
    s = _arr(nbytes)
    k = members_per_node(n, stride, node.gpus_per_node)
    return _nvlink_and_network(node, n, k, (k - 1) / np.maximum(n, 1) * s,
                               (n - k) / np.maximum(n, 1) * s)


def _nvlink_and_network(node: NodeGroup, n: FloatArray, k: FloatArray, nvl_bytes: FloatArray,
                        net_bytes: FloatArray) -> FloatArray:
    """An exchange over a group of n ranks, k per node, moving `nvl_bytes` per rank over NVLink
    and, when the group spans nodes, `net_bytes` over the network at the same time: the slower
    part sets the time (0 for a single rank)."""
    bw_in, lat_in = _link(node, np.ones_like(n))
    bw_out, lat_out = _link(node, np.zeros_like(n))
    t_in = nvl_bytes / bw_in + lat_in
    t = np.where(n > k, np.maximum(t_in, net_bytes / bw_out + lat_out), t_in)
    return np.where(n > 1, t, 0.0)


def remote_nodes_per_token(nodes: npt.ArrayLike, top_k: int, num_experts: int,
                           groups: int = 1, groups_picked: int = 1) -> FloatArray:
    """Expected number of other nodes holding at least one of a token's `top_k` experts.

    The `num_experts` experts are spread evenly over `nodes` nodes in index order and a token
    picks `top_k` distinct experts uniformly (balanced routing, as the benchmarks force it); a
    given node holds none of them with the hypergeometric probability
    prod_{i<top_k} (E - E/nodes - i) / (E - i), so the expected count of the nodes-1 others that
    hold at least one is (nodes - 1)(1 - that probability).

    Group-limited routing (`groups` > 1: DeepSeek-V3 §2.1.2, at most M = 4 nodes of 8;
    Megatron-Core `group_limited_topk`, which also runs on the forced-balance benchmarks'
    random logits): the experts form `groups` groups of e = E/groups consecutive indices, a
    token picks T = `groups_picked` groups (uniformly under balanced routing), the ones whose
    top top_k/T scores sum highest, and its top_k experts among them. Each picked group is
    taken to receive top_k/T of the experts (the scores it was picked for), uniformly within
    the group:
    - nodes | groups: a node holds g = groups/nodes whole groups and is reached iff one of
      them is picked: P(none) = C(groups - g, T) / C(groups, T);
    - groups | nodes: a node is an E/nodes slice of one group, picked with T/groups, then
      missed by its top_k/T experts with C(e - E/nodes, top_k/T) / C(e, top_k/T).
    A simulation of the router on random logits (tests/cost/test_group_limited_routing.py)
    agrees within 1.5% for nodes <= groups and is 4-6% below for 16-32 nodes (a picked
    group's share varies around top_k/T, which concentrates a token on fewer nodes); node
    counts that align neither way keep the unlimited expression, which is above both.
    """
    n = np.maximum(_arr(nodes), 1.0)
    e = float(num_experts)
    p_none = np.ones_like(n)
    for i in range(int(top_k)):
        p_none = p_none * np.clip((e - e / n - i) / (e - i), 0.0, 1.0)
    if groups > 1 and groups_picked < groups:
        p_none = np.array([_p_none_grouped(float(x), top_k, num_experts, groups,
                                           groups_picked, float(d))
                           for x, d in zip(n.ravel(), p_none.ravel(), strict=True)]
                          ).reshape(n.shape)
    return (n - 1.0) * (1.0 - p_none)


@functools.lru_cache(maxsize=1024)
def _p_none_grouped(nodes: float, top_k: int, num_experts: int, groups: int, picked: int,
                    unlimited: float) -> float:
    """`remote_nodes_per_token`'s chance that one node holds none of a token's experts under
    group-limited routing (its docstring); `unlimited` where the nodes and groups do not
    align."""
    n = int(nodes)
    if n != nodes or n <= 1 or num_experts % n or top_k % picked:
        return unlimited
    if groups % n == 0:
        g = groups // n
        return math.comb(groups - g, picked) / math.comb(groups, picked)
    if n % groups == 0:
        e, per = num_experts // groups, num_experts // n
        each = top_k // picked
        return (1.0 - picked / groups) + picked / groups * math.comb(e - per, each) / math.comb(
            e, each)
    return unlimited


def flex_dispatch(node: NodeGroup, group: npt.ArrayLike, stride: npt.ArrayLike,
                  token_bytes: npt.ArrayLike, top_k: int, num_experts: int,
                  groups: int = 1, groups_picked: int = 1) -> FloatArray:
    """One dispatch (or combine) of a node-deduplicating all-to-all (DeepEP / HybridEP).

    `token_bytes` is one copy of every token the rank routes (tokens x hidden x bytes).
    DeepSeek-V3 report §3.2.2 and the DeepEP README ("normal kernels", NVLink/RDMA forwarding):
    a token is sent over the network once to each other node that holds one of its experts
    (to the GPU of the same local rank there), which forwards it over NVLink to the expert GPUs
    of that node; copies for experts on the own node go over NVLink directly. Per rank: network
    bytes `token_bytes x remote_nodes_per_token`; NVLink bytes `token_bytes x top_k x
    ((k-1)/n + (n-k)/n x (k-1)/k)` (own-node copies to the k-1 peers, plus the forwarded share
    of the remote copies), with k members per node of the n-rank group. The two stages run
    pipelined in chunks (HybridEP `NUM_OF_TOKENS_PER_CHUNK_*`), so the slower one sets the
    time. Within one node it is `all_to_all` of the top_k copies exactly. With group-limited
    routing (`groups`, `groups_picked`: the model's `MoESpec.router_groups` /
    `groups_picked`) fewer nodes receive a token (`remote_nodes_per_token`); the NVLink share,
    one copy per expert, is the same.
    """
    n = _arr(group)
    s = _arr(token_bytes)
    k = members_per_node(n, stride, node.gpus_per_node)
    nn = np.maximum(n, 1.0)
    nvl_share = top_k * ((k - 1) / nn + (n - k) / nn * (k - 1) / np.maximum(k, 1.0))
    remote = remote_nodes_per_token(n / np.maximum(k, 1.0), top_k, num_experts, groups,
                                    groups_picked)
    return _nvlink_and_network(node, n, k, nvl_share * s, remote * s)


def p2p(node: NodeGroup, intra: npt.ArrayLike, nbytes: npt.ArrayLike) -> FloatArray:
    """One point-to-point send of `nbytes` (alpha + bytes/bandwidth): on NVLink at
    `P2P_NVLINK_EFFICIENCY` of the link (NCCL's per-peer channels), on the network as a
    collective's share of the NIC."""
    i = _arr(intra)
    bw, lat = _link(node, i)
    bw = np.where(i > 0, node.intra_node.bandwidth_gbps * 1e9 * P2P_NVLINK_EFFICIENCY, bw)
    s = _arr(nbytes)
    return np.where(s > 0, lat + s / bw, 0.0)


def crosses_nodes(span: npt.ArrayLike, gpus_per_node: int) -> FloatArray:
    """1.0 where a group of consecutive-rank span `span` does not fit in one node."""
    return (_arr(span) > gpus_per_node).astype(np.float64)


def pipeline_links(stride: npt.ArrayLike, pp: npt.ArrayLike, gpus_per_node: int) -> FloatArray:
    """How many of the two pipeline links of the worst-placed stage cross the network (0, 1
    or 2), with pipeline stages `stride` = tp·cp·dp consecutive ranks each, pp outermost
    (Megatron's rank order, parallel_state.py; DeepSpeed's ('pipe', 'data', 'model')).

    Stage j holds ranks [j·S, (j+1)·S); its link to stage j+1 pairs rank r with r + S, on
    one node only if both lie in the same run of `gpus_per_node` ranks (G):
    - S >= G: every rank's neighbour is on another node: both links cross (2);
    - S < G and pp·S <= G: the whole pipeline is on one node (0);
    - S < G, pp·S > G, S divides G: a node boundary falls between two stages; the stage just
      before it (or after) has one network link and one NVLink link (1);
    - S < G not dividing G: some stage straddles a node boundary, both its links cross (2:
      an upper bound where that stage ends the pipeline and has one link).
    E.g. the Zero Bubble paper's pure pipelines (tp = dp = 1, pp 16 on two 8-GPU nodes,
    arXiv 2401.10241 §5.1): stages 7 and 8 each have one link over the RoCE network, and the
    blocking 1F1B exchanges pace the whole pipeline by them."""
    s_, pp_ = np.broadcast_arrays(_arr(stride), _arr(pp))
    g = float(gpus_per_node)
    spans = pp_ * s_ > g
    divides = np.mod(g, np.maximum(s_, 1.0)) == 0
    return np.where(s_ >= g, 2.0, np.where(~spans, 0.0, np.where(divides, 1.0, 2.0)))


def overlap_exposed(comm: npt.ArrayLike, compute: npt.ArrayLike) -> FloatArray:
    """Time a collective of duration `comm` adds to the `compute` it runs alongside.

    The compute advances at (1 - COMM_SM_SHARE) while the collective holds its SMs: if the
    collective outlasts the slowed compute, the rest of it is exposed (comm - compute), else the
    compute is stretched by COMM_SM_SHARE·comm; the larger of the two is exact for this model.
    """
    c = _arr(comm)
    return np.maximum(c - _arr(compute), COMM_SM_SHARE * c)
