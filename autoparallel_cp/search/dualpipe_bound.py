"""A per-key lower bound for DualPipe keys (search/model_scored.py scores their plans with the
cost model; until now such a key had only the master's bound, which drops the bubble, the
recompute replays and how the node groups hold the stages, so the search scored keys of 2pp
micro-batches and memory-bound keys first and could not prove a mixed cluster in 10 s).

What evaluate charges a DualPipe plan (cost/steptime.py `step_time`, `_dualpipe_rank`): rank
r runs stage r and its mirror p-1-r on its own GPUs, its per-micro-batch time T_r the mean of
the two stage times, both timed on rank r's node group g_r, its DP sync d_r and optimizer step
o_r the sums; the step (without the calibrated fixed time, as every search composition) is

    m·T + rho·(S - T) + max_r exposed_r + max_r o_r,   T = max_r T_r,  S = sum_r T_r,

rho = `bubble_ratio("dualpipe", p, (F, B, W), m)` (m-free), exposed_r >= tail_frac·d_r
(steptime.py `exposed_dp`, `Tables.tail_frac`). A DualPipe key's plans (model_scan.py
`best_of_key`) are its families' splits (named layouts, the uniform or a pinned split, and
the free per-stage counts: search/dualpipe_splits.py) x its stage placements
(`enumerate_axes.placement_array`) x its recompute counts, so per (split, placement) of an
explicit family, with the tables' per-layer entries (`key_coefs`):

- stage j with l_j layers (k of them the dense prefix on stage 0) run on group g takes
  t_j(g) >= c_j(g) = (l_j - k_j)·u_g + k_j·u'_g (+ the embedding's time on stage 0, the LM
  head's on the last): u the tables' layer time of the key's mode, plus the replay where the
  key recomputes every layer (mode full, neither a pinned count nor partial recompute:
  `recompute_values` == [None]); the tables' layer times are the plan's (dense models) or
  lower bounds of them (a hidden EP share: model_scored.py `hidden_lb`); p2p, ZeRO-3, MTP and
  offload terms are >= 0 and dropped. So with R_r = c_r(g_r) + c_{p-1-r}(g_r), T >= T_lb =
  max_r R_r/2, S >= S_lb = Σ_r R_r/2, and as 0 <= rho < 1 <= m, m·T + rho·(S - T) =
  (m - rho)·T + rho·S >= (m - rho)·T_lb + rho·S_lb. rho is the key's (the plans' split is
  the probe's, `schedule_axis.key_split`; a pinned count: the least of its two).
- tail: d_r >= both stages' DP-sync entries on g_r + the edges' + the fixed term of g_r once
  per stage (0 when the plan syncs nothing, as steptime.py), o_r likewise, so
  max_r exposed_r + max_r o_r >= tail_frac·max_r d_r + max_r o_r.
- memory (necessary): rank r holds both stages' model states and their activations at their
  own in-flight counts (cost/memory.py `stage_memory`, `inflight_units`), each on g_r, plus
  its constant buffers, in charged bytes as the tables hold them; the work buffers are >= 0
  and dropped, and a kept layer's bytes are the least of its mode's (a checkpoint where every
  layer is replayed, the least of kept and checkpoint under a pinned count). A (split,
  placement) with a rank above its group's capacity has no fitting plan.

The free family (`_free`: every split l >= 1 summing to L, stage 0 holding the dense prefix
k, and, on several node groups, every stage placement `placement_array` lists: search/
dualpipe_splits.py) has too many splits to list, so it takes what holds for all of them:
S_lb = (L - k)·u + k·u' + emb + head, each entry the least over the groups the stages sit on
(one group: its own; a layer on group g takes >= u_g >= min_g u_g), whatever the split and
placement; S = Σ_r T_r holds every stage twice at weight 1/2 (as rank j's own and rank
p-1-j's mirror, each on some group of the placement), so S >= S_lb and T >= S/p >= S_lb/p;
the p ranks' DP entries sum to 2·Σ_j d_j (each stage's on two ranks, each >= the least
entries) plus 2·Σ_r fixed_{g_r} (the same for every placement: each is an order of the same
groups' stage counts), so max_r d_r >= their mean 2·D/p, the same for o; memory: if every
rank fits, so does their sum, Σ_r rank_r >= 2·Σ_j mem_j + p·const with every entry the
least over the groups, and Σ_r rank_r <= Σ_r capacity_{g_r} (again placement-free), with
Σ_j mem_j >= the states (split-free) + min_j f_j·a·(L - k) + f_0·(k·a' + emb_act): a sum
above it means no split fits (inf). And as a rank runs its mirror pair on its own group,
pair i (layer count s_i) takes >= s_i·u_g/2 on each of its two ranks' groups g (u_g the least
of g's per-layer entries), so s_i <= 2·T·min(x_a, x_b) with x = 1/u, and summing over the
pairs L <= 2·T·Σ_i min(x_a, x_b) <= 2·T·(x_(2) + x_(4) + ... + x_(p)) with the ranks' x
sorted descending (pairing sorted neighbours maximises a sum of minima: an exchange
argument): T >= T_pair = L/(2·Σ_i x_(2i)), the same for every placement (an order of the same
groups' stage counts); on one group T_pair = L·u/p. So (m - rho)·max(S_lb/p, T_pair) +
rho·S_lb + tail_frac·2·D/p + 2·O/p bounds every plan of the free family.

The key's bound is the least over its families' (split, placement) pairs and the free
family's bound (inf when none fits).
tests/search/test_dualpipe_bound.py checks it is <= every key's exact best on random small
spaces, one and two node groups, dense and MoE; test_dualpipe_search.py, that every search
still equals the enumerator.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.schedules import bubble_ratio, inflight_units
from autoparallel_cp.search.act_offload import act_layers
from autoparallel_cp.search.enumerate_axes import (
    partition_array,
    placement_array,
    recompute_values,
)
from autoparallel_cp.search.key_coefs import KeyCoefs, key_coefs
from autoparallel_cp.search.replay_axis import dualpipe_free
from autoparallel_cp.search.schedule_axis import key_split
from autoparallel_cp.search.space import Degrees
from autoparallel_cp.search.tables import Tables, key_variants
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

F64 = npt.NDArray[np.float64]


def applies(space: Any) -> bool:
    """Whether `dualpipe_key_bound` bounds the keys of `space` (DualPipe: pp > 1 always)."""
    return bool(space.schedule == "dualpipe")


def key_constants(t: Tables, key: Any) -> tuple[KeyCoefs, bool, float, bool, list[float]]:
    """What a DualPipe key's bound and its free family's model (dualpipe_splits.py) read:
    the tables' entries (`key_coefs`), whether every layer is recomputed (mode full with
    neither a pinned count nor partial recompute), the key's rho (the least over its recompute
    counts), whether the plans sync DP at all, and each stage's in-flight count."""
    space = t.space
    mode = RECOMPUTE_MODES[key.mode]
    rls = recompute_values(space, mode, space.num_layers)
    p = key.pp
    rho = min(bubble_ratio("dualpipe", p, key_split(space, p, key.tp, key.cp, key.ep,
                                                    space.etp, key.sp, key.mbs, mode, rl),
                           key.m) for rl in rls)
    probe = Plan(pp=p, tp=key.tp, cp=key.cp, dp=key.dp, ep=key.ep, etp=space.etp,
                 num_microbatches=key.m, schedule="dualpipe")
    synced = key.dp * key.cp > 1 or probe.expert_dp > 1
    f = [inflight_units(probe, j, (1,)) for j in range(p)]
    return key_coefs(t, key), mode == "full" and rls == [None], rho, synced, f


