"""Pragmatic advice: the simplest plan whose step time is within a tolerance of the fastest.

The complexity of a plan is a sum of small integer weights, one per axis value, so a CP-SAT model
that has a 0/1 literal per axis value can use it as a linear objective:
`complexity = sum(weight[axis][v] * is[axis == v])`.

Weights (higher = more to set up, debug and tune):
- a parallel dimension in use: tp > 1, pp > 1, ep > 1 (2 each); context parallelism cp > 1 (4);
- interleaved pipeline, vpp > 1 (3);
- ZeRO-2 (1) and ZeRO-3 (4); ZeRO-0/1 are free (the distributed optimizer is standard);
- recompute: selective 1, full 3, plus 1 for partial full recompute (a per-stage layer count);
- a hand-written (non-uniform) pipeline partition (1).
Sequence parallelism and the micro-batch size cost nothing.

Second phase (issue 5, `simplest_within`): the keys whose step-time lower bound (the solver's
key-level master) is within (1 + tolerance) x the optimum, scored simplest first, or the CP-SAT
master with that bound and the complexity minimized; every answer re-checked by the exact cost
model. The partition and partial-recompute weights are applied in
that re-check (the plan's uniform / whole-stage variant is preferred when it qualifies). Without
phase two the complexity is minimized over the k best plans (`method` says which).

Kept whole (about 400 lines): the weights, both phases of `simplest_within` and `recommend` read
the same weight tables and phase two's closures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoparallel_cp.spec.plan import Plan, canonical

# axis -> {value: weight}; values not listed weigh `_DEFAULT_WEIGHT[axis]`.
COMPLEXITY_WEIGHTS: dict[str, dict[Any, int]] = {
    "tp": {1: 0},
    "pp": {1: 0},
    "vpp": {1: 0},
    "cp": {1: 0},
    "ep": {1: 0},
    "sp": {0: 0, 1: 0},
    "zero": {0: 0, 1: 0, 2: 1, 3: 4},
    "recompute": {"none": 0, "selective": 1, "full": 3},
}
_DEFAULT_WEIGHT: dict[str, int] = {"tp": 2, "pp": 2, "vpp": 3, "cp": 4, "ep": 2, "sp": 0,
                                   "zero": 0, "recompute": 0}
PARTIAL_RECOMPUTE_WEIGHT = 1
_REL_EPS = 1e-6  # step times closer than this are equal
CUSTOM_PARTITION_WEIGHT = 1

_REASONS: dict[str, str] = {
    "tp": "tensor parallelism",
    "pp": "pipeline parallelism",
    "vpp": "interleaved pipeline",
    "cp": "context parallelism",
    "ep": "expert parallelism",
    "zero": "ZeRO-{v}",
    "recompute": "{v} recompute",
}


def axis_weight(axis: str, value: Any) -> int:
    """Complexity weight of `axis == value` (0 for axes without a weight)."""
    table = COMPLEXITY_WEIGHTS.get(axis)
    if table is None:
        return 0
    return table.get(value, _DEFAULT_WEIGHT.get(axis, 0))


def weight_table(axis: str, domain: Sequence[Any]) -> list[int]:
    """Weights of every value of an axis domain, in domain order (for a linear CP-SAT term)."""
    return [axis_weight(axis, v) for v in domain]


def _uniform(plan: Plan) -> bool:
    return plan.stage_layers is None or len(set(plan.stage_layers)) <= 1


def complexity(plan: Plan) -> int:
    """Integer complexity score of a plan (0 = plain data parallelism)."""
    score = sum(axis_weight(a, getattr(plan, a)) for a in COMPLEXITY_WEIGHTS)
    if plan.recompute == "full" and plan.recompute_layers is not None:
        score += PARTIAL_RECOMPUTE_WEIGHT
    if not _uniform(plan):
        score += CUSTOM_PARTITION_WEIGHT
    return score


def complexity_terms(plan: Plan) -> list[str]:
    """What makes the plan complex, most costly first, e.g. ['context parallelism (cp=2)']."""
    terms: list[tuple[int, str]] = []
    for axis in COMPLEXITY_WEIGHTS:
        v = getattr(plan, axis)
        w = axis_weight(axis, v)
        if w:
            label = _REASONS[axis].format(v=v)
            if axis in ("tp", "pp", "vpp", "cp", "ep"):
                label += f" ({axis}={v})"
            terms.append((w, label))
    if plan.recompute == "full" and plan.recompute_layers is not None:
        terms.append((PARTIAL_RECOMPUTE_WEIGHT, f"partial recompute ({plan.recompute_layers}"
                                                " layers/stage)"))
    if not _uniform(plan):
        terms.append((CUSTOM_PARTITION_WEIGHT, "non-uniform pipeline partition"))
    terms.sort(key=lambda t: -t[0])
    return [t[1] for t in terms]


@dataclass(frozen=True)
class Recommendation:
    """The recommended plan against the fastest one."""

    plan: Plan
    step_s: float
    fastest: Plan
    fastest_step_s: float
    tolerance: float
    complexity: int
    fastest_complexity: int
    method: str  # "cp-sat phase 2" or "top-k"
    evaluation: Any = None  # the recommended plan's Evaluation, when known

    @property
    def slowdown(self) -> float:
        """Relative step-time cost of the recommendation (0.02 = 2 % slower)."""
        return self.step_s / self.fastest_step_s - 1.0 if self.fastest_step_s > 0 else 0.0

    @property
    def same_as_fastest(self) -> bool:
        return self.plan.key() == self.fastest.key() or (
            self.plan.model_copy(update={"stage_layers": None}).key()
            == self.fastest.model_copy(update={"stage_layers": None}).key()
            and _uniform(self.plan) and _uniform(self.fastest))

    def why(self) -> str:
        """One or two sentences on why this plan is recommended."""
        if self.same_as_fastest:
            return (f"The fastest plan is also the simplest within {self.tolerance:.0%} "
                    f"(complexity {self.complexity}).")
        if self.step_s < self.fastest_step_s * (1 - _REL_EPS):
            return (f"{-self.slowdown:.1%} faster than #1 and no more complex (complexity "
                    f"{self.complexity} vs {self.fastest_complexity}): the first phase stopped "
                    "at its time limit before reaching it; raise --time-limit for a proof.")
        dropped = []
        for axis in COMPLEXITY_WEIGHTS:
            fv, rv = getattr(self.fastest, axis), getattr(self.plan, axis)
            fw, rw = axis_weight(axis, fv), axis_weight(axis, rv)
            if fw > rw:
                label = _REASONS[axis].format(v=fv)
                if axis in ("tp", "pp", "vpp", "cp", "ep"):
                    label += f" ({axis}={fv})"
                dropped.append(("" if rw == 0 else "less ") + label)
        if _uniform(self.plan) and not _uniform(self.fastest):
            dropped.append("a hand-made stage split")
        if self.fastest.recompute == "full" and self.fastest.recompute_layers is not None \
                and not (self.plan.recompute == "full" and self.plan.recompute_layers is not None):
            dropped.append("partial recompute")
        what = ("avoids " + ", ".join(dropped)) if dropped else "fewer moving parts in all"
        return (f"{self.slowdown:+.1%} step time for a simpler set-up (complexity "
                f"{self.complexity} vs {self.fastest_complexity}): {what}.")


def pick_simplest(
    candidates: Sequence[tuple[Plan, float]], tolerance: float
) -> tuple[Plan, float]:
    """Among (plan, step_s) pairs, the simplest one within `tolerance` of the fastest.

    Ties go to the faster plan, then to the plan's deterministic key.
    """
    if not candidates:
        raise ValueError("no candidate plans")
    best_t = min(t for _, t in candidates)
    limit = best_t * (1.0 + tolerance)
    ok = [(p, t) for p, t in candidates if t <= limit * (1 + 1e-12)]
    return min(ok, key=lambda pt: (complexity(pt[0]), pt[1], pt[0].key()))


def simplest_within(
    job: Any,
    max_step_s: float,
    *,
    fix: Any = None,
    time_limit: float | None = 10.0,
    workers: int | None = None,
    seed: int = 0,
    max_rounds: int = 200,
    hint: Plan | None = None,
    context: Any = None,
) -> tuple[Plan, float] | None:
    """CP-SAT phase two: the simplest plan whose exact step time is <= `max_step_s`.

    LB(key) (`key_table`, the objective of `cpsat_master.build_master`) is a proven lower
    bound of every plan of a key, so bounding it by `max_step_s` cuts off no qualifying plan.
    The keys with LB under the limit are listed from the key table and scored simplest first
    (below); when there are too many (`key_table.WINDOW_CAP`) or the scoring is cut by the
    time limit, the CP-SAT master minimizes `complexity * (limit + 1) + LB` (the simplest,
    then the fastest bound), each key it returns is solved (`solve.best_for_key`) and
    re-checked exactly, and one that does not qualify is forbidden and the master re-solved.
    None when nothing qualifies in the time limit (`limits.Budget`, shared by the phase).

    `context` (`solve.SearchContext` of a solve over the same job and pins) hands over what that
    solve proved: space, tables, key table, the keys it listed (only the part above its last
    complete window is listed again), their `key_bound` values and its scored keys' plans.
    """
    import math

    from ortools.sat.python import cp_model

    from autoparallel_cp.search.cpsat_master import KEY_AXES, build_master
    from autoparallel_cp.search.key_bounds import key_bounds
    from autoparallel_cp.search.key_table import build_key_table
    from autoparallel_cp.search.limits import Budget, check
    from autoparallel_cp.search.solve import best_for_key
    from autoparallel_cp.search.space import SearchSpace
    from autoparallel_cp.search.tables import build_tables, plan_cost
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES

    budget = Budget(time_limit)
    if context is not None:
        space, space_tables, table = context.space, context.tables, context.keys
        scored, bounds, above = context.found, context.key_bounds, context.above
    else:
        # the default schedules' sub-space, as the solve's context (solve.py `SearchContext`)
        space = SearchSpace.for_job(job, fix=fix).schedule_variants()[0]
        space_tables = build_tables(space)
        table = build_key_table(space_tables)
        scored, bounds, above = {}, {}, {}
    limit = math.floor(max_step_s / table.unit_s)

    def qualify(k: Any) -> tuple[int, float, Plan] | None:
        # a key whose best plan is slower than the limit cannot qualify (its variants are plans
        # of the same key): the cutoff lets CP-SAT stop there, and a key the solve proved
        # slower than a larger cutoff (`above`) is not solved again
        cutoff = max_step_s * (1 + 1e-12)
        res = scored.get(k) or (None if above.get(k, -math.inf) >= cutoff else best_for_key(
            space, k, seed=seed, tables=space_tables, cutoff_s=cutoff, budget=budget,
            above=above))
        if res is None:
            return None
        best: tuple[int, float, Plan] | None = None
        for cand in _plain_variants(canonical(res.plan, space.num_layers), space.fixed,
                                    space.num_layers):
            if plan_violations_ok(job, cand):
                pc = plan_cost(res.tables, cand)
                if pc.fits and pc.step_s <= max_step_s * (1 + 1e-12):
                    item = (complexity(cand), pc.step_s, cand)
                    if best is None or item[:2] < best[:2]:
                        best = item
        return best

    def key_complexity(k: Any) -> int:
        return sum(axis_weight("recompute" if n == "mode" else n,
                               RECOMPUTE_MODES[k.mode] if n == "mode" else getattr(k, n))
                   for n in KEY_AXES if ("recompute" if n == "mode" else n)
                   in COMPLEXITY_WEIGHTS)

    # 1) list every key whose proven bound fits under the limit (the solver's window listing),
    #    drop those whose per-key numpy bound already exceeds it, and score the rest in order of
    #    key complexity (a lower bound of the complexity of its plans), then bound: the first
    #    complexity level that yields a qualifying plan, fully scanned, is the answer
    listed: list[Any] = []
    capped = True
    if not budget.exhausted():
        hi = context.listed_hi if context is not None else None
        if hi is not None and limit <= hi:
            listed, capped = [(lb, k) for lb, k in context.listed if lb <= limit], False
        elif hi is not None:
            more, capped = table.window(hi, limit)
            listed = [*context.listed, *more]
        else:
            listed, capped = table.window(None, limit)
        if not capped:
            cands = []
            new = [k for _, k in listed if k not in bounds]
            # Ctrl-C (limits.request_stop) is checked between the bound's schedule classes
            bounds.update(zip(new, key_bounds(space_tables, new, between=check),
                          strict=True))
            for _, k in listed:
                kb = bounds[k]
                if kb <= max_step_s * (1 + 1e-12):
                    cands.append((key_complexity(k), kb, k.order(), k))
            cands.sort(key=lambda c: c[:3])
            found: tuple[int, float, Plan] | None = None
            complete = True
            for kc, _, _, k in cands:
                if found is not None and kc > found[0]:
                    break
                if budget.exhausted():
                    complete = False
                    break
                got = qualify(k)
                if got is not None and (found is None or got[:2] < found[:2]):
                    found = got
            if complete:
                return None if found is None else (found[2], found[1])
    # 2) fallback (too many keys, or scoring cut by the time limit): the CP-SAT master
    #    minimizes complexity; keys that do not qualify are forbidden, the master re-solved
    master = build_master(space_tables)
    model = master.model
    model.add(master.objective <= limit)
    terms: list[Any] = []
    for name, axis in master.axes.items():
        key = "recompute" if name == "mode" else name
        if key not in COMPLEXITY_WEIGHTS:
            continue
        for v, lit in zip(axis.values, axis.lits, strict=True):
            w = axis_weight(key, RECOMPUTE_MODES[v] if name == "mode" else v)
            if w:
                terms.append(w * lit)
    model.clear_objective()
    model.minimize(sum(terms) * (limit + 1) + master.objective)
    if hint is not None:  # the fastest plan qualifies: start from it
        values = {"mode": RECOMPUTE_MODES.index(hint.recompute), "m": hint.num_microbatches}
        for name, axis in master.axes.items():
            want = values.get(name, getattr(hint, name, None))
            for value, lit in zip(axis.values, axis.lits, strict=True):
                model.add_hint(lit, value == want)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = workers or 1
    prm.random_seed = seed
    # as in solve.py: CP-SAT 9.15's presolve was seen returning a minimum above a key's pinned
    # bound and missing solutions on this master; without it the search is also faster
    prm.cp_model_presolve = False
    chosen: tuple[int, float, Plan] | None = None  # keys come by complexity, <= their plans'
    for _ in range(max_rounds):
        if budget.exhausted() or budget.solve(solver, model) not in (cp_model.OPTIMAL,
                                                                     cp_model.FEASIBLE):
            break
        k = master.key_of(solver.boolean_value)
        if chosen is not None and key_complexity(k) >= chosen[0]:
            break  # no later key can give a simpler plan than the one chosen
        got = qualify(k)
        if got is not None and (chosen is None or got[:2] < chosen[:2]):
            chosen = got
        model.add_bool_or([lit.negated() for lit in master.key_lits(k)])
    return None if chosen is None else (chosen[2], chosen[1])


def plan_violations_ok(job: Any, plan: Plan) -> bool:
    """Whether the plan obeys every divisibility rule (a uniform variant may not)."""
    from autoparallel_cp.spec.plan import plan_violations

    return not plan_violations(job, plan)


def _plain_variants(plan: Plan, pinned: Any = (), num_layers: int | None = None) -> list[Plan]:
    """The plan, and the same plan with a uniform split / whole-stage recompute (simpler);
    never a variant that drops a field the user pinned (`pinned`: the --fix field names). The
    split is dropped only where the default split is the even one (pp*vpp | `num_layers`):
    elsewhere the default is Megatron's slot split, no simpler than the plan's own."""
    out = [plan]
    even = num_layers is None or num_layers % (plan.pp * plan.vpp) == 0
    if (plan.stage_layers is not None and plan.stage_groups is None and even
            and "stage_layers" not in pinned):
        out.append(plan.model_copy(update={"stage_layers": None}))
    if plan.recompute_layers is not None and "recompute_layers" not in pinned:
        out += [p.model_copy(update={"recompute_layers": None}) for p in list(out)]
    return out


def recommend(
    job: Any,
    ranked: Sequence[tuple[Plan, float]],
    tolerance: float = 0.03,
    *,
    evaluations: Sequence[Any] | None = None,
    phase_two: bool = True,
    fix: Any = None,
    time_limit: float | None = 10.0,
    workers: int | None = None,
    context: Any = None,
) -> Recommendation:
    """Recommend the simplest plan within `tolerance` of the fastest of `ranked` (best first).

    With `phase_two` the complexity is minimized by CP-SAT over the whole space under
    `step <= (1 + tolerance) * best` (`simplest_within`); otherwise, or when that phase finds
    nothing in its time limit, over `ranked` (the k best plans).
    """
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0")
    fastest, fastest_t = min(ranked, key=lambda pt: pt[1])
    method = "top-k"
    plan, step = pick_simplest(ranked, tolerance)
    evaluation = None
    if evaluations is not None:
        for (p, _), ev in zip(ranked, evaluations, strict=False):
            if p.key() == plan.key():
                evaluation = ev
    if phase_two:
        # the search composes without the calibrated fixed time per step (steptime.py)
        from autoparallel_cp.cost.steptime import fixed_step_s

        fixed = fixed_step_s(job)
        out = simplest_within(job, fastest_t * (1.0 + tolerance) - fixed, fix=fix,
                              time_limit=time_limit, workers=workers, hint=fastest,
                              context=context)
        if out is not None:
            method = "cp-sat phase 2"
            p2, t2 = out
            t2 += fixed
            # strictly simpler, or as simple and really faster (not float noise between the
            # solver's tables and evaluate)
            if complexity(p2) < complexity(plan) or (
                    complexity(p2) == complexity(plan) and t2 < step * (1 - _REL_EPS)):
                plan, step, evaluation = p2, t2, None
    return Recommendation(
        plan=plan, step_s=step, fastest=fastest, fastest_step_s=fastest_t,
        tolerance=tolerance, complexity=complexity(plan),
        fastest_complexity=complexity(fastest), method=method, evaluation=evaluation,
    )
