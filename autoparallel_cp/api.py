"""Python API: the functions the `ap-solve` CLI itself uses.

Example::

    from autoparallel_cp import load_model, load_cluster, make_job
    from autoparallel_cp.search import solve
    from autoparallel_cp.cost import evaluate

    job = make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    result = solve(job, top_k=5, time_limit=10)
    best = result.plans[0]                       # Evaluation, best first
    print(best.to_json()["throughput"]["mfu"])
    print(evaluate(job, "tp=8,pp=4,mbs=1,recompute=selective,zero=1").to_json())

The cost model (`evaluate.py`) and the solver (`solve.py`) are imported on first use, so
`import autoparallel_cp` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ClusterSpec, Job, ModelSpec, TrainingRecipe
from autoparallel_cp.spec.base import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from autoparallel_cp.spec.plan import Plan, PlanError, check_fields, parse_assignments, parse_plan
from autoparallel_cp.spec.validation import validation_error

__all__ = [
    "load_model", "load_cluster", "make_job", "resolve_recipe", "select_gpus", "evaluate",
    "solve", "enumerate_plans", "parse_fix", "with_inter_node_bandwidth", "cluster_price_per_hour",
]


#: Most plans `solve` / `enumerate_plans` may be asked for (the table of a run).
MAX_TOP_K = 10_000
#: Most CP-SAT workers (threads) of one solve.
MAX_WORKERS = 1024
#: Longest time limit, seconds (11.6 days; proven optima of the presets take seconds).
MAX_TIME_LIMIT_S = 1e6


def _check_type(value: Any, types: type | tuple[type, ...], field: str, what: str) -> None:
    """InputError naming `field` unless `value` is one of `types` (bool is never a number)."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise InputError(f"expected {what}, got a boolean ({value})", field=field)
    if not isinstance(value, types):
        raise InputError(f"expected {what}, got {type(value).__name__} {value!r:.80}",
                         field=field)


def check_int(value: Any, field: str, lo: int, hi: int, why: str = "") -> int:
    """`value` as an int in [lo, hi], or InputError naming `field`, the bound and why."""
    _check_type(value, int, field, "an integer")
    if not lo <= value <= hi:
        because = f" ({why})" if why and value > hi else ""
        raise InputError(f"must be in {lo}..{hi}{because}, got {value}", field=field)
    return int(value)


def check_number(value: Any, field: str, *, positive: bool = True,
                 hi: float = math.inf) -> float:
    """`value` as a finite float (> 0 when `positive`, <= `hi`), or InputError naming
    `field`."""
    _check_type(value, (int, float), field, "a number")
    x = float(value)
    if not math.isfinite(x):
        raise InputError(f"must be a finite number, got {value}", field=field)
    if positive and x <= 0:
        raise InputError(f"must be positive, got {value}", field=field)
    if x > hi:
        raise InputError(f"must be <= {hi:g}, got {value}", field=field)
    return x


def _check_path(name_or_path: Any, what: str) -> None:
    _check_type(name_or_path, (str, Path), what, "a preset name or a file path")


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A ModelSpec from a preset name, a YAML/JSON spec or a Hugging Face config.json."""
    from autoparallel_cp.spec.loaders import load_model as _load

    _check_path(name_or_path, "model")
    return _load(name_or_path)


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A ClusterSpec from a preset name or a YAML/JSON file."""
    from autoparallel_cp.spec.loaders import load_cluster as _load

    _check_path(name_or_path, "cluster")
    return _load(name_or_path)


def resolve_recipe(recipe: str | TrainingRecipe) -> TrainingRecipe:
    """A recipe from its name (RECIPES keys), a YAML/JSON file, or the recipe itself."""
    if isinstance(recipe, TrainingRecipe):
        return recipe
    from autoparallel_cp.spec.loaders import load_recipe

    _check_type(recipe, (str, Path), "--recipe", "a recipe name, a file path or a TrainingRecipe")

    return load_recipe(recipe)


def select_gpus(cluster: ClusterSpec, gpus: int | None = None,
                nodes: int | None = None) -> ClusterSpec:
    """The part of `cluster` used: the first `gpus` GPUs or `nodes` nodes (default: all)."""
    _check_type(cluster, ClusterSpec, "cluster", "a ClusterSpec")
    if gpus is not None and nodes is not None:
        raise InputError("give --gpus or --nodes, not both", field="--gpus")
    if gpus is not None:
        check_int(gpus, "--gpus", 1, MAX_GPUS, "~20x the largest published cluster")
    if nodes is not None:
        check_int(nodes, "--nodes", 1, MAX_GPUS, "~20x the largest published cluster")
    try:
        if gpus is not None:
            return cluster.take_gpus(gpus)
        if nodes is not None:
            return cluster.take_nodes(nodes)
    except ValueError as exc:
        raise InputError(str(exc), source=f"cluster {cluster.name!r}",
                         field="--gpus" if gpus is not None else "--nodes") from None
    return cluster


