"""Per-GPU memory of a plan: the composition of factors.py (docs/design.md), stage by stage.

For pipeline stage j (rank j of the pipeline; with interleaving it holds vpp chunks):

    mem_j = states_j + f_j·Σ_kind((n_k - r_k)·act_k + r_k·ckpt_k) + f_j·[j=0]·emb_act
            + [j=last]·(head_act + mtp_act) + max(work_k, [j=last]·head_work) + buffers_j
            + other     (work_k over the MTP layers' kind too)

- states_j: parameters of the stage per GPU (layers, + embedding on the first stage, + final
  norm and LM head on the last) x (weights, grads, optimizer) bytes per parameter by ZeRO stage,
  dense params sharded over dp·cp, expert params over the expert-data-parallel group (dp·cp/ep,
  or tp·cp·dp/(etp·ep) with parallel folding: `Plan.expert_dp`), each over dp_replicate with
  hybrid sharding (`Plan.state_shard`, `Plan.expert_state_shard`)
  (factors.state_bytes_per_param);
- f_j: in-flight micro-batches (factors.inflight: 1F1B / interleaved; factors.stage_inflight
  when the stage's model chunks hold unequal layer counts, `Plan.chunks_per_stage`);
- n_k / r_k: layers of each kind (dense, MoE) on the stage / of them fully recomputed
  (Megatron `--recompute-method block`: the first r layers of the stage);
- work: transient working set of one layer's backward (the recomputed layer's activations
  under full recompute) or, on the last stage, the fp32 logits at the loss, whichever is larger;
- mtp: DeepSeek-V3 MTP depths on the last stage (`mtp_terms`): their layers' activations in
  the plan's mode for one micro-batch, their parameters in states_j (and the embedding copy,
  but under DualPipe: `schedules.mtp_shares_embedding`);
- buffers_j: autocast weight copies (pytorch-amp), ZeRO-3 gathered layers;
- other: framework buckets (factors.other_bytes).
`fits` compares required = peak + factors.overhead_bytes(peak, persistent) to the capacity:
CUDA context + ALLOCATOR_FRAGMENTATION x (peak - persistent), where persistent = the model
states held in buffers allocated once and never freed (factors.persistent_bytes: weights,
optimizer states, gradients where the framework keeps a contiguous buffer); the caching
allocator's free space sits in the segments serving the transient allocations only.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.mtp_stage import _base_mode, mtp_terms
from autoparallel_cp.cost.offload import (
    gpu_kept_optimizer_share,
    offloaded_activations,
    optimizer_host_bytes,
)
from autoparallel_cp.cost.schedules import dualpipe_mirror, head_stage, inflight_units
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


@dataclass(frozen=True)
class StageMemory:
    """Memory of one pipeline stage's GPU (bytes)."""

    stage: int
    group: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    capacity_bytes: float
    persistent_bytes: float  # of the peak, in buffers never freed (factors.persistent_bytes)
    host_bytes: float = 0.0  # offloaded to host memory (cost/offload.py)

    @property
    def peak_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_bytes)

    @property
    def fragmentation_bytes(self) -> float:
        return float(F.fragmentation_bytes(self.peak_bytes, self.persistent_bytes))

    @property
    def overhead_bytes(self) -> float:
        return float(F.overhead_bytes(self.peak_bytes, self.persistent_bytes))

    @property
    def charged_bytes(self) -> float:
        """required_bytes less the CUDA context: what the solver's tables compare with the
        capacity less the context (factors.charged_bytes)."""
        return float(F.charged_bytes(self.peak_bytes, self.persistent_bytes))

    @property
    def required_bytes(self) -> float:
        return self.peak_bytes + self.overhead_bytes


def stage_groups(job: Job, plan: Plan) -> tuple[int, ...]:
    """Node group of each pipeline stage: `plan.stage_groups`, else by rank ranges (pp is the
    outermost mesh dimension, so stage j owns ranks [j·N/pp, (j+1)·N/pp))."""
    if plan.stage_groups is not None:
        return plan.stage_groups
    n = job.num_gpus // plan.pp
    bounds = np.cumsum([g.num_gpus for g in job.cluster.node_groups])
    return tuple(int(np.searchsorted(bounds, j * n, side="right")) for j in range(plan.pp))


