"""Free per-rank layer counts under ZBV / DualPipeV (issue 31, "one space"), searched exactly,
on one node group or several:
the replayed pipeline term as a max of longest-path cuts in the per-key CP-SAT model, and the
exact loop that scores the model's candidates with the cost model.

What the model encodes (cost/schedules.py `simulated_bubble`, cost/pipeline_sim.py
`makespan`, torch v2.13.0 `ScheduleZBVZeroBubble` / `ScheduleDualPipeV`): a V plan's
pipeline term is m·T + max(span(t) - m'·T, 0) with t_r rank r's per-micro-batch time, T the
largest, m' = `sim_microbatches(p, m)` and span(t) the end of the last step when every rank
runs its step list (`v_orders`) in order, each step when its rank is free and its inputs are
ready (`dependencies`), an action of kind k on either of rank r's two chunks taking
s_k·t_r/2 with (s_F, s_I, s_W) the key's split (`schedule_axis.key_split`). The replay reads
the ranks' times only, so a V plan's step time and memory (`inflight_units`: whole-rank units)
depend on the per-rank layer counts l_r, not on how a rank splits them between its chunks:
the free family holds every l_r a multiple of vpp = 2, >= 2 (rank 0 >= 0 where it may be
empty: search/empty_rank.py), equal chunks (`SearchSpace.free_ok`), and the per-key
partition model (cpsat_partition.py `build_partition`) already has each rank's time t_r as
an integer (floored) expression of them, its memory, DP tail and optimizer terms.

The encoding (`replay_pipeline`, `ReplayCuts`): span(t) is the longest path through the
step DAG (pipeline_sim.py `Dag`: each rank's list in order, plus the data dependencies), each
step lasting the sum of its actions' s_k·t_r/2. Each path P is a set of actions, so its length
is Σ_r Σ_k n_{P,r,k}·s_k·t_r/2 with n_{P,r,k} the path's actions of kind k on rank r, linear
in t with coefficients >= 0: span(t) = max over paths, convex. The model holds span >= the
length of every path added so far, in integers c_k = floor(s_k·Q/2) (units tu/Q), and
pipeline = span + Q·(m - m')·T. Its first paths: each rank's own list (consecutive steps: a
path, of length m'·t_r) and a longest path at equal ranks and with each rank in turn the
slowest (`pipeline_sim.critical_path`); the paths found by earlier keys of the same tables
(any path is a path of every key of that (schedule, pp, m'): only the durations differ).
A full per-step encoding (one completion time per step, 6·m'·p steps) is the same bound with
every path, but CP-SAT took 16-209 s per Llama 3 70B pp 8 key on it; the cuts take
milliseconds (RESULTS).

Lower bound (every plan of the family, exact float cost): each added path is a path of the
DAG, so its length at the exact times is <= the exact span; c_k·t_r/Q <= s_k·t_r^exact/2
(both floored); T·tu <= the exact T; m >= m'; and max(span - m'T, 0) >= span - m'T, so
m·T + max(...) >= span + (m - m')·T: the model's pipeline term is <= the exact one, and the
tail terms are cpsat_partition's (<= the exact ones). Once the cuts hold a split's own longest
path, its pipeline term is short by < m'·p·per + (m - m')·per + 6·m'·p·BT/Q units (each action
loses < t_r/Q to its coefficient's floor and s_a/2 x the < per-unit floor of t_r; Σ over the
actions of s_a/2 is m'·p; per = 2L + 15, BT the bound on a rank's time).

Exactness (`solve_free`): the model's objective is a lower bound of every plan's exact step
time, so the loop takes the model's best, scores it with `tables.plan_cost` (the enumerator's
composition, bit for bit), adds its own longest path at its exact times, forbids it, and adds
objective <= the best exact time so far (plus one unit: an exact tie stays in), until CP-SAT
proves the rest infeasible. Every partition whose exact time is <= the returned one has then
been scored, so the returned plan is the family's exact best, ties to the smallest
`stage_layers` (the enumerator's partition order, search/enumerate_axes.py `partitions`).
Each round draws on the search's `limits.Budget` (deterministic time); if it or `ROUNDS_MAX`
runs out the best so far is returned, unproven, with its gap to the model's bound as error
bound. No pp cap is needed on one node group: the model has O(pp) variables and one cut
per path found; a longest path costs one pass over the DAG (Llama 3 70B,
`--fix schedule=zbv,pp=32`: 0.6 s).

Several node groups (issue 31, "one space"; at the pp with at most `PLACEMENTS_MAX` stage
placements, schedule_axis.py `placement_capped`): the stage placement is a decision of the
same model, cpsat_partition's group selectors y_rg (one group per rank, group g holding
gpus_g·pp/N ranks, or the pinned `stage_groups`: exactly the placements the enumerator scans,
enumerate_axes.py `placements`), and rank r's counts sit on its group, so t_r is the floored
time of its layers, edges and constants on that group's tables (<= the exact t_r of the
plan with that placement, as for 1F1B on several groups). The cuts need nothing more: the
DAG and its paths depend on (schedule, p, m') only, and each path's length is linear in the
rank times with coefficients >= 0, so it is <= span(t) for the exact t of every
(split, placement). Every other step of the bound above is per rank, so the objective at a
(split, placement) is <= its exact step. The exact loop forbids (counts, r, placement)
together (`PartitionModel.forbid`) and scores each candidate with its `stage_groups`
(`tables.plan_cost`), so the stopping rule covers every (split, placement); ties go to the
least `Plan.key()` (r, then `stage_layers`, then `stage_groups`: the enumerator's order,
recompute option, partition, placement, each lexicographic). The cost-model-scored keys
below score each split over all its placements at once (`model_scan.best_of_split`) and
forbid the split whatever its placement; the model's least objective over a split's
placements is <= the least exact step over them. tests/search/test_replay_free_multi.py
checks the bound on every (split, placement) and CP-SAT against the enumerator on two groups.

Scored by the cost model (`replay_axis.scored_free`: a DualPipeV hiding EP all-to-all, whose
hidden share h(m) no table holds; search/model_scored.py): the model is built from the same
tables, which hold each layer's time at a hidden share of 1 (`hidden_lb`), so every rank time
the model reads is <= the plan's exact t_r at its m (the DP-sync, optimizer and memory tables
are the plan's: the share moves no byte and no sync), and T <= the exact T. The bound still
holds: the span is a max of path lengths, each linear in t with coefficients >= 0, so the
model's span <= span(t_exact); m >= m', so (m - m')·T <= (m - m')·T_exact; the exposed DP
sync, max(DTF·d_r, d_r - bs·t_r) per rank, falls as t_r grows, so the model takes it against
T + 2L + nc units (>= every rank's table time: each floored t_r <= T is < 2L + nc units
short, cpsat_partition.py) where m - m' >= bs: then
(m - m')·T + max_r max(DTF·d_r, d_r - bs·T) is nondecreasing in T (each branch's slope is
m - m' or m - m' - bs >= 0) and <= its value at T_exact, which is <= the exact
(m - m')·T_exact + max_r exposed_r since t_r <= T_exact; where m - m' < bs (m <= 8p) only
E >= DTF·d_r, <= every exposed_r. So objective <= the exact step of every plan of the split.
Each split the model proposes is scored by `model_scan.best_of_split` (over its recompute
counts and placements, the enumerator's scoring; each plan scored charges
`limits.MODEL_PLAN_DTIME`), forbidden whatever its recompute count, and the best kept as the
least (step, `Plan.key()`), the enumerator's order for model-scored keys; the stopping rule
above is unchanged. tests/search/test_vhide_free_split.py checks the bound on every split.

The bounds that order and skip keys stay valid for the free family (search/solve.py's
stopping rule needs every bound <= every plan of its key): the per-key bounds
(key_bounds.py) take rho' = 0 (`bubble_divisor` infinite), so they compose m·T + tail over the
stage positions, each position's own edge terms (the head at `head_position` 0): every step of
`key_bound`'s proof is over any per-position layer counts that are multiples of vpp, so it
holds for the free V partitions, and m·T + tail <= the exact pipeline + tail since the
replayed bubble is >= 0. The master (cpsat_master.py) sums every layer and both edges
wherever they sit (S_lb), T >= S/pp, needs >= 1 micro-batch in flight per stage (min(p, m)
or min(p + 1/2, m) >= 1 here) and takes the bubble term times rho' = 0: none of it reads the
partition, so it bounds every free split too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from autoparallel_cp.cost.path_batch import critical_steps
from autoparallel_cp.cost.pipeline_sim import critical_path, v_dag
from autoparallel_cp.cost.schedules import sim_microbatches
from autoparallel_cp.search import limits
from autoparallel_cp.search.cpsat_portfolio import REPLAY_PORTFOLIO, solve_portfolio
from autoparallel_cp.search.limits import Budget
from autoparallel_cp.search.replay_axis import scored_free
from autoparallel_cp.search.tables import Tables, plan_cost
from autoparallel_cp.spec.plan import Plan, canonical

#: Fixed-point scale of an action's share of its rank's time (lowered for huge models)
DUR_SCALE = 1 << 16
#: Most rounds (model solves) of one key's exact loop before it returns unproven
ROUNDS_MAX = 200

Counts = tuple[tuple[int, int, int], ...]  # per rank: the path's F, I, W actions


@dataclass
class ReplayCuts:
    """The replayed span of one key's model: span >= every path's length added so far
    (`add`), each a valid lower bound of the span (module docstring)."""

    model: cp_model.CpModel
    span: Any
    times: Sequence[Any]
    coef: tuple[int, int, int]  # floor(s_k·Q/2) for F, I, W
    schedule: str
    pp: int
    msim: int
    split: tuple[float, float, float]
    paths: set[Counts] = field(default_factory=set)  # the paths added (each once)

    def add(self, counts: Counts) -> None:
        """span >= the path of `counts`: Σ_r Σ_k n_rk·c_k·t_r, the ranks the path does not
        visit (a zero weight, 0·t_r: no term of the constraint) left out of the sum."""
        if counts in self.paths:
            return
        self.paths.add(counts)
        f, i, w = self.coef
        self.model.add(self.span >= sum(
            k * t for k, t in zip([a * f + b * i + c * w for a, b, c in counts], self.times,
                                  strict=True) if k))

    def path_at(self, rank_times: Sequence[float]) -> Counts:
        """The counts of a longest path when rank r takes `rank_times[r]` (the replay's
        durations: each action of kind k s_k·t_r/2, `simulated_bubble`), `_path_counts`."""
        return _path_counts(self.schedule, self.pp, self.msim, tuple(map(float, self.split)),
                            tuple(map(float, rank_times)))

    def seeds(self) -> list[Counts]:
        """`path_at` with each rank in turn the slowest (1.25, the others 1.0), rank 0
        first (`_seed_counts`)."""
        return list(_seed_counts(self.schedule, self.pp, self.msim,
                                 tuple(map(float, self.split))))


@functools.lru_cache(maxsize=4096)
def _path_counts(schedule: str, p: int, msim: int, split: tuple[float, ...],
                 rank_times: tuple[float, ...]) -> Counts:
    """`ReplayCuts.path_at`, memoized (a function of these arguments: keys of one pp and
    split share the seeds, and the exact loops meet the same rank times again)."""
    return _counts(p, critical_path(v_dag(schedule, p, msim), _dur(p, split, rank_times)))


@functools.lru_cache(maxsize=256)
def _seed_counts(schedule: str, p: int, msim: int, split: tuple[float, ...]
                 ) -> tuple[Counts, ...]:
    """`_path_counts` at each seed's rank times (`ReplayCuts.seeds`), the p paths replayed
    together (cost/path_batch.py `critical_steps`: the same chains as `critical_path`)."""
    dag = v_dag(schedule, p, msim)
    durs = [_dur(p, split, tuple(1.25 if j == r else 1.0 for j in range(p))) for r in range(p)]
    # each step shape's F, I, W actions (B: an I and a W), added up per rank along each chain
    per = np.array([[sum(dag.uniq[k][0] in kinds for k in ks) for kinds in ("F", "IB", "WB")]
                    for ks in dag.shapes], np.int64).reshape(-1, 3)
    rank, shape = np.array(dag.rank, np.int64), np.array(dag.shape, np.int64)
    out: list[Counts] = []
    for steps in critical_steps(dag, durs):
        if isinstance(steps, list):
            out.append(_counts(p, steps))
            continue
        n = np.zeros((p, 3), np.int64)
        np.add.at(n, rank[steps], per[shape[steps]])
        out.append(tuple((f, i, w) for f, i, w in n.tolist()))
    return tuple(out)


def _dur(p: int, split: tuple[float, ...], rank_times: tuple[float, ...]
         ) -> Callable[[str, int], float]:
    """The replay's durations: an action of kind k on rank r s_k·t_r/2."""
    part = dict(zip("FIW", split, strict=True))

    def dur(kind: str, stage: int) -> float:
        return 0.5 * rank_times[stage if stage < p else 2 * p - 1 - stage] * part[kind]

    return dur


