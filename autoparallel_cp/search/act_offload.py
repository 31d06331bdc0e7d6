"""Activation offload as a search axis (issues 28, 31.2): `--fix activation_offload=k` searches
the plans with k layers per stage whose saved activations go to host memory
(`Plan.activation_offload`, cost/offload.py `offloaded_activations`, `activation_offload_s`),
and `--search-also offload` adds the counts of `domain` (ceil((L-1)/2) and L - 1), one-stage
only: each count is a sub-space of the union `SearchSpace.schedule_variants` lists
(`variants`), solved as the schedule sub-spaces are (solve.py `_solve_union`, a key's best
over them; the enumerator walks the same list), so the default search (no request) is
unchanged. Measured (loaded 2-core machine): the whole command +0.4-0.5 s on Llama-3 8B / 16
H100, Llama 2 13B / 8 A100 and the README job (1.5-2.2 s before with the optimizer shares
alone).

Which plans (`narrow`). `--search-also offload`'s counts and a framework row that refuses
some pinned plan (Megatron's: Transformer Engine's CPU offloading behind
`--cpu-offloading-num-layers k` needs pp = 1, no recompute and k < L, spec/frameworks.py rule
`megatron` / `activation_offload`, megatron/core/transformer/transformer_config.py
:1884-1899): the exact one-stage family only (pp = 1, vpp = 1, recompute none, 1F1B: "One
stage" below); torchtitan and DeepSpeed run none (their rows refuse the pin, exit 2); MTP
models are refused (their MTP layer reads the same activation table). Otherwise, on clusters
with a host on every node group, the pin searches what the unpinned search does (issue 31):
every recompute mode (none, selective, full and its partial counts), every vpp, every
searched schedule (`PINNED_SCHEDULES`: 1F1B, interleaved, GPipe, ZB-H1 / H2, ZBV, DualPipe,
DualPipeV), pp = 1 and the pp > 1 with p·k <= L (`_stages_ok`: evaluate needs every stage to
hold >= k layers, spec/schedules.py `offload_violations`); on several node groups every stage
placement, at the pp with at most `PLACEMENTS_MAX` of them (schedule_axis.py
`placement_capped`; `stage_groups` pinned: one), each stage's group's tables, host memory
and host link (cost/offload.py; act_offload_free.py makes the placement a model decision).
`_by_stages` splits it into disjoint parts (`part_key`): the exact one-stage part (tables,
`kept_share`) and the parts the cost model scores (`scored`): pp = 1 with the other recompute
modes, and pp > 1. A scored part at pp > 1 lists the named layouts whose stages hold >= k
layers (spec/splits.py `named_layouts`, `SearchSpace.layouts`), a uniform / pinned split and,
under `FREE_SCHEDULES` the free splits of stages >= k (`free_at`, act_offload_free.py). A plan
that recomputes every layer of a stage keeps none there, so it offloads nothing (evaluate's
memory.py: `offloaded_activations` of no kept layer is 0) and costs as without the pin.

Scored parts: why a per-stage table cannot hold them. On stage (rank part) j with n_j layers,
r_j of them recomputed (their checkpoint bytes C_j), kappa_j = n_j - r_j kept (their bytes
K_j in the mode's base, mean mu_j), and f_j in-flight micro-batches (cost/schedules.py
`inflight_units`), evaluate keeps act_j = (C_j + K_j - off_j)·f_j + one_j bytes of layer
activations (memory.py: off_j = min(k, kappa_j)·mu_j on the host, one_j = mu_j, one
offloaded layer in transit; both 0 when kappa_j = 0) and adds the exposed copies o_j =
max(0, d_j - F_j) + max(0, d_j - B_j) per micro-batch to the stage time (steptime.py
`offload_s`, d_j = off_j/link). mu_j mixes the layer kinds and recompute choice of a stage,
and F_j, B_j grow with n_j and the edges: neither is a scale of the layer tables. So their
keys are scored by the cost model (search/model_scored.py `model_scored`, model_scan.py
`best_of_key`, stages of >= k layers: plan_cost equals evaluate by construction, and the
enumerator scores the same plans the same way), and only the bounds read the tables:
- memory (`lower_acts`). Every searched schedule holds f_j >= 1: 1F1B min(pp - j, m),
  interleaved `stage_inflight` (>= 1, unequal chunks too: cpsat_master.py's docstring),
  GPipe m, ZB-H1 / ZBV min(pp, m), ZB-H2 min(2pp - 1, m), DualPipe min(pp - j, m/2) (m >=
  2pp), DualPipeV min(pp + 1/2, m). With K_j - off_j >= 0, act_j >= C_j + K_j - (min(k,
  kappa_j) - 1)·mu_j >= E_j - (k - 1)·a_max (kappa_j = 0: act_j >= C_j = E_j), E_j = C_j +
  K_j the stage's per-layer entries (kept: the mode's activation bytes, recomputed: the
  checkpoint) and a_max the largest layer kind's kept entry (>= mu_j). Summed over the pp
  parts (a DualPipe rank holds two, so the ranks' sum is twice it), Σ_j act_j >=
  max(0, ΣE - (k - 1)·pp·a_max). The master's memory condition (cpsat_master.py: the sum of
  the stage peaks with >= 1 micro-batch in flight fits the capacities) reads per layer
  e = the mode's entry (full: min(kept, checkpoint)) <= E's, and ΣE >= Σe >= L·e_min. With
  s = 1 - (k - 1)·P·a_max/(L·e_min) (P >= pp the space's largest pp) both the kept and (full)
  checkpoint tables times s give s·Σe <= Σe - (k - 1)·P·a_max <= ΣE - (k - 1)·pp·a_max when
  s > 0, and 0 when clipped: <= Σ_j act_j either way, per entry (tp, cp, ep, sp, mbs,
  mode), so the condition stays necessary. The checkpoint is scaled too: with it unscaled,
  the master's Σ_l min(s·kept, checkpoint) is not below that sum in general (one kind, L = 8,
  pp = P = 2, k = 2, checkpoint 0.7a, two of four layers per stage kept: s = 3/4, 8·0.7a =
  5.6a > 6.8a - 2a = 4.8a). tests/search/test_act_offload_any.py shows tables left unscaled
  break the master's bound. Several node groups (stage j on g_j, E_j from g_j's entries):
  a_max and e_min are taken over the groups too, so Σ_j act_j >= ΣE - (k - 1)·pp·a_max and
  ΣE >= m0 = Σ_l min_g e_{g,l} >= L·e_min; the master reads M = min_g Σ_l e_{g,l} (every
  layer on one group, cpsat_master.py `ma6`), which is <= r·m0 with r = the largest over the
  kinds of max_g e / min_g e (1 where a layer's entry is the same on every group). One
  factor s/r for every group gives (s/r)·M <= s·m0 <= m0 - (k - 1)·P·a_max <= Σ_j act_j
  (tests/search/test_act_offload_multi.py: LB <= every key's exact best on two groups).
- time: every bound the master (cpsat_master.py LB1, LB2) and DualPipe's own
  (dualpipe_bound.py) take is proven from lower bounds of the stage times (t_j >= the tables'
  sum of its layers' entries, hence S >= S_lb, T >= S/pp, T >= the harmonic bound) through
  forms nondecreasing in T and S (LB2 keeps its S coefficient > 0); the copies only add
  o_j >= 0 to t_j, so the bounds stay valid. The bubble's rho' <= rho: rho is
  `bubble_ratio(schedule, pp, (F, B, W), m)` of the plan's `backward_split` (cost/
  pass_split.py), which no copy changes; a V's replayed bubble (longest paths, >= 0) takes
  rho' = 0 (schedule_axis.py `family_ratio`).
- per-key bounds (key_bounds.py): 0 for a scored part (the master's), DualPipe's own with
  the activations dropped (dualpipe_bound.py `kept`), DualPipeV's composition not used
  (`_own_bound`: its tables hold no offload term); host memory left out (a relaxation).
- tests/search/test_act_offload_search.py, test_act_offload_any.py: CP-SAT equals the
  enumerator (recompute pinned or free, vpp 1-2, the schedules), LB <= every plan's exact
  cost, plan_cost == evaluate, and a too-large scaling caught.

One stage (pp = 1):
it enters the composition (tables.py, enumerate.py, cpsat_partition.py), k fixed per space
(`act_layers`, the pin in `SearchSpace.fixed`):
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

Why the bounds stay valid (the exact one-stage part): the master (cpsat_master.py) and the key
bounds (key_bounds.py) read the scaled activation tables (exact) and leave out the copy time and the
host check. Leaving out a check only relaxes (more plans, a smaller least). Leaving out the
time: at pp = 1 the step time is m·t + max(a·d, d - b·t) + o (tables.plan_cost: pipeline m·t,
DP tail with a = DP_TAIL_FRACTION, b = BACKWARD_SHARE <= 1 <= m), non-decreasing in the stage
time t (slope m or m - b >= 0), so the cost with t less the copy time is <= the exact cost and
a lower bound of the former is one of the latter. The partition model adds the floored copy
time, so its objective stays <= the exact step time (tests/search/test_act_offload_search.py:
CP-SAT equals the enumerator, LB <= every key's exact best, diff <= error bound).

Kept whole (about 420 lines): the pinned space's narrowing (`narrow`), its parts
(`_by_stages`, `scored`) and the memory bound (`lower_acts`) are one proof; split, each half
would restate the other's rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autoparallel_cp.errors import InputError
from autoparallel_cp.search.schedule_axis import PLACEMENTS_MAX, placement_count

#: the schedules of the exact one-stage family (today's default at vpp 1, 1F1B), whose single
#: stage holds one micro-batch in flight (the memory identity above)
_SCHEDULES = (None, "1f1b")
#: the searched schedules a pinned offload takes (module docstring, "Every other plan"): every
#: schedule of `schedule_axis.SEARCHED`; the V ones' and DualPipe's bounds are proven there
PINNED_SCHEDULES = (None, "1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2", "zbv",
                    "dualpipe", "dualpipev")


def act_layers(space: Any) -> int:
    """Layers per stage whose activations go to the host in every plan of `space` (its pin)."""
    return int(space.fixed.get("activation_offload", 0) or 0)


def kept_share(space: Any) -> float:
    """Factor of every layer's activation entry in the tables of a one-stage space (module
    docstring): (L - k + 1)/L with k = `act_layers`, exactly 1.0 at k = 0 and for a
    `pipelined` space (whose tables `lower_acts` scales)."""
    k = act_layers(space)
    if not k or scored(space):  # a part the cost model scores: `lower_acts`
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
                narrow(space, k, one_stage=True)
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
    memo: dict[str, tuple[Any, ...]] = space.__dict__.setdefault("_aoff_v", {})
    if "v" not in memo:
        memo["v"] = tuple(p for v in subs for p in _by_stages(v.with_(act_axis=()) if
                                                           space.act_axis else v)) + tuple(
            narrow(space.with_(act_axis=(), fixed={**space.fixed, "activation_offload": k}),
                   k, one_stage=True) for k in space.act_axis)
    return memo["v"]


def _by_stages(space: Any) -> tuple[Any, ...]:
    """A pinned space as its exact one-stage part (pp = 1, recompute none, 1F1B: the tables)
    and the parts the cost model scores (`scored`): pp = 1 with the other recompute modes, and
    pp > 1 with every mode; disjoint (their plans differ in pp or recompute). A space without
    the exact family, or without a pin, as it is; pp = 1 dropped where no vpp of the space is
    1 (interleaving needs pp > 1: those pp = 1 parts hold no plan)."""
    if act_layers(space) and 1 not in space.vpp and 1 in space.pp and len(space.pp) > 1:
        return (space.with_(pp=tuple(p for p in space.pp if p > 1)),)
    if not act_layers(space) or 1 not in space.pp or 1 not in space.vpp \
            or "none" not in space.recompute or space.schedule not in _SCHEDULES:
        return (space,)
    out = [space.with_(pp=(1,), vpp=(1,), recompute=("none",), partial_recompute=False)]
    if rest := tuple(r for r in space.recompute if r != "none"):
        out.append(space.with_(pp=(1,), vpp=(1,), recompute=rest))
    if more := tuple(p for p in space.pp if p > 1):
        out.append(space.with_(pp=more))
    return tuple(out)


def exact_one_stage(space: Any) -> bool:
    """Whether `space` is the one-stage family the tables compose exactly (module
    docstring, "One stage"): pp = 1, recompute none, 1F1B."""
    return space.pp == (1,) and space.recompute == ("none",) and space.schedule in _SCHEDULES


def scored(space: Any) -> bool:
    """Whether `space` is a part of an activation offload whose keys the cost model scores
    (search/model_scored.py `model_scored`): every pinned part but the exact one-stage one."""
    return bool(act_layers(space)) and not exact_one_stage(space)


#: the schedules whose scored pp > 1 parts search free per-stage counts (act_offload_free.py)
FREE_SCHEDULES = (None, "1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2")


def free_at(space: Any, pp: int, vpp: int) -> bool:
    """Whether a scored part's own free partitions are searched at (pp, vpp), pp > 1
    (search/act_offload_free.py): under `FREE_SCHEDULES` (any number of node groups: the
    placement is the model's decision there), neither a pinned nor a uniform split, and some
    split holds every stage >= `stage_min` layers."""
    lo, lo0 = stage_min(space, vpp)
    return (scored(space) and space.schedule in FREE_SCHEDULES and not space.fixed_split
            and space.partition != "uniform" and lo0 + (pp - 1) * lo <= space.num_layers)


def stage_min(space: Any, vpp: int) -> tuple[int, int]:
    """(least layers of a stage, of the first stage) of a free split at vpp: multiples of
    `layer_step` (vpp), each >= k = `act_layers` (spec/schedules.py `offload_violations`;
    k = 0 without a pin), the first also >= the dense prefix (`first_stage_min_units`; 0 for
    a V's empty rank 0, search/empty_rank.py)."""
    step, first = space.layer_step(vpp), space.first_stage_min_units(vpp)
    lo = step * max(1, -(-act_layers(space) // step))
    return lo, (max(lo, first * step) if first else 0)


def lower_acts(space: Any, t: Any) -> None:
    """Scale the layer activation tables `t.act` (and, for full recompute, `t.ckpt`) of a
    `scored` space, in place, to a lower bound the master may read (module docstring, "Every
    other plan"): per entry and mode one factor for every node group, s/r = (1 - (k - 1)·P·
    a_max/(L·e_min))/r, clipped to [0, 1], with a_max the largest kept-layer entry over the
    layer kinds and groups, e_min the least per-layer entry the master reads (full: min(kept,
    checkpoint)), r the largest over the kinds of max_g e / min_g e (1 on one group) and P
    the space's largest pp; other spaces unchanged."""
    if not scored(space):
        return
    k, L, top = act_layers(space), space.num_layers, max(space.pp)
    gs = sorted({g for g, _ in t.act})

    def scale(hi: np.ndarray, es: dict[Any, np.ndarray]) -> np.ndarray:
        lo = np.minimum.reduce(list(es.values()))
        s = np.where(lo > 0.0, 1.0 - (k - 1) * top * hi / (L * np.where(lo > 0.0, lo, 1.0)),
                     0.0)
        r = np.maximum.reduce([np.maximum.reduce([es[g, kind] for g in gs])
                               / np.maximum(np.minimum.reduce([es[g, kind] for g in gs]),
                                            1e-300) for kind in t.kinds])
        return np.asarray(np.clip(s / np.maximum(r, 1.0), 0.0, 1.0), float)

    hi = np.maximum.reduce([t.act[g, kind] for g in gs for kind in t.kinds])
    s = scale(hi, {(g, kind): t.act[g, kind] for g in gs for kind in t.kinds})
    # full recompute (mode 2): the master reads min(kept, checkpoint) per layer
    s2 = scale(hi[..., 2], {(g, kind): np.minimum(t.act[g, kind][..., 2], t.ckpt[g, kind])
                            for g in gs for kind in t.kinds})
    s[..., 2] = s2
    for g in gs:
        for kind in t.kinds:
            t.act[g, kind] = t.act[g, kind] * s
            t.ckpt[g, kind] = t.ckpt[g, kind] * s2


def words(space: Any) -> str:
    """What the space's activation offload covers, for the proof line (search/space_proof.py
    `_offload_text`): every pinned part (module docstring, "Which plans"), or the exact
    one-stage family and why only it."""
    ks = ", ".join(map(str, searched(space)))
    parts = [v for v in space.schedule_variants() if act_layers(v)]
    if any(scored(v) for v in parts):
        multi = len(space.job.cluster.node_groups) > 1 and "stage_groups" not in space.fixed
        return (f"activations of {ks} layers per stage on the host: every recompute mode, vpp "
                "and schedule searched here, at pp = 1 and at pp > 1 with every stage >= k "
                "layers (named layouts, a uniform / pinned split, and free splits under 1f1b, "
                "interleaved, gpipe, zb-h1, zb-h2"
                + (f"; every stage placement on the node groups, at the pp with at most "
                   f"{PLACEMENTS_MAX} of them" if multi else "")
                + "; search/act_offload.py)")
    why = ("--search-also offload's counts" if "activation_offload" not in space.fixed else
           "the frameworks' rows" if space.restriction is not None else "the pins")
    return (f"activations of {ks} layers on the host on one-stage plans without recompute "
            f"under 1F1B ({why}; search/act_offload.py)")


def searched(space: Any) -> list[int]:
    """The activation-offload counts the space's plans take (`SearchSpace.describe`)."""
    return [act_layers(space)] if "activation_offload" in space.fixed else [0, *space.act_axis]


def part_key(space: Any) -> Any:
    """A sub-space's name in a union's parts (solve.py `_solve_union`, capacity.py): its
    schedule, with its offloaded-layer count when it has one."""
    k = act_layers(space)
    if not k:
        return space.schedule
    if not scored(space):
        return (space.schedule, k)
    return (space.schedule, k, "pp>1" if 1 not in space.pp else "pp=1 " + "/".join(
        space.recompute))


def narrow(space: Any, k: Any, one_stage: bool = False) -> Any:
    """`space` (built with the pin `activation_offload=k`) narrowed to the plans that offload
    (module docstring). `one_stage` (`--search-also offload`'s counts) or a framework row that
    refuses some of the pinned plans: the exact one-stage family (pp = 1, vpp = 1, recompute
    none, 1F1B). Otherwise every recompute mode, vpp and schedule of `PINNED_SCHEDULES` the
    space searches, pp = 1 and the pp > 1 of `_stages_ok`. InputError (exit 2) for a k
    outside 0..L, a cluster without hosts, an MTP model, pins that leave no such plan, or
    frameworks that do not run it."""
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
                         "offload (their MTP layer reads the same activation table); evaluate "
                         "a plan with it (evaluate --plan)", field="activation_offload")
    r = space.restriction
    refused = r is not None and any(
        f.field == "activation_offload" for p in space.pp for rc in space.recompute
        for f in r.key_refusals(Plan(pp=p, recompute=rc, activation_offload=k)))
    if not (one_stage or refused):
        scheds = tuple(s for s in space.schedules if s in PINNED_SCHEDULES)
        pps = tuple(p for p in space.pp if p == 1 or _stages_ok(space, k, p))
        if not pps or not scheds:
            many = (f", and on these node groups at most {PLACEMENTS_MAX} stage placements"
                    " (pin stage_groups to search one)" if len(job.cluster.node_groups) > 1
                    else "")
            raise InputError(f"{where}: no searched plan offloads {k} layers per stage "
                             f"(pp > 1 needs every stage to hold >= {k} layers, pp·{k} <= "
                             f"{L}{many}); evaluate such a plan with evaluate --plan",
                             field="activation_offload")
        return space.with_(pp=pps, schedules=scheds)
    pps = tuple(p for p in space.pp if p == 1 or (not one_stage and _stages_ok(space, k, p)))
    if not pps or 1 not in space.vpp or "none" not in space.recompute \
            or space.schedule not in _SCHEDULES:
        why = f" ({r.describe()} runs it only there)" if refused and r is not None else ""
        raise InputError(f"{where}: activation offload is searched here on plans without "
                         "recompute under 1F1B at vpp=1 and pp=1; the other pins leave none"
                         + why + ". Evaluate such a plan with evaluate --plan",
                         field="activation_offload")
    if r is not None:
        rows = [f for p in pps for f in r.key_refusals(Plan(pp=p, activation_offload=k))
                if f.field == "activation_offload"]
        if rows and len(rows) == len(pps):
            raise InputError(f"{where}: {r.describe()} does not run it ({rows[0].reason})",
                             field="activation_offload")
        pps = tuple(p for p in pps if not [
            f for f in r.key_refusals(Plan(pp=p, activation_offload=k))
            if f.field == "activation_offload"])
    return space.with_(pp=pps, vpp=(1,), recompute=("none",), partial_recompute=False,
                       schedules=(space.schedule,))


def _stages_ok(space: Any, k: int, p: int) -> bool:
    """pp = p > 1 holds a searched plan offloading k layers per stage: p·k <= L (every stage
    >= k layers), and on several node groups at most `PLACEMENTS_MAX` stage placements (each
    is scored: schedule_axis.py `placement_capped`; `stage_groups` pinned: one)."""
    job = space.job
    return p > 1 and p * k <= space.num_layers and (
        len(job.cluster.node_groups) == 1 or "stage_groups" in space.fixed
        or placement_count(job, p) <= PLACEMENTS_MAX)



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
