"""Key-level CP-SAT master: a proven lower bound of the step time over all plans of a key.

A *key* is the choice of every plan axis (tp, cp, pp, dp, ep, vpp, sp, zero, mbs, micro-batch
count, recompute mode); the remaining decisions (layer count of each stage, recomputed layers,
node group of each stage) are the per-key partition problem solved by `cpsat_partition`.

The master has only the one-hot axes, the linear degree rules of `cpsat.add_axes` and one
literal per *reachable* value combination of a few axes (families N7, N5, NB below; each at
most the number of legal degree choices times |sp| x |mode| or |zero|, never whole plans).
Its objective LB(key) satisfies LB(key) <= exact step time of *every* plan of that key:

- pipeline = m*T + (S - T)/vpp with T = max_j t_j, S = sum_j t_j (design.md). Since m >= 1/vpp
  it grows with T, and T >= S/pp, T >= T_h, S >= S_lb, so pipeline >= m*V/pp + S_lb/vpp - V/(pp*vpp)
  with V = max(S_lb, L*Hu). S_lb sums every layer's time (cheapest node group) plus embedding and
  LM head; Hu = 1/sum_g(frac_g/u_g) is the harmonic per-layer time over the node groups (a stage
  of group g with l_j layers takes at least l_j*u_g, and group g holds a fraction frac_g of the
  stages; DualPipe's ranks average two stages: Hd <= Hu instead, search/model_scored.py
  `pair_harmonic`). With m = B/(dp*mbs) and dp*pp = N/(tp*cp), m*V/pp = B*tp*cp/(N*mbs) * V
  is a table over (tp, cp, ep, sp, mbs, mode).
- tail = max_j dp_exposed_j + max_j opt_j >= mean over stages of DP_TAIL_FRACTION*dsync_j and of
  opt_j: tables over (tp, ep, zero, dp, cp) (pp = N/(tp*cp*dp) there).
- Dropped terms (all >= 0): pipeline p2p, recompute replays.
- Second bound (DP overlap; LB = max of the two): exposed DP_j = max(DP_TAIL_FRACTION d_j,
  d_j - 2/3 t_j)
  >= d_j - 2/3 t_j, so max_j exposed_j >= D/pp - 2/3 S/pp (D, S: sums over stages); with
  T >= S/pp, m*T + (S - T)/vpp - 2/3 S/pp grows with T and then with S (its S coefficient
  (m - 2/3)/pp + (1 - 1/pp)/vpp > 0 for m >= 1), so step >= (m - 2/3) S_lb/pp + bubble
  + D_lb/pp + mean opt (+ (m - 2/3) x the ZeRO-3 gathers per stage). (m - 2/3)/pp depends on
  (tp, cp, dp, mbs): the N6 family carries dp (`N7`), so this stays linear in literals.
Rounding: every positive term is floored and the one subtracted term ceiled, so the integer
objective stays a lower bound. Memory: the sum over stages of the stage peaks must fit in the
sum of their capacities (each stage keeps >= 1 in-flight micro-batch of every layer's cheapest
activation choice) - a necessary condition, linear in tables over <= 6 axes.
Interleaving with m >= pp micro-batches that pp need not divide (Megatron's micro-batch groups of
N in [pp, m], `spec.plan.microbatch_group`): the time bounds above never use pp | m, and every
stage still holds >= 1 micro-batch of each of its chunks at its peak (its warm-up runs
(vpp - 1)*N >= vpp - 1 forwards, chunks 0..vpp-2 of the first group, and the first steady step
adds chunk vpp - 1 before any backward; `factors.stage_inflight` >= 1 for unequal chunks too), so
the memory condition holds as well; `tests/search` checks LB <= every such key's exact best.

Uneven layouts (the named layouts of `SearchSpace.split_families`: a key's plans are the union
of its families' splits) do not touch it either: no step above uses how the layers are split
(S_lb sums every layer, T >= S/pp and T >= the harmonic per-layer bound hold for any counts,
a chunk of 0 layers included), and every stage still holds >= 1 micro-batch of its layers at
its peak (`factors.stage_inflight` >= 1 for unequal chunks, above), so LB(key) bounds every
family's plans; the keys are `SearchSpace.degrees()`, whose split rule admits (pp, vpp) when
some family places the layers (tests/search: LB <= every key's exact best on spaces where only
a named layout places them).

The expert-TP size as a searched axis (`SearchSpace.etp_axis`, `Tables.variants`: one set of
factor tables per size, the keys the union of the sizes' keys, `SearchSpace.degrees`): a key's
plans are the union over the sizes under which it is legal. Every piece of LB is monotone in
its table (lb1, lb2 and the memory condition grow with mt6, s6, tail5, tail5x, ma6, ms5 and
shrink with V, since m >= 1 > 2/3), so the tables taken elementwise as the least over the sizes
(V the largest, the capacity the largest) give a value <= each size's own LB, hence <= the
exact step time of every plan of the key whatever its etp (`bound_tables`); the key listing
(`key_table`) reads the same combined tables.

Hybrid sharding's replicas as a searched axis (`SearchSpace.rep_axis`: 1 and, per key, the
replicas of a shard group of whole nodes) are variants too (`etp_variants` is the product of
the two axes). The replicas change only the tables over (tp, ep, zero, dp, cp) (states, DP
sync, optimizer, ZeRO-3 gathers, per-micro-batch gradient work: `tables._replica_tables`),
never the composition, and every factor stays >= 0, so each variant's own LB bounds its plans
as above. A variant R > 1 is legal only where R is the entry's replicas and zero >= 2
(`rep_ok`, `zero_ok`, `ep_ok`); its pieces are +inf elsewhere (`_replica_masked`), so the
elementwise least at an entry is over the variants legal there, the R = 1 variant (legal for
every key) among them: still <= each legal variant's piece, hence LB(key) <= every plan of
the key whatever its replicas, and finite (tests/search/test_hybrid_sharding_axis.py checks
LB <= every key's exact best with the axis). A pinned R (`--fix dp_replicate`) is one value
per space, every key takes it, and nothing is masked.

MoE parallel folding (`--fix etp`) does not touch this argument: the expert-TP size is one
value per search space, so the tables are the factor functions evaluated at it (the folded
layers' times, activations, expert states and expert-DP gradient sync) over the same axes, the
reachable combinations come from `SearchSpace.degrees` / `sp_ok` (etp*ep | tp*cp*dp, SP for a
folded tp > 1), and every step above uses only the composition and that the factors are >= 0,
never how a factor depends on an axis; the same holds for `key_bounds`. Tested against the
enumerator on folded spaces (tests/search/test_solver_vs_enumerate.py, test_cpsat_partition.py).

A pinned pipeline schedule (`--fix schedule`, search/schedule_axis.py: 1f1b, interleaved,
gpipe) does not touch it either: the bubble is (S - T)/vpp for all three (cost/steptime.py,
`bubble_ratio` 1), so the time bounds are the same, and GPipe holds all m >= 1 micro-batches
on every stage at its peak (torch `ScheduleGPipe`), so the ">= 1 in-flight micro-batch" of
the memory condition holds; `key_bounds` and the partition model read the schedule's own f_j
(tests/search/test_schedule_search.py: LB <= every GPipe plan's exact cost). ZB-H1 / ZB-H2
(bubble rho (S - T)/vpp, 0 <= rho <= 1 per key): m*T + rho (S - T)/vpp grows with T and S
and is >= m*T + rho' (S - T)/vpp for rho' <= rho, so the bubble term above times rho' = the
least rho of its (tp, cp, mbs, pp) family (`schedule_axis.family_ratio`) stays a lower bound
(in both LB1 and LB2, whose T and S coefficients stay positive); they hold >= 1 micro-batch
on every stage (schedule_axis.py's docstring; tests/search/test_zb_search.py).

Listing: the search takes every key's LB from `key_table` (this objective evaluated with numpy
for all keys at once, the same integers); `enumerate_keys` (CP-SAT's solution enumeration) is
the reference the tests compare it with, and the model itself serves the recommendation's
fallback (`recommend.simplest_within`).

Kept whole (about 545 lines): the master's literals, its two lower bounds and the key listing
read the same marginal tables; the bounds' proofs refer to the literals defined here.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autoparallel_cp.cost.factors import DP_TAIL_FRACTION
from autoparallel_cp.cost.steptime import BACKWARD_SHARE
from autoparallel_cp.search import cpsat_blocks as cb
from autoparallel_cp.search.cpsat_axes import add_axes
from autoparallel_cp.search.empty_rank import empty_first
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.model_scored import pair_harmonic
from autoparallel_cp.search.schedule_axis import BOUND_RATIO, family_ratio
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import RECOMPUTE_MODES

#: Axes whose values make up a key, in the order of `Key` tuples.
KEY_AXES = ("tp", "cp", "pp", "dp", "ep", "vpp", "sp", "zero", "mbs", "m", "mode")

#: Scale of the bubble products (Q/vpp and Q/(pp*vpp) are tabulated as integers).
Q = 1 << 16


@dataclass(frozen=True)
class Key:
    """One choice of every axis (mode is the index in RECOMPUTE_MODES)."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    vpp: int
    sp: int
    zero: int
    mbs: int
    m: int
    mode: int

    def order(self) -> tuple[int, ...]:
        """Deterministic tie-break order (matches Plan.key's leading fields)."""
        return (self.tp, self.pp, self.cp, self.dp, self.ep, self.vpp, self.sp, self.zero,
                self.mbs, self.mode)

    @property
    def recompute(self) -> str:
        return RECOMPUTE_MODES[self.mode]