def _counts(p: int, path: Sequence[tuple[int, tuple[str, int, int]]]) -> Counts:
    """A path's F, I, W actions per rank (a full backward B is an I and a W)."""
    n = [[0, 0, 0] for _ in range(p)]
    for r, (kind, _, _) in path:
        for k in ("IW" if kind == "B" else kind):
            n[r]["FIW".index(k)] += 1
    return tuple(tuple(row) for row in n)  # type: ignore[misc]


def replay_pipeline(model: cp_model.CpModel, times: Sequence[Any], T: Any, schedule: str,
                    split: tuple[float, float, float], pp: int, m: int, bt: int, rest: int,
                    per: float) -> tuple[Any, int, float, ReplayCuts]:
    """The pipeline term of a V key (module docstring) on `model`, whose rank r takes
    `times[r]` (integer units tu, each <= `bt` and < `per` units short of the exact time)
    and T >= each: (the term's expression in units tu/Q, Q, its error bound in units tu
    where the cuts hold the split's own longest path, the cuts handle). Its first paths:
    every rank's own list (a path: consecutive steps) and a longest path at equal ranks
    (`solve_free` adds the seeds and the paths found). `rest` bounds the other objective
    terms (units tu): Q is lowered until every sum stays below 2^61."""
    msim = sim_microbatches(pp, m)
    q = DUR_SCALE
    while q > 1 and (msim * pp + m + 1) * bt * q + rest * q > 2**61:
        q //= 2
    coef = tuple(int(math.floor(0.5 * share * q)) for share in split)
    span = model.new_int_var(0, msim * pp * q * bt, "span")  # every path <= all durations
    cuts = ReplayCuts(model, span, times, coef, schedule, pp, msim, split)  # type: ignore[arg-type]
    for r in range(pp):  # rank r's list: each micro-batch's F, I, W on both chunks
        cuts.add(tuple((2 * msim,) * 3 if j == r else (0, 0, 0) for j in range(pp)))
    cuts.add(cuts.path_at([1.0] * pp))
    # each action on a path loses < t_r/Q to its floor (< 6·m'·p actions on a path) and
    # s_k/2 x the < per-unit floor of t_r (Σ s_k/2 over the actions <= m'·p)
    err = msim * pp * per + (m - msim) * per + 6 * msim * pp * bt / q
    return span + q * (m - msim) * T, q, err, cuts