def make_job(
    model: str | Path | ModelSpec,
    cluster: str | Path | ClusterSpec,
    *,
    gpus: int | None = None,
    nodes: int | None = None,
    seq_len: int = 4096,
    global_batch: int = 512,
    recipe: str | TrainingRecipe = "megatron-bf16",
    moe_load_imbalance: float = 1.0,
) -> Job:
    """Build a Job from names/paths or specs; `gpus`/`nodes` select part of the cluster;
    `moe_load_imbalance` is --moe-load-imbalance (1: balanced routing).

    Bad arguments raise InputError naming the argument (as its CLI option)."""
    check_int(seq_len, "--seq-len", 1, MAX_SEQ_LEN, "3x the longest published context")
    check_int(global_batch, "--global-batch", 1, MAX_GLOBAL_BATCH,
              "~1000x the largest published batch, in sequences")
    m = model if isinstance(model, ModelSpec) else load_model(model)
    c = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    part = select_gpus(c, gpus, nodes)
    r = resolve_recipe(recipe)
    try:
        job = Job(model=m, cluster=part, recipe=r, seq_len=seq_len, global_batch=global_batch)
    except ValidationError as exc:
        raise validation_error(exc, Job, "job") from None
    if moe_load_imbalance == 1.0:
        return job
    try:
        return job.with_moe_load_imbalance(moe_load_imbalance)
    except (TypeError, ValueError) as exc:
        raise InputError(str(exc), field="--moe-load-imbalance") from None


def _check_job(job: Any) -> Job:
    _check_type(job, Job, "job", "a Job (see make_job)")
    return job


