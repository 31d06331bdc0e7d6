"""A per-key lower bound for the keys of a pinned activation offload's scored parts
(search/act_offload.py `scored`) under 1F1B, interleaved, GPipe and ZB-H1 / ZB-H2, on one
node group or several: the cost model scores their plans (model_scan.py `best_of_key`), and
the master alone (no bubble split, no stage imbalance, no tail per stage) left the README
job's pin unproven.

What evaluate charges such a plan (cost/steptime.py `step_time`), without the calibrated fixed
time: m·T + rho·(S - T)/vpp + max_j exposed_j + max_j o_j, T = max_j t_j, S = Σ_j t_j, rho = 1
(1F1B, interleaved, GPipe) or `bubble_ratio` of the plan's (F, B, W) split (ZB), exposed_j =
max(tail·d_j, d_j - share·t_j) >= tail·d_j (`exposed_dp`, `Tables.tail_frac`). Per split of
the key's families (`partition_array`: per-stage layer counts l_j, k_j of them the dense
prefix on stage 0) and per stage placement (`placement_array`: one row on one node group,
every order of the groups' stage counts on several), with the tables' entries (`key_coefs`)
of each stage's own group g_j (`placed`):
- t_j >= c_j = (l_j - k_j)·u + k_j·u' (+ the embedding's time on stage 0, the LM head's on
  stage pp - 1): u, u' the tables' layer times of the key's mode (full: the kept time, plus
  the replay where every layer is recomputed, as dualpipe_bound.py), exact for the layers;
  the copies (`offload_s`), p2p, ZeRO-3 and the replays of a partial count are >= 0 and
  dropped. So T >= T_lb = max_j c_j and S >= S_lb = Σ_j c_j; with 0 <= rho' <= rho <= 1 <= m
  (rho' = `family_ratio`, the family's least: act_offload.py's docstring, the copies do not
  change (F, B, W)), m·T + rho·(S - T)/vpp = (m - rho/vpp)·T + (rho/vpp)·S >= (m -
  rho'/vpp)·T_lb + (rho'/vpp)·S_lb (nondecreasing in T, S and rho as S >= T).
- tail: d_j >= the layers' DP-sync entries + the edges' + the fixed term (0 when the plan
  syncs nothing), o_j likewise (the optimizer share's host time is in the tables' variants:
  `key_variants`, the least over them), so max_j exposed_j + max_j o_j >= tail·max_j d_j +
  max_j o_j.
- memory: dropped (a relaxation; the master keeps its necessary condition).
The key's bound is the least over its families' (split, placement) pairs (inf when it has
none); the free family (act_offload_free.py), too many splits to list, by
`StageCoefs.free_value` per placement (<= every free split's value on it: its docstring,
each stage's entries its own).
tests/search/test_act_offload_any.py checks it is <= every key's exact best (one group),
test_act_offload_multi.py on two groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoparallel_cp.search.act_offload import free_at, scored, stage_min
from autoparallel_cp.search.enumerate_axes import (
    partition_array,
    placement_array,
    recompute_values,
)
from autoparallel_cp.search.key_coefs import key_coefs
from autoparallel_cp.search.schedule_axis import family_ratio
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.search.tables import Tables, key_variants
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

#: the schedules whose bubble is rho·(S - T)/vpp with one stage per rank (module docstring)
_SCHEDULES = (None, "1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2")


def applies(space: Any) -> bool:
    """Whether `offload_key_bound` bounds the keys of `space`."""
    return scored(space) and space.schedule in _SCHEDULES


@dataclass(frozen=True)
class StageCoefs:
    """What the bound reads of one key (module docstring), each entry one group's or per
    stage (`placed`): per quantity
    (stage time, DP sync, optimizer step) its (main layer, dense-prefix layer, embedding,
    head, fixed) entries, each stage j holding (l_j - k_j)·main + k_j·dense + [j = 0]·emb +
    [j = pp - 1]·head + fixed; the pipeline coefficients (m - rho'/vpp, rho'/vpp), the tail
    fraction and the dense prefix K (k_j = min(l_j, max(K - S_j, 0)), S_j the layers before)."""

    time: tuple[Any, ...]  # each entry a float, or per stage (`placed`: its group's)
    dsync: tuple[Any, ...]
    opt: tuple[Any, ...]
    a: float  # m - rho'/vpp
    b: float  # rho'/vpp
    tail: float
    dense: int

    def per_stage(self, ls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(c_j, d_j, o_j) of the split `ls` (per-stage layer counts, axis 0 the stages; a
        2-D `ls` holds one column per split, elementwise the same floats)."""
        ls = np.asarray(ls, float)
        p = ls.shape[0]
        # each stage's dense-prefix layers as the cost model lays them out (spec/splits.py
        # `prefix_counts`: min(l_j, max(K - S_j, 0)); k_0 = min(K, l_0) when l_0 >= K)
        k = np.clip(float(self.dense) - (np.cumsum(ls, axis=0) - ls), 0.0, ls)
        shape = (p,) + (1,) * (ls.ndim - 1)
        first = (np.arange(p) == 0).reshape(shape)
        last = (np.arange(p) == p - 1).reshape(shape)

        def one(e: tuple[Any, ...]) -> np.ndarray:
            ev = [x if isinstance(x, float) else np.asarray(x, float).reshape(shape)
                  for x in e]  # a per-stage entry along axis 0
            return np.asarray((ls - k) * ev[0] + k * ev[1] + first * ev[2] + last * ev[3]
                              + ev[4], float)

        return one(self.time), one(self.dsync), one(self.opt)

    def value(self, ls: np.ndarray) -> float:
        """The bound of the split `ls` (module docstring)."""
        cst, ds, os_ = self.per_stage(ls)
        return (self.a * float(np.max(cst)) + self.b * float(np.sum(cst))
                + self.tail * float(np.max(ds)) + float(np.max(os_)))

    def free_value(self, p: int, L: int, lo: int, lo0: int, step: int) -> float:
        """A lower bound of `value` over every split of L layers into p > 1 stages, each a
        multiple of `step` (vpp), stage 0 holding >= lo0 >= K layers, the others >= lo (the
        free family of act_offload_free.py): each term's least over the splits on its own
        (the sum of the least terms is <= the least sum), less 1e-12 of it (the splits' float
        sums may round differently). A term max_j x_j(l_j) is at least the least T at which
        some split has every x_j(l_j) <= T: the stages' largest counts cap_j(T) with
        x_j(cap_j) <= T sum to >= L (each count a multiple of step between its minimum and
        cap_j then sums to L); every x_j(l) is the float `per_stage` computes, so the least
        such T is <= max_j x_j(l_j) of every split. The sum Σ_j c_j is <= every split's:
        with l_0 >= lo0 >= K it is a constant plus Σ_j l_j·main_j (main_j stage j's
        per-layer entry: one value on one group, its group's under `placed`), least where
        every stage holds its minimum and the rest (a multiple of step) sits on a stage of
        the least main_j (the last such; on one group the last stage), less the margin."""
        counts = np.arange(0, L + 1, step)
        ok = np.stack([counts >= (lo0 if j == 0 else lo) for j in range(p)])
        # vals[q][j, i]: quantity q of stage j holding counts[i] layers
        vals = self.per_stage(np.broadcast_to(counts.astype(float), (p, len(counts))))

        def least(v: np.ndarray) -> float:
            v = np.where(ok, v, np.inf)  # v[j, i]: stage j holding counts[i] layers
            cands = np.unique(v[np.isfinite(v)])  # sorted; feasibility grows with T

            def holds(T: np.ndarray) -> np.ndarray:  # the stages' caps at each T hold L
                caps = np.where(v[None] <= T[:, None, None], counts, -1).max(axis=2)
                return np.asarray((caps >= 0).all(axis=1) & (caps.sum(axis=1) >= L))

            if cands.size * v.size <= 1 << 16:  # at once
                good = holds(cands)
                return float(cands[np.argmax(good)]) if good.any() else math.inf
            lo_, hi_ = 0, len(cands)  # else bisect
            while lo_ < hi_:
                mid = (lo_ + hi_) // 2
                lo_, hi_ = (lo_, mid) if holds(cands[mid:mid + 1])[0] else (mid + 1, hi_)
            return float(cands[lo_]) if lo_ < len(cands) else math.inf

        T, D, Op = (least(v) for v in vals)
        rest = L - lo0 - (p - 1) * lo
        mains = np.broadcast_to(np.asarray(self.time[0], float), (p,))
        split = [lo0, *([lo] * (p - 1))]
        split[p - 1 - int(np.argmin(mains[::-1]))] += rest
        S = float(np.sum(self.per_stage(np.asarray(split))[0])) if rest >= 0 else math.inf
        v = self.a * T + self.b * S + self.tail * D + Op
        return v - abs(v) * 1e-12


