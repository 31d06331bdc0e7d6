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
from typing import Any

import numpy as np

from autoparallel_cp.search.act_offload import scored
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


def offload_key_bound(t: Tables, key: Any) -> float:
    """The module docstring's bound of every plan of `key` (inf when no split places it);
    the least over the key's variants (offload shares, replicas, expert-TP sizes)."""
    vs = key_variants(t, key)
    if len(vs) != 1 or vs[0] is not t:
        return min((offload_key_bound(v, key) for v in vs if not v.variants),
                   default=math.inf)
    space = t.space
    p, vpp, m = key.pp, key.vpp, key.m
    c = key_coefs(t, key)
    mode = RECOMPUTE_MODES[key.mode]
    every = mode == "full" and recompute_values(space, mode, space.num_layers) == [None]
    rho = family_ratio([space], key.tp, key.cp, key.mbs, p) if p > 1 else 1.0
    probe = Plan(pp=p, tp=key.tp, cp=key.cp, dp=key.dp, ep=key.ep, etp=space.etp)
    synced = key.dp * key.cp > 1 or probe.expert_dp > 1
    g = 0
    u = c.tau[g] + (c.rho[g] if every else 0.0)
    ud = c.tau_d[g] + (c.rho_d[g] if every else 0.0)
    first = np.arange(p) == 0
    last = np.arange(p) == p - 1
    best = math.inf
    for fam in space.split_families(p, vpp):
        parts, _ = partition_array(fam, p, vpp)
        for row in parts:
            ls = np.asarray(row, float)
            k = np.zeros(p)
            k[0] = min(float(t.dense_prefix), float(ls[0]))
            main = ls - k

            def per_stage(mv: float, dv: float, emb: float, head: float,
                          main: Any = main, k: Any = k) -> Any:
                return main * mv + k * dv + first * emb + last * head

            cst = per_stage(u, ud, c.emb_time[g], c.head_time[g])
            ds = (per_stage(c.dsync[g], c.dsync_d[g], c.emb_dps[g], c.head_dps[g])
                  + c.dps_fixed[g]) if synced else np.zeros(p)
            os_ = per_stage(c.opt[g], c.opt_d[g], c.emb_opt[g], c.head_opt[g])
            T, S = float(np.max(cst)), float(np.sum(cst))
            val = (m - rho / vpp) * T + (rho / vpp) * S + t.tail_frac * float(np.max(ds)) \
                + float(np.max(os_))
            best = min(best, val)
    return best
