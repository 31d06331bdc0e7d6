"""Per-key partition model: CP-SAT over one key's layer counts, recomputed layers and placement.

With every key axis pinned (tp, cp, pp, dp, ep, vpp, sp, zero, mbs, m, recompute mode) each
factor of the design.md composition is a constant read from `tables.Tables`, so the partition
problem is an integer *linear* program (no element constraints, no products of variables):

- per stage j (front to back) and node group g: MoE/main-kind layers `nm_jg`, of them
  recomputed `rm_jg`, recomputed dense-prefix layers `rd_jg` (first stage), selector `y_jg`
  (exactly one group per stage, `G_g * pp / N` stages per group, fixed for the key);
- `l_j = sum_g (nm_jg + K y_jg [j = 0])`, a multiple of vpp and >= vpp; `r_j = min(r, l_j)`
  with the global Megatron `recompute_layers` r;
- `t_j`, `mem_j`, `dsync_j`, `opt_j` linear in those counts with the key's coefficients
  (tables.plan_cost is the reference composition; the working set is a max over booleans);
- objective (times vpp, so exact in integers): `vpp*m*T + (S - T) + vpp*(E + O)` with the
  epigraphs `T >= t_j`, `E >= DP_TAIL_FRACTION*dsync_j`, `E >= dsync_j - 2/3 t_j^up`,
  `O >= opt_j` (design.md: pipeline `m*T + (S - T)/vpp`, tail `max exposed + max opt`).

Every time coefficient is floored to the unit `tu` (and `t_j^up` over-estimates by the count of
floored terms), every memory coefficient and the capacity are floored to 1 KiB: the objective is
a lower bound of the exact step time of the same partition, off by at most `error_bound_s`, and
the feasible set holds every partition that fits exactly (the few that fit only by rounding are
cut off by the caller's exact re-check). Model size: O(pp * groups) variables.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.steptime import BACKWARD_SHARE
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan, canonical

#: Fixed-point scale of the DP-tail fractions (DP_TAIL_FRACTION, BACKWARD_SHARE).
FRAC_SCALE = 1 << 20


@dataclass
class KeyCoefs:
    """The key's factors per node group (seconds / bytes), read from the tables."""

    tau: list[float]  # main-kind layer time (base mode)
    rho: list[float]  # extra time of a recomputed main-kind layer
    act: list[float]
    ckpt: list[float]
    sigma: float  # model-state bytes of one main-kind layer (group independent)
    dsync: list[float]
    opt: list[float]
    work: list[float]
    work_full: list[float]
    z3l: list[float]
    z3f: list[float]
    # dense prefix (first stage, MoE models with first_k_dense_layers)
    tau_d: list[float]
    rho_d: list[float]
    act_d: list[float]
    ckpt_d: list[float]
    sigma_d: float
    dsync_d: list[float]
    opt_d: list[float]
    work_d: list[float]
    work_full_d: list[float]
    z3l_d: list[float]
    z3f_d: list[float]
    # edges
    emb_time: list[float]
    emb_act: list[float]
    emb_states: float
    emb_dps: list[float]
    emb_opt: list[float]
    head_time: list[float]
    head_act: list[float]
    head_work: list[float]
    head_states: float
    head_dps: list[float]
    head_opt: list[float]
    dps_fixed: list[float]
    p2p: list[float]
    const_mem: float  # ZeRO-3 buffers + other allocations
    capacity: list[float]


