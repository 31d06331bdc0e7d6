"""The stage-time grid of a class of search keys (`Batch`) and what a key's lower bound derives
from it: T_lb, the Lagrange multipliers, S_lb over all entries and the DP tail (`least_step`);
`search/key_bounds.py` holds the bound itself and its proof (`key_bound`'s docstring), which
this grid's steps implement.

Kept whole (about 400 lines): one grid class whose methods are the proof's steps over the same
arrays (tmin, the layer counts, the placements).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.steptime import BACKWARD_SHARE
from autoparallel_cp.search.replay_axis import head_position
from autoparallel_cp.search.schedule_axis import inflight_row, layout_inflight, stage_inflight
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import RECOMPUTE_MODES

#: From how many entries a grid takes the paths that touch fewer entries with more numpy calls
#: (below it numpy's per-call cost dominates); either path gives the same floats
SPLIT_ENTRIES = 20_000
#: ... and a grid of this many stage positions or more is composed per (first, last) class
SPLIT_POSITIONS = 5


def replay_counts(rs: npt.NDArray[np.float64], ls: npt.NDArray[np.float64]
                   ) -> npt.NDArray[np.float64]:
    """The partial-recompute counts 1..R (`rs`) the grid needs for layer counts `ls`: a stage
    of l layers replays min(r, l), so every r >= max(ls) gives the entries of r = max(ls) and
    the min over r is the same float without them (a split's counts near L / pp: far fewer r)."""
    return rs[:max(1, min(rs.size, int(ls.max())))]


@functools.lru_cache(maxsize=1 << 14)
def _stage_sums(cl: tuple[int, ...], pp: int) -> tuple[int, ...]:
    """Layers per stage of a layout in `chunk_layers` order (chunk v of stage j at v*pp + j)."""
    return tuple(sum(cl[j::pp]) for j in range(pp))



def key_class(t: Tables, key: Any, rho_ok: bool) -> tuple[int, int, bool, bool] | None:
    """The class of keys `Batch` bounds together; None when no placement of the key's pp
    stages gives every node group whole stages (no plan: inf). `rho_ok`: every group's
    replay time of a main-kind layer is >= 0 (the closed form's condition)."""
    s = t.space
    N = s.job.num_gpus
    if any((grp.num_gpus * key.pp) % N for grp in s.job.cluster.node_groups):
        return None
    full = RECOMPUTE_MODES[key.mode] == "full"
    closed = full and s.partial_recompute and "recompute_layers" not in s.fixed \
        and key.pp > 1 and rho_ok
    return key.pp, key.vpp, full, closed


@dataclass
class Batch:
    """The stage-time grid tmin (B, pp, G, nl) of B keys of one class and what the bound of
    each derives from it (`key_bound`'s docstring): T_lb, the Lagrange multipliers, S_lb over
    all entries, and the DP tail's a, b, o."""

    t: Tables
    pp: int
    vpp: int
    m: npt.NDArray[np.float64]  # (B,)
    ng: list[int]
    ls: npt.NDArray[np.float64]
    tmin: npt.NDArray[np.float64]  # (B, pp, G, nl)
    co: dict[str, npt.NDArray[np.float64]]  # the keys' `KeyCoefs` fields (`stack_coefs`)
    moved: bool = False  # position 1 may hold the dense prefix (`prefix_moves`)
    k_fixed: npt.NDArray[np.float64] | None = None  # a pinned split's dense layers (rows, pp)

    @classmethod
    def build(cls, t: Tables, klass: tuple[int, int, bool, bool], keys: Sequence[Any],
              co: dict[str, npt.NDArray[np.float64]],
              layouts: Sequence[tuple[int, ...]] | None = None) -> Batch | None:
        """tmin of every key (None when no layer count is allowed at all); `layouts` (one
        per key, `chunk_layers` order): key i's split is that named layout, each position
        holding its own count with its own chunks' in-flight count (a pinned split per row)."""
        s = t.space
        L = s.num_layers
        N = s.job.num_gpus
        pp, vpp, full, closed_form = klass
        hp = head_position(s.schedule, pp)  # the LM head's stage: 0 in a V (replay_axis.py)
        B = len(keys)
        K = t.dense_prefix if t.main_kind else 0
        G = t.groups
        ng = [grp.num_gpus * pp // N for grp in s.job.cluster.node_groups]
        ms = [k.m for k in keys]
        z3 = any(k.zero >= 3 for k in keys)  # others: zero ZeRO-3 terms (x + 0.0 == x)
        if not full:
            rs = np.zeros(1)
        elif "recompute_layers" in s.fixed:
            rs = np.array([float(s.fixed["recompute_layers"])])
        elif not s.partial_recompute:
            rs = np.array([float(L)])
        else:
            rs = np.arange(1, L + 1, dtype=float)
        fixed = s.fixed_stage_layers(pp, vpp)
        n_fixed = np.zeros((1, pp))
        if layouts is not None:  # a named layout per key (rows of one or several families)
            n_fixed = np.array([_stage_sums(cl, pp) for cl in layouts], float)
            ls = np.unique(n_fixed)
            f_all = np.array([layout_inflight(s.schedule, pp, vpp, m, cl)
                              for m, cl in zip(ms, layouts, strict=True)])
        elif fixed is not None:  # a pinned split: each position holds its own count only
            ls = np.array(sorted(set(fixed)), dtype=float)
            chunks = tuple(s.chunks_of(pp, vpp, j, n) for j, n in enumerate(fixed))
            f_all = np.array([[stage_inflight(s.schedule, pp, vpp, m, j, c)
                               for j, c in enumerate(chunks)]
                              for m in ms], float)
            n_fixed = np.array(fixed, float).reshape(1, pp)
        else:  # a V's rank 0 may hold 0 layers (empty_rank.py): position 0 only, count_ok
            ls = np.arange(vpp * min(s.first_stage_min_units(vpp), 1), L + 1, vpp, dtype=float)
            f_all = np.stack([inflight_row(s.schedule, pp, vpp, m) for m in ms])
        if ls.size == 0:
            return None
        # a pinned split's / named layout's dense prefix per position (spec/splits.py
        # `prefix_counts`: spread over the first stages when the first holds fewer than K)
        # (spec/splits.py `prefix_counts` per row: min(n_j, max(K - S_j, 0)), S_j the layers
        # before position j)
        k_fixed = np.clip(K - (np.cumsum(n_fixed, axis=1) - n_fixed), 0.0, n_fixed) if K and (
            fixed is not None or layouts is not None) else None
        if k_fixed is not None and k_fixed[:, 1:].any():
            closed_form = False  # `closed` composes main-kind layers only: the full grid
        moved = bool(K) and fixed is None and layouts is None and ls[0] == 0 and pp > 1
        if full and rs.size > 1:
            rs = replay_counts(rs, ls)

        def inflight_at(j: Any) -> Any:
            """f_j of the positions j (the pinned stages' own chunks, else equal chunks)."""
            return f_all[:, j].reshape(B, -1, 1, 1, 1)

        def count_ok(j: Any) -> Any:
            """Layer counts position j may hold (all of ls unless the split is pinned)."""
            if fixed is None and layouts is None:
                return True if ls[0] > 0 else (lv > 0) | (j == 0).reshape(1, -1, 1, 1, 1)
            return lv == n_fixed[:, j].reshape(n_fixed.shape[0], -1, 1, 1, 1)

        def A(name: str) -> Any:  # per key and node group, broadcast over (b, j, g, l, r)
            return co[name].reshape(B, 1, G, 1, 1)

        def P(name: str) -> Any:  # per key, group independent
            return co[name].reshape(B, 1, 1, 1, 1)

        ga = {name: A(name) for name in (
            "tau", "tau_d", "rho", "rho_d", "emb_time", "head_time", "p2p", "z3l", "z3l_d",
            "z3f", "z3f_d", "act", "ckpt", "act_d", "ckpt_d", "emb_act", "work", "work_full",
            "work_d", "work_full_d", "head_work", "head_act", "capacity", "mtp_time",
            "mtp_rec", "mtp_act", "mtp_ckpt")}
        gs = {name: P(name) for name in (
            "sigma", "sigma_d", "emb_states", "head_states", "const_mem", "mtp_states")}
        capx = ga["capacity"] * (1 + 1e-9) + 1.0  # fits up to float rounding of a reordered sum
        lv = ls.reshape(1, 1, 1, -1, 1)

        # the last stage's MTP layers: replayed (rc True) only with recompute_layers None, every
        # stage fully recomputed, so the last one's r_j = l_j; not replayed (False) in any
        # other mode and under full recompute with recompute_layers set (partial or pinned)
        rc_false_ok = not full or s.partial_recompute or "recompute_layers" in s.fixed

        def grid(j: Any, rs: Any, mtp: bool | None = None, pre: bool = False) -> Any:
            """tmin over stage positions j, every allowed r (the plan_cost composition); with
            `mtp` (False / True: the replay flag) the last stage's MTP terms added. Positions
            differ only by being first / last and by their in-flight count (and a pinned split's
            own count): on a large grid each (first, last) class is composed once and only the
            peak's f * acts term and what follows are per position (each entry the same float;
            on a small one numpy's per-call cost outweighs the entries saved). `pre`: the
            positions hold the dense prefix (a V's rank 1 after an empty rank 0)."""
            first = (j == 0).astype(float).reshape(1, -1, 1, 1, 1)
            last = (j == hp).astype(float).reshape(1, -1, 1, 1, 1)
            if len(j) < SPLIT_POSITIONS or B * len(j) * G * ls.size * rs.size < SPLIT_ENTRIES:
                return grid_at(j, first, last, rs, mtp, pre)
            out = np.empty((B, len(j), G, ls.size))
            fl = first[0, :, 0, 0, 0] * 2 + last[0, :, 0, 0, 0]
            for c in np.unique(fl):
                sel = np.flatnonzero(fl == c)
                out[:, sel] = grid_at(j[sel], first[:, sel[:1]], last[:, sel[:1]], rs, mtp, pre)
            return out

        def grid_at(j: Any, first: Any, last: Any, rs: Any, mtp: bool | None,
                    pre: bool = False) -> Any:
            """`grid` of positions j; first / last: 1.0 / 0.0 per position, or one value for
            positions that are all alike."""
            f = inflight_at(j)
            # the dense prefix: on the first stage, none on an empty rank 0 (empty_rank.py)
            if k_fixed is not None:  # a pinned split: each position its own share
                nd = k_fixed[:, j].reshape(k_fixed.shape[0], -1, 1, 1, 1) + 0.0 * lv
            else:
                nd = K + 0.0 * lv if pre else first * K * (lv > 0)
            rv = rs.reshape(1, 1, 1, 1, -1)
            ok_l = (lv >= nd) & count_ok(j)  # the first stage holds the dense prefix
            nm = np.maximum(lv - nd, 0.0)
            rk = np.minimum(rv, lv)
            rd = np.minimum(rk, nd)
            rm = rk - rd
            time_ = nm * ga["tau"] + nd * ga["tau_d"] + rm * ga["rho"] + rd * ga["rho_d"] \
                + first * ga["emb_time"] + last * ga["head_time"]
            if pp > 1:
                time_ = time_ + ga["p2p"]
            if z3:
                time_ = time_ + nm * ga["z3l"] + nd * ga["z3l_d"] + np.maximum(
                    np.where(nm > 0, ga["z3f"], 0.0), np.where(nd > 0, ga["z3f_d"], 0.0))
            states = nm * gs["sigma"] + nd * gs["sigma_d"] + first * gs["emb_states"] \
                + last * gs["head_states"]
            acts = (nm - rm) * ga["act"] + rm * ga["ckpt"] + (nd - rd) * ga["act_d"] \
                + rd * ga["ckpt_d"] + first * ga["emb_act"]
            work = np.maximum(
                np.where(nm > 0, np.where(rm > 0, ga["work_full"], ga["work"]), 0.0),
                np.where(nd > 0, np.where(rd > 0, ga["work_full_d"], ga["work_d"]), 0.0))
            work = np.maximum(work, last * ga["head_work"])
            extra = last * ga["head_act"]
            if mtp is not None:  # mtp_coefs: n layers of the main kind + the extras
                time_ = time_ + last * (ga["mtp_time"] + ga["mtp_rec"] if mtp
                                        else ga["mtp_time"])
                states = states + last * gs["mtp_states"]
                extra = extra + last * (ga["mtp_ckpt"] if mtp else ga["mtp_act"])
                work = np.maximum(work, last * (ga["work_full"] if mtp else ga["work"]))
                ok_l = ok_l & (((rk == lv) & full) if mtp else rc_false_ok)
            peak = states + f * acts + extra + work + gs["const_mem"]
            fits = (peak <= capx) & ok_l
            return np.where(fits, time_, np.inf).min(axis=4)

        def closed(j: Any, mtp: bool | None = None) -> Any:
            """tmin over positions j >= 1 with partial full recompute (r_j in [1, l]): the stage
            time grows with r_j (rho >= 0) and its peak is linear in r_j >= 1 (work_full), so
            the least fitting r_j has a closed form (rounded down: a smaller r_j only lowers the
            bound). With `mtp` the last stage's MTP terms added: not replayed (False), constants
            in the peak and the time; replayed (True), r_j = l (recompute_layers None)."""
            f = inflight_at(j)
            last = (j == hp).astype(float).reshape(1, -1, 1, 1, 1)
            work = np.maximum(ga["work_full"], last * ga["head_work"])
            p0 = lv * gs["sigma"] + last * gs["head_states"] + f * lv * ga["act"] \
                + last * ga["head_act"] + work + gs["const_mem"]
            if mtp is not None:
                p0 = p0 + last * (gs["mtp_states"] + (ga["mtp_ckpt"] if mtp else ga["mtp_act"]))
                if not mtp:  # the replayed layer's working set is work_full, already there
                    p0 = p0 - work + np.maximum(work, last * ga["work"])
            d = f * (ga["act"] - ga["ckpt"])
            if mtp:
                r1 = lv + 0.0 * d
                ok = (p0 - lv * d <= capx) & count_ok(j)
            else:
                with np.errstate(divide="ignore", invalid="ignore"):
                    need = np.ceil((p0 - capx) / d - 1e-6)
                r1 = np.where(d > 0, np.maximum(need, 1.0), 1.0)
                ok = np.where(d > 0, r1 <= lv, p0 - d <= capx) & count_ok(j)
                r1 = np.minimum(r1, lv)
            time_ = lv * ga["tau"] + r1 * ga["rho"] + last * ga["head_time"]
            if mtp is not None:
                time_ = time_ + last * (ga["mtp_time"] + ga["mtp_rec"] if mtp
                                        else ga["mtp_time"])
            if pp > 1:
                time_ = time_ + ga["p2p"]
            if z3:
                time_ = time_ + lv * ga["z3l"] + ga["z3f"]
            return np.where(ok, time_, np.inf)[..., 0]

        jall = np.arange(pp)
        if closed_form:
            tmin = np.concatenate([grid(jall[:1], rs), closed(jall[1:])], axis=1)
        else:
            tmin = grid(jall, rs)
        if t.mtp:  # the head's position with its MTP terms: the least over the replay flag
            jl = jall[hp:hp + 1]
            opts = [closed(jl, rc) if closed_form and hp == pp - 1 else grid(jl, rs, rc)
                    for rc in (False, True)]
            tmin[:, hp:hp + 1] = np.minimum(*opts)
        if moved:  # rank 1 holding the prefix after an empty rank 0 (a V: the head on 0)
            tmin[:, 1:2] = np.minimum(tmin[:, 1:2], grid(jall[1:2], rs, pre=True))
        tmin = tmin * (1 - 1e-9)  # (B, pp, G, nl)
        pinned = s.fixed.get("stage_groups")
        if pinned is not None and G > 1:  # a pinned placement: position j only on its group
            tmin = np.where(np.arange(G).reshape(1, 1, -1, 1)
                            == np.asarray(pinned, int).reshape(1, -1, 1, 1), tmin, np.inf)
        return cls(t, pp, vpp, np.asarray(ms, float), ng, ls, tmin, co, moved, k_fixed)

    def placed(self, capl: Any) -> Any:
        """The most layers the stages hold over the placements, caps (..., pp, G)."""
        G = self.t.groups
        top = [slice(-n, None) if n else slice(0, 0) for n in self.ng]
        if G == 2:  # group 0 on the n_0 positions that gain most by it
            gain = np.sort(capl[..., 0] - capl[..., 1], axis=-1)
            return capl[..., 1].sum(axis=-1) + gain[..., top[0]].sum(axis=-1)
        capl = np.sort(capl, axis=-2)  # ascending: each group's n_g largest are its last n_g
        return sum(capl[..., top[g], g].sum(axis=-1) for g in range(G))

    def t_lb(self) -> npt.NDArray[np.float64]:
        """T_lb of every key (inf where the caps at the largest finite entry hold fewer than
        L layers, or some stage position fits no layer count on any group): the least entry
        of the key's tmin at which the caps hold L layers, a binary search over its sorted
        entries for all keys at once (holding is monotone in T, so the least entry is the
        least distinct value `key_bound` finds)."""
        L = self.t.space.num_layers
        B = self.tmin.shape[0]
        flat = np.sort(self.tmin.reshape(B, -1), axis=1)  # inf last
        nf = np.isfinite(flat).sum(axis=1)
        rows = np.arange(B)

        # cap(T) = the largest l (ls ascending) with tmin[..., l] <= T, else 0: the first
        # entry <= T from the end, found by argmax on the reversed counts (numpy's fast path
        # for booleans; the masked max over all entries read and wrote each one)
        big = self.tmin.size >= SPLIT_ENTRIES
        rev = np.ascontiguousarray(self.tmin[..., ::-1]) if big else self.tmin
        ls_rev = self.ls[::-1]
        lsr = self.ls.reshape(1, 1, -1)

        def holds(T: Any) -> Any:
            if not big:
                caps = np.where(self.tmin <= T.reshape(-1, 1, 1, 1), lsr, 0.0).max(axis=3)
                return self.placed(caps) >= L
            le = rev <= T.reshape(-1, 1, 1, 1)
            k = np.argmax(le, axis=3)
            hit = np.take_along_axis(le, k[..., None], axis=3)[..., 0]
            return self.placed(np.where(hit, ls_rev[k], 0.0)) >= L

        fills = np.isfinite(self.tmin).any(axis=(2, 3))  # (B, pp): some group and count
        ok = np.all(fills, axis=1) & (nf > 0)
        ok &= holds(flat[rows, np.maximum(nf - 1, 0)])
        lo = np.zeros(B, int)
        hi = np.where(ok, nf - 1, 0)
        while True:
            act = lo < hi
            if not act.any():
                break
            mid = (lo + hi) // 2
            h = holds(flat[rows, mid])
            hi = np.where(act & h, mid, hi)
            lo = np.where(act & ~h, mid + 1, lo)
        return np.where(ok, flat[rows, lo], np.inf)

    def lams(self, rows: Any) -> npt.NDArray[np.float64]:
        """The Lagrange multipliers of the keys `rows` (n, 9): 9 from the key's least to its
        largest entry per layer."""
        tmin = self.tmin[rows]
        fin = np.isfinite(tmin) & (self.ls > 0).reshape(1, 1, 1, -1)  # (0: an empty rank)
        with np.errstate(divide="ignore", invalid="ignore"):
            per = tmin / self.ls.reshape(1, 1, 1, -1)
        lo = np.where(fin, per, np.inf).min(axis=(1, 2, 3))
        hi = np.where(fin, per, -np.inf).max(axis=(1, 2, 3))
        with np.errstate(invalid="ignore"):
            if np.all((hi - lo) / 8 != 0):  # numpy's linspace rows: arange * step + start
                return np.linspace(lo, hi, 9, axis=1).reshape(-1, 9)
        # a zero step takes linspace's other path for every row of a batch: row by row
        return np.array([np.linspace(a, b, 9) for a, b in zip(lo, hi, strict=True)]
                        ).reshape(-1, 9)

    def s_lb(self, tm: Any, lams: Any) -> Any:
        """S_lb of each (pp, G, nl) slice of tm (leading axis) with the multipliers lams (one
        row per slice, or one for all): max over lambda of lambda*L + the least sum_j
        h[j, g(j)] over the placements."""
        G = self.t.groups
        L = self.t.space.num_layers
        ng = self.ng
        lsr = self.ls.reshape(1, 1, -1)
        lam_l = lams.reshape(len(lams), -1, 1, 1, 1) * lsr  # (n or 1, lambda, 1, 1, nl)
        if np.isfinite(lam_l).all() and bool((tm > -np.inf).all()):
            # tm finite or +inf and lambda*l finite: tm - lambda*l is already +inf where tm
            # is, so the mask below changes no entry; on a large grid one multiplier at a
            # time keeps the difference array small (a min is exact in any order)
            if tm.size < SPLIT_ENTRIES:
                hs = (tm[:, None] - lam_l).min(axis=4)
            else:
                hs = np.stack([(tm - lam_l[:, i]).min(axis=3) for i in range(lam_l.shape[1])],
                              axis=1)  # (n, lambda, j, g)
        else:
            hs = np.where(np.isfinite(tm)[:, None], tm[:, None] - lam_l, np.inf).min(axis=4)
        if G == 2:
            # group 0 on the n_0 positions where it saves most (a position one group cannot
            # hold goes to the other)
            h0, h1 = hs[..., 0], hs[..., 1]
            with np.errstate(invalid="ignore"):
                gain = np.where(np.isinf(h0), np.inf, np.where(np.isinf(h1), -np.inf, h0 - h1))
            on0 = np.zeros(gain.shape, bool)
            np.put_along_axis(on0, np.argsort(gain, axis=2, kind="stable")[..., :ng[0]], True,
                              axis=2)
            hsum = np.where(on0, h0, h1).sum(axis=2)
        else:
            # each group's n_g least h (placement relaxed: two groups may share a position)
            hs = np.sort(hs, axis=2)
            hsum = sum(hs[:, :, :ng[g], g].sum(axis=2) for g in range(G))
        return (lams * L + hsum).max(axis=1)

    def tail(self) -> tuple[Any, Any, Any]:
        """a, b, o of the DP tail of every key (B,): the least DP-sync and optimizer sums."""
        L = self.t.space.num_layers
        K = self.t.dense_prefix if self.t.main_kind else 0
        pp = self.pp

        def lo(name: str) -> Any:
            return self.co[name].min(axis=1)

        D = (L - K) * lo("dsync") + K * lo("dsync_d") + pp * lo("dps_fixed") \
            + lo("emb_dps") + lo("head_dps")
        opt_sum = (L - K) * lo("opt") + K * lo("opt_d") + lo("emb_opt") + lo("head_opt")
        if self.t.mtp:  # the last stage's, on some group
            D, opt_sum = D + lo("mtp_dps"), opt_sum + lo("mtp_opt")
        return self.t.tail_frac * D / pp, D / pp, opt_sum / pp

    def uncoupled(self) -> list[float]:
        """Every key's bound: phi(T_lb, S_lb) (`key_bound`, coupled=False)."""
        T_lb = self.t_lb()
        out = [math.inf] * len(self.m)
        ok = np.flatnonzero(np.isfinite(T_lb))
        if ok.size == 0:
            return out
        S_all = self.s_lb(self.tmin[ok], self.lams(ok))
        a, b, o = self.tail()
        with np.errstate(invalid="ignore"):
            best = least_step(T_lb[ok], S_all, self.pp, self.co["vdiv"][ok], self.m[ok], a[ok],
                              b[ok], o[ok],
                        self.t.bwd_share)
        for i, v in zip(ok, best.tolist(), strict=True):
            # inf (or nan from 0 * inf): no placement fills a stage
            out[i] = v * (1 - 1e-9) - 1e-12 if math.isfinite(v) else math.inf
        return out


def least_step(T0: Any, S_lb: Any, pp: int, vpp: Any, m: Any, a: Any, b: Any, o: Any,
         bs: float = BACKWARD_SHARE) -> Any:
    """The least step over S >= max(S_lb, T0) with T = max(T0, S/pp) (elementwise); `bs`: the
    backward share the DP tail hides behind (0 without DP overlap: the step grows with S);
    `vpp`: the bubble's divisor (vpp / rho for a zero-bubble schedule, search/schedule_axis.py:
    >= vpp, so the step still grows with T; infinite for a replayed one: no bubble term, also
    where S is infinite, search/replay_axis.py)."""
    S0 = np.maximum(S_lb, T0)
    none = np.isinf(vpp)

    def step(S: Any) -> Any:
        T = np.maximum(T0, S / pp)
        with np.errstate(invalid="ignore"):
            bub = np.where(none, 0.0, S / vpp)
        return (m - 1.0 / vpp) * T + bub + np.maximum(a, b - bs * S / pp) + o

    brk = np.broadcast_to((b - a) * pp / bs if bs > 0 else S0, S0.shape)
    return np.minimum.reduce([step(np.maximum(S0, x)) for x in (S0, pp * T0, brk)])