@dataclass
class BoundTables:
    """The master's tables (seconds / bytes), see the module docstring."""

    mt6: np.ndarray  # m*V/pp over (tp, cp, ep, sp, mbs, mode)
    s6: np.ndarray  # S_lb
    v6: np.ndarray  # V = max(S_lb, L*Hu)
    ma6: np.ndarray  # sum over layers of the cheapest activation + embedding/head activations
    tail5: np.ndarray  # over (tp, ep, zero, dp, cp)
    ms5: np.ndarray  # model states of all layers + edges + pp * ZeRO-3 buffers
    cap_avg: float  # stage-weighted mean capacity minus the constant allocations
    tail5x: np.ndarray  # (mean DP sync + mean optimizer + (m - 2/3) ZeRO-3 gathers) per stage


def _sel(t: Tables) -> tuple[list[int], list[int]]:
    s = t.space
    return [v for v in (0, 1) if v in s.sp], [RECOMPUTE_MODES.index(x) for x in s.recompute]


def bound_tables(t: Tables) -> BoundTables:
    """Tabulate LB's pieces from the cost model's factor tables (numpy, no plan lists); with
    several expert-TP sizes searched (`Tables.variants`), each piece the least over the sizes
    (V, the subtracted one, the largest): the module docstring's union argument."""
    if t.variants:
        bts = [_replica_masked(_bound_tables(v), v) for v in t.variants]

        def lo(name: str) -> np.ndarray:
            return np.minimum.reduce([getattr(b, name) for b in bts])

        return BoundTables(mt6=lo("mt6"), s6=lo("s6"),
                           v6=np.maximum.reduce([b.v6 for b in bts]), ma6=lo("ma6"),
                           tail5=lo("tail5"), ms5=lo("ms5"),
                           cap_avg=max(b.cap_avg for b in bts), tail5x=lo("tail5x"))
    return _bound_tables(t)


