"""Exhaustive reference search: every plan of a SearchSpace, scored by the tabulated cost model.

The factor tables are built once (numpy, vectorized over the axis domains). For each legal degree
combination (`SearchSpace.degrees()`) and recompute mode, every (sp, zero, recompute_layers,
layer partition, stage placement) combination is then scored at once with numpy:

1. the distinct stages of those plans, (stage index, node group, layers, recomputed layers), are
   composed over the (sp, zero) grid exactly as `tables.plan_cost` composes one stage (same
   float operations in the same order, so the same bits);
2. the plans gather their stages and apply the pipeline / tail composition (sum of stage times
   in stage order, maxima, fits = every stage peak within its group's capacity);
3. the best fitting plan of every key (tp, pp, cp, dp, ep, vpp, sp, zero, mbs, recompute mode)
   is kept, exact ties going to the smallest `Plan.key()`.

Plans are processed in chunks of partitions so memory stays bounded. It refuses spaces larger
than `DEFAULT_LIMIT` plans with an InputError saying so: restrict the space
(`partition="uniform"`, `partial_recompute=False`, or `--fix`) or use the CP-SAT solver.

The plan axes it visits (partitions, placements, recompute counts) are enumerate_axes.py's.

Kept whole (about 510 lines): the partition and placement generators, the vectorized stage
terms and the per-degree best are one pass over the same arrays; split, each part would need
the others' slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.errors import UserError
from autoparallel_cp.search.act_offload import act_layers, stage_terms
from autoparallel_cp.search.enumerate_axes import (
    partition_array,
    placement_array,
    recompute_valid,
    recompute_values,
)
from autoparallel_cp.search.model_scan import best_of_key
from autoparallel_cp.search.model_scored import model_scored
from autoparallel_cp.search.replay_axis import bubble as replay_bubble
from autoparallel_cp.search.replay_axis import bubble_floor as replay_floor
from autoparallel_cp.search.replay_axis import head_position
from autoparallel_cp.search.schedule_axis import (
    REPLAYED,
    inflight,
    key_ratio,
    plan_schedule,
    stage_inflight,
)
from autoparallel_cp.search.space import Degrees, SearchSpace
from autoparallel_cp.search.tables import (
    MODES,
    Tables,
    build_tables,
    family_tables,
)
from autoparallel_cp.spec.framework_space import KeyView
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, RecomputeMode

F = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

DEFAULT_LIMIT = 3_000_000

# float elements (plans x (sp, zero) columns) scored per numpy pass
_CHUNK_ELEMENTS = 1 << 19


class SpaceTooLarge(UserError):
    """The space has more plans than the enumerator is allowed to visit."""


# --------------------------------------------------------------------------------------------
# Table slices of one degree combination
# --------------------------------------------------------------------------------------------


@dataclass
class _Slices:
    """Factor values of one degree combination: [g, kind, sp, mode] / [kind, zero] / ..."""

    time: F  # (G, K, 2, 3)
    act: F
    work: F
    z3l: F
    rec: F  # (G, K, 2)
    ckpt: F
    work_full: F
    z3f: F  # (G, K)
    states: F  # (K, Z)
    dpsync: F  # (G, K, Z)
    opt: F
    dps_fixed: F  # (G, Z)
    emb_dpsync: F
    emb_opt: F
    head_dpsync: F
    head_opt: F
    emb_states: F  # (Z,)
    head_states: F
    z3: F
    emb_act: F  # (G, 2)
    emb_time: F
    head_act: F
    head_work: F
    head_time: F
    p2p: F
    mbl: F  # (G, K, Z)
    emb_mb: F  # (G, Z)
    head_mb: F
    mtp_time: F  # (G, 2), zeros without MTP (tables.Tables mtp_*)
    mtp_act: F
    mtp_states: F  # (Z,)
    mtpc_states: F
    mtp_dpsync: F  # (G, Z)
    mtpc_dpsync: F
    mtp_opt: F
    mtpc_opt: F
    mtp_mb: F
    mtpc_mb: F


def _slices(t: Tables, d: Degrees) -> _Slices:
    itp, icp, iep, imb = t.i("tp", d.tp), t.i("cp", d.cp), t.i("ep", d.ep), t.i("mbs", d.mbs)
    idp, ivpp = t.i("dp", d.dp), t.i("vpp", d.vpp)
    gs = range(t.groups)

    def gk(tab: dict[tuple[int, bool], F], idx: tuple[Any, ...]) -> F:
        return np.array([[tab[g, k][idx] for k in t.kinds] for g in gs], float)

    def g1(tab: dict[int, F], idx: tuple[Any, ...]) -> F:
        return np.array([tab[g][idx] for g in gs], float)

    a6 = (itp, icp, iep, slice(None), imb)
    i5 = (itp, iep, slice(None), idp, icp)
    i4 = (itp, slice(None), idp, icp)
    ie = (itp, icp, slice(None), imb)
    return _Slices(
        time=gk(t.time, a6), act=gk(t.act, a6), work=gk(t.work, a6),
        z3l=gk(t.z3l, (*a6, slice(None), idp)),
        rec=gk(t.rec, a6), ckpt=gk(t.ckpt, a6), work_full=gk(t.work_full, a6),
        z3f=gk(t.z3f, (itp, icp, iep, idp)),
        states=np.array([t.states[k][i5] for k in t.kinds], float),
        dpsync=gk(t.dpsync, i5), opt=gk(t.opt, i5),
        dps_fixed=g1(t.dps_fixed, i4), emb_dpsync=g1(t.emb_dpsync, i4),
        emb_opt=g1(t.emb_opt, i4), head_dpsync=g1(t.head_dpsync, i4),
        head_opt=g1(t.head_opt, i4),
        emb_states=np.array(t.emb_states[i4], float),
        head_states=np.array(t.head_states[i4], float),
        z3=np.array(t.z3[itp, iep, :], float),
        emb_act=g1(t.emb_act, ie), emb_time=g1(t.emb_time, ie), head_act=g1(t.head_act, ie),
        head_work=g1(t.head_work, ie), head_time=g1(t.head_time, ie),
        p2p=g1(t.p2p, (*ie, ivpp, idp)),
        mbl=gk(t.mbl, i5), emb_mb=g1(t.emb_mb, i4), head_mb=g1(t.head_mb, i4),
        **_mtp_slices(t, ie, i4),
    )


def _mtp_slices(t: Tables, ie: tuple[Any, ...], i4: tuple[Any, ...]) -> dict[str, F]:
    """The MTP extras of one degree combination (zeros when the model has none)."""
    gs = range(t.groups)
    if not t.mtp:
        ze, z4 = np.zeros((t.groups, 2)), np.zeros((t.groups, len(t.space.zero)))
        zz = np.zeros(len(t.space.zero))
        return {"mtp_time": ze, "mtp_act": ze, "mtp_states": zz, "mtpc_states": zz,
                **{k: z4 for k in ("mtp_dpsync", "mtpc_dpsync", "mtp_opt", "mtpc_opt",
                                   "mtp_mb", "mtpc_mb")}}
    out = {k: np.array([getattr(t, k)[g][ie] for g in gs], float)
           for k in ("mtp_time", "mtp_act")}
    out |= {k: np.array([getattr(t, k)[g][i4] for g in gs], float)
            for k in ("mtp_dpsync", "mtpc_dpsync", "mtp_opt", "mtpc_opt", "mtp_mb", "mtpc_mb")}
    out |= {k: np.array(getattr(t, k)[i4], float) for k in ("mtp_states", "mtpc_states")}
    return out


def _later(x: F, cur: F) -> F:
    """Python's `max(cur, x)`: x only when strictly larger."""
    return np.where(x > cur, x, cur)


