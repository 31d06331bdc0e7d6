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

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ClusterSpec, Job, ModelSpec, TrainingRecipe
from autoparallel_cp.spec.plan import Plan, PlanError, parse_assignments, parse_plan

__all__ = [
    "load_model", "load_cluster", "make_job", "resolve_recipe", "select_gpus", "evaluate",
    "solve", "enumerate_plans", "parse_fix", "with_inter_node_bandwidth", "cluster_price_per_hour",
]


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A ModelSpec from a preset name, a YAML/JSON spec or a Hugging Face config.json."""
    from autoparallel_cp.spec.loaders import load_model as _load

    return _load(name_or_path)


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A ClusterSpec from a preset name or a YAML/JSON file."""
    from autoparallel_cp.spec.loaders import load_cluster as _load

    return _load(name_or_path)


def resolve_recipe(recipe: str | TrainingRecipe) -> TrainingRecipe:
    """A recipe from its name (RECIPES keys), a YAML/JSON file, or the recipe itself."""
    if isinstance(recipe, TrainingRecipe):
        return recipe
    from autoparallel_cp.spec.loaders import load_recipe

    return load_recipe(recipe)


def select_gpus(cluster: ClusterSpec, gpus: int | None = None,
                nodes: int | None = None) -> ClusterSpec:
    """The part of `cluster` used: the first `gpus` GPUs or `nodes` nodes (default: all)."""
    if gpus is not None and nodes is not None:
        raise InputError("give --gpus or --nodes, not both", field="--gpus")
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
) -> Job:
    """Build a Job from names/paths or specs; `gpus`/`nodes` select part of the cluster."""
    m = model if isinstance(model, ModelSpec) else load_model(model)
    c = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    if seq_len <= 0:
        raise InputError(f"must be positive, got {seq_len}", field="--seq-len")
    if global_batch <= 0:
        raise InputError(f"must be positive, got {global_batch}", field="--global-batch")
    return Job(model=m, cluster=select_gpus(c, gpus, nodes), recipe=resolve_recipe(recipe),
               seq_len=seq_len, global_batch=global_batch)


def parse_fix(fix: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """`--fix tp=8,sp=1` as a dict of typed plan fields (PlanError on a bad field)."""
    if fix is None:
        return {}
    if isinstance(fix, Mapping):
        return dict(fix)
    return parse_assignments(fix)


def as_plan(job: Job, plan: str | Plan | Mapping[str, Any]) -> Plan:
    """A Plan from `key=value` text, a dict of fields or a Plan; dp/m derived from the job."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, Mapping):
        text = ",".join(
            f"{k}={':'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
            for k, v in plan.items() if v is not None)
        return parse_plan(text, job)
    return parse_plan(plan, job)


def evaluate(job: Job, plan: str | Plan | Mapping[str, Any]) -> Any:
    """The exact memory / time breakdown of one plan (an Evaluation with `.to_json()`).

    Plans that break a divisibility rule raise PlanError listing every broken rule; plans that
    do not fit are evaluated (`fits: false`).
    """
    from autoparallel_cp.spec.plan import plan_violations

    p = as_plan(job, plan)
    bad = plan_violations(job, p)
    if bad:
        raise PlanError("plan breaks: " + "; ".join(bad))
    from autoparallel_cp.cost.evaluate import evaluate as exact

    return exact(job, p)


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
) -> Any:
    """Optimal and k best plans found by CP-SAT: a SolveResult (status, solve_time_s,
    space_size, plans best first). Raises InfeasibleError when no plan fits."""
    if objective not in ("throughput", "cost"):
        raise InputError(f"must be throughput or cost, got {objective!r}", field="--objective")
    if top_k < 1:
        raise InputError(f"must be >= 1, got {top_k}", field="--top-k")
    pins = parse_fix(fix)
    from autoparallel_cp.search.solve import solve as cpsat_solve

    return cpsat_solve(job, **_given(top_k=top_k, time_limit=time_limit, workers=workers,
                                     objective=objective, fix=pins, progress=progress,
                                     seed=seed))


def enumerate_plans(
    job: Job,
    *,
    top_k: int = 5,
    objective: str = "throughput",
    fix: str | Mapping[str, Any] | None = None,
) -> Any:
    """The exhaustive reference over the same space as `solve` (a SolveResult)."""
    if top_k < 1:
        raise InputError(f"must be >= 1, got {top_k}", field="--top-k")
    pins = parse_fix(fix)
    from autoparallel_cp.search.solve import enumerate_plans as reference

    return reference(job, **_given(top_k=top_k, objective=objective, fix=pins))


def with_inter_node_bandwidth(cluster: ClusterSpec, gbps: float) -> ClusterSpec:
    """The cluster with every node group's inter-node bandwidth set to `gbps` (GB/s per GPU)."""
    if gbps <= 0:
        raise InputError(f"must be positive, got {gbps}", field="--inter-node-gbps")
    groups = [g.model_copy(update={"inter_node": g.inter_node.model_copy(
        update={"bandwidth_gbps": float(gbps)})}) for g in cluster.node_groups]
    return cluster.model_copy(update={"node_groups": groups})


def cluster_price_per_hour(cluster: ClusterSpec) -> float | None:
    """USD per hour for all GPUs of the cluster, or None when a node group has no price."""
    total = 0.0
    for g in cluster.node_groups:
        if g.price_per_gpu_hour is None:
            return None
        total += g.price_per_gpu_hour * g.num_gpus
    return total
