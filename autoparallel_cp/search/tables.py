"""The cost model's factors tabulated over the search space's axis domains (solver input).

Every table is indexed by the positions of a few axis values in the space's domains (never by
whole plans): layer factors over (tp, cp, ep, sp, mbs, mode) per node group and layer kind,
model-state bytes per layer over (tp, ep, zero, dp, cp), edges over (tp, cp, sp, mbs), and so on.
`StageCost` / `plan_cost` apply the design.md composition to one plan in exact floats; the
enumerator vectorizes the same composition and cpsat_partition.py mirrors it with integer
variables (one key at a time).

Memory is tabulated as *charged* bytes (factors.charged_bytes): every transient term
(activations, checkpoints, working sets, logits, ZeRO-3 gathered layers, autocast copies,
buckets) x transient_charge() = 1 + ALLOCATOR_FRAGMENTATION, gradients x grad_charge(recipe),
weights and optimizer states x 1; the capacity is the usable memory less CUDA_CONTEXT_BYTES.
Proof that this is `evaluate`'s test: with P the persistent and T the transient bytes of a
stage (peak = P + T), evaluate requires peak + context + f·T <= usable, i.e.
P + (1 + f)·T <= usable - context; the tables' stage sum is exactly P + (1 + f)·T because each
term is charged by its own class and the charges are linear (the max of working sets commutes
with a positive scale).

A MoE load imbalance (`Job.moe_load_imbalance`, rho) changes layer-factor entries only
(`common.routed_load`: a routed term >= 0 times min(rho, ep) >= 1), so the bounds stay valid
(tests/search/test_moe_imbalance_search.py). `plan_cost` of ZBV / DualPipeV adds the head on
rank 0 and the replayed bubble (replay_axis.py); of DualPipe and a DualPipeV hiding EP it is the
cost model, the tables holding the hidden share's lower bound (`hidden_lb`, model_scored.py).

Kept whole (about 600 lines): the tables and `plan_cost`, their one exact reader, must change
together; splitting them would put the composition the solver proves against in two files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.memory import usable_bytes
from autoparallel_cp.cost.offload import gpu_kept_optimizer_share
from autoparallel_cp.cost.steptime import BACKWARD_SHARE, dp_exposure
from autoparallel_cp.search.act_offload import act_layers, kept_share, lower_acts, stage_terms
from autoparallel_cp.search.model_scored import hidden_lb, model_scored, plan_terms
from autoparallel_cp.search.offload_axis import gpu_share, opt_seconds
from autoparallel_cp.search.replay_axis import head_position, plan_bubble
from autoparallel_cp.search.schedule_axis import REPLAYED, plan_ratio, stage_inflight
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec.hybrid_sharding import node_shard_replicas
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.splits import prefix_counts

F = npt.NDArray[np.float64]

MODES = ("none", "selective", "full")
AXES6 = ("tp", "cp", "ep", "mbs", "zero", "dp")  # plan_cost's table positions


@dataclass
class Tables:
    """Factor tables of one search space (see the module docstring)."""

    space: SearchSpace
    dp: tuple[int, ...]
    m: tuple[int, ...]
    kinds: tuple[bool, ...]  # layer kinds present: False dense, True MoE
    # [g][kind] -> array over (tp, cp, ep, sp, mbs, mode)
    act: dict[tuple[int, bool], F] = field(default_factory=dict)
    time: dict[tuple[int, bool], F] = field(default_factory=dict)
    work: dict[tuple[int, bool], F] = field(default_factory=dict)
    # [g][kind] -> array over (tp, cp, ep, sp, mbs) (mode 2 rows)
    ckpt: dict[tuple[int, bool], F] = field(default_factory=dict)
    rec: dict[tuple[int, bool], F] = field(default_factory=dict)
    work_full: dict[tuple[int, bool], F] = field(default_factory=dict)
    # [kind] -> (tp, ep, zero, dp, cp): model-state (+ buffer) bytes of one layer on a GPU
    states: dict[bool, F] = field(default_factory=dict)
    # [g][kind] -> (tp, ep, zero, dp, cp): DP sync / optimizer seconds of one layer's params
    dpsync: dict[tuple[int, bool], F] = field(default_factory=dict)
    opt: dict[tuple[int, bool], F] = field(default_factory=dict)
    # ZeRO-3 gathers [g][kind]: per layer (tp,cp,ep,sp,mbs,mode,dp); one layer (tp,cp,ep,dp)
    z3l: dict[tuple[int, bool], F] = field(default_factory=dict)
    z3f: dict[tuple[int, bool], F] = field(default_factory=dict)
    # gradient work after every micro-batch [g][kind] -> (tp, ep, zero, dp, cp): one layer's
    # seconds per micro-batch (factors.microbatch_grad_factors); edges [g] -> (tp, zero, dp, cp)
    mbl: dict[tuple[int, bool], F] = field(default_factory=dict)
    emb_mb: dict[int, F] = field(default_factory=dict)
    head_mb: dict[int, F] = field(default_factory=dict)
    # edges [g] -> (tp, cp, sp, mbs) ; edge states (tp, zero, dp, cp)
    emb_act: dict[int, F] = field(default_factory=dict)
    emb_time: dict[int, F] = field(default_factory=dict)
    head_act: dict[int, F] = field(default_factory=dict)
    head_work: dict[int, F] = field(default_factory=dict)
    head_time: dict[int, F] = field(default_factory=dict)
    emb_states: F = field(default_factory=lambda: np.zeros(0))
    head_states: F = field(default_factory=lambda: np.zeros(0))
    emb_dpsync: dict[int, F] = field(default_factory=dict)  # (tp, zero, dp, cp)
    head_dpsync: dict[int, F] = field(default_factory=dict)
    emb_opt: dict[int, F] = field(default_factory=dict)
    dps_fixed: dict[int, F] = field(default_factory=dict)  # (tp, zero, dp, cp), per stage
    head_opt: dict[int, F] = field(default_factory=dict)
    z3: F = field(default_factory=lambda: np.zeros(0))  # (tp, ep, zero)
    # DeepSeek-V3 MTP on the last stage (cost/mtp.py, memory.mtp_terms): `mtp` depths, each one
    # layer of kind `mtp_kind` read from the per-layer tables above plus these extras, already
    # times `mtp`: [g] -> (tp, cp, sp, mbs) time / kept bytes; (tp, zero, dp, cp) states and
    # [g] -> (tp, zero, dp, cp) DP sync / optimizer / per-micro-batch gradient seconds of the
    # extras' parameters, and of the embedding copy (`mtpc_*`, pp > 1 only)
    mtp: int = 0
    mtp_kind: bool = False
    mtp_time: dict[int, F] = field(default_factory=dict)
    mtp_act: dict[int, F] = field(default_factory=dict)
    mtp_states: F = field(default_factory=lambda: np.zeros(0))
    mtpc_states: F = field(default_factory=lambda: np.zeros(0))
    mtp_dpsync: dict[int, F] = field(default_factory=dict)
    mtpc_dpsync: dict[int, F] = field(default_factory=dict)
    mtp_opt: dict[int, F] = field(default_factory=dict)
    mtpc_opt: dict[int, F] = field(default_factory=dict)
    mtp_mb: dict[int, F] = field(default_factory=dict)
    mtpc_mb: dict[int, F] = field(default_factory=dict)
    # p2p [g] -> (tp, cp, sp, mbs, vpp, dp) (pp = N/(tp·cp·dp)), used when pp > 1
    p2p: dict[int, F] = field(default_factory=dict)
    capacity: tuple[float, ...] = ()  # per group: charged bytes a stage may reach
    other: float = 0.0
    # exposed DP sync of a stage = max(tail_frac·d, d - bwd_share·t) (steptime.dp_exposure)
    tail_frac: float = fx.DP_TAIL_FRACTION
    bwd_share: float = BACKWARD_SHARE
    #: `family_tables` of each (pp, vpp), built once per tables
    families: dict[tuple[int, int], list[Tables]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    #: one Tables per searched expert-TP size (`SearchSpace.etp_variants`) when the space
    #: searches several, else empty (these tables are then the only ones)
    variants: list[Tables] = field(default_factory=list, init=False, repr=False,
                                   compare=False)
    #: `variants` by their replicas R (`key_variants`), filled on first use
    by_rep: dict[int, list[Tables]] = field(default_factory=dict, init=False, repr=False,
                                            compare=False)

    # ------------------------------------------------------------------ index helpers
    def i(self, axis: str, v: int) -> int:
        dom = {"dp": self.dp, "m": self.m}.get(axis) or getattr(self.space, axis)
        return dom.index(v)

    @cached_property
    def groups(self) -> int:
        return len(self.space.job.cluster.node_groups)

    @cached_property
    def dense_prefix(self) -> int:
        """Dense layers before the MoE layers (placed by spec/splits.py `prefix_counts`)."""
        moe = self.space.job.model.moe
        return moe.first_k_dense_layers if moe is not None else 0

    @property
    def main_kind(self) -> bool:
        return self.space.job.model.moe is not None


def key_variants(t: Tables, key: Any) -> list[Tables]:
    """The tables of each (expert-TP size, offload share, replicas) variant under which `key`
    is a plan (`etp_legal`, `zero_ok`, `host_ok`, a framework row reading R, x): `t` unless the
    space searches several. A key's plans are the union over these (and their families)."""
    if not t.variants:
        return [t]
    sp = t.space
    cands = t.variants
    if len(sp.rep_axis) > 1:  # searched replicas: R = 1 and the key's own R only
        if not t.by_rep:
            for v in t.variants:
                t.by_rep.setdefault(v.space.dp_replicate, []).append(v)
        r = node_shard_replicas(key.tp, key.cp, key.dp, sp.gpus_per_node)
        cands = t.by_rep[1] + (t.by_rep.get(r, []) if r > 1 else [])
    return [v for v in cands
            if v.space.etp_legal(key.tp, key.cp, key.dp, key.ep, key.sp)
            and v.space.zero_ok(key.zero) and key.dp in v.dp and key.m in v.m
            and v.space.host_ok(key.tp, key.ep, key.zero, key.dp, key.cp)
            and ((v.space.dp_replicate == 1 and v.space.optimizer_offload == 0.0)
                 or not v.space.refusals_of_key(key))]