def stage_coefs(t: Tables, key: Any, g: int = 0) -> StageCoefs:
    """The key's `StageCoefs` on tables `t` (one variant), node group `g`'s entries."""
    space = t.space
    p, vpp = key.pp, key.vpp
    c = key_coefs(t, key)
    mode = RECOMPUTE_MODES[key.mode]
    every = mode == "full" and recompute_values(space, mode, space.num_layers) == [None]
    rho = family_ratio([space], key.tp, key.cp, key.mbs, p) if p > 1 else 1.0
    probe = Plan(pp=p, tp=key.tp, cp=key.cp, dp=key.dp, ep=key.ep, etp=space.etp)
    synced = key.dp * key.cp > 1 or probe.expert_dp > 1
    u = c.tau[g] + (c.rho[g] if every else 0.0)
    ud = c.tau_d[g] + (c.rho_d[g] if every else 0.0)
    ds = ((c.dsync[g], c.dsync_d[g], c.emb_dps[g], c.head_dps[g], c.dps_fixed[g]) if synced
          else (0.0, 0.0, 0.0, 0.0, 0.0))
    return StageCoefs((u, ud, c.emb_time[g], c.head_time[g], 0.0), ds,
                      (c.opt[g], c.opt_d[g], c.emb_opt[g], c.head_opt[g], 0.0),
                      key.m - rho / vpp, rho / vpp, t.tail_frac, int(t.dense_prefix))