def with_capacity(b: BoundTables, t: Tables) -> BoundTables:
    """`b` with the capacity mean of `t` (tables of the same space at another memory
    headroom, `tables.with_capacity`): the only piece that reads the capacity, computed as
    `_bound_tables` does."""
    job = t.space.job
    fr = [g.num_gpus / job.num_gpus for g in job.cluster.node_groups]
    return replace(b, cap_avg=sum(f * c for f, c in zip(fr, t.capacity, strict=True))
                   - t.other)


def _replica_masked(b: BoundTables, t: Tables) -> BoundTables:
    """A replicas variant's (R > 1) pieces over (tp, ep, zero, dp, cp) set to +inf where R
    is not that entry's (`SearchSpace.rep_ok`, `zero_ok`, the expert grid `ep_ok`): no
    plan of those keys has R, and the R = 1 variant, legal for every key, keeps the least
    finite (a pinned R is left as it is: no R = 1 variant, and every key takes R). Only
    the pieces over dp read R (the state, sync and ZeRO-3 tables)."""
    s = t.space
    if s.dp_replicate == 1 or "dp_replicate" in s.fixed:
        return b  # a pinned R: every variant has it, and every key of the space takes it
    legal = np.zeros((len(s.tp), len(s.ep), len(s.zero), len(t.dp), len(s.cp)), bool)
    for (i, tp), (j, dp), (c, cp) in itertools.product(enumerate(s.tp), enumerate(t.dp),
                                                       enumerate(s.cp)):
        if not s.rep_ok(tp, cp, dp):
            continue
        for e, ep in enumerate(s.ep):
            if s.ep_ok(tp, cp, dp, ep):
                legal[i, e, :, j, c] = [s.zero_ok(z) for z in s.zero]

    def m(a: np.ndarray) -> np.ndarray:
        mask = legal.reshape(legal.shape + (1,) * (a.ndim - legal.ndim))
        return np.where(mask, a, np.inf)

    return replace(b, tail5=m(b.tail5), ms5=m(b.ms5), tail5x=m(b.tail5x))