def _stage_terms(t: Tables, s: _Slices, d: Degrees, mode: int, sps: Ints,
                 j: Ints, g: Ints, n: Ints, rr: Ints, mrc: B, kd: Ints) -> tuple[F, F, F, B]:
    """Stage time, DP-sync tail term, optimizer time and fits of distinct stages (rows) over the
    (sp, zero) grid: the per-stage part of `plan_cost`, operation for operation (`mrc`: the
    last stage's MTP layers are recomputed, `factors.mtp_recomputed`; `kd`: its dense-prefix
    layers, spec/splits.py `prefix_counts`)."""
    zeros = np.array(t.space.zero)
    col = (slice(None), None, None)
    jr, gr, nr, rrr = (np.asarray(a)[col] for a in (j, g, n, rr))  # (U, 1, 1)
    spc = sps[None, :, None]  # (1, S, 1)
    z3 = (zeros >= 3)[None, None, :]  # (1, 1, Z)
    zi = np.arange(len(zeros))[None, None, :]
    first, last = jr == 0, jr == head_position(t.space.schedule, d.pp)
    k_dense = np.asarray(kd)[col]
    kpos = {k: i for i, k in enumerate(t.kinds)}
    main = kpos[t.main_kind]
    split = (k_dense > 0) & bool(t.main_kind)
    rd = np.minimum(rrr, k_dense)
    slots = [
        (np.where(split, kpos.get(False, 0), main), np.where(split, k_dense, nr),
         np.where(split, rd, rrr), np.ones_like(split)),
        (np.full_like(nr, main), nr - k_dense, rrr - rd, split),
    ]
    shp = (len(jr), len(sps), len(zeros))
    ttime = np.zeros(shp)
    act = np.zeros(shp)
    states = np.zeros(shp)
    dsync = np.zeros(shp)
    opt = np.zeros(shp)
    work = np.zeros(shp)
    z3first = np.zeros(shp)
    for kk, cnt, rc, used in slots:
        on = used & (cnt != 0)
        if not on.any():
            continue
        c, r = cnt.astype(float), rc.astype(float)
        ttime = np.where(on, ttime + (c * s.time[gr, kk, spc, mode] + r * s.rec[gr, kk, spc]),
                         ttime)
        ttime = np.where(on, ttime + c * s.mbl[gr, kk, zi], ttime)
        act = np.where(on, act + ((c - r) * s.act[gr, kk, spc, mode] + r * s.ckpt[gr, kk, spc]),
                       act)
        states = np.where(on, states + c * s.states[kk, zi], states)
        dsync = np.where(on, dsync + c * s.dpsync[gr, kk, zi], dsync)
        opt = np.where(on, opt + c * s.opt[gr, kk, zi], opt)
        w = np.where(rc > 0, s.work_full[gr, kk, spc], s.work[gr, kk, spc, mode])
        work = np.where(on, _later(w, work), work)
        on3 = on & z3
        ttime = np.where(on3, ttime + c * s.z3l[gr, kk, spc, mode], ttime)
        z3first = np.where(on3, _later(s.z3f[gr, kk] + 0.0 * zi, z3first), z3first)
    ttime = ttime + z3first
    dsync = dsync + s.dps_fixed[gr, zi]
    act = np.where(first, act + s.emb_act[gr, spc], act)
    ttime = np.where(first, ttime + (s.emb_time[gr, spc] + s.emb_mb[gr, zi]), ttime)
    states = np.where(first, states + s.emb_states[zi], states)
    dsync = np.where(first, dsync + s.emb_dpsync[gr, zi], dsync)
    opt = np.where(first, opt + s.emb_opt[gr, zi], opt)
    extra = np.where(last, s.head_act[gr, spc], 0.0)
    work = np.where(last, _later(s.head_work[gr, spc], work), work)
    ttime = np.where(last, ttime + (s.head_time[gr, spc] + s.head_mb[gr, zi]), ttime)
    states = np.where(last, states + s.head_states[zi], states)
    dsync = np.where(last, dsync + s.head_dpsync[gr, zi], dsync)
    opt = np.where(last, opt + s.head_opt[gr, zi], opt)
    if t.mtp:
        mk, nn = kpos[t.mtp_kind], float(t.mtp)
        rc = np.asarray(mrc)[col]
        lt = nn * s.time[gr, mk, spc, mode] + np.where(rc, nn * s.rec[gr, mk, spc], 0.0)
        ttime = np.where(last, ttime + lt, ttime)
        ttime = np.where(last, ttime + (nn * s.mbl[gr, mk, zi] + s.mtp_time[gr, spc]
                                        + s.mtp_mb[gr, zi]), ttime)
        la = np.where(rc, nn * s.ckpt[gr, mk, spc], nn * s.act[gr, mk, spc, mode])
        extra = np.where(last, extra + (la + s.mtp_act[gr, spc]), extra)
        states = np.where(last, states + (nn * s.states[mk, zi] + s.mtp_states[zi]), states)
        dsync = np.where(last, dsync + (nn * s.dpsync[gr, mk, zi] + s.mtp_dpsync[gr, zi]),
                         dsync)
        opt = np.where(last, opt + (nn * s.opt[gr, mk, zi] + s.mtp_opt[gr, zi]), opt)
        w = np.where(rc, s.work_full[gr, mk, spc], s.work[gr, mk, spc, mode])
        work = np.where(last, _later(w, work), work)
        ttime = np.where(last & z3, ttime + nn * s.z3l[gr, mk, spc, mode], ttime)
        if d.pp > 1:
            ttime = np.where(last, ttime + s.mtpc_mb[gr, zi], ttime)
            states = np.where(last, states + s.mtpc_states[zi], states)
            dsync = np.where(last, dsync + s.mtpc_dpsync[gr, zi], dsync)
            opt = np.where(last, opt + s.mtpc_opt[gr, zi], opt)
    if d.pp > 1:
        ttime = ttime + s.p2p[gr, spc]
    hosts: Any = True
    if act_layers(t.space):  # one stage: its copies and host check (search/act_offload.py)
        ao = np.array([[stage_terms(t.space, d.tp, d.cp, d.dp, d.ep, int(v), z, d.mbs,
                                    d.num_microbatches) for z in zeros] for v in sps])
        ttime, hosts = ttime + ao[None, :, :, 0], ao[None, :, :, 1] > 0.0
    if t.space.fixed_split:
        # a pinned split may hold unequal chunks: the in-flight count of each stage's own
        f = np.array([stage_inflight(t.space.schedule, d.pp, d.vpp, d.num_microbatches,
                                     int(a),
                                     tuple(t.space.chunks_of(d.pp, d.vpp, int(a), int(b))))
                      for a, b in zip(np.asarray(j), np.asarray(n), strict=True)],
                     float)[col]
    else:  # free partitions hold multiples of vpp: equal chunks
        f = inflight(t.space.schedule, d.pp, d.vpp, d.num_microbatches, jr)
    peak = states + f * act + extra + work + s.z3[zi] + t.other
    cap = np.array(t.capacity, float)[gr]
    fits = (peak <= cap) & hosts
    a, b = t.tail_frac * dsync, dsync - t.bwd_share * ttime
    dps = np.where(b > a, b, a)
    return ttime, dps, opt, fits


