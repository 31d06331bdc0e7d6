"""Activation offload as a search axis (issues 28, 31.2): `--fix activation_offload=k` searches
the plans with k layers per stage whose saved activations go to host memory
(`Plan.activation_offload`, cost/offload.py `offloaded_activations`, `activation_offload_s`),
and `--search-also offload` adds the counts of `domain` (ceil((L-1)/2) and L - 1): each count
is a sub-space of the union `SearchSpace.schedule_variants` lists (`variants`), solved as the
schedule sub-spaces are (solve.py `_solve_union`, a key's best over them; the enumerator walks
the same list), so the default search (no request) is unchanged. Measured (loaded 2-core
machine): the whole command +0.4-0.5 s on Llama-3 8B / 16 H100, Llama 2 13B / 8 A100 and the
README job (1.5-2.2 s before with the optimizer shares alone).

Which plans: one pipeline stage (pp = vpp = 1), no activation recompute, k <= L layers, the
default schedule (1F1B), every node group with a host. These are the plans the one framework
that offloads a count of layers runs: Transformer Engine's CPU offloading behind Megatron's
`--cpu-offloading-num-layers k` needs pp = 1, no recompute and k < L (spec/frameworks.py
rule `megatron` / `activation_offload`, megatron/core/transformer/transformer_config.py
:1884-1899); torchtitan and DeepSpeed run none (their rows refuse the pin). Without a
framework restriction the same one-stage space is searched; a pp > 1 plan with offloaded
layers is still evaluated (`evaluate --plan`), not searched (the proof line says so). Models
with MTP depths are not searched (their MTP layer reads the same activation table, below).

How it enters the composition (tables.py, enumerate.py, cpsat_partition.py), k fixed per
space (`act_layers`, the pin in `SearchSpace.fixed`):
- GPU memory. At pp = 1 under 1F1B the stage holds f = 1 micro-batch in flight
  (cost/sync.py `inflight`: min(pp - j, m) = 1), no layer is recomputed, so the kept layers
  are all L layers and evaluate's activations (memory.py) are
  (A - k·A/L)·1 + A/L = A·(L - k + 1)/L, with A = sum over the layers of their activation
  bytes (mean A/L per layer, one offloaded layer in transit). So every layer's activation
  entry of the tables is scaled by `kept_share` = (L - k + 1)/L (1.0, the same bits, at
  k = 0), and every reader of the tables (the master, the key bounds, the partition model,
  the enumerator, `plan_cost`) sees evaluate's memory with no new term. The embedding's and
  the head's activations are separate tables and are not scaled (not offloaded).
- Time. The copies add `activation_offload_s` = max(0, d - F) + max(0, d - B) per
  micro-batch, d = k·A/L over the host link, F and B the stage's forward and backward
  seconds: a constant of the key (one stage holds the whole model). `stage_terms` takes it
  from cost/steptime.py's own `StageTime.offload_s` for the key's one plan (so it is
  evaluate's float), and `plan_cost`, the enumerator and the partition model (floored to its
  time unit, one more floored term in `error_bound_s`) add it to the stage time.
- Host memory. evaluate's `host_fits` on the key's plan (`stage_terms`): the offloaded
  k·A/L bytes (and the optimizer share's, when searched) on each GPU of a node; a plan that
  does not fit is not a plan of the space (`plan_cost.fits`, the enumerator's `fits`, and
  the partition model has no partition).

Why the bounds stay valid: the master (cpsat_master.py) and the key bounds (key_bounds.py)
read the scaled activation tables (exact) and leave out the copy time and the host check.
Leaving out a check only relaxes (more plans, a smaller least). Leaving out the time: at
pp = 1 the step time is m·t + max(a·d, d - b·t) + o (tables.plan_cost: pipeline m·t, DP tail
with a = DP_TAIL_FRACTION, b = BACKWARD_SHARE <= 1 <= m), non-decreasing in the stage time
t (slope m or m - b >= 0), so the cost with t less the copy time is <= the exact cost and a
lower bound of the former is one of the latter. The partition model adds the floored copy
time, so its objective stays <= the exact step time (tests/search/test_act_offload_search.py:
CP-SAT equals the enumerator, LB <= every key's exact best, diff <= error bound).
"""

from __future__ import annotations

from typing import Any

from autoparallel_cp.errors import InputError

#: the schedules of a searched activation offload: today's default at vpp 1 (1F1B), whose
#: single stage holds one micro-batch in flight (the memory identity above)
_SCHEDULES = (None, "1f1b")


def act_layers(space: Any) -> int:
    """Layers per stage whose activations go to the host in every plan of `space` (its pin)."""
    return int(space.fixed.get("activation_offload", 0) or 0)


def kept_share(space: Any) -> float:
    """Factor of every layer's activation entry in the tables (module docstring):
    (L - k + 1)/L with k = `act_layers`, exactly 1.0 at k = 0."""
    k = act_layers(space)
    if not k:
        return 1.0
    L = space.num_layers
    return (L - k + 1) / L