def solve_free(t: Tables, pm: Any, *, seed: int, workers: int, cutoff_s: float | None,
               budget: Budget) -> tuple[tuple[float, Plan, float, float] | None, bool]:
    """The exact best plan of a V key's free family (module docstring) from its built
    partition model `pm` (cpsat_partition.PartitionModel with `replay_pipeline`'s
    objective), as cpsat_partition's `_solve_family` returns it: ((step, plan, exact - model
    objective, error bound), whether a None answer is proven). None, proven, when no plan
    fits with an exact step time <= `cutoff_s`."""
    L = t.space.num_layers
    cuts: ReplayCuts = pm.replay
    # the paths earlier keys of these tables found (any path bounds any key's span)
    known: list[Counts] = t.__dict__.setdefault("_v_paths", {}).setdefault(
        (cuts.schedule, cuts.pp, cuts.msim), [])
    if not known:  # seeds: a longest path with each rank in turn the slowest
        known.extend(cuts.seeds())
    for c in known:
        cuts.add(c)
    cut = cutoff_s if cutoff_s is not None and math.isfinite(cutoff_s) else None
    best: tuple[float, tuple[Any, ...], Plan, float] | None = None
    lb = 0.0
    scored = scored_free(t.space)
    for _ in range(ROUNDS_MAX):
        if cut is not None:  # one unit more: an exact tie is still found (the smallest wins)
            pm.model.add(pm.objective <= int(math.floor(cut / pm.scale_s)) + 1)
        solver, st = solve_portfolio(pm.model, budget, seed, workers, stages=REPLAY_PORTFOLIO)
        if st == cp_model.INFEASIBLE:
            ans = _answer(best, cutoff_s, 0.0, L)
            return ans, ans is None
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        lb = max(lb, solver.best_objective_bound * pm.scale_s)
        plan = pm.read_plan(solver, False)
        times: Sequence[float] | None = None
        if scored:  # the cost model, over the split's recompute counts and placements
            got = _scored(t, pm.key, plan, budget)
            step, fits = (got[0], True) if got is not None else (math.inf, False)
            plan, times = (got[1], got[2]) if got is not None else (plan, None)
        else:
            pc = plan_cost(t, plan)
            step, fits, times = pc.step_s, pc.fits, pc.stage_time_s
        if times is not None:  # its own longest path: the model's bound of it (and of its
            path = cuts.path_at(times)  # neighbours) becomes about exact
            if path not in cuts.paths:
                known.append(path)
                cuts.add(path)
        if fits:
            cand = (step, plan.key())  # the enumerator's order: r, then split, placement
            if best is None or cand < best[:2]:
                best = (*cand, plan, step - solver.objective_value * pm.scale_s)
            cut = step if cut is None else min(cut, step)
        if scored:  # every recompute count and placement of the split is scored
            _forbid_split(pm, solver)
        else:
            pm.forbid(solver)
    # out of rounds or budget: the best so far, its gap to the model's bound as error bound
    return _answer(best, cutoff_s, None if best is None else max(best[0] - lb, 0.0), L), False