# --------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------


def _best_of_degrees(t: Tables, d: Degrees, s: _Slices, mode_name: RecomputeMode,
                     sps: Ints, parts: Ints, places: Ints, cuts: F | None = None
                     ) -> tuple[F, Ints, Ints, Ints, list[int | None]]:
    """Best fitting cost per (sp, zero) column and its (r option, partition, placement);
    with `cuts`, a V column's best only where it is <= its cut (`_replayed`)."""
    space = t.space
    mode = MODES.index(mode_name)
    full = mode_name == "full"
    pp, L = d.pp, space.num_layers
    P, Q = len(parts), len(places)
    ncol = len(sps) * len(space.zero)
    biggest = parts.max(axis=1) if P else np.zeros(0, np.int64)
    ropts = recompute_values(space, mode_name, int(biggest.max()) if P else 0, d.vpp)
    # rho per (sp, zero) column: it depends on sp (the split) and m (schedule_axis.py)
    rhos = [key_ratio(space, d.pp, d.tp, d.cp, d.ep, d.mbs, mode, int(q), d.num_microbatches)
            for q in sps]
    rho = np.repeat(np.array(rhos, float), len(space.zero))
    ones = bool(np.all(rho == 1.0))
    R = len(ropts)
    rvals = np.array([-1 if r is None else r for r in ropts], np.int64)
    best = np.full(ncol, np.inf)
    best_rank = np.full(ncol, -1, np.int64)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, R * Q * ncol))
    jj = np.arange(pp)
    for p0 in range(0, P, chunk):
        pc = parts[p0:p0 + chunk]
        valid = np.stack([recompute_valid(space, mode_name, r, biggest[p0:p0 + chunk])
                          for r in ropts])
        ri, pi = np.nonzero(valid)  # r-major: Plan.key() order within the chunk
        if len(ri) == 0:
            continue
        ri = np.repeat(ri, Q)
        pi = np.repeat(pi, Q)
        qi = np.tile(np.arange(Q), len(ri) // Q)
        ls = pc[pi]  # (K, pp)
        gs = places[qi]
        if full:
            rv = rvals[ri][:, None]
            rr = np.where(rv < 0, ls, np.minimum(rv, ls))
        else:
            rr = np.zeros_like(ls)
        # the last stage's MTP layers are recomputed only with recompute_layers None
        mflag = np.zeros_like(ls)
        if full and t.mtp:
            mflag = ((rvals[ri][:, None] < 0) & (jj[None, :] == head_position(
                space.schedule, pp))).astype(np.int64)
        # each stage's dense-prefix layers (the cost model's: the first stage holding
        # layers, search/empty_rank.py)
        K1 = t.dense_prefix + 1
        kd = np.clip(t.dense_prefix - (np.cumsum(ls, axis=1) - ls), 0, ls)
        code = ((((jj[None, :] * t.groups + gs) * (L + 1) + ls) * (L + 1) + rr) * K1
                + kd) * 2 + mflag
        uniq, inv = np.unique(code, return_inverse=True)
        inv = inv.reshape(code.shape)
        umr = (uniq % 2).astype(bool)
        ukd = (uniq // 2) % K1
        base = uniq // (2 * K1)
        urr = base % (L + 1)
        un = (base // (L + 1)) % (L + 1)
        ug = (base // (L + 1) ** 2) % t.groups
        uj = base // ((L + 1) ** 2 * t.groups)
        tt3, dps3, opt3, fits3 = _stage_terms(t, s, d, mode, sps, uj, ug, un, urr, umr, ukd)
        shape3 = (len(uniq), len(sps), len(space.zero))
        tt = tt3.reshape(len(uniq), ncol)
        dps = dps3.reshape(len(uniq), ncol)
        fits = fits3.reshape(len(uniq), ncol)
        opt = np.broadcast_to(opt3, shape3).reshape(len(uniq), ncol)
        tsum = tt[inv[:, 0]]
        tmax, dmax, omax, ok = tsum, dps[inv[:, 0]], opt[inv[:, 0]], fits[inv[:, 0]]
        for j in range(1, pp):
            u = inv[:, j]
            x = tt[u]
            tsum = tsum + x
            tmax = _later(x, tmax)
            dmax = _later(dps[u], dmax)
            omax = _later(opt[u], omax)
            ok = ok & fits[u]
        bub = tsum - tmax  # x rho for zb-h1 / zb-h2 (tables.plan_cost, schedule_axis.py)
        pipeline = d.num_microbatches * tmax + (bub if ones else rho * bub) / d.vpp
        cost = np.where(ok, pipeline + (dmax + omax), np.inf)
        if space.schedule in REPLAYED and pp > 1:  # search/replay_axis.py
            cost = _replayed(t, d, mode_name, sps, ropts, ri, tt[inv],
                             d.num_microbatches * tmax, np.where(ok, dmax + omax, np.inf), best,
                             np.full(ncol, np.inf) if cuts is None else cuts)
        k = np.argmin(cost, axis=0)
        c = cost[k, np.arange(ncol)]
        rank = (ri[k] * P + (p0 + pi[k])) * Q + qi[k]
        better = (c < best) | ((c == best) & (c < np.inf) & (rank < best_rank))
        best = np.where(better, c, best)
        best_rank = np.where(better, rank, best_rank)
    return best, best_rank // (P * Q), (best_rank // Q) % P, best_rank % Q, ropts


def _replayed(t: Tables, d: Degrees, mode_name: RecomputeMode, sps: Ints,
              ropts: list[int | None], ri: Ints, times: F, mt: F, tail: F, best: F,
              cuts: F) -> F:
    """Exact costs of a ZBV / DualPipeV chunk (rows x (sp, zero) columns): (m·T `mt` + the
    replayed bubble of each row's stage times `times` (rows, pp, columns)) + `tail` (inf
    where nothing fits), `tables.plan_cost`'s operations in its order (search/replay_axis.py),
    for every row that can be its column's best <= the column's cut `cuts`. A row whose lower
    bound is above the column's cut (the least of `cuts`, the best so far `best` and a row's
    exact cost found here) cannot be that: it keeps the bound (above the cut) without a
    replay. The bounds, each <= the row's exact cost in floats: lb = m·T + tail (the bubble
    is >= 0; rows in lb order, so the rest of the column too), then the same sum with
    `replay_axis.bubble_floor` (one path of the replay, cost/replay_bound.py). A row whose
    exact cost is <= the cut is always replayed (ties too), so a column whose best is <= its
    cut gets the same best and first row as with no cut; one above it, some value > it."""
    lb = mt + tail
    out = lb.copy()
    nz = len(t.space.zero)
    for col in range(lb.shape[1]):
        cut = min(float(best[col]), float(cuts[col]))
        for k in np.argsort(lb[:, col], kind="stable"):
            if not lb[k, col] <= cut:  # inf (nothing fits) or above the best: the rest too
                break
            args = (t.space, d.pp, d.tp, d.cp, d.ep, int(sps[col // nz]), d.mbs, mode_name,
                    ropts[int(ri[k])], d.num_microbatches, times[k, :, col].tolist())
            floor = (float(mt[k, col]) + replay_floor(*args)) + float(tail[k, col])
            if floor > cut:
                out[k, col] = floor
                continue
            out[k, col] = (float(mt[k, col]) + replay_bubble(*args)) + float(tail[k, col])
            cut = min(cut, float(out[k, col]))
    return out


def best_of_pinned_split(t: Tables, key: Any, cutoff_s: float | None = None
                         ) -> tuple[float, Plan] | None:
    """The exact best plan of one key of a space whose split is pinned (`--fix` or a named
    layout, `SearchSpace.split_families`; or a free family with one split at the key's pp,
    cpsat_partition.py `_determined`): the enumerator's vectorized composition over the
    key's recompute counts and stage placements (one partition), ties by `Plan.key()` order
    as `enumerate_best`. None when nothing fits. `cpsat_partition` scores such keys here: a
    pinned split leaves at most the recompute count and the placement to choose, a scan.
    With `cutoff_s`, exact only where the best is <= it (above: None or a cost > it; a V key
    replays no plan shown to be above it, `_replayed`)."""
    space = t.space
    d = Degrees(key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    parts, part_objs = partition_array(space, d.pp, d.vpp)
    places, place_objs = placement_array(space, t, d)
    if len(parts) == 0 or len(places) == 0:
        return None
    mode_name: RecomputeMode = RECOMPUTE_MODES[key.mode]
    col = space.zero.index(key.zero)  # the columns are (sp, zero) with the one sp
    sps = np.array([key.sp], np.int64)
    cuts = np.full(len(space.zero), -np.inf)  # the key's own column only
    cuts[col] = math.inf if cutoff_s is None else cutoff_s
    cost, ri, pi, qi, ropts = _best_of_degrees(t, d, _slices(t, d), mode_name, sps, parts,
                                               places, cuts)
    if not np.isfinite(cost[col]):
        return None
    cl = space.fixed.get("chunk_layers")
    row = int(pi[col])  # a free family's split is its row (`partition_array`'s objects: None)
    free = not (space.fixed_split or space.partition == "uniform")
    plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep, sp=key.sp,
                zero=key.zero, mbs=d.mbs, num_microbatches=d.num_microbatches,
                recompute=mode_name, recompute_layers=ropts[int(ri[col])],
                stage_layers=(tuple(int(x) for x in parts[row]) if free else part_objs[row]),
                stage_groups=place_objs[int(qi[col])],
                chunk_layers=None if cl is None else tuple(cl), etp=space.etp,
                schedule=plan_schedule(space.schedule), dp_replicate=space.dp_replicate,
                optimizer_offload=space.optimizer_offload,
                activation_offload=act_layers(space))
    return float(cost[col]), plan


def enumerate_best(space: SearchSpace, limit: int | None = None,
                   refused: dict[tuple[str, str], int] | None = None
                   ) -> tuple[list[tuple[float, Plan]], int]:
    """Best plan per key (the key of solve.py), ranked by exact step time; and the space size.

    With a framework restriction a key it refuses is left out (the rows read the key only, so
    its best plan stands for all of them), the refusing rows counted in `refused`, and a pinned
    split's plan that breaks a split row too, as `solve.best_for_key` does."""
    size = space.size()
    lim = DEFAULT_LIMIT if limit is None else limit
    if size > lim:
        raise SpaceTooLarge(
            f"enumerate refuses a space of {size:,} plans (limit {lim:,}); use `solve`, "
            "or narrow the space (--fix, uniform partitions, no partial recompute)"
        )
    best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]] = {}
    part_cache: dict[tuple[Any, ...], tuple[Ints, list[tuple[int, ...] | None]]] = {}
    # every schedule sub-space (SearchSpace.schedule_variants: a key keeps its best over
    # them), every expert-TP size searched (one space and tables each), every degree choice
    for si, sv in enumerate(space.schedule_variants()):
        base = build_tables(sv)
        for vi, tabs in enumerate(base.variants or [base]):
            _best_of_space(tabs, (si, vi), best, part_cache)
    out = list(best.values()) if space.restriction is None else _runnable(space, best, refused)
    out.sort(key=lambda x: (x[0], x[1]))
    return [(c, p) for c, _, p in out], size


def _runnable(space: SearchSpace,
              best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]],
              refused: dict[tuple[str, str], int] | None
              ) -> list[tuple[float, tuple[Any, ...], Plan]]:
    """The keys' best plans the space's frameworks run (solve.py `_runnable` and
    `best_for_key`): a key a row refuses is dropped and the row counted in `refused`."""
    assert space.restriction is not None
    out = []
    for (d, mode_name, sp_, zero), cand in best.items():
        why = space.refusals_of_key(KeyView(d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, sp_, zero,
                                            d.mbs, d.num_microbatches, MODES.index(mode_name)))
        for row in why:
            if refused is not None:
                refused[row] = refused.get(row, 0) + 1
        if not why and not space.restriction.split_refusals(cand[2]):
            out.append(cand)
    return out


def _best_by_model(ft: Tables, d: Degrees, sps: Ints,
                   best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]]) -> None:
    """`_best_of_space` for one family of a model-scored space: every (mode, sp, zero) key
    of the degrees scored by the cost model over the family's plans (`best_of_key`)."""
    space = ft.space
    for mode_name in space.recompute:
        for sp_ in sps:
            for zero in space.zero:
                if not space.zero_ok(zero) or not space.host_ok(d.tp, d.ep, zero, d.dp, d.cp):
                    continue
                kv = KeyView(d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, int(sp_), zero, d.mbs,
                             d.num_microbatches, MODES.index(mode_name))
                if (space.dp_replicate > 1 or space.optimizer_offload > 0.0) \
                        and space.refusals_of_key(kv):
                    continue  # not a plan of this variant (tables.key_variants)
                got = best_of_key(ft, kv)
                if got is None:
                    continue
                r = space.restriction
                if r is not None and r.split_refusals(got[1]):
                    continue  # the framework does not run this family's best (as solve)
                k = (d, mode_name, int(sp_), zero)
                cand = (got[0], got[1].key(), got[1])
                if k not in best or cand[:2] < best[k][:2]:
                    best[k] = cand


