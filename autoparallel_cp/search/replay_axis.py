"""ZBV and DualPipeV as searched schedules (issues 28 and 31.1): what the search reads of a
schedule whose bubble is PyTorch's action order replayed (cost/schedules.py
`simulated_bubble`), not a per-key constant times (S - T).

What evaluate charges a V plan (vpp = 2; cost/steptime.py, cost/memory.py): rank j holds the
layers of `Plan.layers_per_stage` (chunk_layers[j] + chunk_layers[pp + j]), the embedding and
the LM head (with DeepSeek-V3's MTP) both on rank 0 (`head_stage`: the V's last chunk sits on
rank 0), every rank min(p, m) (ZBV) or min(p + 1/2, m) (DualPipeV) micro-batches in flight
(`inflight_units`, search/schedule_axis.py `inflight`), no parameter mirror, and the pipeline
term m·T + B(t) with B the replayed bubble of the rank times t = (t_0..t_{p-1}) and the plan's
(F, B, W) split. DualPipeV also hides a share of the EP all-to-all (`ep_hidden_share`), which
depends on m: on a MoE model whose recipe does not overlap every micro-batch's
(`schedule_axis.hides_ep`) its plans are scored by the cost model (search/model_scored.py),
its tables holding each layer's time at a hidden share of 1 (a lower bound: `hidden_lb`), so
the bounds below hold for it; its free family's exact loop scores each split with the cost
model (`scored_free`, search/cpsat_replay.py).

Why B(t) cannot be a per-key ratio: the replay is a longest path through the ranks' action
lists, so B(t) ranges from rho_eq·(S - T) (equal ranks) down to 0 (one rank slow enough that
the others' ramps hide behind it; tests/search/test_replay_search.py shows both). So the
search keeps the bubble out of every bound and scores every plan it reports exactly:

- bounds: rho' = 0 (`schedule_axis.key_ratio`, `family_ratio`; `bubble_divisor` infinite), so
  the master's bubble term is 0 and the per-key bounds compose m·T + tail, each <= the exact
  m·T + B(t) + tail since B(t) >= 0 (`simulated_bubble` takes max(span - m·T, 0)); every
  other term of those bounds is a valid bound of the V composition: the master sums every
  layer and both edges (S_lb) wherever they sit and needs >= 1 micro-batch in flight per stage
  (f >= 1 here), and the per-key bounds place the head's terms on `head_position` (0), as the
  tables' composition does;
- per-key scoring: a named layout (`SearchSpace.split_families`), or a pinned or uniform
  split, leaves only the recompute count and the stage placement, and every such choice is
  scored with the exact composition (search/enumerate.py `best_of_pinned_split`, the same scan
  as the enumerator: stage times from the tables, then `bubble` on them); the free per-rank
  family (`free_family`; on several node groups each (split, placement), the placement a
  decision of the same model) is searched by CP-SAT with the replay's
  longest-path cuts and an exact loop that scores every candidate with the same composition,
  or, for a DualPipeV hiding EP all-to-all (`scored_free`), with the cost model
  (search/cpsat_replay.py, which holds its proof), so each family's best is exact;
- the recompute count: all layers or a pinned count (`schedule_axis.narrow_recompute`): the
  split's replayed share, as for ZB-H1 / ZB-H2.

So the key order, the cutoffs and the stopping rule of search/solve.py hold unchanged (every
bound below every plan of its key, every scored key's best exact), and CP-SAT's top k equals
the enumerator's over the same space (tests/search/test_replay_search.py and
test_replay_free_split.py, test_vhide_free_split.py, test_replay_free_multi.py,
hypothesis). Outside the searched space (evaluate-only): on several node groups, a V at a pp
with more than `PLACEMENTS_MAX` stage placements (schedule_axis.py `placement_capped`;
searched with `stage_groups` pinned), as for the named layouts. DualPipe (two stages per
rank, `dualpipe_mirror`: the rank's time is the mean of a stage pair, which the per-key
bounds' T >= t_j do not carry) is scored by the cost model
(search/model_scored.py); its free per-stage counts (`free_family`, on one node group or
several, each split bounded over every stage placement, at a pp with at most
`DUALPIPE_FREE_MAX` splits: `free_pp_ok`) by search/dualpipe_splits.py, above it by pair-sum
class (search/dualpipe_classes.py: `by_class`; listed up to `DUALPIPE_CLASS_MAX` classes,
found best-first above it at pp <= `DUALPIPE_FRONTIER_PP`, search/dualpipe_frontier.py);
beyond those, the named layouts only (evaluate-only: the other free splits there).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, cast

from autoparallel_cp.cost.schedules import simulated_bubble, simulated_bubble_floor
from autoparallel_cp.search.act_offload import act_layers, scored
from autoparallel_cp.search.model_scored import model_scored
from autoparallel_cp.search.schedule_axis import REPLAYED, key_split
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import V_SHAPED, Schedule


def free_family(space: Any) -> bool:
    """Whether a V or DualPipe space's own free partitions are searched: a V's per-rank
    counts (multiples of vpp = 2, cpsat_replay.py; a DualPipeV hiding EP all-to-all too, each
    split scored by the cost model: `scored_free`; on one node group or several, the stage
    placement a decision of the model), DualPipe's per-stage counts (dualpipe_splits.py; on
    several node groups too, each split bounded over every stage placement), neither under an
    activation offload's scored parts (act_offload.py `scored`)."""
    if scored(space):
        return False
    return space.schedule == "dualpipe" or space.schedule in REPLAYED


