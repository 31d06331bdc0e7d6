"""The (F, B, W) split of a micro-batch's work for the schedules that split the backward
(ZB-H1 / ZB-H2, ZBV, DualPipe(V): cost/schedules.py): the cost model's own per-op times, not
FLOPs.

Qi et al. (arXiv 2401.10241 §2) split a layer's backward into B, the input gradient that the
previous stage waits for, and W, the weight gradient that can wait. Their profiled times
(Appendix D, Table 9, the authors' Megatron fork) give W/F = 0.50 (1.5B), 0.67 (6.2B), 0.72
(14.6B), 0.74 (28.3B) with T_B ~ T_F: W holds the weight-gradient GEMMs and nothing else, while
the backward of every op without weights (norms, activation, softmax / attention core,
dropout, rotary, residual adds, the loss) and the memory-bound ops' slower pace land in B and
F. Counting FLOPs gives W = F instead (every forward GEMM has one weight-gradient GEMM of the
same FLOPs). So here, per layer (cost/layer_factors.py `LayerFactors`):

- W = `wgrad_s`: the weight-gradient GEMMs, each at its own shape's efficiency
  (efficiency.gemm_time on (k, m, n));
- F = `fwd_s`: the forward GEMMs, attention core, elementwise / HBM ops, copies, and the
  forward's exposed TP / CP / EP collectives and MoE host wait;
- B = the rest of `time_s`: the input-gradient GEMMs, the attention backward, every elementwise
  op's backward (constants.ELEMENTWISE_BWD_FACTOR x its forward traffic), the backward's
  collectives, a selective recompute's replay, and under full recompute the replayed forward
  (`recompute_s`: Megatron's checkpointing replays it inside the backward, before B);
- the LM head (embedding_head.py `EdgeFactors`): its forward GEMM, weight cast, the loss's
  forward passes (constants.CE_FWD_BYTES_PER_LOGIT) and vocab-parallel all-reduces in F, its
  weight-gradient GEMM in W, its input-gradient GEMM and the loss's backward in B; the
  embedding's three HBM passes (`emb_time_s`): the gather (one) in F, the gradient's
  scatter-add into the table (two, the table's weight gradient) in W.

Summed over the model's layers (dense and MoE by count, a share min(1, r·pp/L) of them fully
recomputed under `recompute_layers` r, cost/schedules.py's earlier rule) and its edges once:
the mean stage's split. Read on the first node group's GPU (a heterogeneous cluster's other
GPUs have other efficiency curves; one split per plan keeps the bubble ratio one number per
search key: search/schedule_axis.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.memory import _base_mode, plan_factors
from autoparallel_cp.spec import Job, ModelSpec
from autoparallel_cp.spec.plan import Plan


def pass_times(job: Job, plan: Plan, options: F.CostOptions | None = None
               ) -> tuple[float, float, float]:
    """Seconds (F, B, W) of one micro-batch through all of the model's layers and edges
    (module docstring), on node group 0."""
    opts = F.options_for(job, options)
    model = job.model
    layer, edges = plan_factors(job, plan, opts)
    n_moe = _moe_layers(model)
    share = 0.0
    if plan.recompute == "full":
        share = 1.0 if plan.recompute_layers is None else min(
            1.0, plan.recompute_layers * plan.pp / model.num_layers)
    f = b = w = 0.0
    for moe, n in ((False, model.num_layers - n_moe), (True, n_moe)):
        if n == 0:
            continue
        for mode, cnt in ((_base_mode(plan), n * (1.0 - share)), ("full", n * share)):
            if cnt == 0.0:
                continue
            lf = layer(0, mode, moe)
            lf_f, lf_w = float(lf.fwd_s), float(lf.wgrad_s)
            f += cnt * lf_f
            w += cnt * lf_w
            b += cnt * max(float(lf.time_s) - lf_f - lf_w, 0.0)
            if mode == "full":  # the replayed forward runs inside the backward, before B
                b += cnt * float(lf.recompute_s)
    e = edges(0)
    emb = float(e.emb_time_s)
    h_f, h_w = float(e.head_fwd_s), float(e.head_wgrad_s)
    f += emb / 3.0 + h_f
    w += 2.0 * emb / 3.0 + h_w
    b += max(float(e.head_time_s) - h_f - h_w, 0.0)
    return f, b, w


@functools.lru_cache(maxsize=64)
def _moe_layers(model: ModelSpec) -> int:
    """How many of the model's layers are MoE layers."""
    return sum(model.is_moe_layer(i) for i in range(model.num_layers))


