"""Step time of a plan: the composition of factors.py (docs/design.md), with a breakdown.

Per stage j (on its node group's GPU), per micro-batch:

    t_j = Σ_kind((n_k - r_k)·time_k + r_k·(time_k + recompute_k)) + [j=0]·emb_time
          + [j=last]·(head_time + mtp·(time_mtp + [uniform full]·recompute_mtp + extra_mtp))
          + p2p + z3_j + g_j
    pipeline = m·T_max + (Σ_j t_j - T_max)/vpp,   T_max = max_j t_j
    step = pipeline + max_j exposed_dp_j + max_j optimizer_j + per_step_s

- the pipeline term is 1F1B's (m-1)·T_max + Σ t_j for vpp = 1 and the interleaved bubble
  (pp-1)/vpp·t for equal stages (Narayanan §2.2); the slowest stage sets the pace
  (non-uniform partitions, heterogeneous GPUs); model chunks of unequal layer counts
  (`Plan.chunks_per_stage`) enter through the stage totals t_j only: the fill and drain are
  still charged as 1/vpp of each other stage (an approximation: Megatron's fill runs chunk 0
  of each stage, which a slot split makes one layer lighter on the first stage);
- mtp: DeepSeek-V3 MTP depths on the last stage (memory.mtp_terms): one layer of the last
  layer's kind each (replayed only under uniform full recompute, factors.mtp_recomputed) plus
  factors.mtp_factors (embedding, norms, projection, second head and loss); their parameters
  join the stage's DP sync, optimizer and ZeRO-3 gathers;
- z3_j: ZeRO-3 per-layer weight all-gathers (forward and backward) overlapped with the layer's
  compute: exposed l·overlap_exposed(ag, time) (what sticks out, or the SMs the gather takes
  from the overlapped compute) + one layer's gather (prologue) + FSDP2's copy-out / reduce
  packing traffic (factors.zero3_copy_factor); for PyTorch FSDP `ag` includes the per-call
  ring latency of each layer's gathers, and the stage's DP sync that of each layer's
  reduce-scatter (factors.fsdp_call_latency); on the first / last stage + the exposed gather
  (and per-micro-batch reduce-scatter) of the embedding / LM head (factors.zero3_edge_s:
  FSDP's root unit);
- g_j: gradient work after every micro-batch's backward, not overlapped
  (factors.microbatch_grad_factors x the stage's parameters: DeepSpeed ZeRO-2's per-micro-batch
  reduce-scatter, reported with the DP communication, and BF16_Optimizer's fp32 accumulation
  pass, reported with the optimizer);
- the head stage's raw DP sync includes the tied word embedding's gradient all-reduce with the
  first stage (cost/tied_embedding_sync.py; 0 when untied, pp = 1 or the schedule hides it);
- exposed DP: fully exposed without overlap; overlapped with the last micro-batch's backward
  (2/3 of t_j) otherwise, never less than DP_TAIL_FRACTION of it (the last bucket, plus the
  SMs the overlapped part takes from backward: factors.overlap_exposed);
- optimizer: fused Adam over the local shard at HBM bandwidth;
- DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1): rank j holds stage j and its mirror p-1-j
  and runs both on its own GPUs, so both are timed on rank j's node group; its per-micro-batch
  time is their mean, its DP sync and optimizer step their sum (`_dualpipe_rank`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.memory import (
    _base_mode,
    mtp_cache,
    mtp_terms,
    plan_factors,
    shared,
    stage_groups,
    stage_layer_kinds,
    stage_memo,
    unsplit,
)
from autoparallel_cp.cost.offload import (
    activation_offload_s,
    offloaded_activations,
    optimizer_offload_s,
)
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.cost.schedules import (
    bubble_ratio,
    dualpipe_mirror,
    ep_hidden_share,
    head_stage,
    simulated_bubble,
)
from autoparallel_cp.cost.tied_embedding_sync import tied_embedding_sync_s
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

#: Share of a micro-batch's fwd+bwd time that is backward (2 of 3 GEMM passes): the window the
#: DP gradient reduction of the last micro-batch can hide behind.
BACKWARD_SHARE = 2.0 / 3.0


@dataclass(frozen=True)
class StageTime:
    """Per micro-batch time of one stage, split by cause (seconds)."""

    stage: int
    group: int
    compute_s: float
    tp_s: float
    cp_s: float
    ep_s: float
    pp_s: float
    zero3_s: float
    dp_sync_s: float  # raw DP synchronisation of the stage (before overlap)
    optimizer_s: float
    grad_reduce_s: float = 0.0  # per-micro-batch gradient reduction (DeepSpeed ZeRO-2)
    grad_accum_s: float = 0.0  # per-micro-batch fp32 accumulation pass (BF16_Optimizer)
    offload_s: float = 0.0  # activation copies to / from the host beyond the compute

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_s + self.cp_s + self.ep_s + self.pp_s + self.zero3_s
                + self.grad_reduce_s + self.grad_accum_s + self.offload_s)


@dataclass(frozen=True)
class StepTime:
    """Step time and its breakdown (INTERFACE.md `time`)."""

    step_s: float
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    stages: tuple[StageTime, ...]
    slowest_stage: int
    fixed_s: float = 0.0  # calibrated fixed time per step (spec/calibration.py `per_step_s`)
    offload_s: float = 0.0  # exposed activation offload copies (cost/offload.py)


def _dp_factors(job: Job, plan: Plan) -> tuple[Callable[[int], tuple[float, ...]],
                                                 Callable[[int], tuple[float, float]],
                                                 Callable[[int], tuple[float, float]]]:
    """The DP-sync, per-micro-batch gradient and FSDP call-latency factors of the plan's
    tp / cp / dp / ep / ZeRO / etp by node group, each computed once and shared by the job's plans
    with the same axes (`memory.shared`)."""
    fns = (F.dp_sync_factors, F.microbatch_grad_factors, F.fsdp_call_latency)
    tp, cp, dp, ep, zero, etp = plan.tp, plan.cp, plan.dp, plan.ep, plan.zero, plan.etp
    rep = plan.dp_replicate
    sync_f, grad_f, lat_f = fns

    def make() -> tuple[Callable[[int], tuple[float, ...]], Callable[[int], tuple[float, float]],
                        Callable[[int], tuple[float, float]]]:
        @functools.cache
        def sync(g: int) -> tuple[float, ...]:
            return tuple(float(x) for x in sync_f(job, g, tp, cp, dp, ep, zero, etp, rep))

        @functools.cache
        def mb_grad(g: int) -> tuple[float, float]:
            d, e = grad_f(job, g, tp, cp, dp, ep, zero, etp, rep)
            return float(d), float(e)

        @functools.cache
        def unit_lat(g: int) -> tuple[float, float]:
            mb, st = lat_f(job, g, tp, cp, dp, zero, rep)
            return float(mb), float(st)

        return sync, mb_grad, unit_lat

    return shared(job, ("dp axes", tp, cp, dp, ep, zero, etp, rep, fns), make)


Kinds = tuple[int, int, int, int]


def stage_times(job: Job, plan: Plan, options: F.CostOptions | None = None) -> list[StageTime]:
    """Per micro-batch time of every stage (the t_j of the module docstring): DualPipe ranks
    compose stage j and its mirror (`_dualpipe_rank`)."""
    stage = stage_time_fn(job, plan, options)
    groups = stage_groups(job, plan)
    kinds = stage_layer_kinds(job, plan)
    pp = plan.pp
    if dualpipe_mirror(plan, 0) is not None:  # a rank runs its mirror on its own GPUs
        return [_dualpipe_rank(stage(j, kinds[j], groups[j]),
                               stage(pp - 1 - j, kinds[pp - 1 - j], groups[j]))
                for j in range(pp)]
    return [stage(j, kinds[j], groups[j]) for j in range(pp)]


def stage_time_fn(job: Job, plan: Plan, options: F.CostOptions | None = None
                  ) -> Callable[[int, Kinds, int], StageTime]:
    """stage(j, kinds, g): stage j's own per-micro-batch time (before a DualPipe rank's
    mean with its mirror) with `kinds` = (dense, MoE, recomputed dense, recomputed MoE)
    layers (`stage_layer_kinds`) on a GPU of node group g, for the plans that differ from
    `plan` in their split or placement only (memoized: search/dualpipe_pairs.py reads every
    stage count of a key through it, as `stage_times` does)."""
    opts = F.options_for(job, options)

    layer, edges = plan_factors(job, plan, opts)
    mtps = mtp_cache(job, plan, opts)

    sync, mb_grad, unit_lat = _dp_factors(job, plan)

    last = head_stage(plan)
    # DualPipe(V) pairs a forward and a backward chunk: on that share of the micro-batches
    # their all-to-alls hide as in Megatron's combined 1F1B node (moe_comm.ep_overlapped);
    # a recipe that overlaps every micro-batch already (ep_overlap) keeps its own
    hidden = 0.0 if opts.ep_overlap else ep_hidden_share(plan)
    layer_ov = plan_factors(job, plan, opts.model_copy(update={"ep_overlap": True}))[0] \
        if hidden > 0.0 else layer

    # stage j's time is a function of the plan's other fields, its layer kinds and its group
    # (`one`): kept per (j, kinds, group) for the plans that differ in their split or
    # placement only (a search scoring a key's splits; a DualPipe rank's mirror)
    memo = stage_memo(job, ("stage times", unsplit(plan), opts, layer, edges, layer_ov, mtps,
                            sync, mb_grad, unit_lat, F.p2p_factor, F.layer_param_counts,
                            F.overlap_exposed, F.zero3_copy_factor, F.zero3_edge_s,
                            F.optimizer_factor, tied_embedding_sync_s, optimizer_offload_s,
                            activation_offload_s, offloaded_activations, backward_split,
                            mtp_terms))

    def one(j: int, kinds: Kinds, g: int) -> StageTime:
        """Stage j's per-micro-batch time on a GPU of node group g."""
        nd, nm, rd, rm = kinds
        per_dense, per_exp, z3_per, fixed = sync(g)
        lat_mb, lat_step = unit_lat(g)
        layers = 0.0
        comp = tp = cp = ep = z3 = ep_ov = 0.0
        dense_p = exp_p = 0.0
        z3_first = 0.0
        kept: list[tuple[int, float]] = []
        for moe, n, r in ((False, nd, rd), (True, nm, rm)):
            if n == 0:
                continue
            base = layer(g, _base_mode(plan), moe)
            full = layer(g, "full", moe)
            kept.append((n - r, float(base.act_bytes)))
            d_, e_ = F.layer_param_counts(job, moe, plan.tp, plan.ep, plan.etp)
            dense_p += n * float(d_)
            exp_p += n * float(e_)
            # layers kept: base mode; recomputed layers: full-mode time + replayed forward
            for lf, cnt in ((base, n - r), (full, r)):
                comp += cnt * float(lf.compute_s)
                tp += cnt * float(lf.tp_s)
                cp += cnt * float(lf.cp_s)
                ep += cnt * float(lf.ep_s)
            comp += r * float(full.rc_compute_s)
            tp += r * float(full.rc_tp_s)
            cp += r * float(full.rc_cp_s)
            ep += r * float(full.rc_ep_s)
            if hidden > 0.0:
                ob, of = layer_ov(g, _base_mode(plan), moe), layer_ov(g, "full", moe)
                ep_ov += (n - r) * float(ob.ep_s) + r * (float(of.ep_s) + float(of.rc_ep_s))
            layers += n
            ag = z3_per * float(d_) + lat_mb
            z3 += n * (float(F.overlap_exposed(ag, float(base.time_s)))
                       + F.zero3_copy_factor(job, g) * float(d_))
            z3_first = max(z3_first, ag)
        z3 += z3_first
        ep_layers = ep
        edge = edges(g)
        if j == 0:
            comp += float(edge.emb_time_s)
            dense_p += float(edge.emb_params)
            z3 += float(F.zero3_edge_s(job, g, float(edge.emb_params), plan.tp, plan.cp,
                                       plan.dp, plan.zero, plan.dp_replicate))
        if j == last:
            comp += float(edge.head_compute_s)
            tp += float(edge.head_time_s - edge.head_compute_s)
            dense_p += float(edge.head_params)
            z3 += float(F.zero3_edge_s(job, g, float(edge.head_params), plan.tp, plan.cp,
                                       plan.dp, plan.zero, plan.dp_replicate))
            mt = mtp_terms(job, plan, layer, mtps, g)
            if mt is not None:
                comp += mt.compute_s
                tp += mt.tp_s
                cp += mt.cp_s
                ep += mt.ep_s
                dense_p += mt.dense_p
                exp_p += mt.exp_p
                d_mtp, t_mtp = mt.z3_layer
                layers += job.model.mtp_layers  # an MTP depth's layer is a unit too
                z3 += job.model.mtp_layers * (
                    float(F.overlap_exposed(z3_per * d_mtp + lat_mb, t_mtp))
                    + F.zero3_copy_factor(job, g) * d_mtp)
        if hidden > 0.0:  # the MTP and edge terms stay as they are (not paired chunks' a2a)
            ep += hidden * (ep_ov - ep_layers)
        p2p = memo.get(("p2p", g))
        if p2p is None:  # the same for every stage of a node group
            p2p = memo[("p2p", g)] = float(F.p2p_factor(
                job, g, plan.tp, plan.cp, plan.sp, plan.mbs, plan.pp, plan.vpp, plan.dp))
        # expert gradients reduce over the expert-DP group, which folding can make larger than
        # dp*cp (tp*cp*dp/(etp*ep) ranks); by default it is never larger
        synced = plan.dp * plan.cp > 1 or plan.expert_dp > 1
        dp_sync = (fixed + per_dense * dense_p + per_exp * exp_p
                   + lat_step * layers) if synced else 0.0
        if j == last:  # the tied embedding's gradient all-reduce (cost/tied_embedding_sync.py)
            dp_sync += float(tied_embedding_sync_s(job, g, plan.tp, plan.cp, plan.dp, plan.pp,
                                                   plan.pipeline_schedule))
        shard_d = plan.state_shard if plan.zero >= 1 else 1  # dp*cp/dp_replicate
        shard_e = plan.expert_state_shard if plan.zero >= 1 else 1
        opt = F.optimizer_factor(job, g) * (dense_p / shard_d + exp_p / shard_e)
        if plan.optimizer_offload:  # cost/offload.py: that share steps on the host
            x = plan.optimizer_offload
            opt = (1.0 - x) * opt + optimizer_offload_s(
                job, g, dense_p / shard_d + exp_p / shard_e, x)
        off_s = 0.0
        if plan.activation_offload:
            off, _ = offloaded_activations(plan.activation_offload, kept)
            fwd = backward_split(job, plan, opts)[0] * (comp + tp + cp + ep)
            off_s = activation_offload_s(job, g, off, fwd, comp + tp + cp + ep - fwd)
        mb_d, mb_e = mb_grad(g)
        grad_mb = mb_d * dense_p + mb_e * exp_p
        # the accumulation pass (zero <= 1) and the ZeRO-2 reduction never both apply
        grad_accum, grad_reduce = (grad_mb, 0.0) if plan.zero <= 1 else (0.0, grad_mb)
        return StageTime(stage=j, group=g, compute_s=comp, tp_s=tp, cp_s=cp, ep_s=ep,
                         pp_s=p2p, zero3_s=z3 if plan.zero >= 3 else 0.0,
                         dp_sync_s=dp_sync, optimizer_s=opt,
                         grad_reduce_s=grad_reduce, grad_accum_s=grad_accum,
                         offload_s=off_s)

    def stage(j: int, kinds: Kinds, g: int) -> StageTime:
        k = (j, kinds, g)
        hit = memo.get(k)
        if hit is None:
            hit = memo[k] = one(j, kinds, g)
        return cast(StageTime, hit)

    return stage