def trial_margins(space: Any, margins: tuple[float, ...]) -> tuple[float, ...]:
    """search/solve.py's trial cutoff margins for `space`'s keys: a V's without the first
    (1e-3), since its key bounds leave the replayed bubble out (rho' = 0: key_bounds.py), a
    few % of its step, so that trial was proven empty for nearly every key (Llama 3 405B on
    16,384 H100 with `--search-also schedule`: 80 of its 117 V keys solved three times, 33
    twice, 14 of the 310 solves with a plan). The margins only order the work: a trial's plan
    is the key's best, a failed trial a proven bound, so the plans found are the same."""
    return margins[1:] if space.schedule in REPLAYED else margins


def scored_free(space: Any) -> bool:
    """Whether `space` is a V free family (`free_searched`) whose keys the cost model scores
    (search/model_scored.py: a DualPipeV hiding EP all-to-all): cpsat_replay.py `solve_free`
    scores each split it proposes with `model_scan.best_of_split`, its model built from tables
    that hold lower bounds of the stage times (cpsat_replay.py's docstring proves the bound)."""
    return space.schedule in REPLAYED and free_searched(space) and model_scored(space)


#: Most free splits of one pp DualPipe's free family is searched at split by split
#: (`free_pp_ok`): the exact loop (dualpipe_splits.py) bounds every split over its placements
#: at once and scores the splits whose bound is below the best exact step, about 1.2 ms a
#: split with the cost model; every split with the same mirror-pair sums ties on time, so a
#: pair-sum class is scored whole.
DUALPIPE_FREE_MAX = 256

#: Most pair-sum classes (`num_classes`) of one pp that a DualPipe space whose stage kinds
#: follow from position and count (`class_ok`) lists and bounds all at once
#: (search/dualpipe_classes.py): 80 layers have 77 classes at pp 4, 67,525 at pp 8 and about
#: 1e9 at pp 16 (found best-first there: `DUALPIPE_FRONTIER_PP`).
DUALPIPE_CLASS_MAX = 100_000


#: Largest pp whose classes, too many to list, are found best-first
#: (search/dualpipe_frontier.py): pp 16 (DeepSeek-V3's 61 layers: ~1e8 classes, 0.03 s a
#: key). Not pp 32: a class's exact best composes every product of its 16 pairs' kept rows
#: (dualpipe_classes.py `_least`), 3^16 of them at 80 layers, minutes a class.
DUALPIPE_FRONTIER_PP = 16


#: Largest pp searched by class on several node groups: each class is bounded at every stage
#: placement, 70 of them at pp 8 on two equal groups (4.7 million class bounds a key at 80
#: layers: the mixed H100 + A100 job took 153 s instead of 13 s), 6 at pp 4.
DUALPIPE_CLASS_MIXED_PP = 4


def class_ok(space: Any) -> bool:
    """Whether a DualPipe space's stages have layer kinds set by their position and count
    (no MoE, or every layer after the dense prefix MoE), vpp 1 and no offload: what
    search/dualpipe_pairs.py's tables assume."""
    moe = space.job.model.moe
    return (space.schedule == "dualpipe" and (moe is None or moe.moe_layer_freq == 1)
            and not space.optimizer_offload and act_layers(space) == 0
            and space.fixed.get("chunk_layers") is None)


