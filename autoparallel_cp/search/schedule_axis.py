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
  (`key_ratio`, below).

`SEARCHED` lists them; `--fix schedule=X` searches X only, and without it the space keeps
today's meaning (1f1b at vpp 1, interleaved at vpp > 1; the schedule field left unset).

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
  whatever m its dp gives;
- the partition model (cpsat_partition.py) scales its objective by Q = 2^16 and takes
  floor(rho·Q)·(S - T), below the exact rho·Q·(S - T) by < (S - T) <= pp·T units (its error
  bound grows by that);
- memory: f_j = min(p, m) or min(2p - 1, m) >= 1, the same on every stage (the partition
  model's "f_j nonincreasing in j" symmetry break holds, the master's >= 1 in-flight holds).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.pass_split import backward_split
from autoparallel_cp.cost.schedules import bubble_ratio, inflight_units
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan
from autoparallel_cp.spec.schedules import SCHEDULES, Schedule, default_schedule

#: the schedules whose cost the search composes exactly (module docstring)
SEARCHED: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2")
#: the searched schedules whose bubble is 1F1B's times a per-key ratio rho < 1 (`key_ratio`)
RATIO_SCHEDULES: frozenset[str] = frozenset({"zb-h1", "zb-h2"})
#: one model chunk per rank (spec/schedules.py)
ONE_CHUNK: frozenset[str] = frozenset({"1f1b", "gpipe", "zb-h1", "zb-h2"})
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


def refuse_unrun(schedule: str | None, r: Restriction, pp: int, vpp: int) -> None:
    """InputError (exit 2) when the restriction's framework does not run the pinned schedule
    (its spec/frameworks.py "schedule" row, read on a probe plan of the space's pp and vpp:
    the schedule is one per space, so one check covers every plan)."""
    if schedule is None:
        return
    probe = Plan(pp=pp, vpp=vpp, schedule=plan_schedule(schedule))
    for x in r.key_refusals(probe):
        if x.field == "schedule":
            raise InputError(f"--fix schedule={schedule}: {x.framework} does not run it "
                             f"({x.reason})", field="schedule")


def narrow(schedule: str | None, pps: list[int], vpps: list[int]
           ) -> tuple[list[int], list[int]]:
    """The pp and vpp values a pinned `schedule` runs with (spec/schedules.py rules): gpipe,
    zb-h1, zb-h2 and 1f1b one chunk per rank (all but 1f1b pp > 1), interleaved vpp > 1 and
    pp > 1."""
    if schedule is None:
        return pps, vpps
    if schedule in ONE_CHUNK:
        vpps = [v for v in vpps if v == 1]
    if schedule == "interleaved":
        vpps = [v for v in vpps if v > 1]
    if schedule != "1f1b":
        pps = [p for p in pps if p > 1]
    if not pps or not vpps:
        raise InputError(f"--fix schedule={schedule}: no pipeline degree of this job runs it "
                         "(it needs pp > 1" + (" and vpp > 1" if schedule == "interleaved"
                                                 else " and vpp = 1") + ")", field="schedule")
    return pps, vpps


def searched(schedule: str | None, vpps: Sequence[int]) -> list[str]:
    """The schedules a space with this pin and vpp domain covers."""
    if schedule is not None:
        return [schedule]
    return sorted({default_schedule(v) for v in vpps}, key=SCHEDULES.index)


def narrow_recompute(schedule: str | None, pins: Mapping[str, Any], partial: bool) -> bool:
    """The space's `partial_recompute` under a pinned `schedule`: a ZB schedule's bubble ratio
    depends on the replayed share of full recompute (module docstring), so its space
    recomputes all layers of a stage or the pinned `recompute_layers`, never a free count."""
    return partial and not (schedule in RATIO_SCHEDULES and "recompute_layers" not in pins)


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
    return min(key_ratio(sp, pp, tp, cp, e, mbs, RECOMPUTE_MODES.index(r), q, 2 * pp)
               for sp in spaces for e in sp.ep for r in sp.recompute for q in sp.sp)


def bubble_divisor(space: Any, key: Any) -> float:
    """vpp / rho of a key: the bubble's divisor in the bounds' composition (module docstring);
    vpp itself (the same float) when rho is 1."""
    r = key_ratio(space, key.pp, key.tp, key.cp, key.ep, key.mbs, key.mode, key.sp, key.m)
    return float(key.vpp) if r == 1.0 else key.vpp / r


def _ratio(space: Any, schedule: str, pp: int, tp: int, cp: int, ep: int, etp: int | None,
           sp: int, mbs: int, recompute: str, rl: int | None, m: int) -> float:
    """`bubble_ratio` at m micro-batches of the split of a probe plan with these fields
    (cost/pass_split.py, cost/schedules.py), memoized on the space (its job is one per
    space; the split once per layer axes, the ratio once per m)."""
    memo: dict[tuple[Any, ...], float] = space.__dict__.setdefault("_rho", {})
    k = (schedule, pp, tp, cp, ep, etp, sp, mbs, recompute, rl, m)
    if k not in memo:
        splits: dict[tuple[Any, ...], tuple[float, float, float]] = space.__dict__.setdefault(
            "_split", {})
        # pp enters the split only through a pinned recompute count's share min(1, r·pp/L)
        ks = (tp, cp, ep, etp, sp, mbs, recompute, rl, pp if rl is not None else 0)
        if ks not in splits:
            probe = Plan(pp=pp, tp=tp, cp=cp, ep=ep, etp=etp, sp=int(sp), mbs=mbs,
                         recompute=recompute, recompute_layers=rl,
                         schedule=cast(Schedule, schedule))
            splits[ks] = backward_split(space.job, probe)
        memo[k] = float(bubble_ratio(schedule, pp, splits[ks], m))
    return memo[k]


def plan_schedule(schedule: str | None) -> Schedule | None:
    """The `schedule` field of the space's plans: the pin (1f1b / interleaved pinned are
    today's default and stay unset, so their plans and keys are today's)."""
    return None if schedule in (None, "1f1b", "interleaved") else cast(Schedule, schedule)


def inflight(schedule: str | None, pp: int, vpp: int, m: int, stage: Any) -> Any:
    """In-flight micro-batches of stage(s) `stage` with equal chunks (module docstring)."""
    if schedule == "gpipe" or schedule in RATIO_SCHEDULES:  # the same on every stage
        f = float(m) if schedule == "gpipe" else _zb_inflight(schedule, pp, vpp, m)
        return np.full(np.shape(stage), f) if np.ndim(stage) else f
    return fx.inflight(pp, vpp, m, stage)


def _zb_inflight(schedule: str, pp: int, vpp: int, m: int) -> float:
    """cost/schedules.py `inflight_units` of a ZB-H1 / ZB-H2 stage (any stage: the same)."""
    probe = Plan(pp=pp, vpp=vpp, num_microbatches=m, schedule=cast(Schedule, schedule))
    return float(inflight_units(probe, 0, (1,)))


@functools.lru_cache(maxsize=1 << 16)
def stage_inflight(schedule: str | None, pp: int, vpp: int, m: int, j: int,
                   chunks: tuple[int, ...]) -> float:
    """`inflight` of stage j whose model chunks hold `chunks` layers, memoized: every key of a
    batch with the same m and every family sharing a stage's chunks asks for the same value."""
    if schedule == "gpipe":
        return float(m)
    if schedule in RATIO_SCHEDULES:
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