def domain(space: Any) -> tuple[int, ...]:
    """The counts `--search-also offload` searches: ceil(K/2) and K = L - 1 (half and all
    but one of the layers: Megatron runs k < L; k = 1 saves nothing, its one layer in
    transit stays on the GPU, so k >= 2), each kept where `narrow` takes it (hosts, no MTP,
    pp = vpp = 1 and recompute none searched, the frameworks' rows); () otherwise."""
    top = space.num_layers - 1
    out = []
    for k in sorted({-(-top // 2), top}):
        if k >= 2:
            try:
                narrow(space, k)
            except InputError:
                continue
            out.append(k)
    return tuple(out)


def apply(space: Any, pins: Any) -> Any:
    """`space` after `for_job`'s other steps: narrowed to a pinned count (`narrow`), or
    searching `domain` besides its own plans when the job asks for offload
    (`Job.search_also`), else unchanged."""
    if "activation_offload" in pins:
        return narrow(space, pins["activation_offload"])
    if "offload" in space.job.search_also and (ks := domain(space)):
        return space.with_(act_axis=ks)
    return space


def variants(space: Any, subs: tuple[Any, ...]) -> tuple[Any, ...]:
    """`SearchSpace.schedule_variants`: the schedule sub-spaces `subs`, then one one-stage
    sub-space per count of `space.act_axis` (`narrow`), the union of which the space is
    (disjoint: their plans differ in `activation_offload`); `subs` without an axis."""
    if not space.act_axis:
        return subs
    memo: dict[str, tuple[Any, ...]] = space.__dict__.setdefault("_aoff_v", {})
    if "v" not in memo:
        memo["v"] = tuple(v.with_(act_axis=()) for v in subs) + tuple(
            narrow(space.with_(act_axis=(), fixed={**space.fixed, "activation_offload": k}),
                   k) for k in space.act_axis)
    return memo["v"]


def searched(space: Any) -> list[int]:
    """The activation-offload counts the space's plans take (`SearchSpace.describe`)."""
    return [act_layers(space)] if "activation_offload" in space.fixed else [0, *space.act_axis]


def part_key(space: Any) -> Any:
    """A sub-space's name in a union's parts (solve.py `_solve_union`, capacity.py): its
    schedule, with its offloaded-layer count when it has one."""
    k = act_layers(space)
    return space.schedule if not k else (space.schedule, k)


def narrow(space: Any, k: Any) -> Any:
    """`space` (built with the pin `activation_offload=k`) narrowed to the plans that offload
    (module docstring): pp = vpp = 1, recompute none, the default schedule. InputError (exit
    2) for a k outside 0..L, a cluster without hosts, an MTP model, a pin of pp, vpp,
    recompute or schedule that leaves no such plan, or frameworks that do not run it."""
    from autoparallel_cp.search.offload_axis import has_hosts
    from autoparallel_cp.spec.plan import Plan

    job = space.job
    L = job.model.num_layers
    where = f"--fix activation_offload={k}"
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= L:
        raise InputError(f"{where}: expected a layer count in 0..{L}", field="activation_offload")
    if k == 0:
        return space
    if not has_hosts(job):
        raise InputError(f"{where}: offloading needs every node group's host (cluster field "
                         "`host`: link_gbps, memory_gib, memory_gbps)", field="activation_offload")
    if job.model.mtp_layers:
        raise InputError(f"{where}: models with MTP depths are not searched with activation "
                         "offload; evaluate a plan with it (evaluate --plan)",
                         field="activation_offload")
    if 1 not in space.pp or 1 not in space.vpp or "none" not in space.recompute \
            or space.schedule not in _SCHEDULES:
        raise InputError(f"{where}: activation offload is searched on one-stage plans without "
                         "recompute under 1F1B (pp=1, vpp=1, recompute=none: Transformer "
                         "Engine's CPU offloading); the other pins leave none. Evaluate such a "
                         "plan with evaluate --plan", field="activation_offload")
    r = space.restriction
    if r is not None:
        rows = [f for f in r.key_refusals(Plan(activation_offload=k))
                if f.field == "activation_offload"]
        if rows:
            raise InputError(f"{where}: {r.describe()} does not run it ({rows[0].reason})",
                             field="activation_offload")
    return space.with_(pp=(1,), vpp=(1,), recompute=("none",), partial_recompute=False,
                       schedules=(space.schedule,))


def stage_terms(space: Any, tp: int, cp: int, dp: int, ep: int, sp: int, zero: int, mbs: int,
                m: int) -> tuple[float, bool]:
    """(exposed copy seconds per micro-batch, the plan fits its hosts) of the one-stage plan
    of `space` with these axes (module docstring): cost/steptime.py's `offload_s` and
    cost/evaluate.py's `host_fits`, memoized per space. (0.0, True) for axes that make no
    valid plan (the callers mask those keys)."""
    from autoparallel_cp.cost.evaluate import host_fits
    from autoparallel_cp.cost.memory import stage_memory
    from autoparallel_cp.cost.steptime import stage_times
    from autoparallel_cp.errors import UserError
    from autoparallel_cp.spec.plan import Plan

    memo: dict[tuple[int, ...], tuple[float, bool]] = space.__dict__.setdefault("_aoff", {})
    key = (tp, cp, dp, ep, sp, zero, mbs, m)
    if key not in memo:
        job = space.job
        try:
            plan = Plan(dp=dp, tp=tp, pp=1, vpp=1, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs,
                        num_microbatches=m, recompute="none", etp=space.etp,
                        dp_replicate=space.dp_replicate,
                        optimizer_offload=space.optimizer_offload,
                        activation_offload=act_layers(space))
            off = stage_times(job, plan)[0].offload_s
            memo[key] = (float(off), host_fits(job, plan, stage_memory(job, plan)))
        except (UserError, ValueError, ZeroDivisionError):
            memo[key] = (0.0, True)
    return memo[key]