def parse_fix(fix: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """`--fix tp=8,sp=1` as a dict of typed plan fields (PlanError on a bad field)."""
    if fix is None:
        return {}
    if isinstance(fix, Mapping):
        return check_fields(fix)
    if not isinstance(fix, str):
        raise PlanError(f"--fix: expected 'key=value,...' text or a mapping, got "
                        f"{type(fix).__name__}")
    return parse_assignments(fix)


def as_plan(job: Job, plan: str | Plan | Mapping[str, Any]) -> Plan:
    """A Plan from `key=value` text, a dict of fields or a Plan; dp/m derived from the job."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mapping):
        fields = check_fields(plan)
        text = ",".join(
            f"{k}={':'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
            for k, v in fields.items())
        return parse_plan(text, job)
    if not isinstance(plan, str):
        raise PlanError(f"expected a plan as 'key=value,...' text, a mapping or a Plan, got "
                        f"{type(plan).__name__}")
    return parse_plan(plan, job)


def evaluate(job: Job, plan: str | Plan | Mapping[str, Any]) -> Any:
    """The exact memory / time breakdown of one plan (an Evaluation with `.to_json()`).

    Plans that break a divisibility rule raise PlanError listing every broken rule; plans that
    do not fit are evaluated (`fits: false`).
    """
    from autoparallel_cp.spec.plan import plan_violations

    _check_job(job)
    p = as_plan(job, plan)
    bad = plan_violations(job, p)
    if bad:
        raise PlanError("plan breaks: " + "; ".join(bad))
    from autoparallel_cp.cost.evaluate import evaluate as exact

    return exact(job, p)


#: `--objective`: throughput and cost rank alike on a fixed cluster (cost per step is the step
#: time times the cluster's price); robust ranks by the pessimistic step time (`_robust`)
OBJECTIVES = ("throughput", "cost", "robust")


def _robust(job: Job, run: Callable[[Job], Any]) -> Any:
    """`--objective robust`: the k best plans by their pessimistic step time, exact.

    The pessimistic step time of a plan is its step time under `advice.pessimistic_job` (every
    calibration knob at the slow end of its 80 % range): the same cost model on a job with
    other rates, so the solver's composition, bounds and certificate hold for it unchanged and
    `run(pessimistic job)` returns the proven k best by it (no re-ranking of a superset). The
    plans are then re-evaluated on the job itself (their nominal predictions), in that order;
    `stats["pessimistic_step_s"]` holds the ranking's values and `context` the pessimistic
    search's proofs (the recommendation re-uses them with the pessimistic job)."""
    from autoparallel_cp.calibrate.advice import pessimistic_job
    from autoparallel_cp.cost.evaluate import evaluate as exact

    pj = pessimistic_job(job)
    res = run(pj)
    res.stats = {**res.stats, "pessimistic_step_s": [ev.time.step_s for ev in res.plans],
                 "pessimistic_job": pj}
    res.plans = [exact(job, ev.plan) for ev in res.plans]
    return res


def _check_search_args(job: Any, top_k: Any, objective: Any) -> None:
    _check_job(job)
    check_int(top_k, "--top-k", 1, MAX_TOP_K)
    if objective not in OBJECTIVES:
        raise InputError(f"must be one of {', '.join(OBJECTIVES)}, got {objective!r}",
                         field="--objective")


def _given(**kwargs: Any) -> dict[str, Any]:
    """The keyword arguments that were given (None means the callee's default)."""
    return {k: v for k, v in kwargs.items() if v is not None}


def solve(
    job: Job,
    *,
    top_k: int = 5,
    time_limit: float | None = 10.0,
    workers: int | None = None,
    objective: str = "throughput",
    fix: str | Mapping[str, Any] | None = None,
    progress: Callable[..., Any] | None = None,
    seed: int | None = None,
    emit: str | None = None,
    prior: Any = None,
) -> Any:
    """Optimal and k best plans found by CP-SAT: a SolveResult (status, solve_time_s,
    space_size, plans best first). Raises InfeasibleError when no plan fits. The search keeps
    to the plans the recipe's framework (deepspeed, torchtitan-fsdp, pytorch-fsdp) and the
    `emit` format run (spec/framework_space.py). `prior`: a SolveResult's `context` of the
    same search at a smaller `mem_headroom`, whose proven parts are reused (search/capacity.py
    `reuse`; not with the robust objective, whose job differs)."""
    _check_search_args(job, top_k, objective)
    if time_limit is not None:
        check_number(time_limit, "--time-limit", hi=MAX_TIME_LIMIT_S)
    if workers is not None:
        check_int(workers, "--workers", 1, MAX_WORKERS)
    if seed is not None:
        check_int(seed, "seed", -(2**31), 2**31 - 1)  # CP-SAT random_seed is an int32
    if progress is not None and not callable(progress):
        raise InputError(f"expected a callable or None, got {type(progress).__name__}",
                         field="progress")
    pins = parse_fix(fix)
    from autoparallel_cp.search.solve import solve as cpsat_solve

    fmt = _emit_format(emit)

    def run(j: Job) -> Any:
        return cpsat_solve(j, **_given(top_k=top_k, time_limit=time_limit, workers=workers,
                                       fix=pins, progress=progress, seed=seed, emit=fmt,
                                       prior=prior if objective != "robust" else None))

    return _robust(job, run) if objective == "robust" else run(job)


def enumerate_plans(
    job: Job,
    *,
    top_k: int = 5,
    objective: str = "throughput",
    fix: str | Mapping[str, Any] | None = None,
    emit: str | None = None,
) -> Any:
    """The exhaustive reference over the same space as `solve` (a SolveResult)."""
    _check_search_args(job, top_k, objective)
    pins = parse_fix(fix)
    from autoparallel_cp.search.solve import enumerate_plans as reference

    fmt = _emit_format(emit)

    def run(j: Job) -> Any:
        return reference(j, **_given(top_k=top_k, fix=pins, emit=fmt))

    return _robust(job, run) if objective == "robust" else run(job)


def _emit_format(emit: str | None) -> str | None:
    """`emit` checked against the launch-settings formats (InputError naming them)."""
    from autoparallel_cp.spec.frameworks import FRAMEWORKS

    if emit is not None and emit not in FRAMEWORKS:
        raise InputError(f"emit: {emit!r} is not one of {', '.join(FRAMEWORKS)}", field="emit")
    return emit


def with_inter_node_bandwidth(cluster: ClusterSpec, gbps: float) -> ClusterSpec:
    """The cluster with every node group's inter-node bandwidth set to `gbps` (GB/s per GPU)."""
    check_number(gbps, "--inter-node-gbps")
    _check_type(cluster, ClusterSpec, "cluster", "a ClusterSpec")
    data = cluster.model_dump()
    for g in data["node_groups"]:
        g["inter_node"]["bandwidth_gbps"] = float(gbps)
    try:  # validated again: the bandwidth's bounds (spec.base)
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, ClusterSpec, "--inter-node-gbps") from None


def cluster_price_per_hour(cluster: ClusterSpec) -> float | None:
    """USD per hour for all GPUs of the cluster, or None when a node group has no price."""
    total = 0.0
    for g in cluster.node_groups:
        if g.price_per_gpu_hour is None:
            return None
        total += g.price_per_gpu_hour * g.num_gpus
    return total
