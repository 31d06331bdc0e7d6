"""`solve` (CP-SAT, k best with an exactness certificate) and `enumerate_plans` (reference).

Both return a `SolveResult` whose plans are `evaluate.Evaluation` objects ranked by the exact
float cost model (ties by `Plan.key()`). Plans are distinct in their *key* (tp, pp, cp, dp, ep,
vpp, sp, zero, mbs, recompute mode); each key's best partition, recompute count, placement.

Search (a bound table and one CP-SAT model per key, neither listing plans):
1. the master's keys (`key_table.build_key_table`): every key of the space with LB(key), the
   key-level master's objective (`cpsat_master.build_master`), a proven lower bound of the
   exact step time of every plan of the key, evaluated with numpy for all keys at once (the
   same integers as the CP-SAT master, tests/search/test_key_table.py);
2. per key, the partition model (`cpsat_partition.build_partition`, a linear model over the
   key's constant coefficients): layer counts per stage, recomputed layers, node group per
   stage, with the constraint objective <= the current k-th best exact step time (a key whose
   best is above it cannot enter the top k, so the model is then infeasible and the key is
   dropped without being solved to optimality).
Best-first with a certificate: the least LB seeds the first window, then the keys with LB in a
growing window (lo, hi] (a slice of the keys sorted by LB) join one heap over all windows,
keyed by the per-key bound `key_bounds.key_bound` (numpy, proven <= the key's exact best; at
least LB). Keys are scored exactly with model 2 least bound first while the least bound is
<= hi (an unlisted key has LB > hi, so a larger bound: none of them comes first) and <= the
current k-th best; a key about to get its model first gets the coupled bound and goes back to
the heap with it. Its model is first solved with a trial cutoff just above its bound
(`TRIAL_MARGINS`, a V's `replay_axis.trial_margins`; CP-SAT closes a model with a tight cutoff
far sooner): a plan under it is the key's best, as with any cutoff it satisfies; proven
infeasible, no plan of the key is <= the trial cutoff, its bound now, and back to the heap.
A key whose bound is above the k-th best is skipped without a model (so is every key after).
The search stops once the k-th best exact step time is <= hi, since every unseen key has
LB > hi and every skipped key a bound above the k-th best, so an exact step time above it.
With a framework restriction (`SearchSpace.restriction`, spec/framework_space.py) a listed key
whose axes a framework row refuses is dropped as listed (`_runnable`; `best_for_key` refuses it
too): every plan of it is outside the space, so the proof is over the framework's plans, and the
master's LB and the key bounds, computed over the larger space, stay lower bounds.
Status `optimal` means this proof completed. The per-key models' limits are deterministic time
(`limits.Budget`), so the answer does not depend on the machine's load.

Kept whole (about 600 lines): `solve`'s loop is the proof above step by step (windows, heap,
coupled bounds, trial cutoffs); split, its invariants sit apart from the code they hold.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autoparallel_cp.errors import InfeasibleError
from autoparallel_cp.search import capacity
from autoparallel_cp.search.act_offload import part_key
from autoparallel_cp.search.limits import Budget, check
from autoparallel_cp.search.replay_axis import trial_margins
from autoparallel_cp.search.schedule_axis import union_kth
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_proof import proof_space
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


@dataclass
class SearchContext:
    """What one solve proved, for the recommendation phase over the same job and pins to reuse
    instead of re-deriving it: the space and its tables, the key table, every key with its
    proven bound LB (objective units) up to `listed_hi` (all windows listed completely), and
    the best plan of each key that was scored (`KeyResult`, exact: the cutoff only drops keys
    whose best is above it)."""

    space: SearchSpace
    tables: Any
    keys: Any  # key_table.KeyTable: every key of the master with its LB
    listed: list[tuple[int, Any]]
    listed_hi: int | None  # None: no complete window
    found: dict[Any, KeyResult]
    key_bounds: dict[Any, float] = field(default_factory=dict)  # key_bounds.key_bound values
    #: keys proven to have no plan with an exact step time <= the value (`best_for_key`)
    above: dict[Any, float] = field(default_factory=dict)
    #: a union of sub-spaces (`_solve_union`): each one's context by `act_offload.part_key`
    #: (this context is the default sub-space's: the recommendation's phase 2 searches it)
    parts: dict[Any, SearchContext] = field(default_factory=dict)
    #: the space the search was asked (the union itself for a union) and what it was built
    #: from (`capacity.origin_of`; None: given by the caller), for `capacity.space_at`
    root: SearchSpace | None = None
    origin: tuple[Any, ...] | None = None


@dataclass
class SolveResult:
    """Outcome of a search (INTERFACE.md JSON: status, solve_time_s, space_size, plans)."""

    status: str  # optimal | feasible | timeout (no plan in the limit, not proven infeasible)
    solve_time_s: float
    space_size: int
    plans: list[Any]  # evaluate.Evaluation, best first
    method: str = "cpsat"
    max_objective_diff_s: float = 0.0  # largest exact - solver objective over returned plans
    error_bound_s: float = 0.0  # proven per-plan bound on that difference
    gap: float = 0.0  # relative gap left when the time limit hit (0 when proven)
    iterations: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    #: the solve's proofs, reused by `recommend` (not part of the JSON)
    context: SearchContext | None = field(default=None, repr=False)
    #: the space searched: `space_proof.proof_space` of it is the JSON `space` (what the
    #: proof covered)
    searched: SearchSpace | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "solve_time_s": self.solve_time_s,
            "space_size": self.space_size,
            "plans": [p.to_json() for p in self.plans],
            **({"space": proof_space(self.searched)} if self.searched is not None else {}),
        }


#: keys bounded at once beyond a window's end (`solve.bound_upto`): a few windows' worth
BOUND_AHEAD = 512
#: a key's model is first solved with the cutoff bound * (1 + margin), the next margin after
#: each proof that the key has no plan under it, then with the k-th best
TRIAL_MARGINS = (1e-3, 1.6e-2, 0.25)


def _key(plan: Plan) -> tuple[Any, ...]:
    return (plan.tp, plan.pp, plan.cp, plan.dp, plan.ep, plan.vpp, plan.sp, plan.zero,
            plan.mbs, plan.recompute)


def _space(job: Job, space: SearchSpace | None, fix: str | Mapping[str, Any] | None,
           emit: str | None = None) -> SearchSpace:
    return space if space is not None else SearchSpace.for_job(job, fix=fix, emit=emit)


def _finish(job: Job, ranked: list[tuple[float, Plan]], top_k: int) -> list[Any]:
    from autoparallel_cp.cost.evaluate import evaluate

    return [evaluate(job, p) for _, p in ranked[:top_k]]


def key_space(space: SearchSpace, key: Any) -> SearchSpace:
    """The sub-space of one key: every axis pinned, the partition / recompute / placement free."""
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES

    return space.with_(tp=(key.tp,), cp=(key.cp,), pp=(key.pp,), ep=(key.ep,), vpp=(key.vpp,),
                       mbs=(key.mbs,), zero=(key.zero,), sp=(key.sp,),
                       recompute=(RECOMPUTE_MODES[key.mode],),
                       fixed={**dict(space.fixed), "dp": key.dp})


@dataclass(frozen=True)
class KeyResult:
    """Best plan of one key: exact step time, the plan, its solver-vs-exact difference, and
    the key's factor tables (to re-score variants of the plan without rebuilding them)."""

    step_s: float
    plan: Plan
    diff_s: float
    error_bound_s: float
    tables: Any = None


