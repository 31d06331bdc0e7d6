"""Host time a Megatron-Core MoE layer cannot hide: the dropless dispatcher blocks the host on
the device once per MoE layer forward, so the host never runs ahead of the GPU there.

Where the host blocks (Megatron-Core core_v0.15 dev 0d8e0714, core_v0.17.0 d7288711 and
core_v0.18.0 d0b3b775: the Megatron Core of the NeMo 25.11, 26.04(.01) and 26.06 containers,
Megatron-Bridge docs/releases/software-versions.md and the 3rdparty/Megatron-LM submodule of
its v0.2.0, v0.4.x and v0.5.0 tags), file megatron/core/transformer/moe/token_dispatcher.py:

- alltoall, dropless: `preprocess` sets the sync point "before_ep_alltoall" when ep > 1 or
  tp > 1 (d7288711 l. 566; 0d8e0714 l. 572; d0b3b775 l. 570), else "before_finish" (l. 575).
  `_maybe_dtoh_and_synchronize` copies tokens_per_expert and the split sizes to the host on a
  side stream that first waits for the compute stream, and at the sync point calls
  `d2h_event.synchronize()` (d7288711 l. 867-904; 0d8e0714 l. 907; d0b3b775 l. 930): the
  host waits until the GPU has run everything issued before the router's counts. With the
  `moe_preprocess` CUDA graph the copy moves to "before_ep_alltoall" (l. 440-445), still a
  host wait. The all-to-all's backward reuses the host-side split sizes it saved
  (tensor_parallel/mappings.py `_AllToAll.backward`, d7288711 l. 454-458): no wait in
  backward. TEGroupedMLP's `tokens_per_expert.tolist()` (experts.py l. 344) reads the copy
  already on the host.
- flex / HybridEP, dropless: `_HybridEPManager.num_permuted_tokens` stays None ("None means no
  up-bound, will cause a CPU sync", d7288711 l. 991; d0b3b775 l. 1017) and
  `HybridEPDispatch.forward` then dispatches with `non_blocking=False` (fused_a2a.py l. 367 /
  d0b3b775 l. 412); DeepEP's `get_permuted_hidden_states_by_experts` calls
  `tokens_per_expert.sum().item()` (l. 1313). One host wait per forward, none in backward.
- allgather (core_v0.6.0): `tokens_per_expert.cpu()` (token_dispatcher.py l. 161).

So in forward every MoE layer is a segment boundary: between two waits the host issues the
rest of layer L's MoE block (dispatch, experts, combine: block 1) and layer L+1's attention,
router and dispatcher preprocess (block 2), and the GPU cannot start block-k work before the
host issued it. In-order issue makes the segment take max_k(H_<=k + G_>=k) over its ops (a
two-stage flow line: host issue, then GPU); at the block boundaries this is

    wall = max(c + G1 + G2, H1 + G2, H1 + H2),

a lower bound of the per-op value (c: the first op's issue after the wait). The layer's
exposed host time is wall - (G1 + G2) >= c. Backward has no wait, so the host's lead absorbs
layer-to-layer differences and only a host slower than the GPU over the layer shows:
max(0, Hb - Gb). With EP overlap (combined 1F1B) a forward and a backward layer form one
segment: max(c + Gf + Gb, Hf + Hb) - (Gf + Gb). A recomputed MoE block replays its wait.

Host operations counted per MoE layer and micro-batch (one call into ATen or an autograd
Function from Python, or one per-expert launch from Transformer Engine's loops; sources at
d7288711 and Transformer Engine v2.9 / v2.14 transformer_engine/pytorch/module/
grouped_linear.py), each at `MCORE_HOST_S_PER_OP`:

- attention (transformer_layer.py, attention.py): norm+QKV linear, 3 splits/views, q and k
  norms, 2 fused RoPE, core attention, output view, projection, bias-dropout-add, pre-MLP
  norm = 13 forward; 9 autograd nodes.
- router (router.py `TopKRouter.forward` / `routing`, with `moe_router_fusion`): gating
  linear, view, forced-balance logits (2), fused top-k, fused aux-loss scores, token counts
  (sum, tp x cp all-reduce, 2 counts), fused switch loss, aux-loss tracker (2), aux-loss
  scaler = 14 forward; 6 nodes.
- dispatcher preprocess (alltoall `preprocess` + `dispatch_preprocess`): counts and splits
  (11 ops incl. the ep gather), the side-stream copy (wait, 5 copies, event), view, fused
  permute = 21; 1 node. HybridEP (flex): routing-map / probability preparation = 4; 0 nodes.
- dispatch, sort, unsort, combine, unpermute, view, bias-dropout-add: alltoall 8 (2 more
  gathers and a reduce-scatter at tp > 1: 11); flex 5; nodes 6 / 2 (+3 at tp > 1).
- routed experts (experts.py `TEGroupedMLP.forward`): tolist, unsqueeze, activation, and per
  GroupedLinear the module call, reshape, split (or split_quantize), output alloc and the
  grouped-GEMM call = 13; fp8 adds the two quantization paddings and the unpadding (+3).
  Backward: 3 nodes (+3 fp8) and per GroupedLinear 4 Python ops (gradient split/quantize,
  dgrad grouped GEMM, wgrad input, wgrad grouped GEMM).
- per local expert and GroupedLinear (fc1, fc2): forward 1 cuBLAS launch (+ fp8: a quantize
  launch and a Python `get_weight_workspace` call, grouped_linear.py v2.9 l. 127-145);
  backward dgrad and wgrad launches and the per-expert wgrad bookkeeping (l. 145-182 of the
  backward) = 3 (+ fp8: the gradient quantize).
- shared experts: 3 forward (fc1, activation, fc2), 3 nodes each.
- a scope in `cuda_graph_scopes` costs one replay instead of its ops, forward and backward.

The per-expert launches are issued from C++ loops and cost the host less than a Python-issued
op, so charging them `MCORE_HOST_S_PER_OP` makes that part an upper bound. Megatron recipes
only (`framework: megatron`, fused layers); eager PyTorch layers keep `EAGER_HOST_S_*`.

Solver bounds: the exposed time is >= 0 and is added to the layer's compute time (and to a
replayed forward's) inside `layer_factors`, before the search's tables are built; the key and
partition bounds (cpsat_master.py, key_bounds.py, cpsat_partition.py) use only how the
per-layer factors compose and that they are >= 0, never how a factor depends on an axis, so
they stay lower bounds of the exact step time (tests/search compares them with the
enumerator).
"""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost.common import ArrayLike, CostOptions, FloatArray, _f, _te_fp8
from autoparallel_cp.cost.constants import MCORE_HOST_S_PER_OP
from autoparallel_cp.spec import Job

