"""A V's empty first rank in the search (issue 31, "one space"): under `zbv` / `dualpipev`
rank 0 holds model chunks 0 and 2·pp - 1, the embedding and the LM head, and may hold no
transformer layer (spec/plan.py `empty_first_ok`; the Zero Bubble paper's ZB-V runs, arXiv
2401.10241 §6.1 Table 6, sail-sg/zero-bubble-pipeline-parallelism @6574e0ea: 2·pp - 2 layers,
chunks 0 and 2pp-1 empty). The free V family (`replay_axis.free_family`: per-rank counts,
multiples of vpp = 2, equal chunks) then takes rank 0's count from 0, the others from vpp as
before: `SearchSpace.first_stage_min_units` is 0 (`empty_first`), so the enumerator's
partitions (enumerate_axes.py `partitions`, `partition_array`: the splits with a first part
0 come first, lexicographic), the count (space_count.py), the per-key CP-SAT model
(cpsat_partition.py `build_partition`, which cpsat_replay.py's exact loop and `scored_free`
use on one node group or several) and the per-key bound's grid (key_grid.py) walk the same
splits.

A dense prefix (MoE `first_k_dense_layers` = K > 0, e.g. DeepSeek-V3's 3): the cost model
lays the layers out in rank order (cost/memory.py `stage_layer_kinds`: rank j holds layers
[S_j, S_j + l_j), the first K dense; spec/splits.py `prefix_counts`), so with rank 0 empty
rank 1 holds the prefix's start. The search keeps the prefix whole on the first rank holding
layers (`prefix_at`): rank 0 holds 0 or >= K layers, and when 0, rank 1 holds >= K
(`prefix_min_units` units); the splits whose first non-empty rank holds fewer (the prefix
spilling onto the next rank, which `evaluate` accepts) are outside it, and the proof line
says so (space_proof.py `_prefix_rule`, `outside`), as for every other schedule, whose first
stage holds >= K. `tables.plan_cost` and the enumerator (enumerate.py, each stage's dense
count in its row's code) place the prefix by `prefix_counts` for any split, so they are the
cost model's; the per-key model decides rank 0 or 1 by one literal (cpsat_prefix.py).

Where it does not apply (rank 0 keeps >= 1 unit of vpp layers): a pinned activation offload
(every stage holds >= its offloaded layers, spec/schedules.py `offload_violations`), and
every other schedule.

Bounds with an empty rank 0 (every bound the search uses must stay below every plan of its
key, search/solve.py):
- the per-key bound (key_bounds.py `key_bound`, key_grid.py `Batch`): its grid tmin[j, g, l]
  gains the count l = 0 at position 0 only (an entry inf at every other position, so those
  keep l >= vpp). Each step of its proof is over any per-position counts the family allows:
  T >= T_lb (the caps at T hold L layers; a position that holds 0 layers at T adds a cap 0),
  S >= S_lb (the Lagrangian t_j >= h[j, g] + lambda·l_j holds at l_j = 0, h the least over
  the entries of position j, that one included), the tail and the step's monotonicity do not
  read the counts; the multipliers are taken over the counts l > 0 (tmin / l), any lambda
  giving a valid S_lb. The l = 0 entry is the plan_cost composition of a stage with no layer:
  the embedding and the head (and MTP) terms, p2p and the fixed DP-sync term. With a dense
  prefix, position 0's entries at l > 0 hold it (l >= K), its l = 0 entry none; position 1's
  entry is the least of its composition without the prefix and, at l >= K, with it
  (`Batch.moved`): every plan's stage time at (j, g, l_j) is one of the two, so >= the entry,
  and every step above holds for any entries that bound the plans' stage times from below.
  The DP tail's sums D and O count every layer of each kind once wherever it sits; the
  coupled bound's per-entry DP sync d and optimizer time o (`_coupled_bound`) take the same
  least of the two at position 1 (W = max(DTF d, d - 2/3 T') + o grows with d and o, so the
  least of each bounds either case's W).
- the master (cpsat_master.py): S_lb sums every layer and both edges wherever they sit, T >=
  the harmonic per-layer bound (max_j l_j·u_g >= the stages' mean for any counts, 0 included),
  and the memory condition sums >= 1 in-flight micro-batch of each stage's own layers (none
  on an empty rank): no step assumes l_j >= 1 but the ZeRO-3 first gathers', which every
  stage holding a layer pays: with rank 0 possibly empty the stages' mean is >= (hi + (pp -
  2)·lo)/pp, not (hi + (pp - 1)·lo)/pp (`_bound_tables`: lo counted twice less; no counter-
  example to the old term was found on small V spaces, the other dropped terms covered it,
  but its proof step did not hold).
- the replay (cost/pipeline_sim.py, cpsat_replay.py's cuts, cost/replay_bound.py
  `span_floor`): each path's length is linear in the rank times with coefficients >= 0,
  whatever a rank's time is (an empty rank's is its edge work and p2p, > 0): an empty chunk
  still forwards every micro-batch.
tests/search/test_empty_rank.py and test_empty_rank_prefix.py (a dense prefix of 1 to 3
layers, one and two node groups) check every bound against the enumerator's exact best with
hypothesis, CP-SAT against the enumerator, and instances (large vocabulary, few layers) whose
best plan has rank 0 empty, its step evaluate's.
"""

from __future__ import annotations

from typing import Any

from autoparallel_cp.search.act_offload import act_layers
from autoparallel_cp.spec.schedules import V_SHAPED


def empty_first(space: Any) -> bool:
    """Whether the free partitions of `space` may leave rank 0 without layers (module
    docstring): a V schedule, no pinned activation offload (a dense prefix then sits on
    rank 1, `prefix_at`)."""
    return space.schedule in V_SHAPED and act_layers(space) == 0


def dense_prefix(space: Any) -> int:
    """The model's dense prefix (MoE `first_k_dense_layers`; 0 for a dense model)."""
    moe = space.job.model.moe
    return moe.first_k_dense_layers if moe is not None else 0


def prefix_min_units(space: Any, vpp: int) -> int:
    """Least layer units (of `layer_step`) on the stage holding the dense prefix whole (>= 1):
    the first stage, or a V's rank 1 after an empty rank 0 (`prefix_at`)."""
    return max(1, -(-dense_prefix(space) // space.layer_step(vpp)))


def prefix_at(first_layers: Any) -> Any:
    """Position of the stage holding the dense prefix in a searched split, by the first
    stage's layer count (an int or an array): 0, or 1 after a V's empty rank 0."""
    return (first_layers == 0) * 1