def num_classes(space: Any, pp: int) -> int:
    """DualPipe's pair-sum classes at pp (vpp 1): the compositions of L into pp/2 pair sums,
    pair 0's >= the first stage's least count + 1, every other >= 2."""
    lo0 = space.first_stage_min_units(1)
    free = space.num_layers - (lo0 + 1) - 2 * (pp // 2 - 1)
    return math.comb(free + pp // 2 - 1, pp // 2 - 1) if free >= 0 and pp % 2 == 0 else 0


def class_listed(space: Any, pp: int) -> bool:
    """Whether the classes at pp are listed and bounded all at once (at most
    `DUALPIPE_CLASS_MAX`), else found best-first (search/dualpipe_frontier.py)."""
    return num_classes(space, pp) <= DUALPIPE_CLASS_MAX


def by_class(space: Any, pp: int) -> bool:
    """Whether DualPipe's free family at pp is solved by class (dualpipe_classes.py): more
    splits than the split-by-split loop takes, the classes listed (`class_listed`) or, at
    pp <= `DUALPIPE_FRONTIER_PP`, found best-first, and on several node groups pp <=
    `DUALPIPE_CLASS_MIXED_PP`."""
    return (class_ok(space) and space.num_partitions(pp, 1) > DUALPIPE_FREE_MAX
            and (class_listed(space, pp) or pp <= DUALPIPE_FRONTIER_PP)
            and (not space.heterogeneous or pp <= DUALPIPE_CLASS_MIXED_PP))


def free_pp_ok(space: Any, pp: int, vpp: int) -> bool:
    """Whether the free family of `space` is searched at (pp, vpp): every V family; DualPipe's
    where it has at most `DUALPIPE_FREE_MAX` splits (`SearchSpace.num_partitions`: scored
    split by split, dualpipe_splits.py) or is solved by pair-sum class (`by_class`); above
    both, the named layouts."""
    return (space.schedule != "dualpipe" or space.num_partitions(pp, vpp) <= DUALPIPE_FREE_MAX
            or by_class(space, pp))


def dualpipe_free(space: Any) -> bool:
    """Whether `space` is DualPipe's free family (`free_searched`) that dualpipe_splits.py
    solves: per-stage counts >= 1 on one node group or several, each rank stage r and its
    mirror."""
    return space.schedule == "dualpipe" and free_searched(space)


def free_searched(space: Any) -> bool:
    """Whether `space` is a V free family (`free_family`) that cpsat_replay.py solves: its
    own partitions, not a pinned, named or uniform split."""
    return free_family(space) and not space.fixed_split and space.partition != "uniform"


def head_position(schedule: str | None, pp: int) -> int:
    """The stage position holding the LM head (and MTP): 0 in a V (cost/schedules.py
    `head_stage`), else the last."""
    return 0 if schedule in V_SHAPED else pp - 1


@functools.lru_cache(maxsize=256)
def _probe(schedule: str, pp: int, m: int) -> Plan:
    """The fields `simulated_bubble` reads: pp, m and the schedule."""
    return Plan(pp=pp, vpp=2, num_microbatches=m, schedule=cast(Schedule, schedule))


def bubble(space: Any, pp: int, tp: int, cp: int, ep: int, sp: int, mbs: int, recompute: str,
           rl: int | None, m: int, times: Sequence[float]) -> float:
    """The replayed bubble of a plan of `space` (its schedule and etp) whose ranks take
    `times` per micro-batch: `simulated_bubble` with the plan's split (the memo of
    `schedule_axis.key_split`: the split reads these fields only)."""
    assert space.schedule in REPLAYED
    split = key_split(space, pp, tp, cp, ep, space.etp, sp, mbs, recompute, rl)
    return float(simulated_bubble(_probe(space.schedule, pp, m), list(times), split))


def bubble_floor(space: Any, pp: int, tp: int, cp: int, ep: int, sp: int, mbs: int,
                 recompute: str, rl: int | None, m: int, times: Sequence[float]) -> float:
    """A lower bound of `bubble` with the same arguments, bit for bit (cost/schedules.py
    `simulated_bubble_floor`: one path's length, not the whole replay)."""
    assert space.schedule in REPLAYED
    split = key_split(space, pp, tp, cp, ep, space.etp, sp, mbs, recompute, rl)
    return float(simulated_bubble_floor(_probe(space.schedule, pp, m), list(times), split))


def plan_bubble(space: Any, plan: Plan, times: Sequence[float]) -> float:
    """`bubble` of one plan of `space` (tables.py `plan_cost`)."""
    return bubble(space, plan.pp, plan.tp, plan.cp, plan.ep, plan.sp, plan.mbs, plan.recompute,
                  plan.recompute_layers, plan.num_microbatches, times)