def _dualpipe_rank(a: StageTime, b: StageTime) -> StageTime:
    """Rank a.stage under DualPipe: half its micro-batches run stage a, half its mirror b (both
    timed on the rank's node group; per micro-batch: the mean), and it syncs and updates both
    copies' parameters (the sum)."""
    def mean(x: float, y: float) -> float:
        return 0.5 * (x + y)
    return StageTime(
        stage=a.stage, group=a.group, compute_s=mean(a.compute_s, b.compute_s),
        tp_s=mean(a.tp_s, b.tp_s), cp_s=mean(a.cp_s, b.cp_s), ep_s=mean(a.ep_s, b.ep_s),
        pp_s=mean(a.pp_s, b.pp_s), zero3_s=mean(a.zero3_s, b.zero3_s),
        dp_sync_s=a.dp_sync_s + b.dp_sync_s, optimizer_s=a.optimizer_s + b.optimizer_s,
        grad_reduce_s=mean(a.grad_reduce_s, b.grad_reduce_s),
        grad_accum_s=mean(a.grad_accum_s, b.grad_accum_s),
        offload_s=mean(a.offload_s, b.offload_s))


def dp_exposure(overlap: bool) -> tuple[float, float]:
    """(tail share, backward share) of the exposed DP sync max(tail·d, d - share·t) of a stage
    with raw sync d and micro-batch time t: (DP_TAIL_FRACTION, BACKWARD_SHARE) when the recipe
    overlaps the reduction with the last backward, (1, 0) (all of d) when it does not."""
    return (F.DP_TAIL_FRACTION, BACKWARD_SHARE) if overlap else (1.0, 0.0)