def _bound_tables(t: Tables) -> BoundTables:
    """`bound_tables` of one expert-TP size."""
    s = t.space
    job = s.job
    L = s.num_layers
    N = job.num_gpus
    B = job.global_batch
    K = t.dense_prefix
    main = t.main_kind
    counts = [(main, L - K), (False, K)] if (K and main) else [(main, L)]
    G = range(t.groups)
    sp_sel, mode_sel = _sel(t)
    fr = [g.num_gpus / N for g in job.cluster.node_groups]

    def r6(a: np.ndarray) -> np.ndarray:
        return np.take(np.take(a, sp_sel, axis=3), mode_sel, axis=5)

    def r4(a: np.ndarray) -> np.ndarray:  # (tp, cp, sp, mbs) -> 6 axes
        a = np.take(a, sp_sel, axis=2)
        return a[:, :, None, :, :, None]

    tau = [sum(c * r6(t.time[g, k]) for k, c in counts if c) for g in G]
    u = [np.minimum.reduce([r6(t.time[g, k]) for k, c in counts if c]) for g in G]
    edge = [r4(t.emb_time[g] + t.head_time[g]) for g in G]
    s6 = np.minimum.reduce([tau[g] + edge[g] for g in G])
    hu = (pair_harmonic(fr, u, s.pp) if s.schedule == "dualpipe"  # a rank runs two stages
          else 1.0 / sum(fr[g] / np.maximum(u[g], 1e-30) for g in G))
    v6 = np.maximum(s6, L * hu) if t.groups > 1 else s6
    tp = np.array(s.tp, float).reshape(-1, 1, 1, 1, 1, 1)
    cp = np.array(s.cp, float).reshape(1, -1, 1, 1, 1, 1)
    mbs = np.array(s.mbs, float).reshape(1, 1, 1, 1, -1, 1)
    mt6 = (B * tp * cp / (N * mbs)) * v6
    # activations: cheapest per layer (full mode may keep only the checkpoint)
    ma = []
    for g in G:
        tot: float | np.ndarray = 0.0
        for k, c in counts:
            if not c:
                continue
            act = r6(t.act[g, k])
            ck = np.take(t.ckpt[g, k], sp_sel, axis=3)[..., None]
            full = np.array([m == 2 for m in mode_sel]).reshape(1, 1, 1, 1, 1, -1)
            tot = tot + c * np.where(full, np.minimum(act, ck), act)
        ma.append(tot + r4(t.emb_act[g] + t.head_act[g]))
    ma6 = np.minimum.reduce(ma)
    # (tp, ep, zero, dp, cp) tables
    tp5 = np.array(s.tp, float).reshape(-1, 1, 1, 1, 1)
    dp5 = np.array(t.dp, float).reshape(1, 1, 1, -1, 1)
    cp5 = np.array(s.cp, float).reshape(1, 1, 1, 1, -1)
    pp5 = N / (tp5 * cp5 * dp5)

    def e4(a: np.ndarray) -> np.ndarray:  # (tp, zero, dp, cp) -> 5 axes
        return a[:, None, :, :, :]

    tails = []
    for g in G:
        dsync = sum(c * t.dpsync[g, k] for k, c in counts if c) + e4(
            t.emb_dpsync[g] + t.head_dpsync[g]) + pp5 * e4(t.dps_fixed[g])
        opt = sum(c * t.opt[g, k] for k, c in counts if c) + e4(t.emb_opt[g] + t.head_opt[g])
        tails.append((DP_TAIL_FRACTION * dsync + opt) / pp5)
    tail5 = np.minimum.reduce(tails)[..., None]

    def gmin(tab: dict[Any, np.ndarray], k: Any = None) -> np.ndarray:
        return np.minimum.reduce([tab[g] if k is None else tab[g, k] for g in G])

    # the whole DP sync and optimizer sums (each piece at its cheapest node group), per stage
    dsync_all = sum(c * gmin(t.dpsync, k) for k, c in counts if c) + e4(
        gmin(t.emb_dpsync) + gmin(t.head_dpsync)) + pp5 * e4(gmin(t.dps_fixed))
    opt_all = sum(c * gmin(t.opt, k) for k, c in counts if c) + e4(
        gmin(t.emb_opt) + gmin(t.head_opt))
    tail5x = ((dsync_all + opt_all) / pp5)[..., None]
    # ZeRO-3: every micro-batch re-gathers each layer's weights; the part not hidden behind the
    # layer's compute (z3l, least over sp and mode) adds to every stage time, so m*S/pp grows by
    # m*(sum over layers of z3l)/pp + m*(first-layer gather)  -> over (tp, ep, zero, dp, cp, mbs)
    if 3 in s.zero:
        mb5 = np.array(s.mbs, float).reshape(1, 1, 1, 1, 1, -1)
        m5 = B / (dp5[..., None] * mb5)
        zs = []
        for g in G:
            per: float | np.ndarray = 0.0
            hi: float | np.ndarray = 0.0
            lo: float | np.ndarray = math.inf
            for k, c in counts:
                if not c:
                    continue
                z = np.take(t.z3l[g, k], sp_sel, axis=3)
                z = np.take(z, mode_sel, axis=5).min(axis=(3, 5))  # (tp, cp, ep, mbs, dp)
                per = per + c * z
                hi, lo = np.maximum(hi, t.z3f[g, k]), np.minimum(lo, t.z3f[g, k])
            # first gathers: a stage pays its largest kind's (tables.stage_cost); some stage
            # holds the largest kind and every other holds a layer (or, pinned, none), so the
            # stages' mean is >= (hi + (pp-1) lo)/pp = lo + (hi - lo)/pp (hi at pp = 1; the
            # hi alone at every pp was not a bound: tests/search/test_zero3_first_gather_bound)
            if "stage_layers" in s.fixed and min(s.fixed["stage_layers"]) < 1:
                lo = 0.0 * np.asarray(hi)
            # a V's rank 0 may hold none (empty_rank.py): the mean >= (hi + (pp-2) lo)/pp
            lo2 = (2.0 if empty_first(s) else 1.0) * np.asarray(lo)
            per = np.transpose(np.asarray(per), (0, 2, 4, 1, 3))  # (tp, ep, dp, cp, mbs)
            hi = np.transpose(np.asarray(hi), (0, 2, 3, 1))[..., None]  # (tp, ep, dp, cp, 1)
            lo = np.transpose(np.asarray(lo), (0, 2, 3, 1))[..., None]
            lo2 = np.transpose(lo2, (0, 2, 3, 1))[..., None]
            zs.append((per[:, :, None] + (hi - lo2)[:, :, None]) / pp5[..., None]
                      + lo[:, :, None])
        zb = np.minimum.reduce(zs)
        is3 = (np.array(s.zero) == 3).reshape(1, 1, -1, 1, 1, 1)
        tail5 = tail5 + np.where(is3, zb * m5, 0.0)
        tail5x = tail5x + np.where(is3, zb * (m5 - BACKWARD_SHARE), 0.0)
    else:
        tail5 = np.broadcast_to(tail5, tail5.shape[:-1] + (len(s.mbs),))
        tail5x = np.broadcast_to(tail5x, tail5x.shape[:-1] + (len(s.mbs),))
    # gradient work after every micro-batch (mbl: ZeRO-2's per-micro-batch reduce-scatter,
    # the fp32 accumulation passes; factors.microbatch_grad_factors) is in every stage time
    # like the ZeRO-3 gathers: m x (its sum over layers and edges)/pp at the cheapest group
    mbw = B / (dp5[..., None] * np.array(s.mbs, float).reshape(1, 1, 1, 1, 1, -1))
    work = np.minimum.reduce([sum(c * t.mbl[g, k] for k, c in counts if c)
                              + e4(t.emb_mb[g] + t.head_mb[g]) for g in G])
    w5 = (work / pp5)[..., None]
    tail5 = tail5 + w5 * mbw
    tail5x = tail5x + w5 * (mbw - BACKWARD_SHARE)
    ms5 = (sum(c * t.states[k] for k, c in counts if c) + e4(t.emb_states + t.head_states)
           + pp5 * t.z3[:, :, :, None, None])[..., None] + np.zeros(len(s.mbs))
    cap_avg = sum(f * c for f, c in zip(fr, t.capacity, strict=True)) - t.other
    return BoundTables(mt6, s6, v6, ma6, tail5, ms5, cap_avg, tail5x)


