"""Per-key partition model: CP-SAT over one key's layer counts, recomputed layers and placement.

With every key axis pinned (tp, cp, pp, dp, ep, vpp, sp, zero, mbs, m, recompute mode) each
factor of the design.md composition is a constant read from `tables.Tables`, so the partition
problem is an integer *linear* program (no element constraints, no products of variables):

- per stage j (front to back) and node group g: MoE/main-kind layers `nm_jg`, of them
  recomputed `rm_jg`, recomputed dense-prefix layers `rd_jg`, selector `y_jg`
  (exactly one group per stage, `G_g * pp / N` stages per group, fixed for the key);
- `l_j = sum_g (nm_jg + K y_jg hold_j)`, a multiple of vpp, >= vpp but a V's empty rank 0
  (empty_rank.py: hold_j, the prefix's stage, cpsat_prefix.py; a `--fix`ed split: its own
  counts, uneven chunks, each `stage_inflight`);
  `r_j = min(r, l_j)` with the global Megatron `recompute_layers` r;
- `t_j`, `mem_j`, `dsync_j`, `opt_j` linear in those counts with the key's coefficients
  (tables.plan_cost is the reference composition; the working set is a max over booleans);
- objective (times vpp, so exact in integers): `vpp*m*T + (S - T) + vpp*(E + O)` with the
  epigraphs `T >= t_j`, `E >= DP_TAIL_FRACTION*dsync_j`, `E >= dsync_j - 2/3 t_j^up`,
  `O >= opt_j` (design.md: pipeline `m*T + (S - T)/vpp`, tail `max exposed + max opt`);
  under ZBV / DualPipeV (j a rank) the pipeline term is the replay's longest-path cuts
  instead (search/cpsat_replay.py, which solves that family exactly).

Every time coefficient is floored to the unit `tu` (`t_j^up` over-estimates by the count of
floored terms), every memory coefficient and the capacity to 1 KiB: the objective is a lower
bound of the exact step of the same partition, off by at most `error_bound_s`, and the feasible
set holds every partition that fits exactly (the few that fit only by rounding are cut off by
the caller's exact re-check). Model size: O(pp * groups) variables. Kept whole (about 600
lines): one CP-SAT model, its read-back and its solve portfolio; the proof that the objective
is a lower bound spans the whole build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.cost.schedules import sim_microbatches
from autoparallel_cp.search import cpsat_prefix
from autoparallel_cp.search.act_offload import act_layers, free_at, scored, stage_terms
from autoparallel_cp.search.act_offload_free import solve_free_offload
from autoparallel_cp.search.cpsat_portfolio import solve_portfolio
from autoparallel_cp.search.cpsat_replay import replay_pipeline, solve_free
from autoparallel_cp.search.dualpipe_splits import solve_free_dualpipe
from autoparallel_cp.search.key_bounds import KeyCoefs, family_bounds, key_coefs
from autoparallel_cp.search.limits import MODEL_PLAN_DTIME, Budget
from autoparallel_cp.search.mtp_coefs import MtpCoefs, mtp_coefs
from autoparallel_cp.search.replay_axis import (
    dualpipe_free,
    free_searched,
    head_position,
    scored_free,
)
from autoparallel_cp.search.schedule_axis import (
    REPLAYED,
    SCANNED,
    inflight,
    key_ratio,
    key_split,
    plan_schedule,
    stage_inflight,
)
from autoparallel_cp.search.tables import Tables, family_tables, key_variants
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, canonical
from autoparallel_cp.spec.schedules import Schedule

#: Fixed-point scale of the DP-tail fractions (DP_TAIL_FRACTION, BACKWARD_SHARE).
FRAC_SCALE = 1 << 20
#: Fixed-point scale of a zero-bubble schedule's bubble ratio (search/schedule_axis.py)
RHO_SCALE = 1 << 16


@dataclass
class PartitionModel:
    """A built per-key model and handles to read the partition back."""

    model: cp_model.CpModel
    layers: list[Any]  # l_j, front to back (expressions)
    r: cp_model.IntVar
    y: list[list[Any]] | None  # y[j][g] on a heterogeneous cluster
    objective: cp_model.IntVar
    scale_s: float  # seconds per objective unit (tu / vpp)
    error_bound_s: float
    key: Any
    chunk_layers: tuple[int, ...] | None = None  # the pinned layout, carried to the plan
    etp: int | None = None  # the space's expert-TP size (fixed per space, not a key axis)
    schedule: Schedule | None = None  # the plans' schedule field (schedule_axis.plan_schedule)
    dp_replicate: int = 1  # the space's hybrid-sharding replicas (fixed per space)
    optimizer_offload: float = 0.0  # the space's host offload share (fixed per space)
    activation_offload: int = 0  # the space's offloaded layers per stage (act_offload.py)
    replay: Any = None  # a V key's span cuts (cpsat_replay.ReplayCuts)

    def read_plan(self, solver: cp_model.CpSolver, uniform: bool) -> Plan:
        """The plan of the current solution."""
        k = self.key
        ls = tuple(int(solver.value(x)) for x in self.layers)
        mode = RECOMPUTE_MODES[k.mode]
        r = int(solver.value(self.r))
        rl = r if (mode == "full" and r < max(ls)) else None
        sg: tuple[int, ...] | None = None
        if self.y is not None:
            sg = tuple(next(g for g, b in enumerate(row) if solver.value(b)) for row in self.y)
        return Plan(dp=k.dp, tp=k.tp, pp=k.pp, vpp=k.vpp, cp=k.cp, ep=k.ep, sp=k.sp,
                    zero=k.zero, mbs=k.mbs, num_microbatches=k.m, recompute=mode,
                    recompute_layers=rl, stage_layers=None if uniform else ls,
                    stage_groups=sg, chunk_layers=self.chunk_layers, etp=self.etp,
                    schedule=self.schedule,
                    dp_replicate=self.dp_replicate, optimizer_offload=self.optimizer_offload,
                    activation_offload=self.activation_offload)

    def forbid(self, solver: cp_model.CpSolver) -> None:
        """No-good on the current (layer counts, r, groups)."""
        m = self.model
        alts = []
        vals: list[tuple[Any, int]] = [(x, int(solver.value(x))) for x in self.layers]
        vals.append((self.r, int(solver.value(self.r))))
        for var, v in vals:
            b = m.new_bool_var("")
            m.add(var != v).only_enforce_if(b)
            alts.append(b)
        if self.y is not None:
            for row in self.y:
                for b in row:
                    if solver.value(b):
                        alts.append(b.negated())
        m.add_bool_or(alts)


def _mtp_time(mc: MtpCoefs | None) -> float:
    """The largest MTP time of the last stage (0 without MTP)."""
    return max(mc.time) + max(mc.rec) if mc is not None else 0.0


def _time_unit(c: KeyCoefs, L: int, m: int, mc: MtpCoefs | None = None,
               off_s: float = 0.0) -> float:
    """1e-7 s, coarsened until vpp*m*(a stage's largest time) stays far below 2^53."""
    big = (max(c.tau) + max(c.rho) + max(c.z3l) + max(c.tau_d) + max(c.rho_d)) * (L + 1) * 2 \
        + max(c.emb_time) + max(c.head_time) + max(c.p2p) + max(c.z3f) + max(c.z3f_d) + 1.0 \
        + _mtp_time(mc) + off_s
    tu = 1e-7
    while 8 * m * big / tu > 2**50:
        tu *= 2
    return tu


def build_partition(t: Tables, key: Any, mem_unit: float = 1.0) -> PartitionModel | None:
    """The per-key linear model (module docstring); None when the key cannot be placed."""
    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    pp, vpp, m = key.pp, key.vpp, key.m
    K = t.dense_prefix if t.main_kind else 0
    c = key_coefs(t, key)
    mc = mtp_coefs(t, key)
    G = list(range(t.groups))
    hetero = len(G) > 1
    counts = []
    for grp in job.cluster.node_groups:
        if (grp.num_gpus * pp) % N:
            return None
        counts.append(grp.num_gpus * pp // N)
    k_off = act_layers(s)  # a one-stage space's offloaded layers (search/act_offload.py)
    off_s, host_ok = stage_terms(s, key.tp, key.cp, key.dp, key.ep, key.sp, key.zero,
                                 key.mbs, m) if k_off else (0.0, True)
    if not host_ok:
        return None  # the key's one plan overflows its hosts: no plan
    nc = 15 if k_off else 14  # floored constants of a stage time (one more: the copies)
    tu = _time_unit(c, L, m, mc, off_s)
    mu = mem_unit
    full = RECOMPUTE_MODES[key.mode] == "full"
    z3 = key.zero >= 3

    def ti(x: float) -> int:
        return int(math.floor(x / tu))

    def mi(x: float) -> int:
        return int(math.floor(x / mu))

    model = cp_model.CpModel()
    # ------------------------------------------------------------------ group selectors
    y: list[list[Any]]
    if hetero:
        y = [[model.new_bool_var(f"y{j}_{g}") for g in G] for j in range(pp)]
        for j in range(pp):
            model.add_exactly_one(y[j])
        for g in G:
            model.add(sum(y[j][g] for j in range(pp)) == counts[g])
        if "stage_groups" in s.fixed:
            for j, gg in enumerate(s.fixed["stage_groups"]):
                model.add(y[j][gg] == 1)
    else:
        y = [[1] for _ in range(pp)]
    # ------------------------------------------------------------------ counts
    r = model.new_int_var(0, L, "r")
    if not full:
        model.add(r == 0)
    elif "recompute_layers" in s.fixed:
        # a pinned count, 0 included (Plan allows it; the enumerator scores it too)
        model.add(r == int(s.fixed["recompute_layers"]))
    else:
        model.add(r >= 1)
        if not s.partial_recompute:
            model.add(r == L)
        if (step := s.recompute_step(vpp)) > 1:  # a framework's rule (space.recompute_step):
            # multiples of step, or L ("all layers", the enumerator's None)
            model.add_linear_expression_in_domain(r, cp_model.Domain.from_values(
                sorted({*range(step, L + 1, step), L})))
    layers: list[Any] = []
    nm_t: list[Any] = []
    rm_t: list[Any] = []
    rd_t: list[Any] = []
    nm: list[list[Any]] = []
    rm: list[list[Any]] = []
    rd: list[list[Any]] = []
    fixed_sl = s.fixed_stage_layers(pp, vpp)
    l_lo0 = int(fixed_sl[0]) if fixed_sl is not None else s.first_stage_min_units(vpp)
    hp_ = cpsat_prefix.holders(model, K, pp, fixed_sl is None and l_lo0 == 0, fixed_sl)
    for j in range(pp):
        first = j == 0
        kd = hp_.kds[j]
        if fixed_sl is not None:  # a pinned split (any Plan accepts, uneven chunks included)
            l_j, u = model.new_int_var(int(fixed_sl[j]), int(fixed_sl[j]), f"l{j}"), None
        else:
            l_j = model.new_int_var(0, L, f"l{j}")
            u = model.new_int_var(int(not first or l_lo0 > 0), L, f"u{j}")  # empty_rank.py
            model.add(l_j == vpp * u)
        layers.append(l_j)
        rk = model.new_int_var(0, L, f"rk{j}")
        model.add_min_equality(rk, [r, l_j])
        nmj = model.new_int_var(0, L, f"nm{j}")
        model.add(nmj == l_j - kd * hp_.hold[j])
        rdj = model.new_int_var(0, kd, f"rd{j}")
        cpsat_prefix.stage_counts(model, hp_, j, u, l_j, rk, rdj)
        rmj = model.new_int_var(0, L, f"rm{j}")
        model.add(rmj == rk - rdj)
        nm_t.append(nmj)
        rm_t.append(rmj)
        rd_t.append(rdj)
        if hetero:
            a, b, d = ([model.new_int_var(0, ub, f"{nmn}{j}_{g}") for g in G]
                       for nmn, ub in (("nm", L), ("rm", L), ("rd", kd)))
            for g in G:
                model.add(a[g] <= L * y[j][g])
                model.add(b[g] <= L * y[j][g])
                model.add(d[g] <= kd * y[j][g])
            model.add(sum(a) == nmj)
            model.add(sum(b) == rmj)
            model.add(sum(d) == rdj)
            nm.append(a)
            rm.append(b)
            rd.append(d)
        else:
            nm.append([nmj])
            rm.append([rmj])
            rd.append([rdj])
    model.add(sum(layers) == L)
    # MTP layers are recomputed iff the plan's recompute_layers is None (factors.mtp_recomputed),
    # which `read_plan` writes exactly when r >= every l_j: hf <=> r >= max_j l_j
    hf = model.new_bool_var("hf")
    if not (full and mc is not None):
        model.add(hf == 0)
    else:
        short = []
        for j, l_j in enumerate(layers):
            model.add(r >= l_j).only_enforce_if(hf)
            sb = model.new_bool_var(f"short{j}")
            model.add(r <= l_j - 1).only_enforce_if(sb)
            short.append(sb)
        model.add_bool_or(short).only_enforce_if(hf.negated())
    if s.partition == "uniform":
        for l_j in layers:
            model.add(l_j == L // pp)
    if fixed_sl is None and not hetero and s.schedule not in REPLAYED:  # (a V's ranks differ)
        # middle stages are interchangeable but for their in-flight count (nonincreasing in j):
        # moving the larger count later keeps every time and never raises a memory peak
        for j in range(1, pp - 2):
            model.add(layers[j] <= layers[j + 1])
    # ------------------------------------------------------------------ per-stage costs
    if fixed_sl is not None:  # the pinned stages' own chunks (tables.plan_cost's f_j)
        f = [stage_inflight(s.schedule, pp, vpp, m, j, s.chunks_of(pp, vpp, j, int(fixed_sl[j])))
             for j in range(pp)]
    else:  # multiples of vpp: equal chunks
        f = [float(inflight(s.schedule, pp, vpp, m, j)) for j in range(pp)]
    times: list[Any] = []
    E_cons: list[tuple[Any, Any, Any]] = []
    opts: list[Any] = []
    BT = ti(max(c.tau) * 4 * (L + 2) + max(c.rho) * (L + 2) + max(c.z3l) * (L + 2)
            + max(c.tau_d) * 4 * (K + 2) + max(c.emb_time) + max(c.head_time) + max(c.p2p)
            + max(c.z3f) + max(c.z3f_d) + _mtp_time(mc) + off_s) + 64
    dmax = (max(c.dsync) * L + max(c.dsync_d) * K + max(c.emb_dps) + max(c.head_dps)
            + max(c.dps_fixed) + (max(mc.dps) if mc is not None else 0.0))
    omax = max(c.opt) * L + max(c.opt_d) * K + max(c.emb_opt) + max(c.head_opt) \
        + (max(mc.opt) if mc is not None else 0.0)
    BD = ti(max(dmax, omax)) + 64
    for j in range(pp):
        first, last = j == 0, j == head_position(s.schedule, pp)
        kd = hp_.kds[j]
        yj = y[j]
        zd = cpsat_prefix.on_groups(model, hp_, j, yj, hetero)  # the prefix on group g
        # holds main-kind layers? (not: the dense prefix only, or a V's empty rank 0)
        hn: Any = 1
        if kd or (first and l_lo0 == 0):
            hn = model.new_bool_var(f"hn{j}")
            model.add(nm_t[j] <= L * hn)
            model.add(nm_t[j] >= hn)
        t_expr: Any = 0
        act_expr: Any = 0
        mem_expr: Any = 0
        d_expr: Any = 0
        o_expr: Any = 0
        # MTP (last stage): hg[g] = hf and the stage on group g
        hg: list[Any] = []
        if last and mc is not None:
            for g in G:
                if hetero:
                    v = model.new_bool_var(f"hf{g}")
                    model.add_implication(v, hf)
                    model.add_implication(v, yj[g])
                    model.add_bool_or([v, hf.negated(), yj[g].negated()])
                    hg.append(v)
                else:
                    hg.append(hf)
                t_expr += ti(mc.time[g]) * yj[g] + ti(mc.rec[g]) * hg[g]
                mem_expr += (mi(mc.act[g]) + mi(mc.states)) * yj[g] \
                    + (mi(mc.ckpt[g]) - mi(mc.act[g])) * hg[g]
                d_expr += ti(mc.dps[g]) * yj[g]
                o_expr += ti(mc.opt[g]) * yj[g]
        for g in G:
            a, b, d, yg, zg = nm[j][g], rm[j][g], rd[j][g], yj[g], zd[g]
            t_expr += ti(c.tau[g] + (c.z3l[g] if z3 else 0.0)) * a + ti(c.rho[g]) * b
            act_expr += (a - b) * mi(f[j] * c.act[g]) + b * mi(f[j] * c.ckpt[g])
            mem_expr += a * mi(c.sigma)
            d_expr += ti(c.dsync[g]) * a + ti(c.dps_fixed[g]) * yg
            o_expr += ti(c.opt[g]) * a
            cap_term = mi(c.capacity[g]) * yg
            mem_expr += mi(c.const_mem) * yg - cap_term
            t_expr += ti(c.p2p[g]) * yg if pp > 1 else 0
            if kd:
                t_expr += ti(kd * (c.tau_d[g] + (c.z3l_d[g] if z3 else 0.0))) * zg \
                    + ti(c.rho_d[g]) * d
                act_expr += (kd * zg - d) * mi(f[j] * c.act_d[g]) + d * mi(f[j] * c.ckpt_d[g])
                mem_expr += mi(kd * c.sigma_d) * zg
                d_expr += ti(kd * c.dsync_d[g]) * zg
                o_expr += ti(kd * c.opt_d[g]) * zg
            if first:
                t_expr += ti(c.emb_time[g]) * yg + (ti(off_s) * yg if k_off else 0)
                act_expr += mi(f[j] * c.emb_act[g]) * yg
                mem_expr += mi(c.emb_states) * yg
                d_expr += ti(c.emb_dps[g]) * yg
                o_expr += ti(c.emb_opt[g]) * yg
            if last:
                t_expr += ti(c.head_time[g]) * yg
                mem_expr += mi(c.head_act[g] + c.head_states) * yg
                d_expr += ti(c.head_dps[g]) * yg
                o_expr += ti(c.head_opt[g]) * yg
        # ZeRO-3: the first gathered layer of the stage (the largest of the kinds present)
        if z3:
            zf = model.new_int_var(0, BT, f"zf{j}")
            for g in G:
                model.add(zf >= ti(c.z3f[g]) * yj[g] + ti(c.z3f[g]) * (hn - 1))
                if kd:
                    model.add(zf >= ti(c.z3f_d[g]) * zd[g])
            t_expr += zf
        # working set: max over the kinds present of (full if any recomputed, else base)
        BW = mi(max(c.work + c.work_full + c.work_d + c.work_full_d + c.head_work)) + 1
        w = model.new_int_var(0, BW, f"w{j}")
        hr = model.new_bool_var(f"hr{j}")
        model.add(rm_t[j] <= L * hr)
        model.add(rm_t[j] >= hr)
        for g in G:
            model.add(w >= mi(c.work[g]) * (yj[g] + hn - 1 - hr))
            model.add(w >= mi(c.work_full[g]) * (yj[g] + hr - 1))
            if last:
                model.add(w >= mi(c.head_work[g]) * yj[g])
                if mc is not None:  # the MTP layer's working set, full when recomputed
                    model.add(w >= mi(c.work[g]) * (yj[g] - hg[g]))
                    model.add(w >= mi(c.work_full[g]) * hg[g])
        if kd:
            hd = model.new_bool_var(f"hd{j}")
            model.add(rd_t[j] <= kd * hd)
            model.add(rd_t[j] >= hd)
            for g in G:
                model.add(w >= mi(c.work_d[g]) * (zd[g] - hd))
                model.add(w >= mi(c.work_full_d[g]) * (zd[g] + hd - 1))
        model.add(mem_expr + act_expr + w <= 0)
        tj = model.new_int_var(0, BT, f"t{j}")
        model.add(tj == t_expr)
        times.append(tj)
        # t_j is short of the exact time by < one unit per floored term times its count
        # (nm + rm + rd + constants <= 2 l_j + 14: the last stage adds its two MTP terms)
        dj = model.new_int_var(0, BD, f"d{j}")
        model.add(dj == d_expr)
        E_cons.append((dj, tj, 2 * layers[j] + nc))
        opts.append(o_expr)
    T = model.new_int_var(0, BT, "T")
    for tj in times:
        model.add(tj <= T)
    S = sum(times)
    E = model.new_int_var(0, BD + BT, "E")
    fr = int(math.floor(t.tail_frac * FRAC_SCALE))
    bs = int(math.ceil(t.bwd_share * FRAC_SCALE))
    # a V free family scored by the cost model (its tables' times at most the plan's): the
    # exposed sync against T + per (>= every stage's table time), only where m - m' >= the
    # backward share, else none (cpsat_replay.py's docstring: "Scored by the cost model")
    scored = scored_free(s)
    t_ok = not scored or key.m - sim_microbatches(pp, key.m) >= t.bwd_share
    for dj, tj, e in E_cons:
        model.add(fr * dj <= FRAC_SCALE * E)
        if t_ok:
            model.add(FRAC_SCALE * dj - bs * ((T + 2 * L + nc) if scored else (tj + e))
                      <= FRAC_SCALE * E)
    Ov = model.new_int_var(0, BD + BT, "O")
    for o in opts:
        model.add(o <= Ov)
    # zb-h1 / zb-h2: the bubble is rho x 1F1B's (search/schedule_axis.py): the objective
    # times Q with floor(rho Q) (S - T), a lower bound (S >= T); Q = 1 otherwise (unchanged)
    rho = key_ratio(s, pp, key.tp, key.cp, key.ep, key.mbs, key.mode, key.sp, key.m)
    q, rq = (1, 1) if rho == 1.0 else (RHO_SCALE, int(math.floor(rho * RHO_SCALE)))
    per = 2 * L + nc
    if s.schedule in REPLAYED:  # ZBV / DualPipeV: the replay's longest path (cpsat_replay.py)
        split = key_split(s, pp, key.tp, key.cp, key.ep, s.etp, key.sp, key.mbs,
                          RECOMPUTE_MODES[key.mode], s.fixed.get("recompute_layers") if full
                          else None)
        pipe, q, pipe_err, cuts = replay_pipeline(model, times, T, s.schedule, split, pp, m,
                                                  BT, 2 * (BD + BT), per)
        vpp = 1  # the objective in units tu/q: the replayed term, then q x the tail
        hi = q * (m * pp * BT + 2 * (BD + BT))
    else:
        cuts = None
        pipe, pipe_err = q * vpp * m * T + rq * (S - T), m * per + (2 * L + nc * pp) / vpp
        hi = q * (vpp * m * BT + pp * BT + vpp * 2 * (BD + BT))
    obj = model.new_int_var(0, hi, "obj")
    model.add(obj == pipe + q * vpp * (E + Ov))
    model.minimize(obj)
    # error bound (seconds): each t_j is < 2 l_j + 14 units short (one unit per floored term
    # times its count), so m*T < m (2L + 14), the bubble < (2L + 14 pp)/vpp; d_j and opt_j are
    # < L + 14 short and t_j^up over-estimates by < 2 (2L + 14), so E < (L + 14) + 2 (2L + 14);
    # the fixed-point fractions lose < 2^-20 of the largest d_j and t_j
    err_u = pipe_err + (L + 14) + 2 * per + (L + 14) + 2
    err = err_u * tu + (dmax + BT * tu) * 2.0 / FRAC_SCALE
    if q > 1 and s.schedule not in REPLAYED:  # floor(rho Q) (S - T) is short of
        # rho Q (S - T) by < S - T <= pp BT units
        err += pp * BT * tu / (vpp * q)
    cl = s.fixed.get("chunk_layers")
    return PartitionModel(model, layers, r, y if hetero else None, obj, tu / (vpp * q), err, key,
                          None if cl is None else tuple(int(x) for x in cl), t.space.etp,
                          plan_schedule(s.schedule), t.space.dp_replicate,
                          t.space.optimizer_offload, k_off, cuts)


def solve_partition(t: Tables, key: Any, *, time_limit: float = 10.0, seed: int = 0,
                    workers: int = 1, max_rounds: int = 20, cutoff_s: float | None = None,
                    budget: Budget | None = None) -> tuple[float, Plan, float, float] | None:
    """Best partition of one key: (exact step s, plan, exact - model objective, error bound).

    The model is solved, the plan re-scored with `tables.plan_cost`; a plan that fits only by
    the model's memory rounding is cut off and the model re-solved. None when nothing fits, or
    when `cutoff_s` is given and no partition has an exact step time <= cutoff_s (the model's
    objective is a lower bound of the exact time, so `objective <= cutoff` drops no such plan).
    CP-SAT draws on `budget` (deterministic time; default `Budget(time_limit)`).
    """
    return solve_partition_proven(t, key, time_limit=time_limit, seed=seed, workers=workers,
                                  max_rounds=max_rounds, cutoff_s=cutoff_s, budget=budget)[0]


def solve_partition_proven(t: Tables, key: Any, *, time_limit: float = 10.0, seed: int = 0,
                           workers: int = 1, max_rounds: int = 20,
                           cutoff_s: float | None = None, budget: Budget | None = None
                           ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_partition`, and whether a None answer is proven: no partition of the key fits
    with an exact step time <= `cutoff_s` (the model has no partition, or CP-SAT proved the
    model with that cutoff infeasible), not a budget or round limit that ran out.

    The key's partitions are the union of its families (`SearchSpace.split_families`: the
    space's own partitions, then each named uneven layout): each family's model is solved in
    turn, least `key_bounds.family_bounds` first, a later one with the cutoff lowered to the
    best exact time so far (a plan above it cannot be the key's best) and none whose bound is
    above it or `cutoff_s` (each bound is proven <= every plan of its family, and the later
    ones no smaller); the best is the least (exact step time, `Plan.key()`), the enumerator's.
    A family with an infinite bound has no fitting split (`key_bound`: tmin is inf wherever no
    count fits). None is proven when every family's None is."""
    budget = budget or Budget(time_limit)
    best: tuple[float, Plan, float, float] | None = None
    proven = True
    fams: list[Tables] = []
    lbs: list[float] = []
    for v in key_variants(t, key):  # every expert-TP size the key is legal under
        fv = family_tables(v, key.pp, key.vpp)
        fams += fv
        if len(fv) > 1 or len(t.variants) > 1:  # once per key on these tables (trials)
            memo: dict[Any, list[float]] = v.__dict__.setdefault("_family_lbs", {})
            if key not in memo:
                memo[key] = family_bounds(v, key)
            lbs += memo[key]
        else:
            lbs.append(0.0)
    for i in sorted(range(len(fams)), key=lambda i: (lbs[i], i)):
        tf = fams[i]
        if best is not None:  # a later family must tie or beat the best so far to matter
            if lbs[i] > best[0]:
                break  # this family's bound, and every later one's, is above the best
            cutoff_s = best[0] if cutoff_s is None else min(cutoff_s, best[0])
        elif lbs[i] == math.inf or (cutoff_s is not None and lbs[i] > cutoff_s):
            break  # no split of this family, nor of a later one, fits (at most the cutoff)
        res, ok = _solve_family(tf, key, seed=seed, workers=workers, max_rounds=max_rounds,
                                cutoff_s=cutoff_s, budget=budget)
        r = tf.space.restriction
        if res is not None and r is not None and r.split_refusals(res[1]):
            res, ok = None, True  # a family whose best the framework does not run (as the
            # enumerator: spec/framework_space.py, split rows of a pinned or named layout)
        if res is None:
            proven = proven and ok
        elif best is None or (res[0], res[1].key()) < (best[0], best[1].key()):
            best = res
    return best, best is None and proven


def _solve_family(t: Tables, key: Any, *, seed: int, workers: int, max_rounds: int,
                  cutoff_s: float | None, budget: Budget
                  ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """`solve_partition_proven` over one partition family (`t.space`'s own partitions)."""
    from autoparallel_cp.search.tables import plan_cost

    if dualpipe_free(t.space):  # DualPipe's free family: exact (dualpipe_splits.py)
        return solve_free_dualpipe(t, key, seed=seed, workers=workers, cutoff_s=cutoff_s,
                                   budget=budget)
    if key.pp > 1 and free_at(t.space, key.pp, key.vpp):  # act_offload_free.py: exact
        return solve_free_offload(t, key, seed=seed, workers=workers, cutoff_s=cutoff_s,
                                  budget=budget)
    if _determined(t, key):
        return _score_determined(t, key, cutoff_s, budget)
    pm = build_partition(t, key)
    if pm is None:
        return None, True
    if free_searched(t.space):  # a V's free family: exact (cpsat_replay.py)
        return solve_free(t, pm, seed=seed, workers=workers, cutoff_s=cutoff_s, budget=budget)
    if cutoff_s is not None and math.isfinite(cutoff_s):
        pm.model.add(pm.objective <= int(math.floor(cutoff_s / pm.scale_s)))
    uniform = t.space.partition == "uniform"
    for _ in range(max_rounds):
        solver, st = solve_portfolio(pm.model, budget, seed, workers)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None, st == cp_model.INFEASIBLE
        plan = canonical(pm.read_plan(solver, uniform), t.space.num_layers)
        pc = plan_cost(t, plan)
        if pc.fits:
            diff = pc.step_s - solver.objective_value * pm.scale_s  # a time-out: widen by the gap
            gap = (solver.objective_value - solver.best_objective_bound) * pm.scale_s
            return (pc.step_s, plan, diff, pm.error_bound_s + max(gap, 0.0)), False
        pm.forbid(solver)
    return None, False


#: Most stage placements a pinned split's key is scored over directly (`_determined`)
DIRECT_PLACEMENTS = 64


def _determined(t: Tables, key: Any) -> bool:
    """A pinned split (`--fix` or a named layout; a V free family's only split at this pp,
    e.g. 126 layers on pp 64: rank 0 empty) leaves the recompute count and the placement: a
    scan (`enumerate.best_of_pinned_split`) when the placements are few (one on one group)."""
    if t.space.schedule in SCANNED or scored(t.space):  # model_scored.py; a V's free family:
        return not free_searched(t.space) or (  # cpsat_replay.py, unless it has one split
            t.space.schedule in REPLAYED and not scored(t.space) and not scored_free(t.space)
            and t.space.num_partitions(key.pp, key.vpp) == 1)
    if not t.space.fixed_split:
        return False
    return t.space.num_placements(key.tp, key.cp, key.dp, key.pp) <= DIRECT_PLACEMENTS


def _score_determined(t: Tables, key: Any, cutoff_s: float | None, budget: Budget
                      ) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a `_determined` key (the scan scores every choice with the
    vectorized `tables.plan_cost` composition): no model, so no rounding error (diff and
    bound 0). None, proven, when nothing fits or the best is above `cutoff_s`. The cost
    model's own scans charge `budget` per plan scored (`limits.MODEL_PLAN_DTIME`)."""
    from autoparallel_cp.search.enumerate import best_of_pinned_split
    from autoparallel_cp.search.model_scan import best_of_key
    from autoparallel_cp.search.model_scored import model_scored

    # once per (family, key) and cutoff: a V key's scan is exact only up to the cutoff it
    # was given (`best_of_pinned_split`), so it is reused for a cutoff <= that one and redone
    # for a larger one; the others read no cutoff, once however many trial cutoffs the key
    # is solved with (search/solve.py); kept on the instance, so tables at another capacity
    # (`tables.with_capacity`, a new instance) rescan
    memo: dict[Any, Any] = t.__dict__.setdefault("_pinned_best", {})
    scored = model_scored(t.space)
    cut = math.inf if cutoff_s is None or scored or t.space.schedule not in REPLAYED else cutoff_s
    if key not in memo or memo[key][0] < cut:
        n0 = len(t.__dict__.get("_model_terms", {}))
        memo[key] = (cut, best_of_key(t, key) if scored else best_of_pinned_split(t, key, cut))
        budget.charge(MODEL_PLAN_DTIME * (len(t.__dict__.get("_model_terms", {})) - n0))
    got = memo[key][1]
    if got is None or (cutoff_s is not None and got[0] > cutoff_s):
        return None, True
    step, plan = got
    return (step, canonical(plan, t.space.num_layers), 0.0, 0.0), False