def offload_key_bound(t: Tables, key: Any) -> float:
    """The module docstring's bound of every plan of `key` (inf when no split places it);
    the least over the key's variants (offload shares, replicas, expert-TP sizes). The free
    family (act_offload.py `free_at`, too many splits to list: act_offload_free.py) by
    `StageCoefs.free_value`."""
    vs = key_variants(t, key)
    if len(vs) != 1 or vs[0] is not t:
        return min((offload_key_bound(v, key) for v in vs if not v.variants),
                   default=math.inf)
    space = t.space
    p, vpp = key.pp, key.vpp
    d = Degrees(key.tp, p, key.cp, key.dp, key.ep, vpp, key.mbs, key.m)
    places, _ = placement_array(space, t, d)
    scs = {g: stage_coefs(t, key, g) for g in sorted({int(g) for g in places.reshape(-1)})}
    best = math.inf
    for q in places:  # none: no plan (inf)
        sc = placed(scs, q)
        for fam in space.split_families(p, vpp):
            if p > 1 and free_at(fam, p, vpp):
                lo, lo0 = stage_min(fam, vpp)
                best = min(best, sc.free_value(p, space.num_layers, lo, lo0,
                                               fam.layer_step(vpp)))
                continue
            parts, _ = partition_array(fam, p, vpp)
            for row in parts:
                best = min(best, sc.value(row))
    return best


def placed(scs: dict[int, StageCoefs], row: Any) -> StageCoefs:
    """The `StageCoefs` of one stage placement `row` (node group of each stage): each entry
    per stage, its group's (`scs`: each group's own); on one group that group's floats."""
    gs = [int(g) for g in row]
    first = scs[gs[0]]
    if len(set(gs)) == 1:
        return first

    def per(name: str) -> tuple[Any, ...]:
        return tuple(np.array([getattr(scs[g], name)[i] for g in gs], float) for i in range(5))

    return StageCoefs(per("time"), per("dsync"), per("opt"), first.a, first.b, first.tail,
                      first.dense)