@dataclass
class Master:
    """The built master model and handles to read keys back."""

    model: cp_model.CpModel
    axes: dict[str, cb.Axis]
    objective: cp_model.IntVar
    unit_s: float  # seconds per objective unit
    bounds: BoundTables

    def key_of(self, value: Any) -> Key:
        """The key of the current solution; `value(lit) -> bool` reads a literal."""
        vals = {}
        for a in KEY_AXES:
            ax = self.axes[a]
            vals[a] = next(v for v, b in zip(ax.values, ax.lits, strict=True) if value(b))
        return Key(**vals)

    def key_lits(self, key: Key) -> list[cp_model.IntVar]:
        """The literals that select `key`."""
        out = []
        for a in KEY_AXES:
            lit = self.axes[a].lit(getattr(key, a))
            assert lit is not None
            out.append(lit)
        return out


N6 = ("tp", "cp", "ep", "sp", "mbs", "mode")
N5 = ("tp", "ep", "zero", "dp", "cp", "mbs")
N7 = N6 + ("dp",)
NB = ("tp", "cp", "mbs", "pp", "vpp")


def reachable_bubble(t: Tables) -> set[tuple[int, ...]]:
    """(tp, cp, mbs, pp, vpp) combinations that some legal degree choice reaches."""
    return {(d.tp, d.cp, d.mbs, d.pp, d.vpp) for d in t.space.degrees()}


