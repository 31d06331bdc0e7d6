"""Megatron-Core's allgather MoE dispatcher (`--moe-token-dispatcher-type allgather`, the
default of core_v0.6.0 arguments.py l. 1592-1594): the HBM traffic of its local permutation.

The expected bytes are counted here op by op from `MoEAllGatherTokenDispatcher`
(megatron/core/transformer/moe/token_dispatcher.py @core_v0.6.0 l. 85-272) and from the
backward formulas PyTorch's autograd uses for `gather`, `scatter`, `scatter_add` and a
broadcast product, in rows of h x 2 bytes (bf16): N tokens gathered over tp x ep, L routed
copies on the rank's experts.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.cost.efficiency import HBM_EFFICIENCY
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.moe_comm import allgather_permute_bytes
from autoparallel_cp.emit import megatron_args
from autoparallel_cp.spec import (
    RECIPES,
    Job,
    ModelSpec,
    MoESpec,
)
from autoparallel_cp.spec.plan import parse_plan
from tests.cost.toy_cluster import h100_cluster

H, K, E, S, HBM = 1024, 2, 8, 2048, 3350.0
ROW = H * 2  # one token row in bf16


def _job(dispatcher: str) -> Job:
    m = ModelSpec(name="toy-moe", num_layers=2, hidden_size=H, ffn_hidden_size=4096,
                  num_attention_heads=8, num_kv_heads=8, vocab_size=32000,
                  moe=MoESpec(num_experts=E, top_k=K, expert_ffn_hidden_size=2048))
    rec = RECIPES["megatron-bf16"].with_behaviour(ep_dispatcher=dispatcher)
    return Job(model=m, cluster=h100_cluster(2, HBM), recipe=rec, seq_len=S, global_batch=16)


def _by_hand(n: float, ell: float) -> tuple[float, float]:
    """(forward, backward) rows of the dispatcher's permutation, op by op."""
    fwd = (
        2 * ell      # gather of the gathered tokens to the local copies: read L, write L
        + 2 * ell    # gather into expert order
        + ell        # zeros_like of the expert output
        + 2 * ell    # out-of-place scatter: clone of the zeros
        + 2 * ell    # ... and the scattered expert output
        + 2 * ell    # times the probabilities
        + n          # zeros of the gathered shape
        + 2 * n      # out-of-place scatter_add: clone
        + 3 * ell    # ... read the sources, read and write the destination rows
    )
    bwd = (
        2 * ell      # scatter_add -> its source: grad.gather
        + 2 * ell    # product -> tokens: grad x probs
        + 4 * ell    # product -> probabilities: grad x tokens temporary, then its sum
        + 2 * ell    # scatter -> its source: grad.gather
        + ell + 3 * ell  # gather into expert order -> zeros + scatter_add_
        + n + 3 * ell    # gather to the local copies -> zeros of the gathered + scatter_add_
    )
    return fwd * ROW, bwd * ROW


@pytest.mark.parametrize("tp,ep", [(1, 1), (8, 1), (2, 4)])
def test_bytes_per_token_match_the_op_count(tp: int, ep: int) -> None:
    # per token of the layer's micro-batch: N = ep tokens gathered per token (each of the
    # tp x ep ranks brings tokens/tp), L = top_k copies on the rank's E/ep experts
    f, b = allgather_permute_bytes(_job("allgather"), np.float64(tp), np.float64(ep), None)
    ef, eb = _by_hand(float(ep), float(K))
    assert float(f) == pytest.approx(ef)
    assert float(b) == pytest.approx(eb)


def test_layer_time_swaps_the_generic_permute_for_the_dispatcher_traffic() -> None:
    # ep 1, tp 8, sp: the alltoall pricing charges the permute / unpermute copies as
    # elementwise traffic (4 rows per copy, backward 2x) plus the re-sort of E > 1 local
    # experts (4 rows per copy each pass); allgather replaces both by its own bytes
    tp = 8
    tokens = 1 * S
    bw = HBM * 1e9 * HBM_EFFICIENCY
    a2a = layer_factors(_job("alltoall"), 0, tp, 1, 1, 1, 1, "none", moe=True)
    ag = layer_factors(_job("allgather"), 0, tp, 1, 1, 1, 1, "none", moe=True)
    ef, eb = _by_hand(1.0, float(K))
    generic = 4 * K * ROW * (1 + 2) + 4 * K * ROW * 2
    expect = (ef + eb - generic) * tokens / bw
    # GPU work only: the host-wait exposure (cost/moe_host.py) is reported apart
    gpu_ag, gpu_a2a = ag.compute_s - ag.host_s, a2a.compute_s - a2a.host_s
    assert float(gpu_ag - gpu_a2a) == pytest.approx(expect, rel=1e-9)
    # the attention's tp block in both; the alltoall dispatcher gathers the routed copies over
    # the expert-TP group in its EP term (token_dispatcher.py:741-751), the allgather one
    # keeps the MLP's tp block: twice the attention's (no shared expert)
    assert float(ag.tp_s) == pytest.approx(2 * float(a2a.tp_s))
    assert float(a2a.ep_s) > 0.0


def test_megatron_emits_the_allgather_dispatcher() -> None:
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    base = job.recipe
    ag = job.model_copy(update={"recipe": base.model_copy(update={
        "behaviour": base.behaviour.model_copy(update={"ep_dispatcher": "allgather"})})})
    args, _ = megatron_args(ag, parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1", ag))
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "allgather"