def key_coefs(t: Tables, key: Any) -> KeyCoefs:
    """Read one key's factor values from the tables (the indexing of `tables.plan_cost`)."""
    mode = key.mode
    itp, icp, iep, imb = t.i("tp", key.tp), t.i("cp", key.cp), t.i("ep", key.ep), \
        t.i("mbs", key.mbs)
    iz, idp = t.i("zero", key.zero), t.i("dp", key.dp)
    i6 = (itp, icp, iep, key.sp, imb)
    i6m = i6 + (mode,)
    i7 = i6m + (idp,)
    iz4 = (itp, icp, iep, idp)
    i5 = (itp, iep, iz, idp, icp)
    i4 = (itp, iz, idp, icp)
    ie = (itp, icp, key.sp, imb)
    G = range(t.groups)
    main = t.main_kind
    z3 = key.zero >= 3
    dense = bool(t.dense_prefix and main)

    def per(kind: bool, tab: dict[tuple[int, bool], Any], idx: tuple[int, ...]) -> list[float]:
        return [float(tab[g, kind][idx]) for g in G]

    def zero_l() -> list[float]:
        return [0.0 for _ in G]

    def kind_vals(kind: bool) -> dict[str, Any]:
        return dict(
            tau=per(kind, t.time, i6m), rho=per(kind, t.rec, i6), act=per(kind, t.act, i6m),
            ckpt=per(kind, t.ckpt, i6), sigma=float(t.states[kind][i5]),
            dsync=per(kind, t.dpsync, i5), opt=per(kind, t.opt, i5),
            work=per(kind, t.work, i6m), work_full=per(kind, t.work_full, i6),
            z3l=per(kind, t.z3l, i7) if z3 else zero_l(),
            z3f=per(kind, t.z3f, iz4) if z3 else zero_l())

    mv: dict[str, Any] = kind_vals(main)
    dv: dict[str, Any] = kind_vals(False) if dense else {
        k: (0.0 if k.startswith("sigma") else zero_l()) for k in mv}
    p2p = ([float(t.p2p[g][ie + (t.i("vpp", key.vpp), idp)]) for g in G] if key.pp > 1
           else zero_l())
    return KeyCoefs(
        **mv, **{k + "_d": v for k, v in dv.items()},
        emb_time=[float(t.emb_time[g][ie]) for g in G],
        emb_act=[float(t.emb_act[g][ie]) for g in G],
        emb_states=float(t.emb_states[i4]),
        emb_dps=[float(t.emb_dpsync[g][i4]) for g in G],
        emb_opt=[float(t.emb_opt[g][i4]) for g in G],
        head_time=[float(t.head_time[g][ie]) for g in G],
        head_act=[float(t.head_act[g][ie]) for g in G],
        head_work=[float(t.head_work[g][ie]) for g in G],
        head_states=float(t.head_states[i4]),
        head_dps=[float(t.head_dpsync[g][i4]) for g in G],
        head_opt=[float(t.head_opt[g][i4]) for g in G],
        dps_fixed=[float(t.dps_fixed[g][i4]) for g in G],
        p2p=p2p,
        const_mem=float(t.z3[itp, iep, iz]) + float(t.other),
        capacity=list(t.capacity),
    )


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
                    stage_groups=sg)

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