def stage_layer_kinds(job: Job, plan: Plan) -> list[tuple[int, int, int, int]]:
    """Per stage: (dense layers, MoE layers, recomputed dense, recomputed MoE)."""
    model = job.model
    out = []
    start = 0
    for n in plan.layers_per_stage(model.num_layers):
        idx = list(range(start, start + n))
        r = plan.recomputed_layers(n)
        kinds = [model.is_moe_layer(i) for i in idx]
        n_moe = sum(kinds)
        r_moe = sum(kinds[:r])
        out.append((n - n_moe, n_moe, r - r_moe, r_moe))
        start += n
    return out


#: How many shared factor sets (`shared`) are kept (least recently used dropped)
FACTOR_CACHE_SIZE = 128
_SHARED: OrderedDict[tuple[Any, ...], tuple[Job, Any]] = OrderedDict()
_SHARED_LOCK = threading.Lock()
_T = TypeVar("_T")


#: How many per-stage memos (`stage_memo`) are kept, apart from the factor sets
STAGE_CACHE_SIZE = 64
_STAGES: OrderedDict[tuple[Any, ...], tuple[Job, Any]] = OrderedDict()


def stage_memo(job: Job, key: tuple[Any, ...]) -> dict[tuple[Any, ...], Any]:
    """A dict kept for the same job object and `key` (at most STAGE_CACHE_SIZE, least recently
    used dropped, apart from `shared`'s factor sets, which it would otherwise push out): the
    per-stage results of the plans that differ only in their split or placement
    (steptime.py `stage_times`, `stage_memory`); `key` names the functions they call."""
    return shared(job, key, dict, _STAGES, STAGE_CACHE_SIZE)


def shared(job: Job, key: tuple[Any, ...], make: Callable[[], _T],
           store: OrderedDict[tuple[Any, ...], tuple[Job, Any]] | None = None,
           size: int = FACTOR_CACHE_SIZE) -> _T:
    """make() kept for the same job object and `key` (at most FACTOR_CACHE_SIZE of them), so the
    plans of one job that share a plan's axes share the factors computed from them: `evaluate`
    composes the memory and the step time from the same factors, and a solve's top k or a
    sensitivity sweep's plans mostly share tp / cp / mbs. Keyed by the job's identity (a frozen
    model; the entry holds it, so its id names no other job while kept): the callers' factors
    are pure functions of the job and the key, which names the functions themselves too."""
    cache = _SHARED if store is None else store
    k = (id(job), key)
    with _SHARED_LOCK:
        hit = cache.get(k)
        if hit is not None and hit[0] is job:
            cache.move_to_end(k)
            return cast(_T, hit[1])
    value = make()
    with _SHARED_LOCK:
        cache[k] = (job, value)
        while len(cache) > size:
            cache.popitem(last=False)
    return value


@dataclass(frozen=True)
class _PlanFactors:
    """The layer, edge and MTP factors of one (job, tp, cp, ep, sp, mbs, etp, options), each
    computed on first use."""

    layer: Callable[[int, str, bool], F.LayerFactors]
    edges: Callable[[int], F.EdgeFactors]
    mtp: Callable[[int], F.MtpFactors]


def _plan_factors(job: Job, plan: Plan, opts: F.CostOptions) -> _PlanFactors:
    """The factors of `plan`'s layer axes, shared (`shared`) by the job's plans with the same
    axes and options."""
    fns = (F.layer_factors, F.edge_factors, F.mtp_factors)
    tp, cp, ep, sp, mbs, etp = plan.tp, plan.cp, plan.ep, plan.sp, plan.mbs, plan.etp
    layer_f, edge_f, mtp_f = fns

    def make() -> _PlanFactors:
        @functools.cache
        def layer(g: int, mode: str, moe: bool) -> F.LayerFactors:
            return layer_f(job, g, tp, cp, ep, sp, mbs, mode, moe, opts, etp=etp)

        @functools.cache
        def edges(g: int) -> F.EdgeFactors:
            return edge_f(job, g, tp, cp, sp, mbs, opts)

        @functools.cache
        def mtp(g: int) -> F.MtpFactors:
            return mtp_f(job, g, tp, cp, sp, mbs, opts)

        return _PlanFactors(layer, edges, mtp)

    return shared(job, ("layer axes", tp, cp, ep, sp, mbs, etp, opts, fns), make)


def clear_factor_cache() -> None:
    """Drop every shared factor set (`shared`) and per-stage memo (`stage_memo`)."""
    with _SHARED_LOCK:
        _SHARED.clear()
        _STAGES.clear()