def family_tables(t: Tables, pp: int, vpp: int) -> list[Tables]:
    """The tables over each partition family of (pp, vpp) (`SearchSpace.split_families`: the
    space's own partitions, then each named uneven layout): the same factor tables, since a
    family changes only the layer split and no table depends on it. A key's plans are the
    union of its families' plans: its best is the best over them, and the least of the
    families' lower bounds bounds every plan of the key."""
    if (pp, vpp) not in t.families:
        t.families[pp, vpp] = [t if f is t.space else replace(t, space=f)
                               for f in t.space.split_families(pp, vpp)]
    return t.families[pp, vpp]


def capacity_bytes(total: float) -> float:
    """Largest charged memory (fx.charged_bytes: fragmentation already in the tables' terms)
    that fits a GPU of `total` usable bytes: the total less the CUDA context."""
    return total - fx.CUDA_CONTEXT_BYTES


def build_tables(space: SearchSpace) -> Tables:
    """Tabulate every factor over the space's domains (numpy broadcasting, no plan lists).
    A space searching several expert-TP sizes gets one Tables per size (`variants`, each over
    its one-etp space: the factor functions take etp as a parameter); the returned tables are
    the first size's over the whole space."""
    variants = space.etp_variants()
    dps = space.dp_domain or (1,)
    ms = tuple(sorted({d.num_microbatches for d in space.degrees()})) or (1,)
    if len(variants) > 1:  # every variant's tables over the whole space's dp and m domains
        vs: list[Tables] = []
        by_etp: dict[int | None, Tables] = {}
        rest: dict[int | None, list[Tables]] = {}
        for v in variants:
            base = by_etp.get(v.etp)
            if base is None:
                vt = by_etp[v.etp] = _build_tables(v, dps, ms)
            else:  # R and x change only the state, sync, optimizer tables: share the rest
                vt = replace(base, space=v)
                rest.setdefault(v.etp, []).append(vt)
            vs.append(vt)
        for group in rest.values():  # every R > 1 of one etp at once
            _replica_tables_of(group)
        t = replace(vs[0], space=space)
        t.variants = vs
        return t
    return _build_tables(space, dps, ms)