def _time_unit(c: KeyCoefs, L: int, m: int) -> float:
    """1e-7 s, coarsened until vpp*m*(a stage's largest time) stays far below 2^53."""
    big = (max(c.tau) + max(c.rho) + max(c.z3l) + max(c.tau_d) + max(c.rho_d)) * (L + 1) * 2 \
        + max(c.emb_time) + max(c.head_time) + max(c.p2p) + max(c.z3f) + max(c.z3f_d) + 1.0
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
    G = list(range(t.groups))
    hetero = len(G) > 1
    counts = []
    for grp in job.cluster.node_groups:
        if (grp.num_gpus * pp) % N:
            return None
        counts.append(grp.num_gpus * pp // N)
    tu = _time_unit(c, L, m)
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
    else:
        model.add(r >= 1)
        if not s.partial_recompute:
            model.add(r == L)
        if "recompute_layers" in s.fixed:
            model.add(r == int(s.fixed["recompute_layers"]))
    layers: list[Any] = []
    nm_t: list[Any] = []
    rm_t: list[Any] = []
    rd_t: list[Any] = []
    nm: list[list[Any]] = []
    rm: list[list[Any]] = []
    rd: list[list[Any]] = []
    for j in range(pp):
        first = j == 0
        kd = K if first else 0
        l_j = model.new_int_var(vpp, L, f"l{j}")
        u = model.new_int_var(1, L, f"u{j}")
        model.add(l_j == vpp * u)
        if kd:
            model.add(l_j >= kd)
        layers.append(l_j)
        rk = model.new_int_var(0, L, f"rk{j}")
        model.add_min_equality(rk, [r, l_j])
        nmj = model.new_int_var(0, L, f"nm{j}")
        model.add(nmj == l_j - kd)
        rdj = model.new_int_var(0, kd, f"rd{j}")
        if kd:
            model.add_min_equality(rdj, [rk, kd])
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
    if s.partition == "uniform":
        for l_j in layers:
            model.add(l_j == L // pp)
    fixed_sl = s.fixed.get("stage_layers")
    if fixed_sl is not None:
        for l_j, n in zip(layers, fixed_sl, strict=True):
            model.add(l_j == int(n))
    elif not hetero:
        # middle stages are interchangeable but for their in-flight count (nonincreasing in j):
        # moving the larger count later keeps every time and never raises a memory peak
        for j in range(1, pp - 2):
            model.add(layers[j] <= layers[j + 1])
    # ------------------------------------------------------------------ per-stage costs
    f = [float(fx.inflight(pp, vpp, m, j)) for j in range(pp)]
    times: list[Any] = []
    E_cons: list[tuple[Any, Any, Any]] = []
    opts: list[Any] = []
    BT = ti(max(c.tau) * 4 * (L + 2) + max(c.rho) * (L + 2) + max(c.z3l) * (L + 2)
            + max(c.tau_d) * 4 * (K + 2) + max(c.emb_time) + max(c.head_time) + max(c.p2p)
            + max(c.z3f) + max(c.z3f_d)) + 64
    dmax = (max(c.dsync) * L + max(c.dsync_d) * K + max(c.emb_dps) + max(c.head_dps)
            + max(c.dps_fixed))
    omax = max(c.opt) * L + max(c.opt_d) * K + max(c.emb_opt) + max(c.head_opt)
    BD = ti(max(dmax, omax)) + 64
    for j in range(pp):
        first, last = j == 0, j == pp - 1
        kd = K if first else 0
        yj = y[j]
        # does the stage hold main-kind layers? (only the first stage may not)
        hn: Any = 1
        if first and kd:
            hn = model.new_bool_var(f"hn{j}")
            model.add(nm_t[j] <= L * hn)
            model.add(nm_t[j] >= hn)
        t_expr: Any = 0
        act_expr: Any = 0
        mem_expr: Any = 0
        d_expr: Any = 0
        o_expr: Any = 0
        for g in G:
            a, b, d, yg = nm[j][g], rm[j][g], rd[j][g], yj[g]
            t_expr += ti(c.tau[g] + (c.z3l[g] if z3 else 0.0)) * a + ti(c.rho[g]) * b
            act_expr += (a - b) * mi(f[j] * c.act[g]) + b * mi(f[j] * c.ckpt[g])
            mem_expr += a * mi(c.sigma)
            d_expr += ti(c.dsync[g]) * a + ti(c.dps_fixed[g]) * yg
            o_expr += ti(c.opt[g]) * a
            cap_term = mi(c.capacity[g]) * yg
            mem_expr += mi(c.const_mem) * yg - cap_term
            t_expr += ti(c.p2p[g]) * yg if pp > 1 else 0
            if kd:
                t_expr += ti(kd * (c.tau_d[g] + (c.z3l_d[g] if z3 else 0.0))) * yg \
                    + ti(c.rho_d[g]) * d
                act_expr += (kd * yg - d) * mi(f[j] * c.act_d[g]) + d * mi(f[j] * c.ckpt_d[g])
                mem_expr += mi(kd * c.sigma_d) * yg
                d_expr += ti(kd * c.dsync_d[g]) * yg
                o_expr += ti(kd * c.opt_d[g]) * yg
            if first:
                t_expr += ti(c.emb_time[g]) * yg
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
                    model.add(zf >= ti(c.z3f_d[g]) * yj[g])
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
        if kd:
            hd = model.new_bool_var(f"hd{j}")
            model.add(rd_t[j] <= kd * hd)
            model.add(rd_t[j] >= hd)
            for g in G:
                model.add(w >= mi(c.work_d[g]) * (yj[g] - hd))
                model.add(w >= mi(c.work_full_d[g]) * (yj[g] + hd - 1))
        model.add(mem_expr + act_expr + w <= 0)
        tj = model.new_int_var(0, BT, f"t{j}")
        model.add(tj == t_expr)
        times.append(tj)
        # t_j is short of the exact time by < one unit per floored term times its count
        # (nm + rm + rd + constants <= 2 l_j + 12)
        dj = model.new_int_var(0, BD, f"d{j}")
        model.add(dj == d_expr)
        E_cons.append((dj, tj, 2 * layers[j] + 12))
        opts.append(o_expr)
    T = model.new_int_var(0, BT, "T")
    for tj in times:
        model.add(tj <= T)
    S = sum(times)
    E = model.new_int_var(0, BD + BT, "E")
    fr = int(math.floor(fx.DP_TAIL_FRACTION * FRAC_SCALE))
    bs = int(math.ceil(BACKWARD_SHARE * FRAC_SCALE))
    for dj, tj, e in E_cons:
        model.add(fr * dj <= FRAC_SCALE * E)
        model.add(FRAC_SCALE * dj - bs * (tj + e) <= FRAC_SCALE * E)
    Ov = model.new_int_var(0, BD + BT, "O")
    for o in opts:
        model.add(o <= Ov)
    obj = model.new_int_var(0, vpp * m * BT + pp * BT + vpp * 2 * (BD + BT), "obj")
    model.add(obj == vpp * m * T + S - T + vpp * (E + Ov))
    model.minimize(obj)
    # error bound (seconds): each t_j is < 2 l_j + 12 units short (one unit per floored term
    # times its count), so m*T < m (2L + 12), the bubble < (2L + 12 pp)/vpp; d_j and opt_j are
    # < L + 12 short and t_j^up over-estimates by < 2 (2L + 12), so E < (L + 12) + 2 (2L + 12);
    # the fixed-point fractions lose < 2^-20 of the largest d_j and t_j
    per = 2 * L + 12
    err_u = m * per + (2 * L + 12 * pp) / vpp + (L + 12) + 2 * per + (L + 12) + 2
    err = err_u * tu + (dmax + BT * tu) * 2.0 / FRAC_SCALE
    return PartitionModel(model, layers, r, y if hetero else None, obj, tu / vpp, err, key)


def solve_partition(t: Tables, key: Any, *, time_limit: float = 10.0, seed: int = 0,
                    workers: int = 1, max_rounds: int = 20, cutoff_s: float | None = None
                    ) -> tuple[float, Plan, float, float] | None:
    """Best partition of one key: (exact step s, plan, exact - model objective, error bound).

    The model is solved, the plan re-scored with `tables.plan_cost`; a plan that fits only by
    the model's memory rounding is cut off and the model re-solved. None when nothing fits, or
    when `cutoff_s` is given and no partition has an exact step time <= cutoff_s (the model's
    objective is a lower bound of the exact time, so `objective <= cutoff` drops no such plan).
    """
    from autoparallel_cp.search.tables import plan_cost

    t0 = time.perf_counter()
    pm = build_partition(t, key)
    if pm is None:
        return None
    if cutoff_s is not None and math.isfinite(cutoff_s):
        pm.model.add(pm.objective <= int(math.floor(cutoff_s / pm.scale_s)))
    uniform = t.space.partition == "uniform"
    for _ in range(max_rounds):
        left = time_limit - (time.perf_counter() - t0)
        solver, st = _portfolio(pm.model, max(left, 0.05), seed, workers)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        plan = canonical(pm.read_plan(solver, uniform), t.space.num_layers)
        pc = plan_cost(t, plan)
        if pc.fits:
            diff = pc.step_s - solver.objective_value * pm.scale_s
            # a time-out leaves the key's optimum unproven: widen its bound by the gap
            gap = (solver.objective_value - solver.best_objective_bound) * pm.scale_s
            return pc.step_s, plan, diff, pm.error_bound_s + max(gap, 0.0)
        pm.forbid(solver)
    return None


#: Sequential portfolio for the per-key model, each stage capped in deterministic time (so
#: the answer does not depend on the machine's load): no single CP-SAT strategy is fast on every
#: key (fixed search stalls on long pipelines, the default on two-stage MoE keys, the LB-tree
#: search on node-group placement), each closes most keys in milliseconds.
PORTFOLIO: tuple[tuple[dict[str, Any], float], ...] = (
    ({"search_branching": cp_model.FIXED_SEARCH, "cp_model_presolve": False}, 0.05),
    ({"search_branching": cp_model.FIXED_SEARCH}, 0.2),
    ({"search_branching": cp_model.PSEUDO_COST_SEARCH}, 0.5),
    ({"optimize_with_lb_tree_search": True}, 1.0),
    ({}, float("inf")),
)


def _portfolio(model: cp_model.CpModel, time_limit: float, seed: int, workers: int,
               presolve: bool = True) -> tuple[cp_model.CpSolver, Any]:
    """Solve with each PORTFOLIO stage in turn until one proves optimality (or infeasibility);
    each later stage starts from the best solution so far (hint)."""
    t0 = time.perf_counter()
    best: tuple[cp_model.CpSolver, Any] | None = None
    for params, dtime in PORTFOLIO:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = workers
        prm.random_seed = seed
        prm.max_time_in_seconds = left
        prm.cp_model_presolve = presolve
        if dtime != float("inf"):
            prm.max_deterministic_time = dtime
        for k, v in params.items():
            setattr(prm, k, v)
        st = solver.solve(model)
        if st in (cp_model.OPTIMAL, cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
            model.clear_hints()
            return solver, st
        if st == cp_model.FEASIBLE:
            if best is None or solver.objective_value < best[0].objective_value:
                best = (solver, st)
            model.clear_hints()
            for v in range(len(model.proto.variables)):
                var = model.get_int_var_from_proto_index(v)
                model.add_hint(var, int(solver.value(var)))
    model.clear_hints()
    if best is None:
        return cp_model.CpSolver(), cp_model.UNKNOWN
    return best


def key_bound(t: Tables, key: Any, c: KeyCoefs | None = None) -> float:
    """A proven lower bound of the exact step time of every plan of `key` (numpy, no CP-SAT),
    used only to skip keys whose best cannot enter the top k before their model is built.

    Per stage position j, node group g and layer count l (a multiple of vpp), `tmin[j, g, l]`
    is the least stage time over the recompute counts r_j = min(r, l) whose memory peak fits
    (the `tables.plan_cost` composition with the key's constants; inf when none fits): memory
    that forces recompute adds its replay time here, and the embedding / LM head / dense prefix
    sit at their positions. Then, with T = max_j t_j and S = sum_j t_j:

    - T >= T_lb, the least T at which the stages can hold L layers: stage j on group g holds at
      most cap_g(j, T) = max{l : tmin[j, g, l] <= T} layers and group g holds n_g stages, so
      L <= sum_g (sum of the n_g largest cap_g(j, T) over j);
    - S >= S_lb = lambda*L + sum_g (sum of the n_g least h[j, g] over j), h[j, g] =
      min_l (tmin[j, g, l] - lambda*l), for any lambda (Lagrangian of sum_j l_j = L; each group
      picks its n_g positions on its own, a relaxation of the assignment);
    - tail = max_j dp_exposed_j + max_j opt_j >= max(a, b - 2/3 S/pp) + o with D, O the least
      DP-sync and optimizer sums (a = DP_TAIL_FRACTION*D/pp, b = D/pp, o = O/pp);
    - step = (m - 1/vpp) T + S/vpp + tail, nondecreasing in T (m >= 1): the least value over
      S >= max(S_lb, T_lb) with T = max(T_lb, S/pp), a convex piecewise-linear function of S
      whose minimum is at a breakpoint.
    Dropped terms (>= 0): the coupling of r across stages and of positions across groups.
    """
    import numpy as np

    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    pp, vpp, m = key.pp, key.vpp, key.m
    K = t.dense_prefix if t.main_kind else 0
    c = c if c is not None else key_coefs(t, key)
    G = t.groups
    ng = []
    for grp in job.cluster.node_groups:
        if (grp.num_gpus * pp) % N:
            return math.inf
        ng.append(grp.num_gpus * pp // N)
    full = RECOMPUTE_MODES[key.mode] == "full"
    z3 = key.zero >= 3
    if not full:
        rs = np.zeros(1)
    elif "recompute_layers" in s.fixed:
        rs = np.array([float(s.fixed["recompute_layers"])])
    elif not s.partial_recompute:
        rs = np.array([float(L)])
    else:
        rs = np.arange(1, L + 1, dtype=float)
    ls = np.arange(vpp, L + 1, vpp, dtype=float)
    if ls.size == 0:
        return math.inf
    def A(xs: list[float]) -> Any:  # per node group, broadcast over (j, g, l, r)
        return np.asarray(xs, float).reshape(1, G, 1, 1)

    capx = A(c.capacity) * (1 + 1e-9) + 1.0  # fits up to float rounding of a reordered sum
    lv = ls.reshape(1, 1, -1, 1)

    def grid(j: Any, rs: Any) -> Any:
        """tmin over stage positions j, every allowed r (the plan_cost composition)."""
        f = np.asarray(fx.inflight(pp, vpp, m, j), float).reshape(-1, 1, 1, 1)
        first = (j == 0).astype(float).reshape(-1, 1, 1, 1)
        last = (j == pp - 1).astype(float).reshape(-1, 1, 1, 1)
        nd = first * K
        rv = rs.reshape(1, 1, 1, -1)
        ok_l = lv >= nd  # the first stage holds the dense prefix
        nm = np.maximum(lv - nd, 0.0)
        rk = np.minimum(rv, lv)
        rd = np.minimum(rk, nd)
        rm = rk - rd
        time_ = nm * A(c.tau) + nd * A(c.tau_d) + rm * A(c.rho) + rd * A(c.rho_d) \
            + first * A(c.emb_time) + last * A(c.head_time)
        if pp > 1:
            time_ = time_ + A(c.p2p)
        if z3:
            time_ = time_ + nm * A(c.z3l) + nd * A(c.z3l_d) + np.maximum(
                np.where(nm > 0, A(c.z3f), 0.0), np.where(nd > 0, A(c.z3f_d), 0.0))
        states = nm * c.sigma + nd * c.sigma_d + first * c.emb_states + last * c.head_states
        acts = (nm - rm) * A(c.act) + rm * A(c.ckpt) + (nd - rd) * A(c.act_d) \
            + rd * A(c.ckpt_d) + first * A(c.emb_act)
        work = np.maximum(
            np.where(nm > 0, np.where(rm > 0, A(c.work_full), A(c.work)), 0.0),
            np.where(nd > 0, np.where(rd > 0, A(c.work_full_d), A(c.work_d)), 0.0))
        work = np.maximum(work, last * A(c.head_work))
        peak = states + f * acts + last * A(c.head_act) + work + c.const_mem
        fits = (peak <= capx) & ok_l
        return np.where(fits, time_, np.inf).min(axis=3)

    def closed(j: Any) -> Any:
        """tmin over positions j >= 1 with partial full recompute (r_j in [1, l]): the stage time
        grows with r_j (rho >= 0) and its peak is linear in r_j >= 1 (work_full), so the least
        fitting r_j has a closed form (rounded down: a smaller r_j only lowers the bound)."""
        f = np.asarray(fx.inflight(pp, vpp, m, j), float).reshape(-1, 1, 1, 1)
        last = (j == pp - 1).astype(float).reshape(-1, 1, 1, 1)
        p0 = lv * c.sigma + last * c.head_states + f * lv * A(c.act) + last * A(c.head_act) \
            + np.maximum(A(c.work_full), last * A(c.head_work)) + c.const_mem
        d = f * (A(c.act) - A(c.ckpt))
        with np.errstate(divide="ignore", invalid="ignore"):
            need = np.ceil((p0 - capx) / d - 1e-6)
        r1 = np.where(d > 0, np.maximum(need, 1.0), 1.0)
        ok = np.where(d > 0, r1 <= lv, p0 - d <= capx)
        r1 = np.minimum(r1, lv)
        time_ = lv * A(c.tau) + r1 * A(c.rho) + last * A(c.head_time)
        if pp > 1:
            time_ = time_ + A(c.p2p)
        if z3:
            time_ = time_ + lv * A(c.z3l) + A(c.z3f)
        return np.where(ok, time_, np.inf)[..., 0]

    jall = np.arange(pp)
    if full and s.partial_recompute and "recompute_layers" not in s.fixed and pp > 1 \
            and min(c.rho) >= 0.0:
        tmin = np.concatenate([grid(jall[:1], rs), closed(jall[1:])], axis=0)
    else:
        tmin = grid(jall, rs)
    tmin = tmin * (1 - 1e-9)  # (pp, G, nl)
    finite = np.isfinite(tmin)
    if not finite.any(axis=(1, 2)).all():
        return math.inf  # some stage position fits no layer count on any group
    cands = np.unique(tmin[finite])

    def holds(T: float) -> bool:
        capl = np.where(tmin <= T, ls.reshape(1, 1, -1), 0.0).max(axis=2)  # (pp, G)
        tot = 0.0
        for g in range(G):
            col = np.sort(capl[:, g])[::-1]
            tot += float(col[:ng[g]].sum())
        return tot >= L

    if not holds(float(cands[-1])):
        return math.inf
    lo_i, hi_i = 0, len(cands) - 1
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        if holds(float(cands[mid])):
            hi_i = mid
        else:
            lo_i = mid + 1
    T_lb = float(cands[lo_i])
    per = tmin[finite] / np.broadcast_to(ls.reshape(1, 1, -1), tmin.shape)[finite]
    S_lb = 0.0
    for lam in np.linspace(float(per.min()), float(per.max()), 9):
        h = np.where(finite, tmin - lam * ls.reshape(1, 1, -1), np.inf).min(axis=2)  # (pp, G)
        # group g holds n_g positions: at least the sum of its n_g least h (assignment relaxed)
        v = lam * L + sum(float(np.sort(h[:, g])[:ng[g]].sum()) for g in range(G))
        S_lb = max(S_lb, v)
    D = (L - K) * min(c.dsync) + K * min(c.dsync_d) + pp * min(c.dps_fixed) \
        + min(c.emb_dps) + min(c.head_dps)
    opt_sum = (L - K) * min(c.opt) + K * min(c.opt_d) + min(c.emb_opt) + min(c.head_opt)
    a = fx.DP_TAIL_FRACTION * D / pp
    b = D / pp
    o = opt_sum / pp

    def step(S: float) -> float:
        T = max(T_lb, S / pp)
        return (m - 1.0 / vpp) * T + S / vpp + max(a, b - BACKWARD_SHARE * S / pp) + o

    S0 = max(S_lb, T_lb)
    best = min(step(max(S0, x)) for x in (S0, pp * T_lb, (b - a) * pp / BACKWARD_SHARE))
    return best * (1 - 1e-9) - 1e-12