def best_for_key(space: SearchSpace, key: Any, *, time_limit: float = 10.0,
                 seed: int = 0, workers: int = 1, tables: Any = None,
                 cutoff_s: float | None = None, budget: Budget | None = None,
                 above: dict[Any, float] | None = None) -> KeyResult | None:
    """Solve one key's partition problem (layer counts per stage, recomputed layers, node group
    per stage) with the per-key linear CP-SAT model (`cpsat_partition`) and re-score it exactly.

    `tables` may be the whole space's tables (they hold every key's entries); None builds the
    key's own. None when no partition of the key fits (or none is <= `cutoff_s`); when that is
    proven (not a limit that ran out) and `above` is given, `above[key]` is set to the cutoff
    (inf without one): no plan of the key has an exact step time <= it. One worker,
    deterministic-time stages: deterministic.
    """
    from autoparallel_cp.search.cpsat_partition import solve_partition_proven
    from autoparallel_cp.search.tables import build_tables

    del workers  # the per-key model is solved by one deterministic worker
    if space.refusals_of_key(key):  # outside the frameworks' space: none of its plans runs
        if above is not None:
            above[key] = math.inf
        return None
    tk = tables if tables is not None else build_tables(key_space(space, key))
    res, proven = solve_partition_proven(tk, key, time_limit=time_limit, seed=seed, workers=1,
                                         cutoff_s=cutoff_s, budget=budget)
    if res is None:
        if proven and above is not None:
            above[key] = math.inf if cutoff_s is None else cutoff_s
        return None
    step, plan, diff, err = res
    if space.restriction is not None and space.restriction.split_refusals(plan):
        return None  # a pinned split the framework cannot run (free splits obey the rows)
    return KeyResult(step, plan, diff, err, tk)