def with_capacity(t: Tables, space: SearchSpace) -> Tables:
    """`t` for `space`, the same space at another `mem_headroom` (search/capacity.py
    `reuse`): the usable memory (`memory.usable_bytes`) is the only input the headroom
    changes, so every table is `t`'s (shared, never written) and the capacity is
    `space`'s; the variants follow `space.etp_variants()` (the same order: the same axes)."""
    cap = tuple(capacity_bytes(usable_bytes(space.job, g.gpu.memory_bytes))
                for g in space.job.cluster.node_groups)
    out = replace(t, space=space, capacity=cap)
    if t.variants:
        out.variants = [replace(v, space=vs, capacity=cap)
                        for v, vs in zip(t.variants, space.etp_variants(), strict=True)]
    return out


def _build_tables(space: SearchSpace, dps: tuple[int, ...], ms: tuple[int, ...]) -> Tables:
    """`build_tables` of a space with one expert-TP size, over the dp and m domains given."""
    job = space.job
    model = job.model
    kinds: tuple[bool, ...] = (False,) if model.moe is None else (
        (False, True) if model.moe.first_k_dense_layers else (True,))
    t = Tables(space=space, dp=tuple(dps), m=ms, kinds=kinds)
    t.tail_frac, t.bwd_share = dp_exposure(fx.options_for(job, None).dp_overlap)
    tch = fx.transient_charge()  # every transient byte's charge (module docstring)
    tp = np.array(space.tp, float)
    cp = np.array(space.cp, float)
    ep = np.array(space.ep, float)
    sp = np.array([0.0, 1.0])
    mbs = np.array(space.mbs, float)
    zero = np.array(space.zero, float)
    dp = np.array(dps, float)
    vpp = np.array(space.vpp, float)
    ax6 = np.ix_(tp, cp, ep, sp, mbs, np.array([0.0, 1.0, 2.0]))
    for g in range(len(job.cluster.node_groups)):
        for kind in kinds:
            lf = fx.layer_factors(job, g, ax6[0], ax6[1], ax6[2], ax6[3], ax6[4], ax6[5], moe=kind,
                                  etp=space.etp)
            act = tch * np.array(lf.act_bytes, float) * kept_share(space)  # act_offload.py
            tim = np.array(lf.time_s, float)
            wrk = tch * np.array(lf.work_bytes, float)
            # base mode of a `full` plan is none (its non-recomputed layers)
            act[..., 2] = act[..., 0]
            tim[..., 2] = tim[..., 0]
            full_t = np.array(lf.time_s, float)[..., 2] + np.array(lf.recompute_s, float)[..., 2]
            hidden_lb(job, space, g, ax6, kind, lf, tim, full_t)  # EP hidden: model_scored.py
            t.act[g, kind] = act
            t.time[g, kind] = tim
            t.ckpt[g, kind] = tch * np.array(lf.ckpt_bytes, float)[..., 2]
            t.rec[g, kind] = full_t - tim[..., 0]  # a recomputed layer's extra time
            t.work_full[g, kind] = wrk[..., 2].copy()
            wrk[..., 2] = wrk[..., 0]
            t.work[g, kind] = wrk
        ax4 = np.ix_(tp, cp, sp, mbs)
        ef = fx.edge_factors(job, g, ax4[0], ax4[1], ax4[2], ax4[3])
        t.emb_act[g] = np.broadcast_to(tch * np.asarray(ef.emb_act_bytes, float),
                                       (len(tp), len(cp), 2, len(mbs))).copy()
        t.emb_time[g] = np.broadcast_to(ef.emb_time_s, t.emb_act[g].shape).copy()
        t.head_act[g] = np.broadcast_to(tch * np.asarray(ef.head_act_bytes, float),
                                        t.emb_act[g].shape).copy()
        t.head_work[g] = np.broadcast_to(tch * np.asarray(ef.head_work_bytes, float),
                                         t.emb_act[g].shape).copy()
        t.head_time[g] = np.broadcast_to(ef.head_time_s, t.emb_act[g].shape).copy()
        if model.mtp_layers:
            mf = fx.mtp_factors(job, g, ax4[0], ax4[1], ax4[2], ax4[3])
            shape_e = t.emb_act[g].shape
            t.mtp_time[g] = model.mtp_layers * np.broadcast_to(mf.time_s, shape_e).copy()
            t.mtp_act[g] = tch * model.mtp_layers * np.broadcast_to(mf.act_bytes,
                                                                    shape_e).copy()
        ax_p = np.ix_(tp, cp, sp, mbs, vpp, dp)
        # pp = N / (tp·cp·dp) (space.py: dp is derived), so the table keeps its axes
        pp_of = job.num_gpus / (ax_p[0] * ax_p[1] * ax_p[5])
        p2p = fx.p2p_factor(job, g, ax_p[0], ax_p[1], ax_p[2], ax_p[3], pp_of, ax_p[4],
                            ax_p[5])
        t.p2p[g] = np.broadcast_to(
            p2p, (len(tp), len(cp), 2, len(mbs), len(vpp), len(dp))).copy()
    lower_acts(space, t)  # a pp > 1 activation offload's bound (search/act_offload.py)
    if model.mtp_layers:
        t.mtp = model.mtp_layers
        t.mtp_kind = fx.mtp_layer_kind(job)
        if t.mtp_kind != t.main_kind:  # space.py admits no MoE layer frequency > 1
            raise ValueError("the MTP layer's kind is not the search space's main layer kind")
    tp3, ep3, z3_ = np.ix_(tp, ep, zero)
    t.z3 = np.broadcast_to(tch * fx.zero3_buffer_bytes(job, tp3, ep3, z3_, etp=space.etp),
                           (len(tp), len(ep), len(zero))).copy()
    t.capacity = tuple(capacity_bytes(usable_bytes(job, g.gpu.memory_bytes))
                       for g in job.cluster.node_groups)
    t.other = tch * fx.other_bytes(job)
    return _replica_tables(t)


