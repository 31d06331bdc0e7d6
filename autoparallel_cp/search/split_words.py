"""The proof line's words for the layer split (issue 28.2, search/space_proof.py
`proof_space`): which per-stage layer counts a search covers (free, uniform, named layouts),
under which schedules (V, DualPipe), on several node groups, and what each leaves to
evaluate (the dense prefix's place, an empty rank 0, the caps of the exact loops).
"""

from __future__ import annotations

from typing import Any

from autoparallel_cp.search.act_offload import scored
from autoparallel_cp.search.empty_rank import dense_prefix, empty_first
from autoparallel_cp.search.replay_axis import (
    DUALPIPE_CLASS_MAX,
    DUALPIPE_CLASS_MIXED_PP,
    DUALPIPE_FREE_MAX,
    DUALPIPE_FRONTIER_PP,
    by_class,
    class_listed,
    class_ok,
    free_family,
    scored_free,
)
from autoparallel_cp.search.schedule_axis import PLACEMENTS_MAX, SCANNED

#: a search/space.py SearchSpace (not imported: space.py is the lower module)
SearchSpace = Any

_NAMED = ("the named layouts (layers + 0/1 embedding and 0/1 loss slots spread over the "
          "pp*vpp chunks, the remainder to the first)")


def split_rule(space: SearchSpace) -> str:
    """The `layer_split` words of the proof line: which per-stage splits the search covers,
    under which schedules, and what it leaves to evaluate."""
    if space.fixed_split:
        return "the pinned stage_layers / chunk_layers only"
    if space.partition == "uniform":
        return "uniform: Megatron's default split, pp*vpp dividing the layers"
    scanned = [s for s in space.schedules if s in SCANNED]
    named_only = [s for s in scanned if not free_family(space.with_(schedule=s)) or (
        s == "dualpipe" and not any(space.with_(schedule=s).free_ok(p, 1) for p in space.pp))]
    free_v = [s for s in scanned if s not in named_only]
    if named_only and named_only == list(space.schedules):  # replay_axis.py, model_scored.py
        return (_NAMED.replace("layouts (", "layouts only (")[:-1]
                + f"; free per-stage counts under {', '.join(named_only)}: evaluated, not "
                + f"searched{_why_named(space, named_only)})" + _placements(space))
    rule = ("free: any per-stage layer counts that are multiples of vpp, each >= vpp"
            + _prefix_rule(space))
    vs = [x for x in free_v if x != "dualpipe"]
    if vs:
        hid = [x for x in vs if scored_free(space.with_(schedule=x))]
        rule += (f" (under {', '.join(vs)}: per rank, the V's two chunks equal, "
                 + _v_first(space, vs) + ", the replayed pipeline searched exactly"
                 + (f"; under {', '.join(hid)} hiding EP all-to-all each split scored exactly "
                    "by the cost model" if hid else "")
                 + ("; on several node groups each rank timed on its group, the stage "
                    "placement a choice of the same model" if space.heterogeneous else "")
                 + ": search/cpsat_replay.py"
                 + _v_empty(space) + ")")
    if "dualpipe" in free_v:
        rule += _dualpipe_free(space.with_(schedule="dualpipe"))
    if space.named_splits:
        rule += "; and " + _NAMED.replace("the named layouts", "the named uneven layouts")
    if named_only:
        rule += (f"; under {', '.join(named_only)} the named layouts only"
                 f"{_why_named(space, named_only)}")
    if scanned:
        rule += _placements(space)
    return rule


def _why_named(space: SearchSpace, named_only: list[str]) -> str:
    """Why these V or DualPipe schedules keep the named layouts (replay_axis.py
    `free_family`): an activation offload's scored parts keep the named layouts
    (act_offload.py `scored`); DualPipe above `DUALPIPE_FREE_MAX` free splits and not
    searched by class (`by_class`) at every pp.
    V's and DualPipe's free families are searched on several node groups too
    (cpsat_replay.py, dualpipe_splits.py)."""
    why = []
    for s in named_only:
        if scored(space.with_(schedule=s)):
            why.append(f"{s} under a pipelined activation offload")
        else:  # DualPipe, its free family above the cap at every pp
            why.append(f"dualpipe with more than {DUALPIPE_FREE_MAX} free splits and no "
                       f"pair-sum class search (over {DUALPIPE_CLASS_MAX:,} classes above pp "
                       f"{DUALPIPE_FRONTIER_PP}, pp above {DUALPIPE_CLASS_MIXED_PP} on several "
                       "node groups, or stage kinds set by where a stage starts) at each pp "
                       "(replay_axis.py `free_pp_ok`)")
    return ": " + ", ".join(why)