def plan_factors(job: Job, plan: Plan, opts: F.CostOptions
                 ) -> tuple[Callable[[int, str, bool], F.LayerFactors],
                            Callable[[int], F.EdgeFactors]]:
    """The plan's layer factors by (node group, mode, MoE) and edge factors by node group,
    each computed once: they do not depend on the stage, so a 126-layer pipeline of 16 stages
    needs 4 layer evaluations, not 64 (and none for a plan of the same job with the same layer
    axes evaluated recently: `_plan_factors`)."""
    pf = _plan_factors(job, plan, opts)
    return pf.layer, pf.edges


def mtp_cache(job: Job, plan: Plan, opts: F.CostOptions) -> Callable[[int], F.MtpFactors]:
    """`F.mtp_factors` of the plan by node group, computed once (`_plan_factors`)."""
    return _plan_factors(job, plan, opts).mtp


Parts = tuple[float, float, float, float, float, float]


def state_consts(job: Job, plan: Plan) -> tuple[float, ...]:
    """(wd, gd, od, we, ge, oe, buf_pp, z3, other): the bytes per dense and expert parameter
    of weights, grads and optimizer states, the buffer bytes per parameter, the ZeRO-3
    buffer and the framework's other bytes, as `stage_memory` composes a GPU's memory."""
    wd, gd, od = (float(x) for x in F.state_bytes_per_param(job.recipe, plan.zero,
                                                            plan.state_shard, plan.pp))
    we, ge, oe = (float(x) for x in F.state_bytes_per_param(job.recipe.for_experts(),
                                                            plan.zero, plan.expert_state_shard,
                                                            plan.pp))
    return (wd, gd, od, we, ge, oe, float(F.buffer_bytes_per_param(job, plan.zero)),
            float(F.zero3_buffer_bytes(job, plan.tp, plan.ep, plan.zero, plan.etp)),
            float(F.other_bytes(job)))


def stage_parts_fn(job: Job, plan: Plan, options: F.CostOptions | None = None
                   ) -> Callable[[int, tuple[int, int, int, int], tuple[int, ...], int], Parts]:
    """held(j, kinds, chunks, g): stage j's own (dense params, expert params, activations,
    work buffer, host bytes, ZeRO-3 edge buffer) with `kinds` (`stage_layer_kinds`) and its
    chunks' layer counts on node group g, for the plans that differ from `plan` in their
    split or placement only (memoized; search/dualpipe_pairs.py reads it too)."""
    opts = F.options_for(job, options)
    layer, edges = plan_factors(job, plan, opts)
    mtps = mtp_cache(job, plan, opts)
    last = head_stage(plan)

    def part(j: int, kinds: tuple[int, int, int, int], chunks: tuple[int, ...], g: int
             ) -> Parts:
        """Stage j's dense_p exp_p act work host edge_buf (ZeRO-3 root unit) on group g."""
        nd, nm, rd, rm = kinds
        edge = edges(g)
        dense_p = 0.0
        exp_p = 0.0
        act = 0.0
        work = 0.0
        kept: list[tuple[int, float]] = []
        for moe, n, r in ((False, nd, rd), (True, nm, rm)):
            if n == 0:
                continue
            dp_, ep_ = F.layer_param_counts(job, moe, plan.tp, plan.ep, plan.etp)
            dense_p += n * float(dp_)
            exp_p += n * float(ep_)
            base = layer(g, _base_mode(plan), moe)
            full = layer(g, "full", moe)
            act += (n - r) * float(base.act_bytes) + r * float(full.ckpt_bytes)
            kept.append((n - r, float(base.act_bytes)))
            work = max(work, float(full.work_bytes if r > 0 else base.work_bytes))
        f = inflight_units(plan, j, chunks)
        off, one = offloaded_activations(plan.activation_offload, kept)
        act = (act - off) * f + one  # one offloaded layer in transit (cost/offload.py)
        edge_buf = 0.0
        if j == 0:
            dense_p += float(edge.emb_params)
            act += f * float(edge.emb_act_bytes)
            edge_buf += float(F.zero3_edge_bytes(float(edge.emb_params), plan.zero))
        if j == last:
            dense_p += float(edge.head_params)
            edge_buf += float(F.zero3_edge_bytes(float(edge.head_params), plan.zero))
            act += float(edge.head_act_bytes)
            work = max(work, float(edge.head_work_bytes))
            mt = mtp_terms(job, plan, layer, mtps, g)
            if mt is not None:
                dense_p += mt.dense_p
                exp_p += mt.exp_p
                act += mt.act
                work = max(work, mt.work)
        return dense_p, exp_p, act, work, f * off, edge_buf

    # `part` reads the plan's other fields and the stage's kinds, chunks and group: kept
    # for the plans that differ in their split or placement only (keyed by the functions)
    memo = stage_memo(job, ("stage parts", unsplit(plan), opts, layer, edges, mtps,
                            F.layer_param_counts, F.zero3_edge_bytes, inflight_units,
                            offloaded_activations, mtp_terms))

    def held(j: int, kinds: tuple[int, int, int, int], chunks: tuple[int, ...], g: int
             ) -> Parts:
        k = (j, kinds, chunks, g)
        hit = memo.get(k)
        if hit is None:
            hit = memo[k] = part(j, kinds, chunks, g)
        return cast(Parts, hit)

    return held