def _replica_tables(t: Tables) -> Tables:
    """The replica-dependent tables of `t`'s space (`_replica_tables_of`), set on `t`."""
    _replica_tables_of([t])
    return t


def _replica_tables_of(ts: list[Tables]) -> None:
    """The replica-dependent tables (`_replica_parts`) of spaces that differ only in R (the
    same etp, domains and layer tables), computed at once with R as a leading axis (the
    factor functions broadcast it: every entry is the float R alone gives) and set on each
    `t` as its slice (contiguous: R leads), in fresh dicts (a variant sharing the other tables
    with its R = 1 sibling never writes into them)."""
    parts, arrs = _replica_parts(ts[0], [v.space.dp_replicate for v in ts],
                                 [v.space.optimizer_offload for v in ts])
    for i, ti in enumerate(ts):
        for n, vals in parts.items():
            setattr(ti, n, {k: v[i] for k, v in vals.items()})
        for n, a in arrs.items():
            setattr(ti, n, a[i])


#: the tables (dict-valued, then array-valued) that read the replicas (`_replica_parts`)
_REP_DICTS = ("z3l", "z3f", "states", "dpsync", "opt", "mbl", "emb_dpsync", "head_dpsync",
              "emb_opt", "head_opt", "emb_mb", "head_mb", "dps_fixed", "mtp_dpsync",
              "mtpc_dpsync", "mtp_opt", "mtpc_opt", "mtp_mb", "mtpc_mb")