def solve(
    job: Job,
    space: SearchSpace | None = None,
    *,
    top_k: int = 5,
    time_limit: float | None = 10.0,
    workers: int | None = None,
    seed: int | None = 0,
    objective: str = "throughput",
    progress_callback: Callable[[dict[str, Any]], None] | None = None,
    fix: str | Mapping[str, Any] | None = None,
    progress: Callable[..., Any] | None = None,
    emit: str | None = None,
    prior: SearchContext | None = None,
    incumbents: dict[tuple[Any, ...], tuple[float, Any]] | None = None,
    budget: Budget | None = None,
) -> SolveResult:
    """The k best distinct plans by CP-SAT, proven (see the module docstring).

    A space of several schedule sub-spaces (`SearchSpace.schedule_variants`) is solved by
    `_solve_union`, which calls this once per sub-space with `incumbents` (the union's best
    (step, `Plan.key()`) so far per `_key`: the k-th best of the union is every cutoff) and
    its shared `budget`; such a call returns an empty plan list instead of raising when no
    plan of its sub-space is under the union's k-th best.

    `prior`: the context of a search of the same space up to a larger capacity (the CLI's
    first, up-to-capacity search, when the fastest plan within the --mem-headroom margin is
    asked next): its tables, bounds and exact key results that stay true here are reused
    (`capacity.reuse`, where the proof is); anything else is ignored.

    `time_limit` (seconds) is a deterministic-time budget (`limits.Budget`): the same input
    gives the same plans and status on an idle or a busy machine. Status `timeout` (no plan,
    not proven infeasible) when it runs out before any plan is found. `workers` is accepted
    and unused: the master's keys are a numpy table and every per-key model is solved by one
    deterministic worker. The space (unless given) holds only the plans the recipe's framework
    and the `emit` format run (`SearchSpace.for_job`); keys it refuses are skipped as listed.
    """
    from autoparallel_cp.search.key_bounds import key_bound, key_bounds
    from autoparallel_cp.search.key_table import build_key_table
    from autoparallel_cp.search.tables import build_tables

    del objective, workers  # a fixed cluster: cost per step is proportional to the step time
    cb_ = progress_callback or progress
    t0 = time.perf_counter()
    origin = capacity.origin_of(fix, emit) if space is None else None
    # within the margin after a search up to capacity: that search's space and its listings
    # (`capacity.space_at`), else the job's own
    sp = (capacity.space_at(prior, job, origin) if prior is not None and origin is not None
          else None) or _space(job, space, fix, emit)
    part = incumbents is not None
    if sp.num_degree_combinations() == 0:
        if part:  # a sub-space without a legal degree combination: nothing to add
            return SolveResult("optimal", time.perf_counter() - t0, 0, [], searched=sp,
                               stats={"phases": {}, "master_keys": 0, "keys_scored": 0,
                                      "keys_skipped": 0, "models": 0})
        _raise_infeasible(job, sp)
    if len(sp.schedule_variants()) > 1:
        return _rooted(_solve_union(job, sp, top_k=top_k, time_limit=time_limit, seed=seed,
                                    progress=cb_, prior=prior), sp, origin)
    size = sp.size()
    refused: dict[tuple[str, str], int] = {}  # framework rows that refused listed keys
    runnable = 0  # listed keys the frameworks run
    phase: dict[str, float] = {}
    tp0 = time.perf_counter()
    ru = capacity.reuse(prior, sp) if prior is not None else None
    tabs = ru.tables if ru is not None else build_tables(sp)
    phase["build_s"] = time.perf_counter() - tp0
    # every key of the master with its LB (numpy, the master's integer objective bit for bit):
    # its least LB seeds the first window and each window is a slice of the sorted keys
    tp0 = time.perf_counter()
    table = ru.keys if ru is not None and ru.keys is not None else build_key_table(
        tabs, bt=ru.bounds if ru is not None else None)
    phase["master_s"] = time.perf_counter() - tp0
    lb0_ = table.minimum()
    if lb0_ is None and part:  # none of this sub-space's keys fits: nothing to add
        return SolveResult("optimal", time.perf_counter() - t0, size, [], searched=sp,
                           stats={"phases": phase, "master_keys": 0, "keys_scored": 0,
                                  "keys_skipped": 0, "models": 0},
                           context=SearchContext(space=sp, tables=tabs, keys=table, listed=[],
                                                 listed_hi=None, found={}))
    if lb0_ is None:  # no key passes the degree rules and the memory condition
        _raise_infeasible(job, sp)
    assert lb0_ is not None
    lb0 = lb0_
    unit = table.unit_s
    top_u = table.top_u
    budget = budget if budget is not None else Budget(time_limit)
    # a prior search's exact key results and lower bounds that hold here (capacity.reuse)
    found: dict[Any, KeyResult] = dict(ru.found) if ru is not None else {}
    bounds: dict[Any, float] = dict(ru.key_bounds) if ru is not None else {}
    above: dict[Any, float] = {}  # keys proven to have no plan <= the value
    tight: set[Any] = set()  # keys whose bound is the coupled one (`key_bound(coupled=True)`)
    heap: list[tuple[float, tuple[Any, ...], int, Any]] = []  # (bound, order, LB, key) to score
    trials: dict[Any, int] = {}  # keys proven above their trial cutoffs: how many times
    models = 0  # per-key models solved (trial cutoffs included)
    evaluated = 0
    proven = True
    lo: int | None = None
    hi = lb0 + max(lb0 // 50, 1)
    listed = 0
    all_listed: list[tuple[int, Any]] = []  # every key of the complete windows, with its LB
    listed_hi: int | None = None  # the windows (-inf, listed_hi] are listed completely

    ahead = 0  # the keys table.key(0 .. ahead - 1) have their `key_bound` in `bounds`

    def bound_upto(hi: int) -> None:
        """`key_bound` of every key with LB <= hi and of the next ones, BOUND_AHEAD keys at
        least (`key_bounds`: numpy over each schedule class at once, the same floats), so the
        small windows near the k-th best do not each pay numpy's per-call cost."""
        nonlocal ahead
        end = table.upto(hi)
        if end > ahead:
            end = min(len(table), max(end, ahead + max(BOUND_AHEAD, ahead // 2)))
            new = [k for k in map(table.key, range(ahead, end)) if k not in bounds]
            bounds.update(zip(new, key_bounds(tabs, new, between=check), strict=True))
            ahead = end

    def push(lb_u: int, key: Any) -> None:
        heapq.heappush(heap, (max(bounds[key], lb_u * unit), key.order(), lb_u, key))

    def kth() -> float:
        if part:  # the union's k-th best: the other sub-spaces' best per key and these
            return union_kth(incumbents or {}, found.values(), top_k, _key)
        costs = sorted((r.step_s, r.plan.key()) for r in found.values())
        return costs[top_k - 1][0] if len(costs) >= top_k else float("inf")

    while True:
        if budget.exhausted():
            proven = False
            break
        tp0 = time.perf_counter()
        keys, capped = table.window(lo, hi)
        phase["enumerate_keys_s"] = phase.get("enumerate_keys_s", 0.0) + time.perf_counter() - tp0
        tp0 = time.perf_counter()
        if capped:  # too wide a window: narrow it and ask again
            hi = (lo if lo is not None else lb0) + max((hi - (lo or lb0)) // 4, 1)
            continue
        keys = _runnable(sp, keys, refused)
        runnable += len(keys)
        all_listed.extend(keys)
        listed_hi = hi
        stop = False
        # every listed key waits in one heap by its bound (`key_bound`, far tighter than LB;
        # the coupled one once computed): keys are scored least bound first across windows, so
        # the first k scored are near the k best and the k-th best (every later model's
        # cutoff) is near its final value early
        tp1 = time.perf_counter()
        bound_upto(hi)
        for lb_u, key in keys:
            push(lb_u, key)
        phase["key_bound_s"] = phase.get("key_bound_s", 0.0) + time.perf_counter() - tp1
        tp0 = time.perf_counter()
        tb_s = 0.0  # the coupled bounds' time, counted with the key bounds
        listed += len(keys)
        while heap:
            kb, _, lb_u, key = heap[0]
            cut = kth()
            if kb > cut or kb == math.inf:
                # proven: every plan of this key and of the later ones is slower (or none fits)
                break
            if kb > hi * unit and hi < top_u:
                break  # an unlisted key (LB > hi) may come before it: list the next window
            heapq.heappop(heap)
            if lb_u * unit >= cut or key in found:
                continue  # above the k-th best, or its best already known (`prior`)
            if key not in tight:
                # the coupled bound (a few ms, so only for the keys that would get a model):
                # the key goes back to the heap with it, to be scored in its turn
                check()
                tight.add(key)
                tb0 = time.perf_counter()
                bounds[key] = max(bounds[key], key_bound(tabs, key, coupled=True))
                tb_s += time.perf_counter() - tb0
                push(lb_u, key)
                continue
            if budget.exhausted():
                stop = True
                break
            # a trial cutoff first; proven empty, it is the key's bound and the key goes back
            tries, margins = trials.get(key, 0), trial_margins(sp, TRIAL_MARGINS)
            trial = kb * (1 + margins[tries]) if tries < len(margins) else cut
            res = best_for_key(sp, key, seed=int(seed or 0), tables=tabs,
                               cutoff_s=min(cut, trial), budget=budget, above=above)
            models += 1
            if res is None and trial < cut:
                if above.get(key, -math.inf) >= trial:
                    trials[key] = tries + 1
                    bounds[key] = max(bounds[key], trial)
                    push(lb_u, key)
                    continue
                res = best_for_key(sp, key, seed=int(seed or 0), tables=tabs, cutoff_s=cut,
                                   budget=budget, above=above)  # unproven: as without it
                models += 1
            evaluated += 1
            if res is not None:
                found[key] = res
            if cb_ is not None and found:
                cb_({"iteration": evaluated, "plans": len(found), "bound_s": lb_u * unit,
                     "best_s": min(r.step_s for r in found.values())})
        phase["partition_s"] = phase.get("partition_s", 0.0) + time.perf_counter() - tp0 - tb_s
        phase["key_bound_s"] += tb_s
        if stop:
            proven = False
            break
        k = kth()
        if k <= hi * unit or hi >= top_u:
            # every listed key is scored or its bound is above k (the heap stopped at a bound
            # above the k-th best or above hi * unit >= k), and every unlisted key has LB > hi:
            # nothing unseen can enter the top k
            break
        lo = hi
        if k < float("inf"):
            # widen geometrically towards the k-th best: keys are scored in bound order and the
            # k-th best usually drops while they are, so a window up to the current k-th best at
            # once would list many keys that the final k-th best rules out
            grow = hi + max(hi - lb0, lb0 // 100, 1)
        else:
            grow = hi + max(2 * (hi - lb0), lb0 // 20, 1)
        # and no further than the least bound waiting in the heap (the next key to score once
        # the keys with LB up to it are listed) or the k-th best
        target = min(k, heap[0][0] if heap else math.inf)
        if math.isfinite(target):
            grow = min(grow, max(int(math.ceil(target / unit)), hi + 1))
        hi = min(grow, top_u)
    ranked = sorted(found.values(), key=lambda r: (r.step_s, r.plan.key()))
    ctx = SearchContext(space=sp, tables=tabs, keys=table, listed=all_listed,
                        listed_hi=listed_hi, found=dict(found), key_bounds=bounds, above=above,
                        root=sp if origin is not None else None, origin=origin)
    if not ranked and part:
        return SolveResult("optimal" if proven else "timeout", time.perf_counter() - t0, size,
                           [], iterations=evaluated, searched=sp, context=ctx,
                           stats={"phases": phase, "master_keys": len(table),
                                  "keys_scored": evaluated, "keys_skipped": listed - evaluated,
                                  "models": models, "refused": refused, "runnable": runnable,
                                  "root_bound_s": lb0 * unit, **_limit_stats(budget)})
    if not ranked:
        if proven:
            _raise_infeasible(job, sp, refused, runnable)
        return SolveResult("timeout", time.perf_counter() - t0, size, [], gap=1.0,
                           iterations=evaluated, stats=_limit_stats(budget))
    best_lb = lb0 * unit
    kk = ranked[min(top_k, len(ranked)) - 1].step_s
    gap = 0.0 if proven else max(0.0, (kk - (hi * unit)) / kk)
    evs = _finish(job, [(r.step_s, r.plan) for r in ranked], top_k)
    return SolveResult(
        status="optimal" if proven else "feasible",
        solve_time_s=time.perf_counter() - t0,
        space_size=size,
        plans=evs,
        max_objective_diff_s=max(r.diff_s for r in ranked[:top_k]),
        error_bound_s=max(r.error_bound_s for r in ranked[:top_k]),
        gap=gap,
        iterations=evaluated,
        stats={"phases": phase, "master_keys": len(table),
               "keys_scored": evaluated, "keys_skipped": listed - evaluated,
               "models": models,
               "root_bound_s": best_lb,
               "ranked": [(r.step_s, r.plan) for r in ranked[:top_k]],
               **_limit_stats(budget)},
        context=ctx,
        searched=sp,
    )


def _solve_union(job: Job, sp: SearchSpace, *, top_k: int, time_limit: float | None,
                 seed: int | None, progress: Callable[..., Any] | None,
                 prior: SearchContext | None) -> SolveResult:
    """`solve` over a union of schedule sub-spaces (`SearchSpace.schedule_variants`): each
    solved in turn by `solve` with the union's best per key so far (schedule_axis.py
    `union_kth` is every cutoff) and one shared deterministic-time budget; a key's best is
    its best over them, ranked by (step, `Plan.key()`) as within one. Exact and proven when
    every sub-space's search is (search/schedule_axis.py: the proof). A `prior` union
    context hands each sub-space its own part (`capacity.reuse` checks it)."""
    t0 = time.perf_counter()
    budget = Budget(time_limit)
    best: dict[tuple[Any, ...], tuple[float, Any]] = {}
    res: dict[tuple[Any, ...], KeyResult] = {}
    parts: dict[Any, SearchContext] = {}
    stats: dict[str, Any] = {"phases": {}, "master_keys": 0, "keys_scored": 0,
                             "keys_skipped": 0, "models": 0}
    refused: dict[tuple[str, str], int] = {}
    runnable, proven, gap = 0, True, 0.0
    roots: list[float] = []

    def report(d: dict[str, Any]) -> None:
        """A sub-space's progress as the union's: keys scored and the best plan so far over
        the sub-spaces solved."""
        if progress is not None:
            progress({**d, "iteration": stats["keys_scored"] + d["iteration"],
                      "plans": len(best) + d["plans"],
                      "best_s": min([d["best_s"], *(c for c, _ in best.values())])})

    for v in sp.schedule_variants():
        pri = prior.parts.get(part_key(v)) if prior is not None else None
        r = solve(job, v, top_k=top_k, time_limit=time_limit, seed=seed, progress=report,
                  prior=pri, incumbents=best, budget=budget)
        if "root_bound_s" in r.stats:
            roots.append(r.stats["root_bound_s"])
        if r.context is not None:
            parts[part_key(v)] = r.context
        else:  # no legal degree combination: nothing listed, nothing found
            continue
        for kr in r.context.found.values():
            k, c = _key(kr.plan), (kr.step_s, kr.plan.key())
            if k not in best or c < best[k]:
                best[k], res[k] = c, kr
        for name in ("master_keys", "keys_scored", "keys_skipped", "models"):
            stats[name] += r.stats.get(name, 0)
        for name, t in r.stats.get("phases", {}).items():
            stats["phases"][name] = stats["phases"].get(name, 0.0) + t
        for row, n in r.stats.get("refused", {}).items():
            refused[row] = refused.get(row, 0) + n
        runnable += r.stats.get("runnable", 0)
        proven = proven and r.status == "optimal"
        gap = max(gap, r.gap)
    ranked = sorted(res.values(), key=lambda r: (r.step_s, r.plan.key()))[:top_k]
    size = sp.size()
    if not ranked:
        if proven:
            _raise_infeasible(job, sp.schedule_variants()[0], refused, runnable)
        return SolveResult("timeout", time.perf_counter() - t0, size, [], gap=1.0,
                           stats=_limit_stats(budget), searched=sp)
    stats.update(ranked=[(r.step_s, r.plan) for r in ranked],
                 root_bound_s=min(roots, default=0.0), **_limit_stats(budget))
    ctx = parts[None] if None in parts else next(iter(parts.values()))
    return SolveResult(
        status="optimal" if proven else "feasible", solve_time_s=time.perf_counter() - t0,
        space_size=size, plans=_finish(job, [(r.step_s, r.plan) for r in ranked], top_k),
        max_objective_diff_s=max(r.diff_s for r in ranked),
        error_bound_s=max(r.error_bound_s for r in ranked), gap=0.0 if proven else gap,
        iterations=stats["keys_scored"], stats=stats, searched=sp,
        context=dataclasses.replace(ctx, parts=parts))


def _rooted(res: SolveResult, sp: SearchSpace, origin: tuple[Any, ...] | None
            ) -> SolveResult:
    """A union's result whose context names the union as its root space (`space_at`)."""
    if res.context is not None and origin is not None:
        res.context = dataclasses.replace(res.context, root=sp, origin=origin)
    return res


def _runnable(space: SearchSpace, keys: list[tuple[int, Any]],
              refused: dict[tuple[str, str], int]) -> list[tuple[int, Any]]:
    """The listed keys the space's frameworks run (all without a restriction); the rows that
    refuse the others are counted in `refused`, for the error when none is left. Skipping a
    key keeps the proof: none of its plans is in the space."""
    if space.restriction is None:
        return keys
    out = []
    for lb_u, key in keys:
        why = space.refusals_of_key(key)
        if why:
            for row in why:
                refused[row] = refused.get(row, 0) + 1
        else:
            out.append((lb_u, key))
    return out


def _limit_stats(budget: Budget) -> dict[str, Any]:
    """What the budget says about the run: deterministic seconds used, and whether the
    wall-clock safety net (not the deterministic budget) stopped it."""
    return {"deterministic_time": budget.used, "wall_clock_net_hit": budget.wall_hit}


def enumerate_plans(
    job: Job,
    space: SearchSpace | None = None,
    *,
    top_k: int = 5,
    objective: str = "throughput",
    fix: str | Mapping[str, Any] | None = None,
    limit: int | None = None,
    progress_callback: Callable[[dict[str, Any]], None] | None = None,
    emit: str | None = None,
) -> SolveResult:
    """The exhaustive reference over the same space (see enumerate.py)."""
    from autoparallel_cp.search import enumerate as en

    del objective, progress_callback
    t0 = time.perf_counter()
    sp = _space(job, space, fix, emit)
    refused: dict[tuple[str, str], int] = {}
    ranked, size = en.enumerate_best(sp, limit=limit, refused=refused)
    if not ranked:
        _raise_infeasible(job, sp, refused)
    evs = _finish(job, ranked, top_k)
    return SolveResult("optimal", time.perf_counter() - t0, size, evs, method="enumerate",
                       stats={"ranked": ranked[:top_k]}, searched=sp)


def _raise_infeasible(job: Job, space: SearchSpace,
                      refused: dict[tuple[str, str], int] | None = None, runnable: int = 0
                      ) -> None:
    from autoparallel_cp.search.infeasibility import explain

    if refused and space.restriction is not None:
        # layouts that may fit exist, and the frameworks' rows refuse them (the `runnable`
        # others, if any, were scored exactly and none fits)
        from autoparallel_cp.spec.framework_space import emptied_by

        raise InfeasibleError(emptied_by(space.restriction, refused, runnable))
    raise InfeasibleError(explain(job, space))