def _best_of_space(tabs: Tables, vi: tuple[int, int],
                   best: dict[tuple[Any, ...], tuple[float, tuple[Any, ...], Plan]],
                   part_cache: dict[tuple[Any, ...], tuple[Ints, list[tuple[int, ...] | None]]]
                   ) -> None:
    """`enumerate_best`'s scan over one expert-TP size's space (`tabs.space`): the best plan
    of every key into `best`, kept when better (cost, then `Plan.key()`) than one there."""
    space = tabs.space
    for d in space.degrees():
        sps = np.array([v for v in space.sp if space.etp_legal(d.tp, d.cp, d.dp, d.ep, v)],
                       np.int64)
        if len(sps) == 0 or len(space.zero) == 0:
            continue
        # every partition family of (pp, vpp): the space's own partitions, then each named
        # uneven layout (`SearchSpace.split_families`); a key keeps its best over them
        for fi, ft in enumerate(family_tables(tabs, d.pp, d.vpp)):
            fs = ft.space
            if (vi, d.pp, d.vpp, fi) not in part_cache:
                part_cache[vi, d.pp, d.vpp, fi] = partition_array(fs, d.pp, d.vpp)
            parts, part_objs = part_cache[vi, d.pp, d.vpp, fi]
            places, place_objs = placement_array(fs, ft, d)
            if len(parts) == 0 or len(places) == 0:
                continue
            if model_scored(fs):  # DualPipe, DualPipeV hiding EP: search/model_scored.py
                _best_by_model(ft, d, sps, best)
                continue
            sl = _slices(ft, d)
            free_parts = not fs.fixed_split and fs.partition != "uniform"
            cl = fs.fixed.get("chunk_layers")
            for mode_name in space.recompute:
                cost, ri, pi, qi, ropts = _best_of_degrees(ft, d, sl, mode_name, sps, parts,
                                                           places)
                for col in np.nonzero(np.isfinite(cost))[0]:
                    sp_ = int(sps[col // len(space.zero)])
                    zero = space.zero[col % len(space.zero)]
                    if not space.zero_ok(zero) or not space.host_ok(
                            d.tp, d.ep, zero, d.dp, d.cp) or (
                            (space.dp_replicate > 1 or space.optimizer_offload > 0.0) and (
                            space.refusals_of_key(KeyView(
                                d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, sp_, zero, d.mbs,
                                d.num_microbatches, MODES.index(mode_name))))):
                        continue  # not a plan of this variant (tables.key_variants)
                    p = int(pi[col])
                    part = tuple(int(x) for x in parts[p]) if free_parts else part_objs[p]
                    plan = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep,
                                sp=sp_, zero=zero, mbs=d.mbs,
                                num_microbatches=d.num_microbatches,
                                recompute=mode_name, recompute_layers=ropts[int(ri[col])],
                                stage_layers=part, stage_groups=place_objs[int(qi[col])],
                                chunk_layers=None if cl is None else tuple(cl),
                                etp=space.etp, schedule=plan_schedule(space.schedule),
                                dp_replicate=space.dp_replicate,
                                optimizer_offload=space.optimizer_offload,
                                activation_offload=act_layers(space))
                    r = fs.restriction
                    if r is not None and r.split_refusals(plan):
                        continue  # the framework does not run this family's best (as solve)
                    k = (d, mode_name, sp_, zero)
                    cand = (float(cost[col]), plan.key(), plan)
                    if k not in best or cand[:2] < best[k][:2]:
                        best[k] = cand

