"""The size of a search space (`SearchSpace.size`), counted without listing its plans: layer
partitions per layout family (compositions), node-group placements (multinomials), recompute
settings, and the keys a framework restriction refuses left out."""

from __future__ import annotations

from itertools import product
from math import comb, factorial
from typing import Any

from autoparallel_cp.search.act_offload import stage_min
from autoparallel_cp.search.empty_rank import prefix_min_units
from autoparallel_cp.spec.framework_space import KeyView
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, RecomputeMode

#: a search/space.py SearchSpace (not imported: space.py is the upper module)
SearchSpace = Any


def num_partitions(space: SearchSpace, pp: int, vpp: int) -> int:
    """Layer partitions over `pp` stages (compositions in steps of vpp*freq)."""
    if space.fixed_split:
        return 1
    if space.partition == "uniform":
        return 1
    step = space.layer_step(vpp)
    if space.num_layers % step:
        return 0
    # compositions of the L/step units, the first part >= f units, the others >= a
    # (act_offload.py `stage_min`: a = 1 but under a pinned activation offload)
    lo, lo0 = stage_min(space, vpp)
    units = space.num_layers // step
    if lo0 > 0 or pp == 1:
        free = units - lo0 // step - (pp - 1) * (lo // step)
        return comb(free + pp - 1, pp - 1) if free >= 0 else 0
    # a V's rank 0 from 0 (search/empty_rank.py; a = 1): the dense prefix's stage, rank 0
    # or, after an empty rank 0, rank 1, holds >= f units, every other rank >= 1
    f = prefix_min_units(space, vpp)
    held, empty = units - f - (pp - 1), units - f - (pp - 2)
    return (comb(held + pp - 1, pp - 1) if held >= 0 else 0) + (
        comb(empty + pp - 2, pp - 2) if empty >= 0 else 0)


def num_placements(space: SearchSpace, tp: int, cp: int, dp: int, pp: int) -> int:
    """Orders of node groups over the stages (1 on a homogeneous cluster)."""
    if not space.heterogeneous or "stage_groups" in space.fixed:
        return 1
    counts = space.stage_group_counts(tp, cp, dp)
    if counts is None or sum(counts) != pp:
        return 0
    out = factorial(pp)
    for c in counts:
        out //= factorial(c)
    return out


def mode_choices(space: SearchSpace, mode: RecomputeMode, pp: int, vpp: int) -> int:
    """Distinct recompute_layers settings of one mode per partition."""
    if mode == "full" and space.partial_recompute and "recompute_layers" not in space.fixed:
        # r = 1 .. (largest possible stage) - 1 in steps of `recompute_step`, plus "all"
        lo, lo0 = stage_min(space, vpp)  # the others at their least, the first maybe 0
        biggest = space.num_layers - (pp - 1) * lo + (lo - lo0 if pp > 1 and lo0 < lo else 0)
        pinned = space.fixed_stage_layers(pp, vpp)
        if pinned is not None:
            biggest = max(pinned)
        elif space.partition == "uniform":
            biggest = space.num_layers // pp
        return (max(1, biggest) - 1) // space.recompute_step(vpp) + 1
    return 1


def count(space: SearchSpace) -> int:
    """`SearchSpace.size`, counted: per degree combination, the sp and ZeRO choices times the
    recompute settings and partitions of each layout family, times the stage placements."""
    zeros = [z for z in space.zero if space.zero_ok(z)]
    total = 0
    if space.multi:  # the union of the one-etp, one-replicas spaces (no plan twice)
        return sum(v.size() for v in space.etp_variants())
    sib = space.__dict__.get("_sibling")
    if sib is not None and space.restriction is None:
        # a replicas or offload-share variant: its degrees are its R = 1, share-0 sibling's
        # that take R, each with the same sp values, partitions and placements (space.py
        # `etp_variants`), and its own ZeRO stages (zero >= 1 under R > 1; those whose
        # whole-model offloaded states the hosts hold, `host_ok`, which reads no sp, mode
        # or split)
        sib.size()
        per = sib.__dict__["_per_degree"]
        return sum(per[d] * _host_zeros(space, zeros, d) for d in space.degrees())
    fams: dict[tuple[int, int], int] = {}
    per_degree: dict[Any, int] = {}  # the plans of a degree choice per ZeRO stage
    per_mode: dict[tuple[int, int, str], int] = {}  # plans of a mode per placement
    places: dict[tuple[int, int, int, int], int] = {}  # (many degrees share each: asked once)
    sp_of: dict[tuple[int, int, int, int], list[int]] = {}
    for d in space.degrees():
        if (d.pp, d.vpp) not in fams:
            fams[d.pp, d.vpp] = sum(
                f.recompute_choices(d.pp, d.vpp) * f.num_partitions(d.pp, d.vpp)
                for f in space.split_families(d.pp, d.vpp))
        pk = (d.tp, d.cp, d.dp, d.pp)
        if pk not in places:
            places[pk] = space.num_placements(d.tp, d.cp, d.dp, d.pp)
        place = places[pk]
        sk = (d.tp, d.cp, d.dp, d.ep)
        if sk not in sp_of:
            sp_of[sk] = [s for s in space.sp if space.etp_legal(d.tp, d.cp, d.dp, d.ep, s)]
        sps = sp_of[sk]
        if space.restriction is None:
            per_degree[d] = len(sps) * fams[d.pp, d.vpp] * place
            total += per_degree[d] * _host_zeros(space, zeros, d)
            continue
        # the keys a framework row refuses, or whose offload share the hosts cannot hold
        # (search/offload_axis.py `host_ok`), hold no plan of the space
        for s, z, mode in product(sps, zeros, space.recompute):
            key = KeyView(d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, s, z, d.mbs,
                          d.num_microbatches, RECOMPUTE_MODES.index(mode))
            if space.host_ok(d.tp, d.ep, z, d.dp, d.cp) and not space.refusals_of_key(key):
                if (d.pp, d.vpp, mode) not in per_mode:
                    per_mode[d.pp, d.vpp, mode] = sum(
                        f.mode_choices(mode, d.pp, d.vpp) * f.num_partitions(d.pp, d.vpp)
                        for f in space.split_families(d.pp, d.vpp))
                total += per_mode[d.pp, d.vpp, mode] * place
    space.__dict__["_per_degree"] = per_degree
    return total


def _host_zeros(space: SearchSpace, zeros: list[int], d: Any) -> int:
    """The ZeRO stages of `zeros` whose offloaded states the hosts hold on degree choice `d`
    (`SearchSpace.host_ok`: all of them at share 0), memoized per (tp, ep, dp, cp)."""
    if space.optimizer_offload == 0.0:
        return len(zeros)
    memo: dict[tuple[int, ...], int] = space.__dict__.setdefault("_host_zeros", {})
    k = (d.tp, d.ep, d.dp, d.cp)
    if k not in memo:
        memo[k] = sum(1 for z in zeros if space.host_ok(d.tp, d.ep, z, d.dp, d.cp))
    return memo[k]