def dualpipe_key_bound(t: Tables, key: Any) -> float:
    """The module docstring's bound of every plan of `key` (inf when none fits); the least
    over the key's variants (expert-TP sizes, offload shares, replicas)."""
    vs = key_variants(t, key)
    if len(vs) != 1 or vs[0] is not t:
        return min((dualpipe_key_bound(v, key) for v in vs if not v.variants),
                   default=math.inf)
    space = t.space
    p = key.pp
    d = Degrees(key.tp, p, key.cp, key.dp, key.ep, key.vpp, key.mbs, key.m)
    places, _ = placement_array(space, t, d)
    if len(places) == 0:
        return math.inf
    c, every, rho, synced, fl = key_constants(t, key)
    f = np.array(fl, float)
    best = math.inf
    for fam in space.split_families(p, key.vpp):
        if dualpipe_free(fam):  # too many splits to list: the free family's own bound
            best = min(best, _free(t, c, key, rho, every, synced, f, places))
            continue
        parts, _ = partition_array(fam, p, key.vpp)
        if len(parts):  # every (split, placement) of the family at once
            best = min(best, float(np.min(split_bounds(
                t, c, key, rho, every, synced, f, np.asarray(parts, float), places))))
    return best


def split_bounds(t: Tables, c: KeyCoefs, key: Any, rho: float, every: bool, synced: bool,
                 f: F64, splits: F64, places: npt.NDArray[np.int64]) -> F64:
    """(n, Q): the module docstring's bound of each (split, placement): splits (n, p) layer
    counts, places (Q, p) each rank's node group; inf where a rank exceeds its memory."""
    n, p = splits.shape
    # each rank's dense-prefix layers, spread over the first ranks as the cost model lays
    # them out (spec/splits.py `prefix_counts`: min(l_j, max(K - S_j, 0)))
    k = np.clip(float(t.dense_prefix) - (np.cumsum(splits, axis=1) - splits), 0.0, splits)
    main = (splits - k)[:, None, :]  # (n, 1, p)
    kk = k[:, None, :]
    first = (np.arange(p) == 0).astype(float)
    last = (np.arange(p) == p - 1).astype(float)

    def arr(x: list[float]) -> F64:
        return np.asarray(x, float)[places][None, :, :]  # (1, Q, p): each rank's group's

    def per_rank(main_v: list[float], dense_v: list[float], emb: list[float],
                 head: list[float], f_: F64 | float = 1.0) -> F64:
        """(n, Q, p): rank r's two stages' entries, stage r and its mirror p-1-r, both on
        the rank's group (a rank runs its mirror on its own GPUs)."""
        def on_rank(mn: F64, kq: F64, fi: F64, la: F64, fj: F64 | float) -> F64:
            return (mn * arr(main_v) + kq * arr(dense_v) + fi * arr(emb) + la * arr(head)) * fj
        fr = f_[::-1] if isinstance(f_, np.ndarray) else f_
        return (on_rank(main, kk, first, last, f_)
                + on_rank(main[..., ::-1], kk[..., ::-1], first[::-1], last[::-1], fr))

    u = [a + (r if every else 0.0) for a, r in zip(c.tau, c.rho, strict=True)]
    ud = [a + (r if every else 0.0) for a, r in zip(c.tau_d, c.rho_d, strict=True)]
    pair = per_rank(u, ud, c.emb_time, c.head_time)  # 2·T_r's bound
    T = np.max(pair, axis=2) / 2.0
    S = np.sum(pair, axis=2) / 2.0
    zeros = [0.0] * len(c.tau)
    if synced:
        ds = per_rank(c.dsync, c.dsync_d, c.emb_dps, c.head_dps) + 2.0 * arr(c.dps_fixed)
    else:
        ds = np.zeros_like(pair)
    os_ = per_rank(c.opt, c.opt_d, c.emb_opt, c.head_opt)
    tail = t.tail_frac * np.max(ds, axis=2) + np.max(os_, axis=2)
    # memory: both stages' states and in-flight activations (on the rank's group), the
    # constant buffers
    kept = act_layers(t.space) == 0  # activation offload moves bytes to the host: dropped
    a = [min(x, y) if not every else y for x, y in zip(c.act, c.ckpt, strict=True)]
    ad = [min(x, y) if not every else y for x, y in zip(c.act_d, c.ckpt_d, strict=True)]
    act = per_rank(a, ad, c.emb_act, zeros, f) if kept else np.zeros_like(pair)
    st = main * c.sigma + kk * c.sigma_d + first * c.emb_states + last * c.head_states
    rank_mem = st + st[..., ::-1] + act + c.const_mem
    fits = np.all(rank_mem <= arr(c.capacity), axis=2)
    val = (key.m - rho) * T + rho * S + tail
    return np.asarray(np.where(fits, val, np.inf), float)