def reachable(t: Tables) -> tuple[set[tuple[int, ...]], set[tuple[int, ...]]]:
    """Axis-value combinations of the N6 and N5 tables that some legal degree choice reaches."""
    s = t.space
    modes = [RECOMPUTE_MODES.index(x) for x in s.recompute]
    r6: set[tuple[int, ...]] = set()
    r5: set[tuple[int, ...]] = set()
    for d in s.degrees():
        for sp in s.sp:
            if not s.key_legal(d.tp, d.cp, d.dp, d.ep, sp):
                continue
            for mo in modes:
                r6.add((d.tp, d.cp, d.ep, sp, d.mbs, mo))
        for z in s.zero:
            r5.add((d.tp, d.ep, z, d.dp, d.cp, d.mbs))
    return r6, r5


def reachable7(t: Tables) -> set[tuple[int, ...]]:
    """(tp, cp, ep, sp, mbs, mode, dp) combinations that some legal degree choice reaches."""
    s = t.space
    modes = [RECOMPUTE_MODES.index(x) for x in s.recompute]
    out: set[tuple[int, ...]] = set()
    for d in s.degrees():
        for sp in s.sp:
            if s.key_legal(d.tp, d.cp, d.dp, d.ep, sp):
                out.update((d.tp, d.cp, d.ep, sp, d.mbs, mo, d.dp) for mo in modes)
    return out


