"""The CP-SAT formulation: one model over all plan axes, optimal + k best, exactness certificate.

Variables (see docs in the functions): one-hot axes tp, cp, pp, dp, ep, vpp, mbs, m (micro-batches),
zero, sp, recompute mode; per pipeline-stage slot k (counted from the LAST stage, so the last
stage is slot 0 and slot k is active iff pp > k; the first stage is slot pp-1): layer count l_k,
recomputed layers r_k = min(r, l_k) with the global Megatron `recompute_layers` r, and on a
heterogeneous cluster the node group g_k. Every number comes from `tables.Tables` (the cost
model's factors tabulated over the axes each depends on), read through element constraints on
mixed-radix indices of those axes only.

Constraints: products of degrees in the exponent domain (dp*tp*pp*cp = N, dp*mbs*m = B,
ep | dp*cp, pp | m when interleaved, ...); per stage memory (states + in-flight x activations
+ working set + buffers <= capacity) as linear constraints over product variables
(AddMultiplicationEquality of a count and a tabulated coefficient).

Objective (integer, time unit `tu` seconds): m*T + floor((sum_k t_k - T)/vpp) + E + O with the
epigraphs T >= t_k, E >= exposed DP_k, O >= optimizer_k. Every coefficient is rounded DOWN to
its unit, products are exact, the division truncates, the DP overlap term uses an upper bound of
t_k: so the objective is a LOWER BOUND of the exact step time of the same plan, off by at most
`error_bound` (m*(2L+6)*tu + ... per plan). Memory coefficients are rounded down too: the
model's feasible set contains every plan that fits exactly; the few that pass only by rounding
are removed by the exact re-check.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from ortools.sat.python import cp_model

from autoparallel_cp import cpsat_blocks as cb
from autoparallel_cp import factors as fx
from autoparallel_cp.plan import RECOMPUTE_MODES, Plan
from autoparallel_cp.space import SearchSpace
from autoparallel_cp.tables import Tables

KEY_AXES = ("tp", "pp", "cp", "dp", "ep", "vpp", "sp", "zero", "mbs", "mode")


@dataclass
class Formulation:
    """A built CP-SAT model and handles to read plans back."""

    model: cp_model.CpModel
    axes: dict[str, cb.Axis]
    layers: list[cp_model.IntVar]
    r: cp_model.IntVar
    groups: list[cp_model.IntVar] | None
    objective: cp_model.IntVar
    tu: float
    error_bound_s: float
    slots: int
    num_vars: int = 0
    num_constraints: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def key_lits(self, solver: cp_model.CpSolver) -> list[cp_model.IntVar]:
        """The literals of the chosen value of every key axis."""
        out: list[cp_model.IntVar] = []
        for a in KEY_AXES:
            ax = self.axes[a]
            out.extend(b for b in ax.lits if solver.boolean_value(b))
        return out

    def forbid_exact(self, lits: Sequence[cp_model.IntVar], layers: Sequence[int], r: int,
                     groups: Sequence[int] | None) -> None:
        """No-good on the whole decision tuple (key, layer counts, r, groups)."""
        m = self.model
        alts: list[Any] = [lit.negated() for lit in lits]
        vals = list(zip(self.layers, layers, strict=True)) + [(self.r, r)]
        if self.groups is not None and groups is not None:
            vals += list(zip(self.groups, groups, strict=True))
        for var, v in vals:
            b = m.new_bool_var("")
            m.add(var != v).only_enforce_if(b)
            alts.append(b)
        m.add_bool_or(alts)

    def read_plan(self, solver: cp_model.CpSolver, space: SearchSpace) -> Plan:
        """The plan of the current solution (stage_layers front to back)."""
        v = {a: self.axes[a].solution(solver) for a in ("tp", "pp", "cp", "dp", "ep", "vpp",
                                                         "sp", "zero", "mbs", "m", "mode")}
        pp = v["pp"]
        ls = [int(solver.value(self.layers[k])) for k in range(pp)][::-1]
        mode = RECOMPUTE_MODES[v["mode"]]
        r = int(solver.value(self.r))
        rl: int | None = None
        if mode == "full" and r < max(ls):
            rl = r
        sg: tuple[int, ...] | None = None
        if self.groups is not None:
            sg = tuple(int(solver.value(self.groups[k])) for k in range(pp))[::-1]
        return Plan(
            dp=v["dp"], tp=v["tp"], pp=pp, vpp=v["vpp"], cp=v["cp"], ep=v["ep"], sp=v["sp"],
            zero=v["zero"], mbs=v["mbs"], num_microbatches=v["m"], recompute=mode,
            recompute_layers=rl,
            stage_layers=None if space.partition == "uniform" else tuple(ls),
            stage_groups=sg,
        )


def _floor(a: np.ndarray, unit: float) -> list[int]:
    return [int(math.floor(x / unit)) for x in np.asarray(a, float).ravel()]


def add_axes(model: cp_model.CpModel, t: Tables) -> dict[str, cb.Axis]:
    """One-hot plan axes and the degree rules (dp*tp*pp*cp = N, dp*mbs*m = B, ...), linear."""
    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    B = job.global_batch
    hetero = t.groups > 1
    ax: dict[str, cb.Axis] = {}
    for name, dom in (("tp", s.tp), ("cp", s.cp), ("pp", s.pp), ("dp", t.dp), ("ep", s.ep),
                      ("vpp", s.vpp), ("mbs", s.mbs), ("m", t.m), ("zero", s.zero),
                      ("sp", s.sp), ("mode", tuple(RECOMPUTE_MODES.index(x)
                                                   for x in s.recompute))):
        ax[name] = cb.Axis.new(model, name, dom)
    cb.add_product_equals(model, [ax["tp"], ax["cp"], ax["pp"], ax["dp"]], N)
    cb.add_product_equals(model, [ax["dp"], ax["mbs"], ax["m"]], B)
    cb.add_divides(model, [ax["ep"]], [ax["dp"], ax["cp"]])
    one_vpp = ax["vpp"].lit(1)
    # negated() is a NotBooleanVariable (a Literal, not an IntVar); add_divides only passes
    # `enforce` on to only_enforce_if, which accepts any literal
    interleaved = cast(list[cp_model.IntVar],
                       [one_vpp.negated()] if one_vpp is not None else [])
    if interleaved or one_vpp is None:
        cb.add_divides(model, [ax["pp"]], [ax["m"]], enforce=interleaved)
        pp1 = ax["pp"].lit(1)
        if pp1 is not None:
            if one_vpp is None:
                model.add(pp1 == 0)
            else:
                model.add_implication(pp1, one_vpp)
    sp1 = ax["sp"].lit(1)
    tp1 = ax["tp"].lit(1)
    if sp1 is not None and tp1 is not None:
        model.add_implication(sp1, tp1.negated())
    if s.partition == "uniform":
        cb.add_divides(model, [ax["pp"], ax["vpp"]], L)
    if "dp" in s.fixed:
        model.add(ax["dp"].value == s.fixed["dp"])
    if hetero:
        for g in job.cluster.node_groups:
            # dp*tp*cp = N/pp divides the group's GPU count  <=>  N | G*pp
            for p in cb.primes_of([N, g.num_gpus] + list(s.pp)):
                model.add(cb.valuation(N, p) <= cb.valuation(g.num_gpus, p)
                          + ax["pp"].exponent(p))
    return ax


def build(t: Tables, *, time_unit: float | None = None, mem_unit: float = 1024.0) -> Formulation:
    """Build the CP-SAT model of the tables' search space (module docstring)."""
    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    hetero = t.groups > 1
    model = cp_model.CpModel()
    ax = add_axes(model, t)
    # ------------------------------------------------------------------ coefficient tables
    tu = time_unit or _time_unit(t)
    mu = mem_unit
    full_mode = ax["mode"].lit(2)
    zero3 = ax["zero"].lit(3)
    idx6, n6 = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["ep"], ax["sp"], ax["mbs"],
                                     ax["mode"]])
    idx5l, n5l = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["ep"], ax["sp"], ax["mbs"]])
    idx5, n5 = cb.mixed_radix_index([ax["tp"], ax["ep"], ax["zero"], ax["dp"], ax["cp"]])
    idx4, n4 = cb.mixed_radix_index([ax["tp"], ax["zero"], ax["dp"], ax["cp"]])
    idxe, ne = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["sp"], ax["mbs"]])
    idxp, npp = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["sp"], ax["mbs"], ax["vpp"],
                                     ax["dp"]])
    idx7, n7 = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["ep"], ax["sp"], ax["mbs"],
                                     ax["mode"], ax["dp"]])
    idxz, nz = cb.mixed_radix_index([ax["tp"], ax["cp"], ax["ep"], ax["dp"]])
    idxb, _ = cb.mixed_radix_index([ax["tp"], ax["ep"], ax["zero"]])
    sp_sel = [i for i, v in enumerate((0, 1)) if v in s.sp]

    def restrict_sp(a: np.ndarray, axis: int) -> np.ndarray:
        return np.take(a, sp_sel, axis=axis)

    def mode_sel(a: np.ndarray) -> np.ndarray:
        return np.take(a, [RECOMPUTE_MODES.index(x) for x in s.recompute], axis=5)

    gvars: list[cp_model.IntVar] | None = None
    slots = max(s.pp)
    if hetero:
        gvars = [model.new_int_var(0, t.groups - 1, f"g{k}") for k in range(slots)]
    shared: dict[tuple[str, int], cp_model.IntVar] = {}

    def coef(name: str, per_group: list[np.ndarray], index: Any, size: int, unit: float,
             k: int | None = None, scale: float = 1.0) -> cp_model.IntVar:
        """Tabulated coefficient (floor to `unit`), shared or for slot k's node group."""
        vals = [_floor(a * scale, unit) for a in per_group]
        for v in vals:
            assert len(v) == size, (name, len(v), size)
        if not hetero or k is None or len(per_group) == 1:
            key = (name, -1)
            if key not in shared:
                shared[key] = cb.lookup(model, index, vals[0], name)
            return shared[key]
        key = (name, k)
        if key not in shared:
            assert gvars is not None
            flat = [x for v in vals for x in v]
            shared[key] = cb.lookup(model, gvars[k] * size + index, flat, f"{name}@{k}")
        return shared[key]

    G = range(t.groups)
    main = t.main_kind
    K = t.dense_prefix

    def lay(kind: bool, what: str) -> list[np.ndarray]:
        src = {"time": t.time, "act": t.act, "work": t.work}[what]
        return [mode_sel(restrict_sp(src[g, kind], 3)) for g in G]

    def lay5(kind: bool, what: str) -> list[np.ndarray]:
        src = {"rec": t.rec, "ckpt": t.ckpt, "workf": t.work_full}[what]
        return [restrict_sp(src[g, kind], 3) for g in G]

    def edge(src: dict[int, np.ndarray]) -> list[np.ndarray]:
        return [restrict_sp(src[g], 2) for g in G]

    # ------------------------------------------------------------------ stage slots
    active = [ax["pp"].is_in(model, [p for p in s.pp if p > k]) for k in range(slots)]
    first = [ax["pp"].lit(k + 1) for k in range(slots)]
    layers = [model.new_int_var(0, L, f"l{k}") for k in range(slots)]
    model.add(sum(layers) == L)
    r = model.new_int_var(0, L, "r")
    if full_mode is None:
        model.add(r == 0)
    else:
        model.add(r == 0).only_enforce_if(full_mode.negated())
        model.add(r >= 1).only_enforce_if(full_mode)
        if not s.partial_recompute:
            model.add(r == L).only_enforce_if(full_mode)
        if "recompute_layers" in s.fixed:
            model.add(r == int(s.fixed["recompute_layers"])).only_enforce_if(full_mode)
    rk = [model.new_int_var(0, L, f"r{k}") for k in range(slots)]
    for k in range(slots):
        model.add_min_equality(rk[k], [r, layers[k]])
        model.add(layers[k] == 0).only_enforce_if(active[k].negated())
        model.add(layers[k] >= ax["vpp"].value).only_enforce_if(active[k])
        for v in s.vpp:
            lit = ax["vpp"].lit(v)
            if v > 1 and lit is not None:
                u = model.new_int_var(0, L // v, f"u{k}_{v}")
                model.add(layers[k] == v * u).only_enforce_if(lit)
        if s.partition == "uniform":
            for p in s.pp:
                if p > k and ax["pp"].lit(p) is not None:
                    model.add(layers[k] == L // p).only_enforce_if(ax["pp"].lit(p))
        if K and main and first[k] is not None:
            model.add(layers[k] >= K).only_enforce_if(first[k])
    if "stage_layers" in s.fixed:
        sl = s.fixed["stage_layers"]
        for j, n in enumerate(sl):
            model.add(layers[len(sl) - 1 - j] == n)
    if "stage_groups" in s.fixed and gvars is not None:
        sg = s.fixed["stage_groups"]
        for j, gg in enumerate(sg):
            model.add(gvars[len(sg) - 1 - j] == gg)
    if not hetero:
        # symmetry: middle stages with fewer in-flight micro-batches hold at least as many layers
        for k in range(1, slots - 1):
            lit = ax["pp"].is_in(model, [p for p in s.pp if p >= k + 3])
            model.add(layers[k] >= layers[k + 1]).only_enforce_if(lit)
    if gvars is not None:
        for gi, g in enumerate(job.cluster.node_groups):
            ys = []
            for k in range(slots):
                y = model.new_bool_var(f"y{k}_{gi}")
                model.add(gvars[k] == gi).only_enforce_if(y)
                model.add(gvars[k] != gi).only_enforce_if(y.negated())
                yk = model.new_bool_var("")
                model.add_bool_and([y, active[k]]).only_enforce_if(yk)
                model.add_bool_or([y.negated(), active[k].negated()]).only_enforce_if(yk.negated())
                ys.append(yk)
            # stages in group gi = G_gi * pp / N
            model.add(N * sum(ys) == g.num_gpus * ax["pp"].value)
    # dense prefix recompute (first stage): rd = min(r, K)
    rd = model.new_int_var(0, max(K, 0), "rd")
    if K and main:
        model.add_min_equality(rd, [r, K])
    else:
        model.add(rd == 0)

    # in-flight micro-batches: table over (pp, vpp, m) per slot, scaled by Q (exact)
    Q = math.lcm(*s.vpp)
    idx_f, nf = cb.mixed_radix_index([ax["pp"], ax["vpp"], ax["m"]])
    pg, vg, mg = np.meshgrid(np.array(s.pp, float), np.array(s.vpp, float),
                             np.array(t.m, float), indexing="ij")

    # ------------------------------------------------------------------ bounds
    def mx(d: dict[Any, np.ndarray] | list[np.ndarray]) -> float:
        vals = d.values() if isinstance(d, dict) else d
        return max((float(np.max(np.abs(a))) for a in vals), default=0.0)

    per_layer_t = mx(t.time) + mx(t.rec) + (mx(t.z3l) if t.z3l else 0.0)
    edge_t = mx(t.emb_time) + mx(t.head_time) + mx(t.p2p) + (mx(t.z3f) if t.z3f else 0.0)
    BT = int((per_layer_t * (L + 1) + edge_t) / tu) + 16
    per_layer_m = mx(t.act) + mx(t.ckpt) + mx(list(t.states.values()))
    BX = int(((mx(t.act) + mx(t.ckpt)) * (L + 1) + mx(t.emb_act)) / mu) + 16
    BM = int((per_layer_m * (L + 1) + mx(t.emb_act) + mx(t.head_act) + mx(t.head_work)
              + mx(t.work) + mx(t.work_full) + float(np.max(t.emb_states))
              + float(np.max(t.head_states))) / mu) + 16
    BD = int(((mx(t.dpsync) + mx(t.opt)) * (L + 1) + mx(t.emb_dpsync) + mx(t.head_dpsync)
              + mx(t.emb_opt) + mx(t.head_opt) + mx(t.dps_fixed)) / tu) + 16
    # ------------------------------------------------------------------ per-slot costs
    cap_units = [int(math.floor(c / mu)) for c in t.capacity]
    other_u = _floor(np.array([t.other]), mu)[0]

    times: list[Any] = []
    errs: list[Any] = []
    tail_E: list[tuple[Any, Any]] = []
    opt_terms: list[Any] = []
    zero3_in = zero3 is not None
    for k in range(slots):
        kk = k if hetero else None
        fvals = np.where(pg > k, fx.inflight(pg, vg, mg, pg - 1 - k), 0.0) * Q
        F_k = cb.lookup(model, idx_f, [int(round(x)) for x in fvals.ravel()], f"F{k}")
        is_first = first[k]
        isf: Any = is_first if is_first is not None else 0
        # main-kind layer counts on the slot
        if K and main:
            nm = model.new_int_var(0, L, f"nm{k}")
            model.add(nm == layers[k] - K * isf)
            rdf = model.new_int_var(0, K, f"rdf{k}")
            if is_first is not None:
                model.add(rdf == rd).only_enforce_if(is_first)
                model.add(rdf == 0).only_enforce_if(is_first.negated())
            else:
                model.add(rdf == 0)
            rm = model.new_int_var(0, L, f"rm{k}")
            model.add(rm == rk[k] - rdf)
        else:
            nm, rm = layers[k], rk[k]
        km = model.new_int_var(0, L, f"km{k}")
        model.add(km == nm - rm)
        A = coef(f"act{main:d}", lay(main, "act"), idx6, n6, mu, kk)
        C = coef(f"ckpt{main:d}", lay5(main, "ckpt"), idx5l, n5l, mu, kk)
        X = model.new_int_var(0, BX, f"X{k}")
        x_terms: list[Any] = [cb.product(model, km, A, f"kmA{k}"),
                              cb.product(model, rm, C, f"rmC{k}")]
        sig = coef(f"states{main:d}", [t.states[main]], idx5, n5, mu)
        mem_terms: list[Any] = [cb.product(model, nm, sig, f"nmS{k}")]
        tau = coef(f"time{main:d}", lay(main, "time"), idx6, n6, tu, kk)
        rho = coef(f"rec{main:d}", lay5(main, "rec"), idx5l, n5l, tu, kk)
        t_terms: list[Any] = [cb.product(model, nm, tau, f"nmT{k}"),
                              cb.product(model, rm, rho, f"rmR{k}")]
        dsy = coef(f"dps{main:d}", [t.dpsync[g, main] for g in G], idx5, n5, tu, kk)
        opc = coef(f"opt{main:d}", [t.opt[g, main] for g in G], idx5, n5, tu, kk)
        d_terms: list[Any] = [cb.product(model, nm, dsy, f"nmD{k}"),
                              coef("dps_fixed", [t.dps_fixed[g] for g in G], idx4, n4, tu, kk)]
        o_terms: list[Any] = [cb.product(model, nm, opc, f"nmO{k}")]
        # working set
        work = model.new_int_var(0, BM, f"work{k}")
        wb = coef(f"work{main:d}", lay(main, "work"), idx6, n6, mu, kk)
        wf = coef(f"workf{main:d}", lay5(main, "workf"), idx5l, n5l, mu, kk)
        model.add(work >= wb).only_enforce_if(active[k])
        has_rm = model.new_bool_var(f"hasr{k}")
        model.add(rm <= L * has_rm)
        model.add(work >= wf).only_enforce_if(has_rm)
        if zero3_in:
            assert zero3 is not None  # narrows for mypy; zero3_in == (zero3 is not None)
            z3l = coef(f"z3l{main:d}", [mode_sel(restrict_sp(t.z3l[g, main], 3)) for g in G],
                       idx7, n7, tu, kk)
            z3t = cb.product(model, nm, z3l, f"nmZ{k}")
            z3v = model.new_int_var(0, BT, f"z3t{k}")
            model.add(z3v == z3t).only_enforce_if(zero3)
            model.add(z3v == 0).only_enforce_if(zero3.negated())
            t_terms.append(z3v)
            z3f = coef(f"z3f{main:d}", [t.z3f[g, main] for g in G], idxz, nz, tu, kk)
            zf = model.new_int_var(0, BT, f"z3f{k}")
            model.add(zf >= z3f).only_enforce_if([zero3, active[k]])
            t_terms.append(zf)
        # first stage: dense prefix + embedding
        if is_first is not None:
            fx_terms: list[Any] = []
            fm_terms: list[Any] = []
            ft_terms: list[Any] = []
            fd_terms: list[Any] = []
            fo_terms: list[Any] = []
            fx_terms.append(coef("emb_act", edge(t.emb_act), idxe, ne, mu, kk))
            ft_terms.append(coef("emb_time", edge(t.emb_time), idxe, ne, tu, kk))
            fm_terms.append(coef("emb_states", [t.emb_states], idx4, n4, mu))
            fd_terms.append(coef("emb_dps", [t.emb_dpsync[g] for g in G], idx4, n4, tu, kk))
            fo_terms.append(coef("emb_opt", [t.emb_opt[g] for g in G], idx4, n4, tu, kk))
            if K and main:
                Ad = coef("act0", lay(False, "act"), idx6, n6, mu, kk)
                Cd = coef("ckpt0", lay5(False, "ckpt"), idx5l, n5l, mu, kk)
                kd = model.new_int_var(0, K, f"kd{k}")
                model.add(kd == K - rd)
                fx_terms += [cb.product(model, kd, Ad, f"kdA{k}"),
                             cb.product(model, rd, Cd, f"rdC{k}")]
                fm_terms.append(K * coef("states0", [t.states[False]], idx5, n5, mu))
                ft_terms += [K * coef("time0", lay(False, "time"), idx6, n6, tu, kk),
                             cb.product(model, rd, coef("rec0", lay5(False, "rec"), idx5l,
                                                        n5l, tu, kk), f"rdR{k}")]
                fd_terms.append(K * coef("dps0", [t.dpsync[g, False] for g in G], idx5, n5,
                                         tu, kk))
                fo_terms.append(K * coef("opt0", [t.opt[g, False] for g in G], idx5, n5, tu,
                                         kk))
                wb0 = coef("work0", lay(False, "work"), idx6, n6, mu, kk)
                wf0 = coef("workf0", lay5(False, "workf"), idx5l, n5l, mu, kk)
                model.add(work >= wb0).only_enforce_if(is_first)
                has_rd = model.new_bool_var(f"hasrd{k}")
                model.add(rd <= K * has_rd)
                model.add(work >= wf0).only_enforce_if([is_first, has_rd])
                if zero3_in:
                    ft_terms.append(K * coef("z3l0", [mode_sel(restrict_sp(t.z3l[g, False], 3))
                                                      for g in G], idx7, n7, tu, kk))
                    z3f0 = coef("z3f0", [t.z3f[g, False] for g in G], idxz, nz, tu, kk)
                    model.add(zf >= z3f0).only_enforce_if([zero3, is_first])
            for lst, tgt, nm_ in ((fx_terms, x_terms, "fx"), (fm_terms, mem_terms, "fm"),
                                  (ft_terms, t_terms, "ft"), (fd_terms, d_terms, "fd"),
                                  (fo_terms, o_terms, "fo")):
                hb = {"fx": BX, "fm": BM, "ft": BT, "fd": BD, "fo": BD}[nm_]
                fv = model.new_int_var(-hb, hb, f"{nm_}{k}")
                model.add(fv == sum(lst)).only_enforce_if(is_first)
                model.add(fv == 0).only_enforce_if(is_first.negated())
                tgt.append(fv)
        if k == 0:  # the last stage: LM head
            extra_mem = coef("head_act", edge(t.head_act), idxe, ne, mu, kk)
            mem_terms.append(extra_mem)
            hw = coef("head_work", edge(t.head_work), idxe, ne, mu, kk)
            model.add(work >= hw)
            t_terms.append(coef("head_time", edge(t.head_time), idxe, ne, tu, kk))
            mem_terms.append(coef("head_states", [t.head_states], idx4, n4, mu))
            d_terms.append(coef("head_dps", [t.head_dpsync[g] for g in G], idx4, n4, tu, kk))
            o_terms.append(coef("head_opt", [t.head_opt[g] for g in G], idx4, n4, tu, kk))
        # pipeline p2p on every active stage when pp > 1
        p2 = coef("p2p", [restrict_sp(t.p2p[g], 2) for g in G], idxp, npp, tu, kk)
        p2v = model.new_int_var(0, BT, f"p2p{k}")
        pp1 = ax["pp"].lit(1)
        on = [active[k]] + ([pp1.negated()] if pp1 is not None else [])
        model.add(p2v == p2).only_enforce_if(on)
        t_terms.append(p2v)
        model.add(sum(x_terms) == X)
        FX = cb.product(model, F_k, X, f"FX{k}")
        z3b = coef("z3buf", [t.z3], idxb, len(t.z3.ravel()), mu)
        mem_expr = Q * (sum(mem_terms) + work + z3b + other_u) + FX
        if hetero:
            assert gvars is not None
            capv = cb.lookup(model, gvars[k], cap_units, f"cap{k}")
            model.add(mem_expr <= Q * capv).only_enforce_if(active[k])
        else:
            model.add(mem_expr <= Q * cap_units[0]).only_enforce_if(active[k])
        tk = model.new_int_var(0, BT, f"t{k}")
        model.add(tk == sum(t_terms)).only_enforce_if(active[k])
        model.add(tk == 0).only_enforce_if(active[k].negated())
        times.append(tk)

        # upper bound of t_k: each product term is short by < one unit per count
        errs.append((layers[k] + rk[k] + 8, active[k]))
        dsum = model.new_int_var(0, BD, f"D{k}")
        model.add(dsum == sum(d_terms))
        tail_E.append((dsum, tk))
        opt_terms.append(sum(o_terms))
    # ------------------------------------------------------------------ objective
    hi = BT * (slots + 1)
    T = model.new_int_var(0, BT, "T")
    for tk in times:
        model.add(tk <= T)
    mval = model.new_int_var(min(t.m), max(t.m), "m")
    model.add(mval == ax["m"].value)
    MT = cb.product(model, mval, T, "mT")
    S = model.new_int_var(0, hi, "S")
    model.add(sum(times) == S)
    vppv = model.new_int_var(min(s.vpp), max(s.vpp), "vppv")
    model.add(vppv == ax["vpp"].value)
    Wb = model.new_int_var(0, hi, "bubble")
    Dv = model.new_int_var(0, hi, "S_minus_T")
    model.add(Dv == S - T)
    if len(s.vpp) == 1:  # a pinned vpp: floor division as two linear inequalities
        v1 = s.vpp[0]
        model.add(v1 * Wb <= Dv)
        model.add(Dv <= v1 * Wb + v1 - 1)
    else:
        model.add_division_equality(Wb, Dv, vppv)
    E = model.new_int_var(0, BD, "E")
    frac_num = int(math.floor(fx.DP_TAIL_FRACTION * 1000))
    bs_num = int(math.ceil(_backward_share() * 1000))
    overlap = fx.DEFAULT_OPTIONS.dp_overlap
    for k, (dsum, tk) in enumerate(tail_E):
        e_up, act_k = errs[k]
        if overlap:
            model.add(frac_num * dsum <= 1000 * E)
            model.add(1000 * dsum - bs_num * (tk + e_up) <= 1000 * E).only_enforce_if(act_k)
        else:
            model.add(dsum <= E)
    Oo = model.new_int_var(0, BD, "O")
    for o in opt_terms:
        model.add(o <= Oo)
    obj = model.new_int_var(0, max(t.m) * BT + hi + 2 * BD, "obj")
    model.add(obj == MT + Wb + E + Oo)
    model.minimize(obj)
    # error bound (seconds): per stage < (l + r + 8) units; m*T, bubble, E, O, division
    mmax = max(t.m)
    err = (mmax * (2 * L + 8) + (2 * L + 8 * slots) + 1 + 1.5 * (L + 8) + (L + 8)) * tu
    f = Formulation(model, ax, layers, r, gvars, obj, tu, err, slots)
    f.extra["time_unit_s"] = tu
    f.extra["mem_unit_bytes"] = mu
    proto = model.proto
    f.num_vars = len(proto.variables)
    f.num_constraints = len(proto.constraints)
    return f


def _backward_share() -> float:
    from autoparallel_cp.steptime import BACKWARD_SHARE

    return float(BACKWARD_SHARE)


def _time_unit(t: Tables) -> float:
    """Time resolution: 1e-7 s, coarsened so m * (largest stage time) stays below 2^50 units."""
    big = max(float(np.max(a)) for a in t.time.values()) * t.space.num_layers * 2
    mmax = max(t.m)
    tu = 1e-7
    while mmax * big / tu > 2**50:
        tu *= 2
    return tu