ATTN_FWD, ATTN_BWD = 13, 9
ROUTER_FWD, ROUTER_BWD = 14, 6
PREPROCESS_FWD = {"alltoall": 21, "allgather": 21, "flex": 4}
PREPROCESS_BWD = {"alltoall": 1, "allgather": 1, "flex": 0}
DISPATCH_FWD = {"alltoall": 8, "allgather": 8, "flex": 5}
DISPATCH_BWD = {"alltoall": 6, "allgather": 6, "flex": 2}
TP_GATHERS = 3  # two gathers after the all-to-all, one reduce-scatter before it (tp > 1)
EXPERTS_FWD, EXPERTS_BWD, GROUPED_LINEAR_BWD = 13, 3, 4
FP8_PADDING = 3
PER_EXPERT_FWD, PER_EXPERT_FWD_FP8 = 1, 2  # per GroupedLinear: GEMM; quantize + workspace
PER_EXPERT_BWD, PER_EXPERT_BWD_FP8 = 3, 1  # dgrad, wgrad, bookkeeping; gradient quantize
SHARED_EXPERT_OPS = 3


def host_ops(job: Job, opts: CostOptions, n_local: ArrayLike, tp: ArrayLike
             ) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(post-wait forward ops, pre-wait forward ops, backward ops) of one MoE layer and
    micro-batch (module docstring). `n_local`: routed experts per rank (num_experts / ep)."""
    moe = job.model.moe
    if moe is None:
        raise ValueError("host_ops needs a MoE model")
    n, tp_ = np.broadcast_arrays(_f(n_local), _f(tp))
    d = opts.ep_dispatcher
    fp8 = 1.0 if _te_fp8(job.recipe) else 0.0
    graphs = set(opts.cuda_graph_scopes)
    tp_extra = np.where((tp_ > 1) & (d != "flex"), float(TP_GATHERS), 0.0)
    shared = SHARED_EXPERT_OPS * moe.num_shared_experts
    post = (DISPATCH_FWD[d] + tp_extra + EXPERTS_FWD + FP8_PADDING * fp8
            + 2.0 * n * (PER_EXPERT_FWD + PER_EXPERT_FWD_FP8 * fp8))
    pre = ((1 if "attn" in graphs else ATTN_FWD)
           + (1 if "moe_router" in graphs else ROUTER_FWD)
           + (1 if "moe_preprocess" in graphs else PREPROCESS_FWD[d]) + shared + 0.0 * n)
    bwd = ((1 if "attn" in graphs else ATTN_BWD)
           + (1 if "moe_router" in graphs else ROUTER_BWD)
           + (0 if "moe_preprocess" in graphs else PREPROCESS_BWD[d])
           + DISPATCH_BWD[d] + tp_extra + EXPERTS_BWD + FP8_PADDING * fp8
           + 2 * GROUPED_LINEAR_BWD + shared
           + 2.0 * n * (PER_EXPERT_BWD + PER_EXPERT_BWD_FP8 * fp8))
    return post, pre, bwd


def sync_exposed(h_post: ArrayLike, h_pre: ArrayLike, g_post: ArrayLike, g_pre: ArrayLike,
                 c: float = MCORE_HOST_S_PER_OP) -> FloatArray:
    """Seconds a forward segment between two host waits takes beyond its GPU time:
    max(c + G1 + G2, H1 + G2, H1 + H2) - (G1 + G2), block 1 issued first (module docstring)."""
    h1, h2, g1, g2 = _f(h_post), _f(h_pre), _f(g_post), _f(g_pre)
    wall = np.maximum(np.maximum(c + g1 + g2, h1 + g2), h1 + h2)
    return wall - (g1 + g2)


def moe_host_exposed(job: Job, opts: CostOptions, n_local: ArrayLike, tp: ArrayLike,
                     g_post: ArrayLike, g_pre: ArrayLike, g_bwd: ArrayLike
                     ) -> tuple[FloatArray, FloatArray]:
    """(exposed host seconds of one MoE layer's forward + backward, of its replayed forward)
    per micro-batch, given the GPU seconds of the forward's post-wait block (dispatch, experts,
    combine), of the rest of the forward, and of the backward.

    --moe-load-imbalance: the host counts are per call and local expert, not per routed token,
    so they do not scale; the most-loaded rank's longer GPU blocks arrive through g_post /
    g_pre / g_bwd (`layer_factors`, `common.routed_load`)."""
    post, pre, bwd = host_ops(job, opts, n_local, tp)
    c = MCORE_HOST_S_PER_OP
    h1, h2, hb = post * c, pre * c, bwd * c
    g1, g2, gb = _f(g_post), _f(g_pre), _f(g_bwd)
    fwd = sync_exposed(h1, h2, g1, g2, c)
    if opts.ep_overlap:
        # combined 1F1B: a forward and a backward layer share one segment
        both = sync_exposed(h1 + h2 + hb, 0.0, g1 + g2 + gb, 0.0, c)
        return both, fwd
    return fwd + np.maximum(hb - gb, 0.0), fwd
