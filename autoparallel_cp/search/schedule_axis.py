"""The pipeline schedule as a search axis (issue 31.1), and the in-flight micro-batch counts
every part of the search reads through it.

The search mirrors a schedule exactly when its cost is today's composition with per-key
constants only: the bubble (Σ_j t_j - T_max)/vpp of 1F1B (steptime.py: `bubble_ratio` is 1
for 1f1b, interleaved and gpipe) and an in-flight count f_j that depends on (schedule, pp, vpp,
m, j) and the stage's chunks alone (cost/schedules.py `inflight_units`):

- `1f1b`, `interleaved`: `factors.inflight` / `factors.stage_inflight` (today's search);
- `gpipe`: m on every stage (all forwards before any backward, torch v2.13.0 schedules.py:872
  `ScheduleGPipe`), one model chunk per rank and pp > 1 (spec/schedules.py);
- `zb-h1`, `zb-h2` (Qi et al., arXiv 2401.10241 §2): min(p, m) and min(2p - 1, m) on every
  stage (cost/schedules.py `inflight_units`), one chunk per rank and pp > 1, and the bubble
  rho·(Σ_j t_j - T_max) with rho = `bubble_ratio` of the plan's F/B/W split
  (cost/pass_split.py `backward_split`) and micro-batch count m, a per-key constant
  (`key_ratio`, below);
- `zbv`, `dualpipev` (`REPLAYED`: torch v2.13.0 `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`):
  vpp = 2 (the V: rank j holds chunks j and 2p-1-j, the LM head on rank 0), pp > 1,
  DualPipeV m >= 2pp (`least_m`), min(p, m) / min(p + 1/2, m) in flight on every rank, and a
  bubble that is PyTorch's action order replayed (`simulated_bubble`): no per-key constant,
  so the bounds take rho' = 0 and every reported plan is scored with the replay
  (search/replay_axis.py holds the proof and names what stays evaluate-only; free per-rank
  counts, on one node group or several: search/cpsat_replay.py);
- `dualpipe` (DeepSeek-V3, arXiv 2412.19437 §3.2.1), pin-only: one chunk per rank, an even
  pp and an even m >= 2pp (`degree_ok`), stage j holding min(p - j, m/2) (`inflight`), rank
  j running stage j and its mirror p-1-j; it and DualPipeV on a MoE model whose recipe does
  not overlap every micro-batch's EP all-to-all (`hides_ep`: the hidden share depends on m)
  are scored by the cost model over the named layouts, bounded by the master (DualPipe with
  its rho) and DualPipe by its own per-key bound (search/dualpipe_bound.py)
  (search/model_scored.py holds the proof, on several node groups too: `pair_harmonic`;
  there every stage placement is scored, at the pp with at most `PLACEMENTS_MAX` of them:
  `narrow_placements`); DualPipeV hiding EP is in the union too (`union_ok`).

`SEARCHED` lists them; `--fix schedule=X` searches X only. Without it the space is the union
(`union_schedules`) of today's default (1f1b at vpp 1, interleaved at vpp > 1; the schedule
field left unset) and `UNION` (zb-h1, zb-h2 where some vpp is 1; zbv, dualpipev where vpp 2
is searched), each restricted to the frameworks the space runs (spec/frameworks.py
RUNS_SCHEDULES: torchtitan runs zbv and dualpipev, Megatron and DeepSpeed none of the four,
so their spaces keep the default): one sub-space per schedule (`SearchSpace.schedule_variants`,
each exactly the space of `--fix schedule=X`), disjoint (their plans differ in `schedule`).
A key's best is the best over the sub-spaces that hold it, as over the expert-TP sizes.

GPipe stays pin-only, by dominance: for every gpipe plan P, the same plan under the default
schedule (1f1b, vpp 1) has the same step time and never more memory. Time: `bubble_ratio` is
1 for both (cost/schedules.py), neither splits the backward (SPLIT_BACKWARD) nor hides EP
all-to-all (`ep_hidden_share`) nor copies parameters (`dualpipe_mirror`), so every term of
steptime.py is the same. Memory: gpipe holds m micro-batches on every stage, 1f1b
min(p - j, m) <= m (`inflight_units`), and nothing else differs. So the default plan fits
whenever P does and is no slower, and its `Plan.key()` (no schedule entry) sorts first: the
best of every key, and so the top k, is the same with or without gpipe
(tests/search/test_schedule_union.py checks both claims on random plans).

Why the union's top k is exact and proven (search/solve.py `_solve_union`): the sub-spaces
are solved in turn, each with its own proof (tables, master, key bounds, per-key models),
and every later one's cutoff is the k-th best of the union so far (the best per key over the
sub-spaces solved, `union_kth`): k distinct keys with a known plan each, so it is >= the
union's final k-th best. A key a sub-space skips has a proven bound above that cutoff (or
LB > the window's end >= it), so none of its plans there enters the union's top k; a key
whose plan there does is scored exactly. Each sub-space's own bounds hold for its plans
(the proofs below), so the union's bounds are the sub-spaces' bounds, per plan. A sub-space
whose least master bound is above the cutoff stops at its first window (every key's bound is
above it: solve.py's stopping rule), after its tables and key table, which are its own (the
in-flight counts and rho enter them; the bubble ratio's F/B/W split is shared, `_split`).

Why the bounds stay valid (cpsat_master.py, key_bounds.py, cpsat_partition.py): the bubble
term is the same function of the stage times for 1f1b, interleaved and gpipe, so every
step-time bound is unchanged; memory enters the bounds only as f_j x (a stage's
activations), and those bounds use f_j >= 1 (cpsat_master) or the exact f_j of the key's
own schedule (key_bounds, cpsat_partition and the enumerator all call `inflight` /
`stage_inflight` here with the space's schedule), and gpipe's m >= 1 and is the same on
every stage (so the partition model's "f_j nonincreasing in j" symmetry break holds too).

ZB-H1 / ZB-H2 (steptime.py: pipeline = m·T + rho·(S - T)/vpp, S = Σ_j t_j, T = max_j t_j).
rho depends on the split (F, B, W), the cost model's per-op times of a layer (the layer
factors of (tp, cp, ep, etp, sp, mbs, recompute mode), the edges, the first node group's GPU)
and, under full recompute, the replayed share min(1, r·pp/L) (`backward_split`), and on m
(`bubble_ratio`: fewer W to fill the ramp when m < p or m < 2p-1); a key holds every one of
them (Key: tp, cp, pp, ep, sp, mbs, m, mode; etp and r per space), so the space of a ZB pin
recomputes all layers or a pinned count r (`narrow_recompute`: no free partial count), and
rho is one number per key: `key_ratio` (the plans' own value, `plan_ratio`, is the same: a
plan written with recompute_layers None has r >= its largest stage, hence r·pp >= L, share
1). Bounds: 0 <= rho <= F + B <= 1 (F, B, W >= 0 sum to 1; every path of `bubble_ratio` is
at most (p-1)(F + B), and (p-1)F >= 0, or at m = 1 (p-1)(F + B), is among them), so
pipeline = (m - rho/vpp)·T + rho·S/vpp has nonnegative coefficients in T and S
(m >= 1 >= rho/vpp), and for any rho' <= rho, m·T + rho'·(S - T)/vpp <= pipeline (S >= T). Hence:
- the per-key bounds (key_bounds.py, key_grid.py `least_step`) compose (m - 1/v)·T + S/v with
  the bubble divisor v = vpp/rho instead of vpp (`bubble_divisor`; v >= vpp >= 1, so
  m - 1/v >= m - 1/vpp and every monotonicity step of their proofs still holds);
- the master (cpsat_master.py, key_table.py) multiplies its bubble term max(0, S_lb - V/pp)/vpp
  by the least rho of the bubble family (tp, cp, mbs, pp) over (ep, sp, mode), the expert-TP
  sizes and every m >= 1 (`family_ratio`: rho does not grow with m and is constant from
  m = 2pp - 1, cost/schedules.py `bubble_ratio`): a rho' <= rho of every key of the family,
  whatever m its dp gives; or rho' = 0 <= rho where those families would need more than
  `FAMILY_SPLITS_MAX` splits (`_exact_families`);
- the partition model (cpsat_partition.py) scales its objective by Q = 2^16 and takes
  floor(rho·Q)·(S - T), below the exact rho·Q·(S - T) by < (S - T) <= pp·T units (its error
  bound grows by that);
- memory: f_j = min(p, m) or min(2p - 1, m) >= 1, the same on every stage (the partition
  model's "f_j nonincreasing in j" symmetry break holds, the master's >= 1 in-flight holds).

Kept whole (about 530 lines): the schedule rules (domains, in-flight counts, bubble ratios and
their bounds) that every part of the search reads, each beside the proof above that uses it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.common import recipe_options
from autoparallel_cp.cost.pass_split import backward_split, backward_splits
from autoparallel_cp.cost.schedules import bubble_ratio, inflight_units
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan
from autoparallel_cp.spec.schedules import SCHEDULES, V_SHAPED, Schedule, default_schedule

#: the schedules whose cost the search composes exactly (module docstring)
SEARCHED: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2", "zbv",
                             "dualpipev", "dualpipe")
#: the schedules searched besides today's default when `--fix schedule` is not given
#: (module docstring; gpipe is dominated by 1f1b)
UNION: tuple[str, ...] = ("zb-h1", "zb-h2", "zbv", "dualpipev")
#: the searched schedules whose bubble is 1F1B's times a per-key ratio rho < 1 (`key_ratio`)
RATIO_SCHEDULES: frozenset[str] = frozenset({"zb-h1", "zb-h2"})
#: the searched schedules whose bubble is PyTorch's action order replayed (search/replay_axis.py)
REPLAYED: frozenset[str] = V_SHAPED
#: the searched schedules whose keys are scanned over the named layouts, never modelled
#: (search/replay_axis.py; DualPipe: search/model_scored.py)
SCANNED: frozenset[str] = REPLAYED | {"dualpipe"}
#: the schedules whose bounds scale 1F1B's bubble by a per-key rho' <= the exact bubble's
#: (`key_ratio`, `family_ratio`: the ZB ratios, 0 for the replayed ones)
BOUND_RATIO: frozenset[str] = RATIO_SCHEDULES | SCANNED
#: the searched schedules holding the same in-flight count on every stage
SAME_INFLIGHT: frozenset[str] = RATIO_SCHEDULES | REPLAYED
#: one model chunk per rank (spec/schedules.py)
ONE_CHUNK: frozenset[str] = frozenset({"1f1b", "gpipe", "zb-h1", "zb-h2", "dualpipe"})
#: plan fields the cost model evaluates but the search does not vary (spec/schedules.py)
UNSEARCHED_FIELDS = ("optimizer_offload", "activation_offload")


def refuse_unsearched(pins: Mapping[str, Any]) -> None:
    """InputError (exit 2) for a pin the search does not vary: a schedule outside `SEARCHED`
    (an unknown name too) or host offload; those are evaluated (`evaluate --plan`, `explain`),
    not searched."""
    s = pins.get("schedule")
    if s is not None and s not in SEARCHED:
        if s not in SCHEDULES:
            raise InputError(f"--fix schedule={s}: expected one of {', '.join(SCHEDULES)}",
                             field="schedule")
        raise InputError(f"--fix schedule={s}: not a search axis yet (searched: "
                         f"{', '.join(SEARCHED)}); evaluate a plan with it (evaluate --plan "
                         f"'...,schedule={s}') or see explain's single changes",
                         field="schedule")
    for k in UNSEARCHED_FIELDS:
        if k in pins:
            raise InputError(f"{k} is not a search axis yet: the search keeps everything on "
                             f"the GPU; evaluate a plan with it (evaluate --plan "
                             f"'...,{k}={pins[k]}') or see explain's single changes", field=k)


def runs(schedule: str, r: Restriction, pp: int, vpp: int) -> str | None:
    """None when the restriction's frameworks run `schedule` (their spec/frameworks.py
    "schedule" row, read on a probe plan of this pp and vpp), else the refusing row's
    framework and reason."""
    probe = Plan(pp=pp, vpp=vpp, schedule=plan_schedule(schedule))
    for x in r.key_refusals(probe):
        if x.field == "schedule":
            return f"{x.framework} does not run it ({x.reason})"
    return None


def refuse_unrun(schedule: str | None, r: Restriction, pp: int, vpp: int) -> None:
    """InputError (exit 2) when the restriction's framework does not run the pinned schedule
    (`runs`; the schedule is one per space, so one check covers every plan)."""
    if schedule is None:
        return
    why = runs(schedule, r, pp, vpp)
    if why is not None:
        raise InputError(f"--fix schedule={schedule}: {why}", field="schedule")


def union_schedules(r: Restriction | None, pps: Sequence[int], vpps: Sequence[int],
                    job: Any = None) -> tuple[str | None, ...]:
    """The sub-spaces' schedules of a space without `--fix schedule`: None (today's default)
    and each of `UNION` that some pp > 1 of the domains runs at its vpp (1, or 2 for the
    V-shaped ones: `chunks`), that the frameworks run and the union adds (`union_ok`)."""
    pp = max(pps, default=1)
    if pp == 1:
        return (None,)
    return (None, *(s for s in UNION if chunks(s) in vpps
                    and (r is None or runs(s, r, pp, chunks(s)) is None)
                    and (job is None or union_ok(s, job))))


def chunks(schedule: str) -> int:
    """The vpp a V-shaped or one-chunk schedule runs with (spec/schedules.py: 2 or 1)."""
    return 2 if schedule in V_SHAPED else 1


def least_m(schedule: str | None, pp: int) -> int:
    """The fewest micro-batches a key of `schedule` with vpp > 1 runs: pp (Megatron's
    interleaving, torch's ZBV), 2pp for DualPipeV (spec/schedules.py)."""
    return 2 * pp if schedule == "dualpipev" else pp


def degree_ok(schedule: str | None, pp: int, vpp: int, m: int) -> bool:
    """Whether a degree combination runs under the space's schedule: vpp > 1 needs pp > 1 and
    `least_m` micro-batches; DualPipe an even pp and an even m >= 2pp (spec/schedules.py)."""
    if schedule == "dualpipe":
        return pp % 2 == 0 and m >= 2 * pp and m % 2 == 0
    return vpp == 1 or (pp > 1 and m >= least_m(schedule, pp))


def hides_ep(schedule: str | None, job: Any) -> bool:
    """Whether `schedule` hides a per-m share of `job`'s EP dispatch / combine
    (cost/schedules.py `ep_hidden_share`): DualPipe / DualPipeV on a MoE model whose recipe
    does not overlap every micro-batch's already (steptime.py: the share is 0 then)."""
    return schedule in ("dualpipe", "dualpipev") and job.model.moe is not None \
        and not recipe_options(job.recipe).ep_overlap


#: the most stage placements (node-group orders, `SearchSpace.stage_group_counts`) a key of a
#: scanned schedule on several node groups may have: each is scored (by the cost model,
#: model_scored.py, or the replay, replay_axis.py), so its pp domain keeps the pipeline
#: degrees at or under it (`placement_capped`; pp 16 on the mixed preset has 12,870)
PLACEMENTS_MAX = 100


def placement_count(job: Any, pp: int) -> int:
    """The distinct node-group orders of pp stages on `job`'s cluster (a stage holds N/pp GPUs,
    group g gpus_g·pp/N stages): the multinomial; 0 where a group holds no whole stage."""
    n = job.num_gpus
    counts = [g.num_gpus * pp for g in job.cluster.node_groups]
    if any(c % n for c in counts):
        return 0
    out, left = 1, pp
    for c in counts:
        out *= math.comb(left, c // n)
        left -= c // n
    return out


def placement_capped(schedule: str | None, pps: Sequence[int], job: Any,
                     pins: Mapping[str, Any]) -> list[int]:
    """The degrees of `pps` whose keys scan at most `PLACEMENTS_MAX` stage placements: every pp
    of a schedule whose keys are not scanned (`SCANNED`: DualPipe, ZBV, DualPipeV score every
    placement of a key, replay_axis.py, model_scored.py), on one node group, or with
    `stage_groups` pinned (one placement)."""
    if schedule not in SCANNED or len(job.cluster.node_groups) == 1 or "stage_groups" in pins:
        return list(pps)
    return [p for p in pps if placement_count(job, p) <= PLACEMENTS_MAX]


def narrow_placements(schedule: str | None, pps: list[int], job: Any,
                      pins: Mapping[str, Any]) -> list[int]:
    """The pp domain of a pinned DualPipe, ZBV or DualPipeV space on several node groups
    (`placement_capped`); InputError for a pinned pp above the cap, or none left."""
    keep = placement_capped(schedule, pps, job, pins)
    if keep == pps:
        return pps
    if "pp" in pins and pins["pp"] in pps and pins["pp"] not in keep:
        raise InputError(
            f"--fix schedule={schedule}: pp={pins['pp']} on these node groups has "
            f"{placement_count(job, pins['pp']):,} stage placements (searched: at most "
            f"{PLACEMENTS_MAX} a key); pin stage_groups to search one, or evaluate a plan "
            f"(evaluate --plan '...,schedule={schedule}')", field="pp")
    if not keep:
        raise InputError(f"--fix schedule={schedule}: every pp of this job has more than "
                         f"{PLACEMENTS_MAX} stage placements on these node groups; pin "
                         f"stage_groups to search one", field="pp")
    return keep


def union_ok(schedule: str, job: Any) -> bool:
    """Whether the union (`union_schedules`) adds `schedule`: every schedule of `UNION`. A
    DualPipeV hiding EP all-to-all (`hides_ep`), whose plans the cost model scores
    (search/model_scored.py), was left out while its keys had the master's bound only; its
    keys now take the tables' V bound (key_bounds.py `_own_bound`), and DeepSeek-V3's union
    proves in about the same time with it (benchmarks/RESULTS.md, session 22)."""
    del schedule, job
    return True


def variant_domains(schedule: str, pps: Sequence[int], vpps: Sequence[int]
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The pp and vpp domains of a union's sub-space of `schedule` (`narrow`'s rules, empty
    where none runs it)."""
    if schedule in V_SHAPED:
        return tuple(p for p in pps if p > 1), tuple(v for v in vpps if v == 2)
    one = schedule in ONE_CHUNK
    return (tuple(p for p in pps if p > 1 or schedule == "1f1b"),
            tuple(v for v in vpps if (v == 1) == one))


def narrow(schedule: str | None, pps: list[int], vpps: list[int]
           ) -> tuple[list[int], list[int]]:
    """The pp and vpp values a pinned `schedule` runs with (spec/schedules.py rules): gpipe,
    zb-h1, zb-h2 and 1f1b one chunk per rank (all but 1f1b pp > 1), interleaved vpp > 1,
    zbv and dualpipev vpp = 2, all of them pp > 1."""
    if schedule is None:
        return pps, vpps
    if schedule in ONE_CHUNK:
        vpps = [v for v in vpps if v == 1]
    if schedule == "interleaved":
        vpps = [v for v in vpps if v > 1]
    if schedule in V_SHAPED:
        vpps = [v for v in vpps if v == 2]
    if schedule != "1f1b":
        pps = [p for p in pps if p > 1 and (schedule != "dualpipe" or p % 2 == 0)]
    if not pps or not vpps:
        need = ("vpp > 1" if schedule == "interleaved" else
                "vpp = 2" if schedule in V_SHAPED else
                "an even pp and vpp = 1" if schedule == "dualpipe" else "vpp = 1")
        raise InputError(f"--fix schedule={schedule}: no pipeline degree of this job runs it "
                         f"(it needs pp > 1 and {need})", field="schedule")
    return pps, vpps


def searched(schedules: Sequence[str | None], vpps: Sequence[int]) -> list[str]:
    """The schedules a space whose sub-spaces have `schedules` (None: today's default) and
    vpp domain `vpps` covers."""
    out = {s for s in schedules if s is not None}
    if None in schedules:
        out |= {default_schedule(v) for v in vpps}
    return sorted(out, key=SCHEDULES.index)


def union_kth(incumbents: Mapping[Any, tuple[float, Any]], found: Any, top_k: int,
              key: Any) -> float:
    """The k-th best step time over distinct keys (`key(plan)`: solve.py's key) of a union
    being solved: each key's best (step, `Plan.key()`) of `incumbents` (the sub-spaces solved
    before) and of the `KeyResult`s `found` in this one. Each value is a real plan's, so it
    is >= the union's final k-th best (the module docstring's proof)."""
    best = dict(incumbents)
    for r in found:
        k, c = key(r.plan), (r.step_s, r.plan.key())
        if k not in best or c < best[k]:
            best[k] = c
    if len(best) < top_k:
        return float("inf")
    return float(sorted(best.values())[top_k - 1][0])


def narrow_recompute(schedule: str | None, pins: Mapping[str, Any], partial: bool) -> bool:
    """The space's `partial_recompute` under a pinned `schedule`: a ZB or V schedule's bubble
    depends on the replayed share of full recompute (module docstring), so its space
    recomputes all layers of a stage or the pinned `recompute_layers`, never a free count."""
    return partial and not (schedule in RATIO_SCHEDULES | SCANNED
                            and "recompute_layers" not in pins)


def plan_ratio(space: Any, plan: Plan) -> float:
    """rho of one plan of `space`: steptime.py's bubble ratio (1 for every schedule but
    zb-h1, zb-h2)."""
    s = plan.pipeline_schedule
    if s not in RATIO_SCHEDULES or plan.pp == 1:
        return 1.0
    return _ratio(space, s, plan.pp, plan.tp, plan.cp, plan.ep, plan.etp, plan.sp, plan.mbs,
                  plan.recompute, plan.recompute_layers, plan.num_microbatches)


def key_ratio(space: Any, pp: int, tp: int, cp: int, ep: int, mbs: int, mode: int, sp: int,
              m: int) -> float:
    """rho of every plan of a key of `space` (its schedule, etp and pinned recompute count;
    1 for the schedules with 1F1B's bubble): the per-key constant of the module docstring."""
    s = space.schedule
    if s in SCANNED:
        return 0.0  # the bounds' rho' (replay_axis.py, model_scored.py: the bubble is >= 0)
    if s not in RATIO_SCHEDULES or pp == 1:
        return 1.0
    rec = RECOMPUTE_MODES[mode]
    rl = space.fixed.get("recompute_layers") if rec == "full" else None
    return _ratio(space, s, pp, tp, cp, ep, space.etp, sp, mbs, rec,
                  None if rl is None else int(rl), m)


def family_ratio(spaces: Sequence[Any], tp: int, cp: int, mbs: int, pp: int) -> float:
    """The least `key_ratio` of the bubble family (tp, cp, mbs, pp) over ep, sp, the recompute
    modes, the expert-TP sizes' spaces `spaces` and every micro-batch count m >= 1 (the
    master's rho', module docstring): `bubble_ratio` does not grow with m (its docstring's
    proof) and is the same for every m >= 2pp - 1, so its least over m is its value at 2pp."""
    s0 = spaces[0]
    if s0.schedule in REPLAYED:
        return 0.0  # `key_ratio`'s rho' of every key
    if s0.schedule not in RATIO_SCHEDULES | {"dualpipe"} or pp == 1:
        return 1.0  # DualPipe: its closed-form rho, m-free (search/model_scored.py)
    # the distinct (etp, ep, mode, count, sp) of the spaces (the replicas variants repeat
    # them): each family's min once
    memo: dict[Any, Any] = s0.__dict__.setdefault("_famrho", {})
    if not _exact_families(spaces):
        return 0.0  # 0 <= rho of every key (module docstring): the per-key bounds keep theirs
    k = (tp, cp, mbs, pp, len(spaces))
    if k not in memo:
        # only the (etp, ep, sp) a key of the family can take (its dp = N/(tp cp pp): the
        # expert grid and SP rules, `ep_ok`, `sp_ok`); the replicas variants repeat them
        dp = s0.job.num_gpus // (tp * cp * pp)
        combos = sorted(
            {(v.etp, e, r, v.fixed.get("recompute_layers") if r == "full" else None, q)
             for v in spaces for e in v.ep if v.ep_ok(tp, cp, dp, e)
             for r in v.recompute for q in v.sp if v.sp_ok(tp, q)}, key=repr)
        memo[k] = min((_ratio(s0, s0.schedule, pp, tp, cp, e, etp, q, mbs, r,
                              None if rl is None else int(rl), 2 * pp)
                       for etp, e, r, rl, q in combos), default=1.0)
    return float(memo[k])


#: the most distinct F/B/W splits (`_split`: each a layer-cost evaluation, cost/pass_split.py)
#: the master's per-family rho' may cost a space; beyond it rho' is 0 (`family_ratio`)
FAMILY_SPLITS_MAX = 1024


def _exact_families(spaces: Sequence[Any]) -> bool:
    """Whether the master of a zero-bubble space takes each family's least rho (the distinct
    splits its families need are at most `FAMILY_SPLITS_MAX`) or rho' = 0, a valid bound too
    (0 <= rho) that spares DeepSeek-V3-sized spaces thousands of layer-cost evaluations; the
    per-key bounds (`bubble_divisor`) read each listed key's exact rho either way. One
    answer per space, from its domains only: deterministic."""
    s0 = spaces[0]
    memo: dict[Any, Any] = s0.__dict__.setdefault("_famrho", {})
    if ("exact", len(spaces)) not in memo:
        need = set()
        for d in s0.degrees():
            for v in spaces:
                if not v.ep_ok(d.tp, d.cp, d.dp, d.ep):
                    continue
                for r in v.recompute:
                    rl = v.fixed.get("recompute_layers") if r == "full" else None
                    for q in v.sp:
                        if v.sp_ok(d.tp, q):
                            need.add((d.tp, d.cp, d.ep, v.etp, q, d.mbs, r, rl,
                                      d.pp if rl is not None else 0))
        memo["exact", len(spaces)] = len(need) <= FAMILY_SPLITS_MAX
    return bool(memo["exact", len(spaces)])


def bubble_divisor(space: Any, key: Any) -> float:
    """vpp / rho of a key: the bubble's divisor in the bounds' composition (module docstring);
    vpp itself (the same float) when rho is 1."""
    r = key_ratio(space, key.pp, key.tp, key.cp, key.ep, key.mbs, key.mode, key.sp, key.m)
    if r == 0.0:
        return math.inf  # no bubble in the bound (a replayed schedule's rho' = 0)
    return float(key.vpp) if r == 1.0 else key.vpp / r


def _ratio(space: Any, schedule: str, pp: int, tp: int, cp: int, ep: int, etp: int | None,
           sp: int, mbs: int, recompute: str, rl: int | None, m: int) -> float:
    """`bubble_ratio` at m micro-batches of the split of a probe plan with these fields
    (cost/pass_split.py, cost/schedules.py), memoized on the space (its job is one per
    space; the split once per layer axes, the ratio once per m)."""
    memo: dict[tuple[Any, ...], float] = space.__dict__.setdefault("_rho", {})
    k = (schedule, pp, tp, cp, ep, etp, sp, mbs, recompute, rl, m)
    if k not in memo:
        split = key_split(space, pp, tp, cp, ep, etp, sp, mbs, recompute, rl)
        memo[k] = float(bubble_ratio(schedule, pp, split, m))
    return memo[k]


def key_split(space: Any, pp: int, tp: int, cp: int, ep: int, etp: int | None, sp: int,
              mbs: int, recompute: str, rl: int | None) -> tuple[float, float, float]:
    """The (F, B, W) split (cost/pass_split.py `backward_split`) of a probe plan with these
    fields, memoized per job (`_job_splits`). pp enters the split only through a pinned
    recompute count's share min(1, r·pp/L), and the schedule not at all (pass_split.py reads
    the layer axes, the recompute mode and that share): every schedule shares it."""
    if "_splits" not in space.__dict__:  # shared by the variants and the command's solves
        space.__dict__["_splits"] = _job_splits(space.job)
    splits = space.__dict__["_splits"]
    ks = (tp, cp, ep, etp, sp, mbs, recompute, rl, pp if rl is not None else 0)
    if ks not in splits and rl is None:
        _fill_splits(space, etp, splits)
    if ks not in splits:
        probe = Plan(pp=pp, tp=tp, cp=cp, ep=ep, etp=etp, sp=int(sp), mbs=mbs,
                     recompute=recompute, recompute_layers=rl)
        splits[ks] = backward_split(space.job, probe)
    return cast(tuple[float, float, float], splits[ks])


def _fill_splits(space: Any, etp: int | None,
                 splits: dict[tuple[Any, ...], tuple[float, float, float]]) -> None:
    """Every split `key_split` can ask of `space` at `etp` without a pinned recompute count,
    from one array evaluation (cost/pass_split.py `backward_splits`: the same floats as one
    `backward_split` per probe plan, which took about 1 ms each, hundreds per command)."""
    axes = (tuple(space.tp), tuple(space.cp), tuple(space.ep), tuple(space.sp),
            tuple(space.mbs))
    done = ("filled", etp, axes)
    if done in splits:
        return
    f, b, w = backward_splits(space.job, *axes, etp)
    for idx in np.ndindex(f.shape):
        i, j, k, q, o, r = idx
        ks = (axes[0][i], axes[1][j], axes[2][k], etp, axes[3][q], axes[4][o],
              RECOMPUTE_MODES[r], None, 0)
        splits.setdefault(ks, (float(f[idx]), float(b[idx]), float(w[idx])))
    splits[done] = (0.0, 0.0, 0.0)  # a marker: these axes are filled


#: `_ratio`'s splits by job, its memory margin left out; a few jobs
_SPLITS: list[tuple[Any, dict[tuple[Any, ...], tuple[float, float, float]]]] = []


def _job_splits(job: Any) -> dict[tuple[Any, ...], tuple[float, float, float]]:
    """The split memo of `job`: the variants of a space (expert-TP sizes, replicas) and the
    searches of one command share it, the within-margin one too (the split reads the job's
    model, cluster and recipe and the probe plan, not `mem_headroom`)."""
    key = job.model_copy(update={"mem_headroom": 0.0})
    for j, memo in _SPLITS:
        if j is key or j == key:
            return memo
    if len(_SPLITS) >= 8:
        _SPLITS.pop(0)
    _SPLITS.append((key, {}))
    return _SPLITS[-1][1]


def plan_schedule(schedule: str | None) -> Schedule | None:
    """The `schedule` field of the space's plans: the pin (1f1b / interleaved pinned are
    today's default and stay unset, so their plans and keys are today's)."""
    return None if schedule in (None, "1f1b", "interleaved") else cast(Schedule, schedule)


def inflight(schedule: str | None, pp: int, vpp: int, m: int, stage: Any) -> Any:
    """In-flight micro-batches of stage(s) `stage` with equal chunks (module docstring)."""
    if schedule == "dualpipe":  # stage j: min(p - j, m/2) (cost/schedules.py)
        return np.minimum(pp - np.asarray(stage, float), m / 2.0) if np.ndim(stage) \
            else min(pp - float(stage), m / 2.0)
    if schedule == "gpipe" or schedule in SAME_INFLIGHT:  # the same on every stage
        f = float(m) if schedule == "gpipe" else _zb_inflight(schedule, pp, vpp, m)
        return np.full(np.shape(stage), f) if np.ndim(stage) else f
    return fx.inflight(pp, vpp, m, stage)


def _zb_inflight(schedule: str, pp: int, vpp: int, m: int) -> float:
    """cost/schedules.py `inflight_units` of a ZB-H1 / ZB-H2 / ZBV / DualPipeV stage (any
    stage: the same)."""
    probe = Plan(pp=pp, vpp=vpp, num_microbatches=m, schedule=cast(Schedule, schedule))
    return float(inflight_units(probe, 0, (1,)))


@functools.lru_cache(maxsize=1 << 16)
def stage_inflight(schedule: str | None, pp: int, vpp: int, m: int, j: int,
                   chunks: tuple[int, ...]) -> float:
    """`inflight` of stage j whose model chunks hold `chunks` layers, memoized: every key of a
    batch with the same m and every family sharing a stage's chunks asks for the same value."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "dualpipe":
        return min(pp - float(j), m / 2.0)
    if schedule in SAME_INFLIGHT:
        return _zb_inflight(schedule, pp, vpp, m)
    return float(fx.stage_inflight(pp, vpp, m, j, chunks))


@functools.lru_cache(maxsize=4096)
def inflight_row(schedule: str | None, pp: int, vpp: int, m: int) -> npt.NDArray[np.float64]:
    """`inflight` of every stage position (equal chunks), computed once per schedule class."""
    out = np.asarray(inflight(schedule, pp, vpp, m, np.arange(pp)), float)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=1 << 14)
def layout_inflight(schedule: str | None, pp: int, vpp: int, m: int, cl: tuple[int, ...]
                    ) -> tuple[float, ...]:
    """`stage_inflight` of every stage of a layout (`chunk_layers` order)."""
    return tuple(stage_inflight(schedule, pp, vpp, m, j, cl[j::pp]) for j in range(pp))
