"""Group-limited ("node-limited") routing in the flex dispatcher's network volume.

DeepSeek-V3 (arXiv 2412.19437 §2.1.2, §4.2: each token goes to at most M = 4 of the 8 nodes;
HF config `n_group` 8, `topk_group` 4) and Megatron-Core's `group_limited_topk` (Megatron-Bridge
DeepSeekV3 provider: `moe_router_num_groups` 8, `moe_router_group_topk` 4): the expected
number of other nodes a token is sent to, derived here by counting (binomial coefficients),
and checked against a simulation of the router itself (random logits, as the forced-balance
benchmarks run it: group score = the sum of its top top_k/T logits, top T groups, top_k
experts among them).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autoparallel_cp.cost import comm
from autoparallel_cp.spec import MoESpec
from autoparallel_cp.spec.loaders import load_model


def _count(nodes: int, k: int, experts: int, groups: int, picked: int) -> float:
    """(nodes - 1) x P(a given other node is reached), each picked group receiving k/picked
    of the token's experts uniformly within it: counted over the picked-group sets (and, for
    a node that is a slice of one group, the expert sets of that group avoiding the slice)."""
    sets = math.comb(groups, picked)
    if nodes <= groups:
        g = groups // nodes
        avoid = sum(1 for s in itertools.combinations(range(groups), picked)
                    if not any(x < g for x in s))  # node 0 holds groups 0..g-1
        return (nodes - 1) * (1 - avoid / sets)
    e, per, each = experts // groups, experts // nodes, k // picked
    with_group = math.comb(groups - 1, picked - 1) / sets
    return (nodes - 1) * with_group * (1 - math.comb(e - per, each) / math.comb(e, each))


def _simulate(nodes: int, k: int, experts: int, groups: int, picked: int,
              tokens: int = 40_000) -> float:
    """Megatron-Core's group-limited top-k on random normal logits (fixed seed): the mean
    count of distinct nodes other than node 0 holding a chosen expert."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((tokens, experts))
    e = experts // groups
    g_scores = np.sort(logits.reshape(tokens, groups, e), axis=2)[:, :, -(k // picked):].sum(2)
    top_groups = np.argsort(-g_scores, axis=1)[:, :picked]
    mask = np.zeros((tokens, groups), dtype=bool)
    np.put_along_axis(mask, top_groups, True, axis=1)
    masked = np.where(np.repeat(mask, e, axis=1), logits, -np.inf)
    chosen = np.argsort(-masked, axis=1)[:, :k]
    node_of = chosen // (experts // nodes)
    hit = np.zeros((tokens, nodes), dtype=bool)
    np.put_along_axis(hit, node_of, True, axis=1)
    return float(hit[:, 1:].sum(1).mean())


@pytest.mark.parametrize(("nodes", "k", "experts", "groups", "picked"),
                         [(8, 8, 256, 8, 4), (4, 8, 256, 8, 4), (2, 8, 256, 8, 4),
                          (16, 8, 256, 8, 4), (8, 6, 160, 8, 3), (32, 8, 256, 8, 4)])
def test_remote_nodes_under_group_limits_by_counting(nodes: int, k: int, experts: int,
                                                     groups: int, picked: int) -> None:
    got = float(comm.remote_nodes_per_token(nodes, k, experts, groups, picked))
    assert got == pytest.approx(_count(nodes, k, experts, groups, picked), rel=1e-12)
    # the limit only concentrates a token's experts: never more nodes than without it
    assert got <= float(comm.remote_nodes_per_token(nodes, k, experts)) + 1e-12


def test_deepseek_v3_on_eight_nodes_by_hand_and_by_the_router() -> None:
    # ep 64 over 8 nodes, one group per node: 4 of the 8 groups picked, each reached, so
    # half of the 7 other nodes: 3.5 (the report's "at most 4 nodes", own node included)
    assert float(comm.remote_nodes_per_token(8, 8, 256, 8, 4)) == pytest.approx(3.5)
    # without the limit: 7 x (1 - C(224, 8)/C(256, 8)) = 4.63 nodes
    free = 7 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert float(comm.remote_nodes_per_token(8, 8, 256)) == pytest.approx(free)
    assert free == pytest.approx(4.63, abs=0.01)
    # the router itself, simulated: within 1.5% of the closed form up to one group a node;
    # beyond, the closed form is above the router (by 4-6%) and below the unlimited count
    for nodes in (2, 4, 8):
        sim = _simulate(nodes, 8, 256, 8, 4)
        assert sim == pytest.approx(float(comm.remote_nodes_per_token(nodes, 8, 256, 8, 4)),
                                    rel=0.015), nodes
    for nodes in (16, 32):
        sim = _simulate(nodes, 8, 256, 8, 4)
        got = float(comm.remote_nodes_per_token(nodes, 8, 256, 8, 4))
        assert sim < got < float(comm.remote_nodes_per_token(nodes, 8, 256)), nodes
        assert got == pytest.approx(sim, rel=0.07), nodes


def test_unaligned_node_counts_keep_the_unlimited_count() -> None:
    # 6 nodes neither divide nor are divided by 8 groups: the unlimited expression
    assert float(comm.remote_nodes_per_token(6, 8, 240, 8, 4)) == pytest.approx(
        float(comm.remote_nodes_per_token(6, 8, 240)))
    # no limit (picked = groups) is the unlimited count exactly
    assert float(comm.remote_nodes_per_token(8, 8, 256, 8, 8)) == float(
        comm.remote_nodes_per_token(8, 8, 256))


def test_the_preset_and_the_spec_rules() -> None:
    moe = load_model("deepseek-v3").moe
    assert moe is not None and (moe.router_groups, moe.groups_picked) == (8, 4)
    with pytest.raises(ValueError, match="must divide num_experts"):
        MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, router_groups=7)
    with pytest.raises(ValueError, match="must not exceed router_groups"):
        MoESpec(num_experts=256, top_k=8, expert_ffn_hidden_size=2048, router_groups=8,
                router_group_topk=9)
    with pytest.raises(ValueError, match="must not exceed the experts"):
        MoESpec(num_experts=16, top_k=8, expert_ffn_hidden_size=2048, router_groups=8,
                router_group_topk=2)
    assert MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=64).groups_picked == 1