_REP_ARRAYS = ("emb_states", "head_states", "mtp_states", "mtpc_states")


def _replica_parts(t: Tables, reps: list[int], offs: list[float] | None = None
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tables that read the replicas R (shard group dp·cp/R) or the host offload share x
    (search/offload_axis.py): ZeRO-3 gathers, model states, DP sync, optimizer and per-micro-
    batch gradient work, of the layers and stage extras, at each (R, x) of `reps`, `offs` (a
    leading axis): dict-valued tables by name, then array-valued ones."""
    space = t.space
    job = space.job
    model = job.model
    rep_a = np.array(reps, float)
    nr = len(reps)

    def rr(k: int) -> npt.NDArray[np.float64]:
        return rep_a.reshape((-1,) + (1,) * k)  # R on a leading axis before k table axes

    offs = offs or [0.0] * nr  # x on the same leading axis (search/offload_axis.py)
    kinds = t.kinds
    tch = fx.transient_charge()
    gch = fx.grad_charge(job.recipe)
    tp = np.array(space.tp, float)
    cp = np.array(space.cp, float)
    ep = np.array(space.ep, float)
    sp = np.array([0.0, 1.0])
    mbs = np.array(space.mbs, float)
    zero = np.array(space.zero, float)
    dp = np.array(t.dp, float)
    out: dict[str, Any] = {n: {} for n in _REP_DICTS}
    for g in range(len(job.cluster.node_groups)):
        # ZeRO-3 per-layer exposed all-gather (used when zero == 3): (tp,cp,ep,sp,mbs,mode,dp)
        ax7 = np.ix_(tp, cp, ep, sp, mbs, np.array([0.0, 1.0, 2.0]), dp)
        for kind in kinds:
            _, _, z3per, _ = fx.dp_sync_factors(job, g, ax7[0], ax7[1], ax7[6], ax7[2], 3,
                                                space.etp, rr(7))
            dl, _ = fx.layer_param_counts(job, kind, ax7[0], ax7[2], space.etp)
            lat_mb, _ = fx.fsdp_call_latency(job, g, ax7[0], ax7[1], ax7[6], 3, rr(7))
            ag = z3per * dl + lat_mb
            base_t = t.time[g, kind][..., None]
            z3l = fx.overlap_exposed(ag, base_t) + fx.zero3_copy_factor(job, g) * dl
            z3l = np.broadcast_to(z3l, (nr,) + base_t.shape[:-1] + (len(dp),))
            out["z3l"][g, kind] = np.ascontiguousarray(z3l)
            out["z3f"][g, kind] = np.broadcast_to(ag, z3l.shape)[:, :, :, :, 0, 0, 0, :].copy()
    # model states per layer: (tp, ep, zero, dp, cp)
    g5 = np.ix_(tp, ep, zero, dp, cp)
    tp5, ep5, z5, dp5, cp5 = g5
    # hybrid sharding: states shard over dp*cp/R (Plan.state_shard, Plan.expert_state_shard)
    shard_d = dp5 * cp5 / rr(5)
    shard_e = fx.expert_dp_size(tp5, cp5, dp5, ep5, space.etp) / rr(5)
    pp5 = job.num_gpus / (tp5 * cp5 * dp5)  # pp is derived (space.py), as for p2p above
    wd, gd, od = fx.state_bytes_per_param(job.recipe, z5, shard_d, pp5)
    we, ge, oe = fx.state_bytes_per_param(job.recipe.for_experts(), z5, shard_e, pp5)
    keep_d, keep_e = (gpu_kept_optimizer_share(r) for r in (job.recipe, job.recipe.for_experts()))
    od, oe = od * gpu_share(offs, 5, keep_d), oe * gpu_share(offs, 5, keep_e)  # GPU's part
    buf = tch * fx.buffer_bytes_per_param(job, z5)
    loc_d = np.where(z5 >= 1, 1.0 / shard_d, 1.0)
    loc_e = np.where(z5 >= 1, 1.0 / np.maximum(np.floor(shard_e), 1.0), 1.0)
    shape5 = (nr, len(tp), len(ep), len(zero), len(dp), len(cp))
    for kind in kinds:
        pd, pe = fx.layer_param_counts(job, kind, tp5, ep5, space.etp)
        out["states"][kind] = np.broadcast_to(
            pd * (wd + gch * gd + od + buf) + pe * (we + gch * ge + oe + buf), shape5).copy()
        for g in range(len(job.cluster.node_groups)):
            sd, se, _z3, _fixed = fx.dp_sync_factors(job, g, tp5, cp5, dp5, ep5, z5, space.etp,
                                                     rr(5))
            opt = opt_seconds(job, g, offs, 5)
            on = (dp5 * cp5 > 1).astype(float)
            # expert gradients reduce over the expert-DP group (steptime.stage_times)
            on_e = np.maximum(on, (shard_e > 1).astype(float))
            _, lat_step = fx.fsdp_call_latency(job, g, tp5, cp5, dp5, z5, rr(5))
            out["dpsync"][g, kind] = np.broadcast_to(
                on * (sd * pd + lat_step) + on_e * (se * pe), shape5).copy()
            out["opt"][g, kind] = np.broadcast_to(opt * (pd * loc_d + pe * loc_e),
                                                  shape5).copy()
            md, me = fx.microbatch_grad_factors(job, g, tp5, cp5, dp5, ep5, z5, space.etp,
                                                rr(5))
            out["mbl"][g, kind] = np.broadcast_to(md * pd + me * pe, shape5).copy()
    ef0 = fx.edge_factors(job, 0, tp, 1, 0, 1)
    emb_p = np.asarray(ef0.emb_params, float).reshape(-1, 1, 1, 1)
    head_p = np.asarray(ef0.head_params, float).reshape(-1, 1, 1, 1)
    tp4, z4, dp4, cp4 = np.ix_(tp, zero, dp, cp)
    pp4 = job.num_gpus / (tp4 * cp4 * dp4)
    w4, g4b, o4 = fx.state_bytes_per_param(job.recipe, z4, dp4 * cp4 / rr(4), pp4)
    o4 = o4 * gpu_share(offs, 4, keep_d)
    per4 = w4 + gch * g4b + o4 + tch * fx.buffer_bytes_per_param(job, z4)
    shape4 = (nr, len(tp), len(zero), len(dp), len(cp))
    # + the ZeRO-3 root unit's gathered edge weights (cost/zero3_edges.py), transient
    arrs: dict[str, Any] = {
        "emb_states": np.broadcast_to(emb_p * per4 + tch * fx.zero3_edge_bytes(emb_p, z4),
                                      shape4).copy(),
        "head_states": np.broadcast_to(head_p * per4 + tch * fx.zero3_edge_bytes(head_p, z4),
                                       shape4).copy()}
    loc4 = np.where(z4 >= 1, 1.0 / (dp4 * cp4 / rr(4)), 1.0)
    # (parameters, dp-sync / optimizer / per-micro-batch tables) of the stage extras
    extras = [(emb_p, out["emb_dpsync"], out["emb_opt"], out["emb_mb"]),
              (head_p, out["head_dpsync"], out["head_opt"], out["head_mb"])]
    if model.mtp_layers:
        mf0 = fx.mtp_factors(job, 0, tp, 1, 0, 1)
        mtp_p = t.mtp * np.asarray(mf0.params, float).reshape(-1, 1, 1, 1)
        copy_p = np.asarray(mf0.copy_params, float).reshape(-1, 1, 1, 1)
        arrs["mtp_states"] = np.broadcast_to(mtp_p * per4, shape4).copy()
        arrs["mtpc_states"] = np.broadcast_to(copy_p * per4, shape4).copy()
        extras += [(mtp_p, out["mtp_dpsync"], out["mtp_opt"], out["mtp_mb"]),
                   (copy_p, out["mtpc_dpsync"], out["mtpc_opt"], out["mtpc_mb"])]
    for g in range(len(job.cluster.node_groups)):
        sd, _, _, fixed = fx.dp_sync_factors(job, g, tp4, cp4, dp4, 1, z4, None, rr(4))
        on4 = (dp4 * cp4 > 1).astype(float)
        sd = sd * on4
        out["dps_fixed"][g] = np.broadcast_to(fixed * on4, shape4).copy()
        opt = opt_seconds(job, g, offs, 4)
        md4, _ = fx.microbatch_grad_factors(job, g, tp4, cp4, dp4, 1, z4, None, rr(4))
        for p_, ds, op, mb in extras:
            ds[g] = np.broadcast_to(p_ * sd, shape4).copy()
            op[g] = np.broadcast_to(p_ * opt * loc4, shape4).copy()
            mb[g] = np.broadcast_to(p_ * md4, shape4).copy()
        # + the tied embedding's grad all-reduce (tied_embedding_sync.py), as steptime.stage_times
        out["head_dpsync"][g] = out["head_dpsync"][g] + np.broadcast_to(
            fx.tied_embedding_sync_s(job, g, tp4, cp4, dp4, pp4, space.schedule), shape4)
        # the embedding's and the LM head's exposed ZeRO-3 collectives (FSDP's root unit)
        for p_, mb in ((emb_p, out["emb_mb"]), (head_p, out["head_mb"])):
            mb[g] = mb[g] + np.broadcast_to(fx.zero3_edge_s(job, g, p_, tp4, cp4, dp4, z4, rr(4)),
                                            shape4)
    return out, arrs


# --------------------------------------------------------------------------------------------
# Exact composition of one plan (floats)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCost:
    """Exact (float) step time and per-stage charged memory of one plan under the tables."""

    step_s: float
    pipeline_s: float
    tail_s: float
    stage_time_s: tuple[float, ...]
    stage_charged: tuple[float, ...]  # StageMemory.charged_bytes (module docstring)
    fits: bool


def stage_groups_of(t: Tables, plan: Plan) -> tuple[int, ...]:
    """Node group of every stage (in file order when the plan does not say)."""
    if plan.stage_groups is not None:
        return plan.stage_groups
    if t.groups == 1:
        return (0,) * plan.pp
    per = plan.dp * plan.tp * plan.cp
    out: list[int] = []
    for gi, g in enumerate(t.space.job.cluster.node_groups):
        out += [gi] * (g.num_gpus // per)
    return tuple(out[: plan.pp])


def plan_cost(t: Tables, plan: Plan) -> PlanCost:
    """The memory.py / steptime.py composition for one plan, in exact floats (with the tables
    of the plan's expert-TP size and replicas when the space searches several)."""
    key = (plan.etp, plan.dp_replicate, plan.optimizer_offload)
    t = next((v for v in t.variants
              if (v.space.etp, v.space.dp_replicate, v.space.optimizer_offload) == key), t)
    sp_ = t.space
    if (plan.dp_replicate, plan.optimizer_offload, plan.activation_offload) != (
            sp_.dp_replicate, sp_.optimizer_offload, act_layers(sp_)):  # one R, x, k
        raise ValueError(f"plan {plan.short()}: not a variant of the tables")
    L = sp_.num_layers
    ls = plan.layers_per_stage(L)
    chunks = plan.chunks_per_stage(L)
    groups = stage_groups_of(t, plan)
    mode = MODES.index(plan.recompute)
    itp, icp, iep, imb, iz, idp = (t.i(a, getattr(plan, a)) for a in AXES6)
    i6 = (itp, icp, iep, plan.sp, imb)
    i6m = (itp, icp, iep, plan.sp, imb, mode)
    i5 = (itp, iep, iz, idp, icp)
    i4 = (itp, iz, idp, icp)
    ie = (itp, icp, plan.sp, imb)
    m = plan.num_microbatches
    kds = prefix_counts(t.dense_prefix, ls)  # the cost model's dense prefix per stage
    z3 = plan.zero >= 3
    times, peaks, dps, opts, hosts = [], [], [], [], True
    for j, (n, g) in enumerate(zip(ls, groups, strict=True)):
        first, last = j == 0, j == head_position(plan.schedule, plan.pp)
        r = plan.recomputed_layers(n)
        if t.main_kind and (kd := kds[j]):
            counts = [(False, kd, min(r, kd)), (True, n - kd, r - min(r, kd))]
        else:
            counts = [(t.main_kind, n, r)]
        f = stage_inflight(plan.schedule, plan.pp, plan.vpp, m, j, tuple(chunks[j]))
        ttime = act = states = dsync = opt = work = z3first = 0.0
        for kind, cnt, rc in counts:
            if cnt == 0:
                continue
            ttime += cnt * t.time[g, kind][i6m] + rc * t.rec[g, kind][i6]
            ttime += cnt * t.mbl[g, kind][i5]
            act += (cnt - rc) * t.act[g, kind][i6m] + rc * t.ckpt[g, kind][i6]
            states += cnt * t.states[kind][i5]
            dsync += cnt * t.dpsync[g, kind][i5]
            opt += cnt * t.opt[g, kind][i5]
            work = max(work, t.work_full[g, kind][i6] if rc > 0 else t.work[g, kind][i6m])
            if z3:
                ttime += cnt * t.z3l[g, kind][(itp, icp, iep, plan.sp, imb, mode, idp)]
                z3first = max(z3first, t.z3f[g, kind][itp, icp, iep, idp])
        ttime += z3first
        dsync += t.dps_fixed[g][i4]
        extra = 0.0
        if first:
            act += t.emb_act[g][ie]
            ttime += t.emb_time[g][ie] + t.emb_mb[g][i4]
            states += t.emb_states[i4]
            dsync += t.emb_dpsync[g][i4]
            opt += t.emb_opt[g][i4]
        if last:
            extra += t.head_act[g][ie]
            work = max(work, t.head_work[g][ie])
            ttime += t.head_time[g][ie] + t.head_mb[g][i4]
            states += t.head_states[i4]
            dsync += t.head_dpsync[g][i4]
            opt += t.head_opt[g][i4]
        if last and t.mtp:
            # mtp x (one layer of mtp_kind, recomputed only under uniform full recompute) + the
            # extras (memory.mtp_terms); activations of one micro-batch, as the head's
            kd_, n_ = t.mtp_kind, t.mtp
            rc = fx.mtp_recomputed(plan.recompute, plan.recompute_layers)
            ttime += n_ * t.time[g, kd_][i6m] + (n_ * t.rec[g, kd_][i6] if rc else 0.0)
            ttime += n_ * t.mbl[g, kd_][i5] + t.mtp_time[g][ie] + t.mtp_mb[g][i4]
            extra += (n_ * t.ckpt[g, kd_][i6] if rc else n_ * t.act[g, kd_][i6m]) \
                + t.mtp_act[g][ie]
            states += n_ * t.states[kd_][i5] + t.mtp_states[i4]
            dsync += n_ * t.dpsync[g, kd_][i5] + t.mtp_dpsync[g][i4]
            opt += n_ * t.opt[g, kd_][i5] + t.mtp_opt[g][i4]
            work = max(work, t.work_full[g, kd_][i6] if rc else t.work[g, kd_][i6m])
            if z3:
                ttime += n_ * t.z3l[g, kd_][(itp, icp, iep, plan.sp, imb, mode, idp)]
            if plan.pp > 1:
                ttime += t.mtpc_mb[g][i4]
                states += t.mtpc_states[i4]
                dsync += t.mtpc_dpsync[g][i4]
                opt += t.mtpc_opt[g][i4]
        if plan.pp > 1:
            ttime += t.p2p[g][(itp, icp, plan.sp, imb, t.i("vpp", plan.vpp), idp)]
        if plan.activation_offload and not model_scored(sp_):  # its copies, host (act_offload.py)
            off, host_ok = stage_terms(sp_, plan.tp, plan.cp, plan.dp, plan.ep, plan.sp,
                                       plan.zero, plan.mbs, m)
            ttime, hosts = ttime + off, host_ok  # (a plan whose hosts overflow does not fit)
        peak = states + f * act + extra + work + t.z3[itp, iep, iz] + t.other
        times.append(ttime)
        peaks.append(peak)
        dps.append(max(t.tail_frac * dsync, dsync - t.bwd_share * ttime))
        opts.append(opt)
    tmax = max(times)
    rho = plan_ratio(sp_, plan)  # 1 but for zb-h1 / zb-h2 (search/schedule_axis.py)
    bub = sum(times) - tmax
    pipeline = m * tmax + (bub if rho == 1.0 else rho * bub) / plan.vpp
    if model_scored(sp_):  # DualPipe, DualPipeV hiding EP: the cost model (model_scored.py)
        return PlanCost(*plan_terms(sp_.job, plan))
    if sp_.schedule in REPLAYED and plan.pp > 1:  # ZBV / DualPipeV: search/replay_axis.py
        pipeline = m * tmax + plan_bubble(sp_, plan, times)
    tail = max(dps) + max(opts)
    fits = hosts and all(p <= t.capacity[g] for p, g in zip(peaks, groups, strict=True))
    return PlanCost(pipeline + tail, pipeline, tail, tuple(times), tuple(peaks), fits)