def combo_literals(model: cp_model.CpModel, ax: dict[str, cb.Axis], names: Sequence[str],
                   combos: set[tuple[int, ...]]) -> dict[tuple[int, ...], cp_model.IntVar]:
    """One literal per reachable value combination of `names`, tied to the axes' one-hots.

    Exactly one combination is chosen and, for every axis value, the combinations holding it
    sum to that value's literal: the LP relaxation then matches every axis marginal, far
    tighter than an element constraint on a mixed-radix index.
    """
    xs = {c: model.new_bool_var("c" + "_".join(map(str, c))) for c in sorted(combos)}
    model.add_exactly_one(xs.values())
    for d, a in enumerate(names):
        for v, lit in zip(ax[a].values, ax[a].lits, strict=True):
            model.add(sum(x for c, x in xs.items() if c[d] == v) == lit)
    return xs


def _at(t: Tables, arr: np.ndarray, names: Sequence[str], combo: tuple[int, ...]) -> float:
    idx = []
    for a, v in zip(names, combo, strict=True):
        if a == "dp":
            idx.append(t.dp.index(v))
        elif a == "mode":
            idx.append([RECOMPUTE_MODES.index(x) for x in t.space.recompute].index(v))
        elif a == "sp":
            sp_vals: list[int] = [x for x in (0, 1) if x in t.space.sp]
            idx.append(sp_vals.index(v))
        else:
            idx.append(getattr(t.space, a).index(v))
    return float(arr[tuple(idx)])


def build_master(t: Tables, time_unit: float = 1e-6) -> Master:
    """Build the master model over the tables' space (module docstring)."""
    bt = bound_tables(t)
    model = cp_model.CpModel()
    ax = add_axes(model, t)
    tu = time_unit
    mu = 1024.0
    _, r5 = reachable(t)
    # one literal per reachable (tp, cp, ep, sp, mbs, mode, dp): dp fixes pp and m, so the
    # overlap bound below is linear in these literals (no enforcement, no products)
    x7 = combo_literals(model, ax, N7, reachable7(t))
    x6 = {c: x for c, x in x7.items()}  # N6 tables are read at c[:6]
    x5 = combo_literals(model, ax, N5, r5)

    def lin(xs: dict[tuple[int, ...], cp_model.IntVar], arr: np.ndarray, names: Sequence[str],
            unit: float, up: bool = False) -> Any:
        rnd = math.ceil if up else math.floor
        n = len(names)
        return sum(int(rnd(_at(t, arr, names, c[:n]) / unit)) * x for c, x in xs.items())

    mt = lin(x6, bt.mt6, N6, tu)
    tail = lin(x5, bt.tail5, N5, tu)
    # bubble >= max(0, S_lb - V/pp)/vpp with S_lb at its least and V at its largest over the
    # axes (ep, sp, mode) that the (tp, cp, mbs, pp, vpp) family does not hold
    s_min = bt.s6.min(axis=(2, 3, 5))
    v_max = bt.v6.max(axis=(2, 3, 5))
    xb = combo_literals(model, ax, NB, reachable_bubble(t))
    bub: int | cp_model.LinearExpr = 0
    for (tp_, cp_, mb_, p_, v_), x in xb.items():
        i = (t.space.tp.index(tp_), t.space.cp.index(cp_), t.space.mbs.index(mb_))
        val = max(0.0, float(s_min[i]) - float(v_max[i]) / p_) / v_
        if t.space.schedule in BOUND_RATIO:  # x the family's least rho (schedule_axis.py)
            val = val * family_ratio([v.space for v in t.variants] or [t.space], tp_, cp_,
                                     mb_, p_)
        bub = bub + int(math.floor(val / tu)) * x
    hi = int((float(np.max(bt.mt6)) + float(np.max(s_min)) + max(float(np.max(bt.tail5)),
                                                                   float(np.max(bt.tail5x))))
             / tu) + 3
    obj = model.new_int_var(0, hi, "LB")
    lb1 = model.new_int_var(0, hi, "LB_tail")
    model.add(lb1 == mt + bub + tail)
    # second bound, with the DP overlap: E >= mean_j (dsync_j - 2/3 t_j) = D/pp - 2/3 S/pp, and
    # m*T + (S - T)/vpp - 2/3 S/pp grows with T >= S/pp and then with S, so the step time is
    # >= (m - 2/3) S_lb/pp + bubble + D/pp + mean opt. (m - 2/3)/pp is fixed by (dp, mbs, tp,
    # cp): one linear expression over the N6 family per dp value, enforced by its literal
    lb2 = model.new_int_var(0, hi, "LB_overlap")
    terms = []
    for c, x in x7.items():
        tp_, cp_, _, _, mb_, _, d = c
        p_ = t.space.job.num_gpus // (tp_ * cp_ * d)
        m_ = t.space.job.global_batch // (d * mb_)
        v = (m_ - BACKWARD_SHARE) * _at(t, bt.s6, N6, c[:6]) / p_
        terms.append(int(math.floor(v / tu)) * x)
    model.add(lb2 == sum(terms) + bub + lin(x5, bt.tail5x, N5, tu))
    model.add_max_equality(obj, [lb1, lb2])
    # memory: sum of stage peaks <= sum of stage capacities (necessary condition)
    cap_u = int(math.ceil(bt.cap_avg / mu))
    model.add(lin(x5, bt.ms5, N5, mu) + lin(x6, bt.ma6, N6, mu) <= cap_u * ax["pp"].value)
    model.minimize(obj)
    return Master(model, ax, obj, tu, bt)


