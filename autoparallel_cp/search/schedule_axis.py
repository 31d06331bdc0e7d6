"""The pipeline schedule as a search axis (issue 31.1), and the in-flight micro-batch counts
every part of the search reads through it.

The search mirrors a schedule exactly when its cost is today's composition with per-key
constants only: the bubble (Σ_j t_j - T_max)/vpp of 1F1B (steptime.py: `bubble_ratio` is 1
for 1f1b, interleaved and gpipe) and an in-flight count f_j that depends on (schedule, pp, vpp,
m, j) and the stage's chunks alone (cost/schedules.py `inflight_units`):

- `1f1b`, `interleaved`: `factors.inflight` / `factors.stage_inflight` (today's search);
- `gpipe`: m on every stage (all forwards before any backward, torch v2.13.0 schedules.py:872
  `ScheduleGPipe`), one model chunk per rank and pp > 1 (spec/schedules.py).

`SEARCHED` lists them; `--fix schedule=X` searches X only, and without it the space keeps
today's meaning (1f1b at vpp 1, interleaved at vpp > 1; the schedule field left unset).

Why the bounds stay valid (cpsat_master.py, key_bounds.py, cpsat_partition.py): the bubble
term is the same function of the stage times for all three, so every step-time bound is
unchanged; memory enters the bounds only as f_j x (a stage's activations), and those bounds
use f_j >= 1 (cpsat_master) or the exact f_j of the key's own schedule (key_bounds,
cpsat_partition and the enumerator all call `inflight` / `stage_inflight` here with the
space's schedule), and gpipe's m >= 1 and is the same on every stage (so the partition model's
"f_j nonincreasing in j" symmetry break holds too). The zero-bubble and DualPipe schedules
(bubble ratio from the plan's F/B/W split, the head on rank 0 in a V, DualPipe's two stages
per rank, the EP overlap) change the composition itself and are not searched yet
(`refuse_unsearched`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import SCHEDULES, Schedule, default_schedule

#: the schedules whose cost the search composes exactly (module docstring)
SEARCHED: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
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
    """The pp and vpp values a pinned `schedule` runs with (spec/schedules.py rules): gpipe
    and 1f1b one chunk per rank (gpipe pp > 1), interleaved vpp > 1 and pp > 1."""
    if schedule is None:
        return pps, vpps
    if schedule in ("1f1b", "gpipe"):
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


def plan_schedule(schedule: str | None) -> Schedule | None:
    """The `schedule` field of the space's plans: the pin (1f1b / interleaved pinned are
    today's default and stay unset, so their plans and keys are today's)."""
    return None if schedule in (None, "1f1b", "interleaved") else cast(Schedule, schedule)


def inflight(schedule: str | None, pp: int, vpp: int, m: int, stage: Any) -> Any:
    """In-flight micro-batches of stage(s) `stage` with equal chunks (module docstring)."""
    if schedule == "gpipe":
        return np.full(np.shape(stage), float(m)) if np.ndim(stage) else float(m)
    return fx.inflight(pp, vpp, m, stage)


@functools.lru_cache(maxsize=1 << 16)
def stage_inflight(schedule: str | None, pp: int, vpp: int, m: int, j: int,
                   chunks: tuple[int, ...]) -> float:
    """`inflight` of stage j whose model chunks hold `chunks` layers, memoized: every key of a
    batch with the same m and every family sharing a stage's chunks asks for the same value."""
    if schedule == "gpipe":
        return float(m)
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