def backward_split(job: Job, plan: Plan, options: F.CostOptions | None = None
                   ) -> tuple[float, float, float]:
    """Shares (F, B, W) of `pass_times`, summing to 1: the split the schedules' bubbles
    (cost/schedules.py `bubble_ratio`, `simulated_bubble`) and the timeline's passes use."""
    f, b, w = pass_times(job, plan, options)
    total = f + b + w
    return f / total, b / total, w / total


def backward_splits(job: Job, tp: Sequence[int], cp: Sequence[int], ep: Sequence[int],
                    sp: Sequence[int], mbs: Sequence[int], etp: int | None = None,
                    options: F.CostOptions | None = None
                    ) -> tuple[npt.NDArray[np.float64], ...]:
    """`backward_split` of the probe plans of every (tp, cp, ep, sp, mbs) of these axes and
    recompute none / selective / full over every layer (no pinned count): three arrays
    (F, B, W shares) of shape (tp, cp, ep, sp, mbs, 3), from one array evaluation of the layer
    and edge factors per layer kind on node group 0. Elementwise the same operations in the
    same order as `pass_times` (a pinned count's share is 0 or 1 here, so each kind adds its
    layers once, at the key's own mode, and full mode its replayed forward to B): the same
    floats as `backward_split` (tests/cost/test_pass_split_grid.py)."""
    opts = F.options_for(job, options)
    model = job.model
    a_tp, a_cp, a_ep, a_sp, a_mbs, a_mode = np.ix_(
        *(np.asarray(x, float) for x in (tp, cp, ep, sp, mbs)), np.array([0.0, 1.0, 2.0]))
    shape = (len(tp), len(cp), len(ep), len(sp), len(mbs), 3)
    f = np.zeros(shape)
    b = np.zeros(shape)
    w = np.zeros(shape)
    n_moe = _moe_layers(model)
    for moe, n in ((False, model.num_layers - n_moe), (True, n_moe)):
        if n == 0:
            continue
        lf = F.layer_factors(job, 0, a_tp, a_cp, a_ep, a_sp, a_mbs, a_mode, moe=moe,
                             options=opts, etp=etp)
        lf_f, lf_w, tim, rec = (np.broadcast_to(np.asarray(x, float), shape) for x in (
            lf.fwd_s, lf.wgrad_s, lf.time_s, lf.recompute_s))
        cnt = n * 1.0
        f = f + cnt * lf_f
        w = w + cnt * lf_w
        b = b + cnt * np.maximum(tim - lf_f - lf_w, 0.0)
        b[..., 2] = b[..., 2] + cnt * rec[..., 2]  # full: the replayed forward, before B
    e_tp, e_cp, e_sp, e_mbs = np.ix_(*(np.asarray(x, float) for x in (tp, cp, sp, mbs)))
    e = F.edge_factors(job, 0, e_tp, e_cp, e_sp, e_mbs, opts)

    def edge(x: npt.ArrayLike) -> npt.NDArray[np.float64]:  # (tp, cp, sp, mbs) -> six axes
        a = np.asarray(x, float)
        return np.broadcast_to(a[:, :, None, :, :, None] if a.ndim == 4 else a, shape)

    emb, h_f, h_w, h_t = (edge(x) for x in (e.emb_time_s, e.head_fwd_s, e.head_wgrad_s,
                                            e.head_time_s))
    f = f + (emb / 3.0 + h_f)
    w = w + (2.0 * emb / 3.0 + h_w)
    b = b + np.maximum(h_t - h_f - h_w, 0.0)
    total = f + b + w
    return f / total, b / total, w / total