class ListingCut(Exception):
    """The key listing ran out of budget before it was complete."""


class _Collector(cp_model.CpSolverSolutionCallback):
    def __init__(self, master: Master, cap: int):
        super().__init__()
        self._m = master
        self._cap = cap
        self.found: dict[Key, int] = {}
        self.hit_cap = False

    def on_solution_callback(self) -> None:
        k = self._m.key_of(self.boolean_value)
        self.found[k] = int(self.value(self._m.objective))
        if len(self.found) >= self._cap:
            self.hit_cap = True
            self.stop_search()


def enumerate_keys(master: Master, lo_units: int | None, hi_units: int, *, cap: int = 20000,
                   time_limit: float | None = None, budget: Budget | None = None
                   ) -> tuple[list[tuple[int, Key]], bool]:
    """Every key with lo < LB <= hi (LB in objective units), sorted by (LB, key order).

    Runs CP-SAT's solution enumeration on a copy of the master without objective, within
    `budget` (deterministic time; default `Budget(time_limit)`); returns the keys and whether
    `cap` stopped it early. Raises `ListingCut` when the budget ran out before the listing was
    complete (a partial list must not be taken for the whole window).
    """
    m = master.model.clone()
    m.clear_objective()
    obj = m.get_int_var_from_proto_index(master.objective.index)
    if lo_units is not None:
        m.add(obj >= lo_units + 1)
    m.add(obj <= hi_units)
    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    # no LP while listing: every key in the window is wanted, so bounds do not prune and the LP
    # only slows each step (about 5x on the benchmark masters)
    solver.parameters.linearization_level = 0
    # no presolve either: with it, CP-SAT 9.15 listed 459 of the 467 keys with LB <= 5.6 s on
    # llama3-405b / 16,384 H100 (each missing key's LB checked by a pinned solve), which would
    # void the certificate; without it the listing is complete and as fast
    solver.parameters.cp_model_presolve = False
    # listing is propagation-bound: the fixed branching order over the one-hot axes, without
    # SAT inprocessing and symmetry detection between solutions, lists the same keys about 2.5x
    # faster on the MoE master (404 keys of deepseek-v3 / 2,048 H800: 1.2 s instead of 2.9-3.7 s)
    solver.parameters.search_branching = cp_model.FIXED_SEARCH
    solver.parameters.use_sat_inprocessing = False
    solver.parameters.symmetry_level = 0
    col = _Collector(master, cap)
    st = (budget or Budget(time_limit)).solve(solver, m, col)
    if not col.hit_cap and st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE):
        raise ListingCut(len(col.found))
    out = sorted(((v, k) for k, v in col.found.items()), key=lambda x: (x[0], x[1].order()))
    return out, col.hit_cap