def _free(t: Tables, c: KeyCoefs, key: Any, rho: float, every: bool, synced: bool, f: F64,
          places: npt.NDArray[np.int64]) -> float:
    """The free family's bound (the module docstring's last paragraph) over its placements
    `places` (Q, p): each per-layer and edge entry the least over the groups the stages sit
    on (one group: that group's), the fixed DP term and the capacities summed over a row
    (every row is an order of the same groups), T >= S_lb/p, the pair sums' mean tail, the
    memory summed over the ranks."""
    p, L = key.pp, t.space.num_layers
    k = min(float(t.dense_prefix), float(L))
    G = sorted({int(g) for g in places.reshape(-1)})

    def lo(x: list[float]) -> float:
        return min(x[g] for g in G)

    def row_sum(x: list[float]) -> float:  # count_g·x_g over the groups (p·x on one)
        return float(sum(int((places[0] == g).sum()) * x[g] for g in G))

    u = min(c.tau[g] + (c.rho[g] if every else 0.0) for g in G)
    ud = min(c.tau_d[g] + (c.rho_d[g] if every else 0.0) for g in G)

    def total(main: float, dense: float, emb: float, head: float) -> float:
        return (L - k) * main + k * dense + emb + head

    S = total(u, ud, lo(c.emb_time), lo(c.head_time))
    ds = (total(lo(c.dsync), lo(c.dsync_d), lo(c.emb_dps), lo(c.head_dps))
          + row_sum(c.dps_fixed) if synced else 0.0)
    os_ = total(lo(c.opt), lo(c.opt_d), lo(c.emb_opt), lo(c.head_opt))
    tail = 2.0 * (t.tail_frac * ds + os_) / p
    kept = act_layers(t.space) == 0
    a = min(min(c.act[g], c.ckpt[g]) if not every else c.ckpt[g] for g in G)
    ad = min(min(c.act_d[g], c.ckpt_d[g]) if not every else c.ckpt_d[g] for g in G)
    states = total(c.sigma, c.sigma_d, c.emb_states, c.head_states)
    acts = (float(np.min(f)) * (L - k) * a + f[0] * (k * ad + lo(c.emb_act))) if kept else 0.0
    if 2.0 * (states + acts) + p * c.const_mem > row_sum(c.capacity):
        return math.inf
    # each rank runs its mirror pair on its own group: pair i's ranks a, b each take
    # >= s_i·u_g/2 (its layers at the least per-layer entry of its group), so s_i <=
    # 2T·min(x_a, x_b) with x = 1/u; summed over the pairs, L <= 2T·Σ_i min(x_a, x_b) <=
    # 2T·(x_(2) + x_(4) + ... + x_(p)), the ranks' x sorted descending (pairing sorted
    # neighbours maximises a sum of minima)
    x = sorted((1.0 / max(min(c.tau[g] + (c.rho[g] if every else 0.0),
                              c.tau_d[g] + (c.rho_d[g] if every else 0.0)), 1e-300)
                for g in (int(v) for v in places[0])), reverse=True)
    T = max(S / p, L / (2.0 * sum(x[1::2])))
    return (key.m - rho) * T + rho * S + tail