def _scored(t: Tables, key: Any, plan: Plan, budget: Budget
            ) -> tuple[float, Plan, tuple[float, ...]] | None:
    """The exact best (step, plan, rank times) of `plan`'s split over the key's recompute
    counts and placements, by the cost model (model_scan.py `best_of_split`, memoized per
    key), each plan it scores charging `limits.MODEL_PLAN_DTIME`; None when none fits."""
    from autoparallel_cp.search.model_scan import _terms, best_of_split

    split = tuple(int(x) for x in plan.stage_layers or ())
    memo: dict[tuple[int, ...], Any] = t.__dict__.setdefault("_v_split", {}).setdefault(key, {})
    if split not in memo:
        n0 = len(t.__dict__.get("_model_terms", {}))
        memo[split] = best_of_split(t, key, split)
        budget.charge(limits.MODEL_PLAN_DTIME * (len(t.__dict__.get("_model_terms", {})) - n0))
    got = memo[split]
    return None if got is None else (got[0], got[1], _terms(t, got[1])[3])


def _forbid_split(pm: Any, solver: cp_model.CpSolver) -> None:
    """No-good on the current layer counts, whatever the recompute count."""
    alts = []
    for x in pm.layers:
        b = pm.model.new_bool_var("")
        pm.model.add(x != int(solver.value(x))).only_enforce_if(b)
        alts.append(b)
    pm.model.add_bool_or(alts)


def _answer(best: tuple[float, tuple[Any, ...], Plan, float] | None, cutoff_s: float | None,
            err: float | None, num_layers: int) -> tuple[float, Plan, float, float] | None:
    """`solve_free`'s plan: None when none fits or the best is above the cutoff."""
    if best is None or (cutoff_s is not None and best[0] > cutoff_s):
        return None
    step, _, plan, diff = best
    return step, canonical(plan, num_layers), diff, err or 0.0
