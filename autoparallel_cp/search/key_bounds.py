"""The numpy lower bound of a key's step time (`key_bound`, `key_bounds`; the key's
constants are read by `key_coefs.py`, the coefficients the per-key CP-SAT model is linear in).

`key_bound` bounds every plan of the key from below without CP-SAT (the least over the key's
partition families, `SearchSpace.split_families`, and expert-TP sizes, `Tables.variants`: the
proof below holds for each family, the space's own partitions or one named layout, and a
key's plans are the union of its families' plans; the named layouts of a batch are rows of
one grid, `Batch.build(layouts=...)`, each row a pinned split), so the master can skip keys
that cannot enter the top k; `key_bounds` computes it for many keys at once (numpy over the
keys of a schedule class, the same floats). The last stage's DeepSeek-V3 MTP terms
(search/mtp_coefs.py, `KeyCoefs.mtp_*`) enter exactly as `plan_cost` adds them, with the
replay flag relaxed (`key_bound`'s docstring, last item).

Kept whole otherwise (about 690 lines; issue #30 asks <= 600): `key_bound` is one proof (its
docstring) whose steps share the stage-time grid tmin (`Batch`) and the placement helpers;
split further, the proof's steps would sit apart from their code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search import key_grid
from autoparallel_cp.search.act_offload import scored
from autoparallel_cp.search.act_offload_bound import applies as offload_applies
from autoparallel_cp.search.act_offload_bound import offload_key_bound
from autoparallel_cp.search.dualpipe_bound import applies as dualpipe_applies
from autoparallel_cp.search.dualpipe_bound import dualpipe_key_bound
from autoparallel_cp.search.key_coefs import KeyCoefs, coef_arrays, key_coefs, stack_coefs
from autoparallel_cp.search.key_grid import Batch, key_class, least_step
from autoparallel_cp.search.model_scored import model_scored
from autoparallel_cp.search.replay_axis import head_position
from autoparallel_cp.search.tables import Tables, key_variants


def _own_bound(space: Any) -> bool:
    """Keys the cost model scores whose bound is not this module's composition: DualPipe
    (dualpipe_bound.py) and a pipelined activation offload (the master's); a DualPipeV hiding
    EP all-to-all takes this module's (`key_bound`'s docstring), but under an activation
    offload the master's (this module's tables hold no offload term: act_offload.py)."""
    return model_scored(space) and (space.schedule != "dualpipev" or scored(space))


def _own(t: Tables, key: Any) -> float:
    """An `_own_bound` space's bound of `key`: DualPipe's (dualpipe_bound.py), a pinned
    activation offload's scored part's (act_offload_bound.py), else 0 (the master's)."""
    if dualpipe_applies(t.space):
        return dualpipe_key_bound(t, key)
    return offload_key_bound(t, key) if offload_applies(t.space) else 0.0


def family_bounds(t: Tables, key: Any, c: KeyCoefs | None = None) -> list[float]:
    """The uncoupled bound of `key` over each of its partition families, in
    `SearchSpace.split_families` order (inf for a family no split of which fits): the space's
    own partitions (when they place the layers), then each named layout."""
    if _own_bound(t.space):  # the master's, or DualPipe's own (search/dualpipe_bound.py),
        # which holds for every split: the same for each family
        v = _own(t, key)
        return [v] * len(t.space.split_families(key.pp, key.vpp))
    cc = c if c is not None else key_coefs(t, key)
    cls = key_class(t, key, min(cc.rho) >= 0.0)
    out: list[float] = []
    if t.space.free_ok(key.pp, key.vpp):
        b = Batch.build(t, cls, [key], stack_coefs([cc])) if cls is not None else None
        out.append(math.inf if b is None else float(b.uncoupled()[0]))
    lays = t.space.layouts(key.pp, key.vpp)
    if lays:
        b = None
        if cls is not None:
            co = stack_coefs([cc])
            b = Batch.build(t, cls, [key] * len(lays),
                             {n: np.repeat(a, len(lays), axis=0) for n, a in co.items()}, lays)
        out += [math.inf] * len(lays) if b is None else [float(v) for v in b.uncoupled()]
    return out


def key_bound(t: Tables, key: Any, c: KeyCoefs | None = None, *, coupled: bool = False
              ) -> float:
    """A proven lower bound of the exact step time of every plan of `key` (numpy, no CP-SAT),
    used only to skip keys whose best cannot enter the top k before their model is built.

    Per stage position j, node group g and layer count l (a multiple of vpp; with a pinned
    split, the position's own count and in-flight count `stage_inflight`), `tmin[j, g, l]`
    is the least stage time over the recompute counts r_j = min(r, l) whose memory peak fits
    (the `tables.plan_cost` composition with the key's constants; inf when none fits): memory
    that forces recompute adds its replay time here, and the embedding / LM head / dense prefix
    sit at their positions. Then, with T = max_j t_j and S = sum_j t_j:

    - T >= T_lb, the least T at which the stages can hold L layers: stage j on group g holds at
      most cap_g(j, T) = max{l : tmin[j, g, l] <= T} layers and group g holds n_g stages, so
      L <= max over placements g(.) with n_g positions per group of sum_j cap_g(j)(j, T);
    - S >= S_lb = lambda*L + min over the same placements of sum_j h[j, g(j)], h[j, g] =
      min_l (tmin[j, g, l] - lambda*l), for any lambda (Lagrangian of sum_j l_j = L:
      t_j >= tmin[j, g(j), l_j] >= h[j, g(j)] + lambda*l_j, summed over j);
    - the placements: one group (homogeneous), the pinned `stage_groups`, or, on two node
      groups, exact: with n_0 positions on group 0, sum_j x[j, g(j)] = sum_j x[j, 1] +
      sum over group 0's positions of (x[j, 0] - x[j, 1]), so the best placement puts group 0
      on the n_0 positions with the largest (for cap) or least (for h) difference, a position
      that one group cannot hold (h = inf) going to the other. With three or more groups each
      group picks its n_g best positions on its own (a relaxation: two groups may pick the
      same position);
    - tail = max_j dp_exposed_j + max_j opt_j >= max(a, b - 2/3 S/pp) + o with D, O the least
      DP-sync and optimizer sums (a = DP_TAIL_FRACTION*D/pp, b = D/pp, o = O/pp); without DP
      overlap (`Tables.tail_frac`, `bwd_share` = 1, 0) the tail is exactly b + o;
    - step = (m - 1/vpp) T + S/vpp + tail, nondecreasing in T (m >= 1): the least value over
      S >= max(S_lb, T_lb) with T = max(T_lb, S/pp), a convex piecewise-linear function of S
      whose minimum is at a breakpoint: phi(T_lb, S_lb).
    Dropped terms (>= 0): the coupling of r across stages, of T, S and the tail (each bound
    takes its own partition), and of positions across groups beyond two.

    MTP (DeepSeek-V3, `t.mtp` depths; `tables.plan_cost`): the last stage, position pp - 1 on
    whichever group g holds it, adds mtp_time[g] + (rc ? mtp_rec[g]) to its time, mtp_states to
    its states, (rc ? mtp_ckpt[g] : mtp_act[g]) to its one-micro-batch bytes, the MTP layer's
    working set (rc ? work_full : work of the main kind, the MTP layer's) into the max, and
    mtp_dps[g], mtp_opt[g] to its DP sync and optimizer time; rc (`mtp_recomputed`) holds iff
    the mode is full and recompute_layers is None, when every stage replays all its layers, so
    the last one's r_j = l_j. tmin[pp - 1, g, l] is therefore taken as the least, over rc in
    {False, True}, of the fitting stage time with these terms: rc = True only where full and
    r_j = l (the closed form: r_j = l, its peak checked directly); rc = False unless the mode
    is full with neither partial recompute nor a pinned recompute_layers (then
    recompute_layers is always None). Every plan's last stage takes one of these (r, rc)
    combinations, so its time is >= this entry, and every step above holds as before. Dropped:
    the coupling of rc with the other stages' r (one flag for all), nothing else; the group is
    the stage's own in tmin (the placement argument). The tail: the last stage is on some
    group, so D and O gain min_g mtp_dps[g], min_g mtp_opt[g] (each <= the stage's own); the
    coupled d_j, o_j gain the last position's own mtp_dps[g], mtp_opt[g].

    `coupled=True` (a few ms; `solve` asks for it only for the keys about to get a model)
    couples them: take any partition and let T' = max_j tmin[j, g(j), l_j] <= T, a value of
    tmin, with T' >= T_lb (the caps at T' hold L layers). Every stage is then an entry of tmin
    <= T', so S >= S_lb(T'), the Lagrangian above over those entries only, and S >= T >= T';
    hence step >= phi(T', S_lb(T')). The tail: with d_j, o_j the stage's DP-sync and optimizer
    times (`tables.plan_cost`: layers times the group's per-layer factor, plus the fixed and
    edge terms), exposed_j = max(DTF d_j, d_j - 2/3 t_j) and t_j <= T, so tail >= max_j
    (exposed_j + o_j) >= max_j w_j(T) with w_j(T) = max(DTF d_j, d_j - 2/3 T) + o_j.
    (m - 1/vpp) T + max_j w_j(T) is nondecreasing in T when m - 1/vpp >= 2/3, so it is >=
    its value at T' (otherwise w drops its T term, DTF d_j + o_j); and max_j w_j(T') >=
    W_lb(T'), the least W at which the stages with tmin <= T' and w <= W can hold L layers
    (the caps argument above, per placement). So step >= bound(T') = max(phi(T', S_lb(T')),
    (m - 1/vpp) T' + max(S_lb(T'), T')/vpp + W_lb(T')), and the least bound(T') over the
    candidates T' >= T_lb bounds every plan of the key. The scan goes up in T' and stops once
    phi(T', S_lb) (<= bound(T'), nondecreasing in T') reaches the least bound so far.

    DualPipe (search/model_scored.py): search/dualpipe_bound.py's bound (a rank averages two
    stages: T >= S/pp, the bubble rho·(S - T), the ranks' mean tail). A DualPipeV hiding EP
    all-to-all: this bound, as for every V (rho' = 0: replay_axis.py), its tables holding each
    layer's time at a hidden share of 1, below the plan's at its m (model_scored.py
    `hidden_lb`), and every step above grows with the stage times; its memory tables are the
    plan's (the share moves no byte). A pipelined activation offload: 0 (the master's).
    """
    if _own_bound(t.space):
        return _own(t, key)
    if t.variants:  # the least over the expert-TP sizes the key is legal under
        return min((key_bound(tv, key, None, coupled=coupled)
                    for tv in key_variants(t, key)), default=math.inf)
    if coupled:
        # the space's own partitions coupled; the named layouts (one split each, already
        # tight) by their uncoupled bound: each bounds its family, the least bounds the key
        cc = c if c is not None else key_coefs(t, key)
        own = _coupled_bound(t, key, cc) if t.space.free_ok(key.pp, key.vpp) else math.inf
        lays = t.space.layouts(key.pp, key.vpp)
        if not lays:
            return own
        return min([own, *family_bounds(t, key, cc)[-len(lays):]])
    return key_bounds(t, [key], [c] if c is not None else None)[0]


def key_bounds(t: Tables, keys: Sequence[Any], cs: Sequence[KeyCoefs] | None = None,
               between: Callable[[], None] | None = None) -> list[float]:
    """`key_bound(t, key)` (uncoupled) of every key, the same floats bit for bit, computed for
    the keys of one schedule class (pp, vpp, full recompute or not, the closed form or not) at
    once: every step of the proof is elementwise, a min / max / sort, or a sum of integer layer
    counts over one key's own slice (the Lagrangian's sum over the stage positions, pp floats,
    is reduced over the same contiguous axis as for one key), so batching changes no value.
    A key's own m and ZeRO stage enter as arrays (ZeRO-3's terms are zeros in `KeyCoefs`
    otherwise, and adding 0.0 changes no float). `between` (Ctrl-C's check) runs between
    classes."""
    if not keys:
        return []
    if _own_bound(t.space):  # `key_bound`'s (search/model_scored.py, dualpipe_bound.py)
        if dualpipe_applies(t.space) or offload_applies(t.space):
            out_d = []
            for k in keys:
                if between is not None:
                    between()
                out_d.append(_own(t, k))
            return out_d
        return [0.0] * len(keys)
    if t.variants:
        # each key's least bound over the expert-TP sizes it is legal under: a row per (key,
        # size) with that size's constants, all rows batched at once (the grid reads a key's
        # tables only through its constants; the splits and schedule are the sizes' same)
        owner: list[int] = []
        parts: list[dict[str, npt.NDArray[np.float64]]] = []
        legal = [{id(v) for v in key_variants(t, k)} for k in keys]
        for tv in t.variants:
            idx = [i for i, ids in enumerate(legal) if id(tv) in ids]
            if idx:
                owner += idx
                parts.append(coef_arrays(tv, [keys[i] for i in idx]))
        out_v = [math.inf] * len(keys)
        if not owner:
            return out_v
        co_v = {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}
        for i, bv in zip(owner, _bounds_of_rows(t, [keys[i] for i in owner], co_v, between),
                         strict=True):
            out_v[i] = min(out_v[i], bv)
        return out_v
    co = stack_coefs(cs) if cs is not None else coef_arrays(t, keys)
    return _bounds_of_rows(t, keys, co, between)


def _bounds_of_rows(t: Tables, keys: Sequence[Any], co: dict[str, npt.NDArray[np.float64]],
                    between: Callable[[], None] | None) -> list[float]:
    """`key_bounds` of rows of keys with their constants `co` (`stack_coefs` arrays)."""
    out = [math.inf] * len(keys)
    classes: dict[tuple[int, int, bool, bool], list[int]] = {}
    rho_ok = co["rho"].min(axis=1) >= 0.0
    for i, k in enumerate(keys):
        cls = key_class(t, k, bool(rho_ok[i]))
        if cls is not None:
            classes.setdefault(cls, []).append(i)
    for cls, idx in classes.items():
        if between is not None:
            between()
        rows = np.asarray(idx)
        sub = {n: a[rows] for n, a in co.items()}
        ks = [keys[i] for i in idx]
        pp, vpp = cls[0], cls[1]
        # the space's own partitions, then every named layout at once (a row per key and
        # layout): the key's bound is the least over its families (`tables.family_tables`)
        if t.space.free_ok(pp, vpp):
            b = Batch.build(t, cls, ks, sub)
            if b is not None:
                for i, v in zip(idx, b.uncoupled(), strict=True):
                    out[i] = min(out[i], v)
        lays = t.space.layouts(pp, vpp)
        if lays:
            F = len(lays)
            b = Batch.build(t, cls, [k for k in ks for _ in lays],
                             {n: np.repeat(a, F, axis=0) for n, a in sub.items()},
                             [cl for _ in ks for cl in lays])
            if b is not None:
                per_key = np.asarray(b.uncoupled(), float).reshape(len(ks), F).min(axis=1)
                for i, v in zip(idx, per_key, strict=True):
                    out[i] = min(out[i], float(v))
    return out




def _coupled_bound(t: Tables, key: Any, c: KeyCoefs) -> float:
    """`key_bound(coupled=True)`: the least bound(T') over the candidates T' >= T_lb (the
    second half of `key_bound`'s docstring)."""
    cls = key_class(t, key, min(c.rho) >= 0.0)
    bt = Batch.build(t, cls, [key], stack_coefs([c])) if cls is not None else None
    if bt is None:
        return math.inf
    T_lb_ = bt.t_lb()
    if not math.isfinite(T_lb_[0]):
        return math.inf
    T_lb = float(T_lb_[0])
    L = t.space.num_layers
    G = t.groups
    K = t.dense_prefix if t.main_kind else 0
    pp, m = key.pp, key.m
    vpp = c.vdiv  # the bubble's divisor: vpp, or vpp / rho (search/schedule_axis.py)
    tmin = bt.tmin[0]
    ls = bt.ls
    lsr = ls.reshape(1, 1, -1)
    ls0 = np.concatenate([[0.0], ls])
    cands = np.unique(tmin[np.isfinite(tmin)])
    lams = bt.lams(np.arange(1))
    S_all = bt.s_lb(tmin[None], lams)
    a, b, o = (float(x[0]) for x in bt.tail())

    def phi(T0: Any, S_lb: Any) -> Any:
        return least_step(T0, S_lb, pp, vpp, m, a, b, o, t.bwd_share)

    # per-stage DP sync d and optimizer time o of every (j, g, l) (the plan_cost composition)
    jj = np.arange(pp).reshape(-1, 1, 1)
    first = (jj == 0).astype(float)
    last = (jj == head_position(t.space.schedule, pp)).astype(float)  # replay_axis.py

    def gv(xs: list[float]) -> Any:
        return np.asarray(xs, float).reshape(1, G, 1)

    def sync_opt(nd: Any) -> tuple[Any, Any]:
        nmj = np.maximum(lsr - nd, 0.0)
        return (nmj * gv(c.dsync) + nd * gv(c.dsync_d) + gv(c.dps_fixed)
                + first * gv(c.emb_dps) + last * gv(c.head_dps),
                nmj * gv(c.opt) + nd * gv(c.opt_d) + first * gv(c.emb_opt)
                + last * gv(c.head_opt))

    if bt.k_fixed is not None:  # a pinned split: each position its own share of the prefix
        # (spec/splits.py `prefix_counts`; tmin is inf at every other count of the position)
        dj, oj = sync_opt(bt.k_fixed[0].reshape(-1, 1, 1) + 0.0 * lsr)
    else:  # no prefix on an empty rank 0 (empty_rank.py)
        dj, oj = sync_opt(first * K * (lsr > 0))
    if bt.moved:  # rank 1 may hold it after an empty rank 0: the least of both, each
        # nondecreasing into w below (`Batch.moved`)
        dp_, op_ = sync_opt(np.full_like(first, float(K)))
        on = (jj == 1) & (lsr >= K)
        dj, oj = np.where(on, np.minimum(dj, dp_), dj), np.where(on, np.minimum(oj, op_), oj)
    if t.mtp:  # the last stage's MTP DP sync and optimizer time
        dj, oj = dj + last * gv(c.mtp_dps), oj + last * gv(c.mtp_opt)
    # exposed_j + opt_j >= max(DTF d_j, d_j - 2/3 t_j) + o_j, and t_j <= T; the T term only
    # where (m - 1/vpp) T + that stays nondecreasing in T (slope m - 1/vpp - 2/3 >= 0)
    use_t = m - 1.0 / vpp >= t.bwd_share
    wbase = t.tail_frac * dj + oj

    def w_lb(Tc: Any) -> Any:
        """W_lb(T') per T' of Tc: the least W such that the stages, each with
        tmin[j, g, l] <= T' and max(DTF d, d - 2/3 T') + o <= W, hold L layers."""
        w = np.maximum(wbase[None], (dj - t.bwd_share * Tc.reshape(-1, 1, 1, 1)) + oj) \
            if use_t else np.broadcast_to(wbase[None], (len(Tc), *wbase.shape))
        w = np.where(tmin[None] <= Tc.reshape(-1, 1, 1, 1), w, np.inf)
        # cap_j(W) >= l iff some l' >= l has w <= W: the suffix minimum over l
        suf = np.minimum.accumulate(w[..., ::-1], axis=-1)[..., ::-1]
        vals = np.unique(suf[np.isfinite(suf)])
        if vals.size == 0:
            return np.full(len(Tc), np.inf)
        # without NaN suf is nondecreasing in l: the l with suf <= W are a prefix whose count
        # picks the largest one (on a large grid: fewer entries written than the masked max)
        monotone = suf.size >= key_grid.SPLIT_ENTRIES and not np.isnan(suf).any()
        if monotone:
            suf = np.ascontiguousarray(suf)
        n = len(Tc)
        lo_ = np.zeros(n, int)
        hi_ = np.full(n, vals.size)  # vals.size: none holds
        while True:
            act = lo_ < hi_
            if not act.any():
                break
            mid = (lo_ + hi_) // 2
            W = vals[np.minimum(mid, vals.size - 1)].reshape(-1, 1, 1, 1)
            if monotone:  # the count of the prefix suf <= W: its first False (argmin)
                le = suf <= W
                caps = ls0[np.where(le[..., -1], le.shape[-1], np.argmin(le, axis=-1))]
            else:
                caps = np.where(suf <= W, lsr[None], 0.0).max(axis=-1)
            ok = bt.placed(caps) >= L
            hi_ = np.where(act & ok, mid, hi_)
            lo_ = np.where(act & ~ok, mid + 1, lo_)
        return np.where(lo_ < vals.size, vals[np.minimum(lo_, vals.size - 1)], np.inf)

    def bound_at(Tc: Any) -> Any:
        """max(phi(T', S_lb(T')), (m - 1/vpp) T' + max(S_lb(T'), T')/vpp + W_lb(T'))."""
        tm = np.where(tmin[None] <= Tc.reshape(-1, 1, 1, 1), tmin[None], np.inf)
        Sc = bt.s_lb(tm, lams)
        with np.errstate(invalid="ignore"):
            v = np.maximum(phi(Tc, Sc),
                           (m - 1.0 / vpp) * Tc + np.maximum(Sc, Tc) / vpp + w_lb(Tc))
        return np.where(np.isnan(v), np.inf, v)

    # A partition whose least stage times tmin[j, g(j), l_j] peak at T' (a candidate >= T_lb)
    # has T >= T', S >= S_lb(T') (the Lagrangian over the entries <= T' only) and a step >=
    # bound_at(T'); the least over T' bounds every partition. The scan stops once a lower
    # estimate nondecreasing in T' (phi with S_all) passes the best so far.
    tc = cands[cands >= T_lb]
    best = math.inf
    for lo in range(0, len(tc), 16):
        ch = tc[lo:lo + 16]
        ch = ch[phi(ch, np.full(ch.shape, S_all[0])) < best]
        if ch.size == 0:
            break
        best = min(best, float(bound_at(ch).min()))
    if not math.isfinite(best):
        return math.inf
    return best * (1 - 1e-9) - 1e-12
