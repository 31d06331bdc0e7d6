"""MoE token dispatch and combine: which links the routed copies cross, and how much of it
Megatron-Core's EP overlap hides (the EP part of `layer_factors`)."""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.common import FloatArray, node, routed_load
from autoparallel_cp.cost.flops import expert_token_factor
from autoparallel_cp.spec import Job


def dispatch_time(job: Job, g: int, ep: FloatArray, stride: FloatArray,
                  copy_bytes: FloatArray, flex: bool) -> FloatArray:
    """One dispatch (or combine) of a rank's routed tokens over its ep group of rank `stride`:
    `copy_bytes` is one copy of every routed token (x top_k copies travel). NCCL all-to-all of
    the top_k copies, or the node-deduplicating flex dispatcher (`comm.flex_dispatch`).

    Scales with `common.routed_load`: the most-loaded rank receives (dispatch) and sends back
    (combine) load x the balanced volume, and the exchange ends when it has."""
    moe = job.model.moe
    assert moe is not None
    nd = node(job, g)
    copy_bytes = copy_bytes * routed_load(job, ep)  # per-rank routed traffic: scales
    if flex:
        return comm.flex_dispatch(nd, ep, stride, copy_bytes, moe.top_k, moe.num_experts,
                                  moe.router_groups, moe.groups_picked)
    return comm.all_to_all(nd, ep, stride, copy_bytes * moe.top_k)


def folded_moe_comm(job: Job, g: int, tokens: FloatArray, tp: FloatArray, ep: FloatArray,
                    etp: FloatArray, flex: bool = False) -> FloatArray:
    """Forward dispatch + combine time of a folded MoE layer (etp != tp), per micro-batch.

    Megatron-Core's alltoall dispatcher (megatron/core/transformer/moe/token_dispatcher.py
    @d98e8a64 `MoEAlltoAllTokenDispatcher`): each rank enters the MoE with its tokens/tp
    sequence-parallel share (moe_layer.py:636 requires SP with TP) and sends its top_k routed
    copies, tokens/tp·top_k·h, by all-to-all over the ep group (`token_dispatch`), whose ranks
    sit etp apart in the expert grid etp x ep x edp (parallel_state.py:886-894), so the
    off-node share is the one `comm.all_to_all` finds at stride etp; with etp > 1 the received
    tokens are all-gathered over the etp consecutive ranks (`dispatch_postprocess`) and the
    outputs reduce-scattered back (`combine_preprocess`), etp x tokens/tp·top_k·h gathered
    bytes; the combine all-to-all returns the same volume. Backward runs the transposes (same
    volumes), which the caller adds. With the flex (DeepEP / HybridEP) dispatcher the ep-group
    exchange deduplicates a token's copies per destination node (`dispatch_time`).
    """
    nd = node(job, g)
    model = job.model
    assert model.moe is not None
    act_b = float(job.recipe.activation_bytes)
    copy = tokens / tp * model.hidden_size * act_b  # one copy of the rank's routed tokens
    a2a = dispatch_time(job, g, ep, etp, copy, flex)  # scaled by routed_load inside
    # the etp gather / scatter of the received tokens: per-rank routed traffic, scales
    gathered = etp * copy * model.moe.top_k * routed_load(job, ep)
    etp_coll = comm.all_gather(nd, etp, 1, gathered) + comm.reduce_scatter(nd, etp, 1, gathered)
    return 2 * a2a + etp_coll


def sort_chunks_bytes(job: Job, tp: FloatArray, ep: FloatArray, etp: FloatArray | None,
                      flex: bool) -> FloatArray:
    """HBM bytes per token of the alltoall dispatcher's local re-sort, per pass.

    Megatron-Core's `MoEAlltoAllTokenDispatcher` (megatron/core/transformer/moe/
    token_dispatcher.py @d98e8a64) permutes the routed copies by expert before the dispatch
    all-to-all and unpermutes them after the combine (charged with the layer's elementwise
    ops), and, with more than one local expert, also regroups the received copies from
    source-rank order to local-expert order (`dispatch_postprocess`: `sort_chunks_by_idxs`,
    fused or not) and back before the combine (`combine_preprocess`): two more copies of the
    top_k routed copies an EP rank holds (`flops.expert_token_factor` with parallel folding),
    each read and written once = 2 x 2 x h x activation bytes x top_k per token. A backward
    pass runs the inverse permutations (same bytes, not the 2x of an elementwise op's
    backward). The flex (DeepEP / HybridEP) dispatcher permutes once after its dispatch and
    has no such re-sort; with one local expert the sort is skipped.
    """
    moe = job.model.moe
    assert moe is not None
    tp_ = np.asarray(tp, dtype=np.float64)
    ep_ = np.asarray(ep, dtype=np.float64)
    # the rank's routed copies (x routed_load: per-rank routed work, scales)
    per = (4.0 * float(job.recipe.activation_bytes) * job.model.hidden_size * moe.top_k
           * expert_token_factor(tp_, etp) * routed_load(job, ep_))
    local = moe.num_experts / np.maximum(ep_, 1.0)
    return np.where((local > 1) & (not flex), per, 0.0 * per)


