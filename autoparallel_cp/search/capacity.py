"""Near-capacity plans (issue 28.5): searched up to the GPUs' whole memory, marked with their
risk instead of dropped.

`--mem-headroom h` is the margin above which a plan is called risky: the search admits every
plan whose predicted need fits the GPU's memory (a need above it is still infeasible), and a
plan whose need is above (1 - h) x capacity is returned with `memory.near_capacity: true` and
its `memory.oom_risk` (cost/uncertainty.py). The recommendation is taken among the plans within
the margin (`safe_ranked`), so the fastest plan a user is advised to run is a safe one, while
the near-capacity plans that production teams run at 95 %+ of memory stay visible.

The table's proof is the search up to capacity (its k best are the k fastest plans that fit);
the plans within the margin are a subset of that space, so when the fastest of the k best is
within the margin it is also the fastest safe plan, and otherwise the caller solves the space
with the margin for it (`needs_safe_search`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoparallel_cp.cost.uncertainty import near_capacity
from autoparallel_cp.search.act_offload import part_key
from autoparallel_cp.spec import GIB, Job
from autoparallel_cp.spec.plan import Plan


def to_capacity(job: Job) -> tuple[Job, float]:
    """(the job searched up to the GPUs' whole memory, the margin h above which a plan is
    risky: the job's `--mem-headroom`)."""
    h = float(job.mem_headroom)
    return (job.model_copy(update={"mem_headroom": 0.0}) if h > 0 else job), h


def annotate(dicts: Iterable[dict[str, Any]], headroom: float) -> None:
    """Add `memory.near_capacity` and `memory.mem_headroom` to PLAN dicts evaluated against the
    whole memory (in place; `fits` and every other field unchanged). A plan that does not fit
    the whole memory (evaluate's `fits: false`) is over capacity, not near it."""
    for d in dicts:
        mem = d.setdefault("memory", {})
        need = mem.get("required_bytes", mem.get("peak_bytes")) or 0.0
        cap = mem.get("capacity_bytes") or 0.0
        mem["near_capacity"] = bool(cap) and d.get("fits", True) is not False \
            and near_capacity(float(need), float(cap), headroom)
        mem["mem_headroom"] = headroom


def is_near(d: Mapping[str, Any]) -> bool:
    """Whether an annotated PLAN dict is above the margin."""
    return bool(d.get("memory", {}).get("near_capacity"))


def safe_ranked(ranked: Sequence[tuple[Plan, float]], dicts: Sequence[Mapping[str, Any]]
                ) -> list[tuple[Plan, float]]:
    """The (plan, step) pairs of `ranked` whose PLAN dict is within the margin."""
    return [pt for pt, d in zip(ranked, dicts, strict=True) if not is_near(d)]


def needs_safe_search(dicts: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the fastest safe plan is unknown from the k best up to capacity: their #1 is
    near capacity (a safe #1 is the fastest safe plan, the safe space being a subset)."""
    return bool(dicts) and is_near(dicts[0])


def risk_text(d: Mapping[str, Any]) -> str:
    """`!12%`: the table's mark of a near-capacity plan ('' within the margin)."""
    if not is_near(d):
        return ""
    risk = d.get("memory", {}).get("oom_risk")
    return "!" if risk is None else f"!{risk:.0%}"


def risk_note(d: Mapping[str, Any]) -> str:
    """`, near capacity (74.5 of 79.1 GiB, above the 14.5% margin): 48% risk of running out of
    memory` for a plan above the margin ('' otherwise)."""
    if not is_near(d):
        return ""
    mem = d.get("memory", {})
    need = mem.get("required_bytes", mem.get("peak_bytes")) or 0.0
    cap = mem.get("capacity_bytes") or 0.0
    risk = mem.get("oom_risk")
    return (f", near capacity ({need / GIB:.1f} of {cap / GIB:.1f} GiB, above the "
            f"{mem.get('mem_headroom', 0):.1%} margin)"
            + ("" if risk is None else f": {risk:.0%} risk of running out of memory"))


@dataclass
class Reuse:
    """What a search of a space up to a larger capacity hands to a search of the same space
    within the margin (`reuse`): tables and bound tables at the new capacity, proven lower
    bounds by key, and the keys whose best plan is already known."""

    tables: Any
    bounds: Any  # cpsat_master.BoundTables at the new capacity
    key_bounds: dict[Any, float]
    found: dict[Any, Any]  # key -> solve.KeyResult, exact under the new capacity
    keys: Any = None  # key_table.KeyTable at the new capacity (`KeyTable.at`)


def reuse(prior: Any, space: Any) -> Reuse | None:
    """The first (up-to-capacity) search's results that stay true for `space`, the same space
    at a smaller capacity (the job differs only in a larger `mem_headroom`); None when the
    spaces differ in anything else. `prior` is the first search's `solve.SearchContext`.

    Proof. Only the GPUs' usable memory changes, so every factor table but the capacity is the
    same (`tables.with_capacity`), and the master's bound tables but their capacity mean
    (`cpsat_master.with_capacity`). A plan fitting the smaller capacity fits the larger one,
    so the new space's plans of a key are a subset of the old's: (1) a lower bound of every old
    plan of the key (`key_bound`, a proven `above` value, the key's old best step time) bounds
    every new one; (2) a key's old best that fits the new capacity (the exact re-check,
    `tables.plan_cost`) is its new best, since no new plan is faster than the old best. The
    search then runs its loop unchanged over these: its stopping rule needs only that every
    bound is a lower bound and every found plan a key's exact best (solve.py)."""
    from dataclasses import replace as dc_replace

    from autoparallel_cp.search.cpsat_master import with_capacity as bt_capacity
    from autoparallel_cp.search.tables import plan_cost
    from autoparallel_cp.search.tables import with_capacity as t_capacity

    subs = space.schedule_variants()
    if len(subs) > 1:
        # a union of schedule sub-spaces (solve.py `_solve_union`): each sub-space reuses its
        # own part of the prior (`SearchContext.parts`), so the union is reusable when every
        # part is; the value returned is the default sub-space's
        parts = getattr(prior, "parts", None) or {}
        got = [reuse(parts[k], v) if (k := part_key(v)) in parts else None for v in subs]
        return got[0] if all(g is not None for g in got) else None
    old = prior.space
    if prior.tables is None or old.job.mem_headroom > space.job.mem_headroom:
        return None
    same_job = old.job.model_copy(update={"mem_headroom": space.job.mem_headroom})
    if same_job != space.job or old.describe() != space.describe() \
            or dict(old.fixed) != dict(space.fixed) or old.restriction != space.restriction:
        return None
    tabs = t_capacity(prior.tables, space)
    bt = bt_capacity(prior.keys.bounds, tabs)
    bounds = dict(prior.key_bounds)
    for key, v in prior.above.items():
        bounds[key] = max(bounds.get(key, v), v)
    found: dict[Any, Any] = {}
    for key, res in prior.found.items():
        if plan_cost(tabs, res.plan).fits:
            found[key] = dc_replace(res, tables=tabs)
        else:  # its best needs more memory: the new best is no faster
            bounds[key] = max(bounds.get(key, res.step_s), res.step_s)
    keys = prior.keys.at(bt) if getattr(prior.keys, "mem", None) is not None else None
    return Reuse(tabs, bt, bounds, found, keys)


def origin_of(fix: str | Mapping[str, Any] | None, emit: str | None) -> tuple[Any, ...]:
    """What `SearchSpace.for_job` builds a job's space from besides the job: the pins (as
    sorted (field, repr) pairs) and the `--emit` format (`space_at` compares them)."""
    from autoparallel_cp.spec.plan import parse_assignments

    pins = parse_assignments(fix) if isinstance(fix, str) else dict(fix or {})
    return tuple(sorted((k, repr(v)) for k, v in pins.items())), emit


def space_at(prior: Any, job: Job, origin: tuple[Any, ...]) -> Any:
    """The space a first (up-to-capacity) search listed, for `job`, the same job at a larger
    `mem_headroom` (the CLI's search within the margin), with every listing it cached (the
    degree combinations, the variants, the partition families, the size, the framework and
    host verdicts, the bubble ratios): `SearchSpace.for_job(job, ...)` without listing the
    space again. None when `prior` (a `solve.SearchContext`) has no root space, was built from
    other pins or another format (`origin`), or its job differs in anything but a smaller
    `mem_headroom`.

    Why the caches hold: `mem_headroom` enters the cost model only as the GPUs' usable memory
    (cost/memory.py `usable_bytes`), which no space rule reads (the degree rules read the GPU
    count, the batch, the model and the cluster's shape; the host rule reads host memory;
    the counts read the domains), so every cached listing of the space is the same at any
    headroom; the capacity lives in the tables alone (`tables.with_capacity`, `reuse`)."""
    root = getattr(prior, "root", None)
    if root is None or getattr(prior, "origin", None) != origin \
            or root.job.mem_headroom > job.mem_headroom \
            or root.job.model_copy(update={"mem_headroom": job.mem_headroom}) != job:
        return None
    return _rejob(root, job, {})


def _rejob(space: Any, job: Job, seen: dict[int, Any]) -> Any:
    """`space` with `job` in place of its job and its caches (the instance-dict entries of
    space.py, space_count.py, offload_axis.py, schedule_axis.py, act_offload.py) carried over;
    every space they hold re-jobbed the same way (once each: `seen`)."""
    from dataclasses import replace

    if id(space) in seen:
        return seen[id(space)]
    r = space.restriction
    if r is not None and id(r) not in seen:  # the same rows' verdicts: no row reads memory
        seen[id(r)] = replace(r, job=job)
        seen[id(r)]._verdicts.update(r._verdicts)
    new = replace(space, job=job, restriction=None if r is None else seen[id(r)])
    seen[id(space)] = new
    for name, memo in space.__dict__.items():
        if name.startswith("_"):
            new.__dict__[name] = _carry(memo, job, seen)
    return new


def _carry(x: Any, job: Job, seen: dict[int, Any]) -> Any:
    """A cached value for the re-jobbed space: the spaces in it re-jobbed, the rest shared."""
    from autoparallel_cp.search.space import SearchSpace

    if isinstance(x, SearchSpace):
        return _rejob(x, job, seen)
    if isinstance(x, dict):
        return {k: _carry(v, job, seen) for k, v in x.items()}
    if isinstance(x, tuple) and x and isinstance(x[0], (SearchSpace, tuple, dict)):
        return tuple(_carry(v, job, seen) for v in x)
    return x
