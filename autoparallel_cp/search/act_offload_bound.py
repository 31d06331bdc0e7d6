"""A per-key lower bound for the keys of a pinned activation offload's scored parts
(search/act_offload.py `scored`) under 1F1B, interleaved, GPipe and ZB-H1 / ZB-H2 on one node
group: the cost model scores their plans (model_scan.py `best_of_key`), and the master alone
(no bubble split, no stage imbalance, no tail per stage) left the README job's pin unproven.

What evaluate charges such a plan (cost/steptime.py `step_time`), without the calibrated fixed
time: m·T + rho·(S - T)/vpp + max_j exposed_j + max_j o_j, T = max_j t_j, S = Σ_j t_j, rho = 1
(1F1B, interleaved, GPipe) or `bubble_ratio` of the plan's (F, B, W) split (ZB), exposed_j =
max(tail·d_j, d_j - share·t_j) >= tail·d_j (`exposed_dp`, `Tables.tail_frac`). Per split of
the key's families (`partition_array`: per-stage layer counts l_j, k_j of them the dense
prefix on stage 0), with the tables' entries (`key_coefs`, one node group g):
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
The key's bound is the least over its families' splits (inf when it has none).
tests/search/test_act_offload_any.py checks it is <= every key's exact best.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoparallel_cp.search.act_offload import free_at, scored, stage_min
from autoparallel_cp.search.enumerate_axes import partition_array, recompute_values
from autoparallel_cp.search.key_coefs import key_coefs
from autoparallel_cp.search.schedule_axis import family_ratio
from autoparallel_cp.search.tables import Tables, key_variants
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

#: the schedules whose bubble is rho·(S - T)/vpp with one stage per rank (module docstring)
_SCHEDULES = (None, "1f1b", "interleaved", "gpipe", "zb-h1", "zb-h2")


def applies(space: Any) -> bool:
    """Whether `offload_key_bound` bounds the keys of `space`."""
    return scored(space) and space.schedule in _SCHEDULES and len(
        space.job.cluster.node_groups) == 1


@dataclass(frozen=True)
class StageCoefs:
    """What the bound reads of one key (module docstring), one node group: per quantity
    (stage time, DP sync, optimizer step) its (main layer, dense-prefix layer, embedding,
    head, fixed) entries, each stage j holding (l_j - k_j)·main + k_j·dense + [j = 0]·emb +
    [j = pp - 1]·head + fixed; the pipeline coefficients (m - rho'/vpp, rho'/vpp), the tail
    fraction and the dense prefix K (k_0 = min(K, l_0))."""

    time: tuple[float, float, float, float, float]
    dsync: tuple[float, float, float, float, float]
    opt: tuple[float, float, float, float, float]
    a: float  # m - rho'/vpp
    b: float  # rho'/vpp
    tail: float
    dense: int

    def per_stage(self, ls: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(c_j, d_j, o_j) of the split `ls` (per-stage layer counts)."""
        p = len(ls)
        ls = np.asarray(ls, float)
        k = np.zeros(p)
        k[0] = min(float(self.dense), float(ls[0]))
        first, last = np.arange(p) == 0, np.arange(p) == p - 1

        def one(e: tuple[float, float, float, float, float]) -> np.ndarray:
            return np.asarray((ls - k) * e[0] + k * e[1] + first * e[2] + last * e[3] + e[4],
                              float)

        return one(self.time), one(self.dsync), one(self.opt)

    def value(self, ls: np.ndarray) -> float:
        """The bound of the split `ls` (module docstring)."""
        cst, ds, os_ = self.per_stage(ls)
        return (self.a * float(np.max(cst)) + self.b * float(np.sum(cst))
                + self.tail * float(np.max(ds)) + float(np.max(os_)))

    def free_value(self, p: int, L: int, lo: int, lo0: int) -> float:
        """A lower bound of `value` over every split of L layers into p > 1 stages, stage 0
        holding >= lo0 >= K layers, the others >= lo (the free family of act_offload_free.py):
        each term's least over the splits, relaxed to real counts. A term max_j (x·l_j +
        e_j) with x >= 0 is >= x·lo_j + e_j for each j and >= the mean (x·L + Σ_j e_j)/p;
        with x < 0 the mean alone. The sum Σ_j c_j is the same for every split (l_0 >= K)."""
        e0 = np.zeros(p)

        def least(e: tuple[float, float, float, float, float]) -> tuple[float, float]:
            x = e[0]
            off = e0.copy()
            off[0] += self.dense * (e[1] - x) + e[2]
            off[-1] += e[3]
            off += e[4]
            mean = (x * L + float(off.sum())) / p
            if x >= 0.0:
                los = np.full(p, float(lo))
                los[0] = float(lo0)
                mean = max(mean, float(np.max(x * los + off)))
            return mean, x * L + float(off.sum())

        T, S = least(self.time)
        D, _ = least(self.dsync)
        O, _ = least(self.opt)
        return self.a * T + self.b * S + self.tail * D + O


def stage_coefs(t: Tables, key: Any) -> StageCoefs:
    """The key's `StageCoefs` on tables `t` (one variant, node group 0)."""
    space = t.space
    p, vpp = key.pp, key.vpp
    c = key_coefs(t, key)
    mode = RECOMPUTE_MODES[key.mode]
    every = mode == "full" and recompute_values(space, mode, space.num_layers) == [None]
    rho = family_ratio([space], key.tp, key.cp, key.mbs, p) if p > 1 else 1.0
    probe = Plan(pp=p, tp=key.tp, cp=key.cp, dp=key.dp, ep=key.ep, etp=space.etp)
    synced = key.dp * key.cp > 1 or probe.expert_dp > 1
    g = 0
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
    sc = stage_coefs(t, key)
    best = math.inf
    for fam in space.split_families(p, vpp):
        if p > 1 and free_at(fam, p, vpp):
            lo, lo0 = stage_min(fam, vpp)
            best = min(best, sc.free_value(p, space.num_layers, lo, lo0))
            continue
        parts, _ = partition_array(fam, p, vpp)
        for row in parts:
            best = min(best, sc.value(row))
    return best