def stage_memory(job: Job, plan: Plan, options: F.CostOptions | None = None
                 ) -> list[StageMemory]:
    """Memory of every pipeline stage's GPU (the composition in the module docstring)."""
    held = stage_parts_fn(job, plan, options)
    groups = stage_groups(job, plan)
    kinds = stage_layer_kinds(job, plan)
    chunks = plan.chunks_per_stage(job.model.num_layers)
    shard_dense = plan.state_shard  # dp*cp, over dp_replicate with hybrid sharding
    shard_exp = plan.expert_state_shard
    wd, gd, od, we, ge, oe, buf_pp, z3, other = state_consts(job, plan)
    out: list[StageMemory] = []
    for j, g in enumerate(groups):
        dense_p, exp_p, act, work, host, edge_buf = held(j, kinds[j], chunks[j], g)
        mirror = dualpipe_mirror(plan, j)
        if mirror is not None:  # DualPipe: the rank also holds stage p-1-j (its own f share)
            # on the rank's own GPUs
            d2, e2, a2, w2, h2, b2 = held(mirror, kinds[mirror], chunks[mirror], g)
            dense_p, exp_p, act, work = dense_p + d2, exp_p + e2, act + a2, max(work, w2)
            host += h2
            edge_buf += b2
        buffers = buf_pp * (dense_p + exp_p) + z3 + edge_buf + other
        params_b = wd * dense_p + we * exp_p
        grads_b = gd * dense_p + ge * exp_p
        opt_b = od * dense_p + oe * exp_p
        if plan.optimizer_offload:  # cost/offload.py: that share's states live on the host
            x = plan.optimizer_offload
            host += optimizer_host_bytes(job, opt_b, dense_p / shard_dense + exp_p / shard_exp
                                         if plan.zero >= 1 else dense_p + exp_p, x)
            keep_d = gpu_kept_optimizer_share(job.recipe)  # 0 unless the GPU keeps the master
            keep_e = gpu_kept_optimizer_share(job.recipe.for_experts())
            opt_b = (od * dense_p * (1.0 - x * (1.0 - keep_d))
                     + oe * exp_p * (1.0 - x * (1.0 - keep_e)))
        out.append(StageMemory(
            stage=j, group=g,
            params_bytes=params_b,
            grads_bytes=grads_b,
            optimizer_bytes=opt_b,
            activations_bytes=act + work,
            other_bytes=buffers,
            capacity_bytes=usable_bytes(job, job.cluster.node_groups[g].gpu.memory_bytes),
            persistent_bytes=F.persistent_bytes(job.recipe, params_b, grads_b, opt_b),
            host_bytes=host,
        ))
    return out


def unsplit(plan: Plan) -> Plan:
    """`plan` without its split and placement (stage_layers, chunk_layers, stage_groups)."""
    return plan.model_copy(update={"stage_layers": None, "chunk_layers": None,
                                   "stage_groups": None})


def usable_bytes(job: Job, memory_bytes: float) -> float:
    """GPU memory a plan may use: the capacity less the `--mem-headroom` fraction (Job)."""
    return float(memory_bytes) * (1.0 - job.mem_headroom)


def peak_stage(stages: list[StageMemory]) -> StageMemory:
    """The stage closest to (or furthest over) its GPU's capacity; ties: the largest peak."""
    return max(stages, key=lambda s: (s.required_bytes / s.capacity_bytes, s.peak_bytes))