def exposed_dp(st: StageTime, overlap: bool) -> float:
    """DP synchronisation left after the last micro-batch's backward (see module docstring)."""
    tail, share = dp_exposure(overlap)
    return max(tail * st.dp_sync_s, st.dp_sync_s - share * st.total_s)


def step_time(job: Job, plan: Plan, options: F.CostOptions | None = None) -> StepTime:
    """Step time with the INTERFACE.md breakdown (components sum to `step_s`)."""
    opts = F.options_for(job, options)
    sts = stage_times(job, plan, opts)
    m = plan.num_microbatches
    tmax_stage = max(sts, key=lambda s: s.total_s)
    tmax = tmax_stage.total_s
    total = sum(s.total_s for s in sts)
    sched = plan.pipeline_schedule
    if sched in ("zbv", "dualpipev") and plan.pp > 1:  # PyTorch's order, replayed
        bubble = simulated_bubble(plan, [s.total_s for s in sts],
                                  backward_split(job, plan, opts))
    else:
        ratio = 1.0 if sched in ("1f1b", "interleaved", "gpipe") else bubble_ratio(
            sched, plan.pp, backward_split(job, plan, opts), m)
        bubble = ratio * (total - tmax) / plan.vpp
    dp_exp = max(exposed_dp(s, opts.dp_overlap) for s in sts)
    opt = max(s.optimizer_s for s in sts)
    t = tmax_stage
    fixed = fixed_step_s(job)
    step = m * tmax + bubble + dp_exp + opt + fixed
    return StepTime(
        step_s=step,
        compute_s=m * t.compute_s,
        bubble_s=bubble,
        tp_comm_s=m * t.tp_s,
        cp_comm_s=m * t.cp_s,
        ep_comm_s=m * t.ep_s,
        pp_comm_s=m * t.pp_s,
        dp_comm_s=dp_exp + m * (t.zero3_s + t.grad_reduce_s),
        optimizer_s=opt + m * t.grad_accum_s,
        stages=tuple(sts),
        slowest_stage=t.stage,
        fixed_s=fixed,
        offload_s=m * t.offload_s,
    )


def fixed_step_s(job: Job) -> float:
    """Calibrated fixed time per step: the same for every plan of the job, so the search
    composes without it (rankings unchanged) and recommend.py subtracts it from its limits."""
    return job.calibration.per_step_s if job.calibration is not None else 0.0