def _v_first(space: SearchSpace, vs: list[str]) -> str:
    """The V's rank 0 in the free family (search/empty_rank.py): from 0 layers (an empty
    first rank: the embedding and the head only; a dense prefix then on rank 1), else >= 2
    (it offloads activations)."""
    if any(empty_first(space.with_(schedule=x)) for x in vs):
        return ("rank 0 (the embedding and the head) from 0 layers: an empty first rank"
                + (", the dense prefix then on rank 1" if dense_prefix(space) else ""))
    return "rank 0 >= 2 layers (it offloads activations)"


def _prefix_rule(space: SearchSpace) -> str:
    """Where a free split puts the dense prefix (search/empty_rank.py): whole on the first
    stage holding layers (the cost model then holds it there, spec/splits.py
    `prefix_counts`); a split whose first such stage holds fewer layers is not searched."""
    k = dense_prefix(space)
    return (f"; the dense prefix ({k} layers) whole on the first rank holding layers"
            if k else "")


def _v_empty(space: SearchSpace) -> str:
    """Why the V's free family holds no split at this job (its per-rank counts are two equal
    chunks, so they sum to an even count): an odd layer count, e.g. DeepSeek-V3's 61."""
    L = space.num_layers
    return (f"; none at {L} layers, an odd count: the named layouts only there"
            if L % 2 else "")


def _dualpipe_free(space: SearchSpace) -> str:
    """DualPipe's free family in words: the pp it is searched at split by split
    (search/dualpipe_splits.py: at most DUALPIPE_FREE_MAX free splits), by pair-sum class
    (search/dualpipe_classes.py: replay_axis.py `by_class`), the named layouts above."""
    at = [p for p in space.pp if space.free_ok(p, 1)]
    cls = [p for p in at if by_class(space, p)]
    above = [p for p in space.pp if p not in at]
    txt = (" (under dualpipe: rank r runs stage r and its mirror p-1-r, each split scored "
           "exactly by the cost model"
           + (" over its stage placements, both stages of a rank timed on the rank's group"
              if space.heterogeneous else "")
           + ", every split's lower bound proving the rest: search/dualpipe_splits.py; "
           f"at pp {','.join(map(str, at)) or 'none'}, at most {DUALPIPE_FREE_MAX} free "
           "splits")
    listed = [p for p in cls if class_listed(space, p)]
    first = [p for p in cls if p not in listed]
    if listed:
        txt += (f" or, at pp {','.join(map(str, listed))}, by pair-sum class (each class of "
                "mirror-pair sums bounded, the classes within the best opened and their best "
                "split found pair by pair, exactly: search/dualpipe_classes.py)")
    if first:
        txt += (f"{' and' if listed else ' or'}, at pp {','.join(map(str, first))}, by "
                f"pair-sum class found best-first (over {DUALPIPE_CLASS_MAX:,} classes, not "
                "listed: a branch and bound over the mirror pairs' sums, each prefix bounded "
                "by its pairs' least entries and a min-max / min-sum DP over the pairs left, "
                "every class within the best opened exactly: search/dualpipe_frontier.py)")
    if above:
        txt += (f"; at pp {','.join(map(str, above))} the named layouts only: more free "
                "splits than the exact loop scores"
                + (f" and more than {DUALPIPE_CLASS_MAX:,} pair-sum classes above pp "
                   f"{DUALPIPE_FRONTIER_PP}"
                   + (f" (on several node groups, by class at pp <= {DUALPIPE_CLASS_MIXED_PP})"
                      if space.heterogeneous else "")
                   if class_ok(space) else
                   " (by class only where every layer after the dense prefix is of one "
                   "kind, vpp 1, no offload)"))
    return txt + ")"


def _placements(space: SearchSpace) -> str:
    """DualPipe, ZBV and DualPipeV on several node groups: every stage placement, at the pp
    with at most `PLACEMENTS_MAX` of them (schedule_axis.py `placement_capped`)."""
    if (not any(s in SCANNED for s in space.schedules) or not space.heterogeneous
            or "stage_groups" in space.fixed):
        return ""
    return (f"; stage placements: every order of the node groups' stages, at the pp with at "
            f"most {PLACEMENTS_MAX} (larger pp: evaluated, or searched with stage_groups "
            f"pinned)")