def allgather_permute_bytes(job: Job, tp: FloatArray, ep: FloatArray,
                            etp: FloatArray | None) -> tuple[FloatArray, FloatArray]:
    """(forward, backward) HBM bytes per token of Megatron-Core's allgather dispatcher's local
    permutation, per micro-batch pass (`MoEAllGatherTokenDispatcher`, megatron/core/
    transformer/moe/token_dispatcher.py @core_v0.6.0 l. 85-272).

    With N tokens gathered over the tp x ep ranks (N = ep x the `tokens` of a layer: each
    rank enters with tokens/tp, tp x ep ranks gather) and L routed copies held by the rank's
    experts (L = top_k x tokens x `flops.expert_token_factor` on balanced routing: N·top_k/ep),
    in rows of h x activation bytes:
    forward: the two index gathers (`torch.gather` to the local copies, then to expert order:
    read + write L each, 4L); the unpermute's zeros (L), out-of-place `scatter` (clone: 2L,
    scatter: 2L), the probability product (2L), the gathered zeros (N), out-of-place
    `scatter_add` (clone 2N; the add reads the L sources and reads and writes L rows, 3L):
    14L + 3N. Backward (PyTorch autograd formulas): `scatter_add` and `scatter` give their
    sources `grad.gather` (2L each); the product gives the tokens grad x probs (2L) and the
    probabilities (grad x tokens) summed over h through an [L, h] temporary (read 2L, write L,
    read L: 4L); each `gather` gives zeros of its input plus an in-place `scatter_add_`
    (L + 3L, and N + 3L): 17L + N. These replace the generic permute / unpermute copies and
    the alltoall re-sort (`sort_chunks_bytes`)."""
    moe = job.model.moe
    assert moe is not None
    row = job.model.hidden_size * float(job.recipe.activation_bytes)
    n = np.asarray(ep, dtype=np.float64)
    # L: the rank's routed copies (x routed_load: per-rank routed work, scales); N: every
    # gathered token, once per rank whatever the routing (does not scale)
    copies = (moe.top_k * expert_token_factor(np.asarray(tp, dtype=np.float64), etp)
              * routed_load(job, n))
    return (14.0 * copies + 3.0 * n) * row, (17.0 * copies + n) * row


#: The expert GEMMs of Megatron-Core's "mlp" schedule node (flops.moe_gemms names); the rest
#: of a MoE layer's compute is its "pre_dispatch" node (norms, attention, router).
MLP_NODE = ("expert_fc1", "expert_fc2", "shared_fc1", "shared_fc2")


def ep_overlapped(one: FloatArray, fwd_compute: FloatArray, compute: FloatArray,
                  fwd: dict[str, FloatArray], bwd: dict[str, FloatArray]) -> FloatArray:
    """Exposed EP time of a layer under Megatron-Core's EP overlap, per micro-batch pair.

    The combined 1F1B node of one layer (megatron/core/models/common/
    model_chunk_schedule_plan.py `TransformerLayerSchedulePlan.run` @d98e8a64) runs the forward
    of micro-batch A and the backward of micro-batch B as

        comm: combine_bwd(B)     | dispatch_fwd(A) -> dispatch_bwd(B) | combine_fwd(A)
        comp: pre_dispatch_fwd(A) | mlp_bwd(B) + dw  -> mlp_fwd(A)     | pre_dispatch_bwd(B)

    with each communication waiting for its own inputs, so each of the four all-to-alls (`one`
    each, dispatch = combine volume) hides only behind its paired compute (`comm.overlap_exposed`,
    which also charges the SMs the communication holds). The mlp windows are the expert GEMMs
    alone; elementwise work stays in the pre_dispatch windows.
    """
    zero = np.zeros_like(one)
    mlp_f = sum((fwd.get(n, zero) for n in MLP_NODE), zero)
    mlp_b = sum((bwd.get(n, zero) for n in MLP_NODE), zero)
    pre_f = np.maximum(fwd_compute - mlp_f, 0.0)
    pre_b = np.maximum(compute - fwd_compute - mlp_b, 0.0)
    return (comm.overlap_exposed(one, pre_f) + comm.overlap_exposed(one, mlp_b)
            + comm.overlap_exposed(one, mlp_f) + comm.overlap_exposed(one, pre_b))
