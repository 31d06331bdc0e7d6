"""Every key of the master with its bound LB(key), evaluated with numpy: listing a window of LB
is a slice of one sorted array instead of a CP-SAT solution enumeration.

The key-level master (`cpsat_master.build_master`) has one feasible assignment per key: the
one-hot axes fix every axis value, the exactly-one literal families N7, N5 and NB (each tied to
the axes by marginal equalities) then have exactly one literal set, the one of the key's own
value combination, so a key is feasible iff that combination is *reachable* in each family
(`cpsat_master.reachable7` / `reachable` / `reachable_bubble`), the degree rules of `add_axes`
hold, the memory condition holds and both bounds lie in the objective's domain [0, top]. The
reachable combinations are projections of `SearchSpace.degrees()` (times the sp values
`key_legal` allows, the zero stages and the recompute modes), and every rule of `degrees()`
reads the axes of one family only (ep_ok and key_legal: tp, cp, dp, ep, sp of N7; the
micro-batch, interleaving and split rules: tp, cp, mbs, pp, vpp of NB, where
dp = N/(tp*cp*pp)), so the keys whose three
combinations are reachable are exactly `degrees() x sp x zero x mode`; `add_axes`' linear
rules hold on every such key (they restate rules of `degrees()`).

The master's objective on a key is then max(lb1, lb2), each a sum of one coefficient per family,
the floor of one table entry over the unit (`cpsat_master.build_master`'s `lin` and bubble
terms), and its memory condition a sum of two floored entries against `cap_u * pp`.
`build_key_table` evaluates the same expressions, in the same floating-point operations and
order, for every key at once, so LB here equals the master's integer objective on the key
bit for bit (`tests/search/test_key_table.py` compares the two listings on dense, MoE,
folded-etp, two-node-group and pinned spaces). The proof that LB is a lower bound of every plan
of the key is the master's (cpsat_master.py docstring); nothing here changes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.steptime import BACKWARD_SHARE
from autoparallel_cp.search.cpsat_master import KEY_AXES, BoundTables, Key, bound_tables
from autoparallel_cp.search.schedule_axis import BOUND_RATIO, family_ratio
from autoparallel_cp.search.tables import Tables
from autoparallel_cp.spec.plan import RECOMPUTE_MODES

I64 = npt.NDArray[np.int64]

#: Most keys one window returns before it counts as too wide (`cpsat_master.enumerate_keys`'
#: default cap, so the windows, hence the scoring order, are the same as with CP-SAT's listing).
WINDOW_CAP = 20000
#: the memory condition's unit (bytes): the master's (`cpsat_master.build_master`)
MEM_UNIT = 1024.0


@dataclass
class KeyTable:
    """Every feasible key of the master, sorted by (LB, `Key.order`).

    `cols[i]` holds key i's axis values in `KEY_AXES` order and `lb[i]` its bound in objective
    units of `unit_s` seconds; `top_u` is the upper end of the master objective's domain;
    `bounds` the master's tables LB was read from.
    """

    cols: I64
    lb: I64
    unit_s: float
    top_u: int
    bounds: BoundTables
    #: each key's memory condition's left side (KiB units, `build_key_table`), for `at`
    mem: I64 | None = None

    def at(self, bt: BoundTables) -> KeyTable:
        """This table for the same space's bound tables at a smaller capacity
        (`cpsat_master.with_capacity`, search/capacity.py `reuse`): only the memory
        condition's right side, ceil(cap_avg / 1 KiB) x pp, changes (LB and the memory sums
        read no capacity), so the keys are this table's that still pass it, in the same
        order with the same LB: `build_key_table` of those bound tables, without listing."""
        assert self.mem is not None
        cap_u = int(math.ceil(bt.cap_avg / MEM_UNIT))
        keep = self.mem <= cap_u * self.cols[:, KEY_AXES.index("pp")]
        return KeyTable(self.cols[keep], self.lb[keep], self.unit_s, self.top_u, bt,
                        self.mem[keep])

    def __len__(self) -> int:
        return int(self.lb.size)

    def minimum(self) -> int | None:
        """The least LB over all keys (the master's optimum); None when no key is feasible."""
        return int(self.lb[0]) if self.lb.size else None

    def key(self, i: int) -> Key:
        """The key of row i (`tolist` gives Python ints, the same values as `int()` of each)."""
        return Key(*self.cols[i].tolist())

    def upto(self, hi: int) -> int:
        """How many keys have LB <= hi (the first ones: the keys are sorted by LB)."""
        return int(np.searchsorted(self.lb, hi, side="right"))

    def window(self, lo: int | None, hi: int, cap: int = WINDOW_CAP
               ) -> tuple[list[tuple[int, Key]], bool]:
        """Every key with lo < LB <= hi, sorted by (LB, key order), and whether the window
        holds `cap` keys or more (then the keys are not returned: the caller narrows it)."""
        a = 0 if lo is None else int(np.searchsorted(self.lb, lo, side="right"))
        b = self.upto(hi)
        if b - a >= cap:
            return [], True
        return [(lb, Key(*row)) for lb, row in zip(self.lb[a:b].tolist(),
                                                   self.cols[a:b].tolist(), strict=True)], False


def _floor_u(x: npt.NDArray[np.float64], unit: float) -> I64:
    return np.floor(x / unit).astype(np.int64)


def build_key_table(t: Tables, time_unit: float = 1e-6,
                    bt: BoundTables | None = None) -> KeyTable:
    """All keys of `t`'s space with the master's integer LB (module docstring); `time_unit`
    must be the master's (`build_master`'s default)."""
    s = t.space
    bt = bt if bt is not None else bound_tables(t)
    tu, mu = time_unit, MEM_UNIT
    sp_vals = [v for v in (0, 1) if v in s.sp]
    modes = [RECOMPUTE_MODES.index(x) for x in s.recompute]
    # the legal degree choices, each with the sp values it allows
    # (many degrees share their (tp, cp, dp, ep, sp): each is asked once)
    deg: list[tuple[int, ...]] = []
    legal: dict[tuple[int, ...], bool] = {}
    for d in s.degrees():
        for spv in sp_vals:
            lk = (d.tp, d.cp, d.dp, d.ep, spv)
            is_legal = legal.get(lk)
            if is_legal is None:
                is_legal = legal[lk] = s.key_legal(*lk)
            if is_legal:
                deg.append((d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, spv, d.mbs,
                            d.num_microbatches))
    nz, nm = len(s.zero), len(modes)
    dg = np.array(deg, dtype=np.int64).reshape(-1, 9)

    def idx(col: int, dom: Sequence[int]) -> I64:
        look = {v: i for i, v in enumerate(dom)}
        return np.array([look[v] for v in dg[:, col].tolist()], dtype=np.int64)

    # domain positions per (degree, sp) row, then every row times every zero stage and mode
    dg = np.concatenate([dg, np.stack([idx(0, s.tp), idx(1, s.cp), idx(4, s.ep),
                                       idx(6, sp_vals), idx(7, s.mbs), idx(3, t.dp)],
                                      axis=1)], axis=1)
    rows = np.repeat(dg, nz * nm, axis=0)
    zi = np.tile(np.repeat(np.arange(nz), nm), len(dg))
    mi = np.tile(np.arange(nm), len(dg) * nz)
    tp, cp, pp, dp, ep, vpp, sp, mbs, m = (rows[:, i] for i in range(9))
    itp, icp, iep, isp, imb, idp = (rows[:, i] for i in range(9, 15))
    # flat positions into the 6-d and 5-d bound tables (one gather each, the same entries)
    i6 = np.ravel_multi_index((itp, icp, iep, isp, imb, mi), bt.s6.shape)
    i5 = np.ravel_multi_index((itp, iep, zi, idp, icp, imb), bt.tail5.shape)

    def at(a: npt.NDArray[np.float64], flat: I64) -> npt.NDArray[np.float64]:
        return np.take(a, flat)  # `take` reads the array in C order, as ravel_multi_index
    # the bubble family (tp, cp, mbs, pp, vpp): S_lb least and V largest over (ep, sp, mode)
    s_min = bt.s6.min(axis=(2, 3, 5))[itp, icp, imb]
    v_max = bt.v6.max(axis=(2, 3, 5))[itp, icp, imb]
    ppf, vppf = pp.astype(np.float64), vpp.astype(np.float64)
    bub_s = np.maximum(0.0, s_min - v_max / ppf) / vppf
    if s.schedule in BOUND_RATIO:  # x the family's least rho (search/schedule_axis.py)
        bub_s = bub_s * _family_rho(t, tp, cp, mbs, pp)
    bub = _floor_u(bub_s, tu)
    lb1 = _floor_u(at(bt.mt6, i6), tu) + bub + _floor_u(at(bt.tail5, i5), tu)
    over = (m.astype(np.float64) - BACKWARD_SHARE) * at(bt.s6, i6) / ppf
    lb2 = _floor_u(over, tu) + bub + _floor_u(at(bt.tail5x, i5), tu)
    top = int((float(np.max(bt.mt6)) + float(np.max(bt.s6.min(axis=(2, 3, 5))))
               + max(float(np.max(bt.tail5)), float(np.max(bt.tail5x)))) / tu) + 3
    cap_u = int(math.ceil(bt.cap_avg / mu))
    mem = _floor_u(at(bt.ms5, i5), mu) + _floor_u(at(bt.ma6, i6), mu)
    ok = (mem <= cap_u * pp) & (lb1 >= 0) & (lb1 <= top) & (lb2 >= 0) & (lb2 <= top)
    lb = np.maximum(lb1, lb2)[ok]
    mode = np.array(modes, dtype=np.int64)[mi]
    zero = np.array(s.zero, dtype=np.int64)[zi]
    by = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp, "sp": sp,
          "zero": zero, "mbs": mbs, "m": m, "mode": mode}
    cols = np.stack([by[a][ok] for a in KEY_AXES], axis=1)
    # sort by (LB, Key.order()): order = (tp, pp, cp, dp, ep, vpp, sp, zero, mbs, mode)
    c = {a: cols[:, i] for i, a in enumerate(KEY_AXES)}
    order = np.lexsort(tuple(c[a] for a in ("mode", "mbs", "zero", "sp", "vpp", "ep", "dp",
                                            "cp", "pp", "tp")) + (lb,))
    return KeyTable(cols[order], lb[order], tu, top, bt, mem[ok][order])


def _family_rho(t: Tables, tp: I64, cp: I64, mbs: I64, pp: I64) -> npt.NDArray[np.float64]:
    """`schedule_axis.family_ratio` of every row's bubble family (tp, cp, mbs, pp), asked once
    per distinct family (the master's same floats)."""
    fam = np.stack([tp, cp, mbs, pp], axis=1)
    uniq, inv = np.unique(fam, axis=0, return_inverse=True)
    spaces = [v.space for v in t.variants] if t.variants else [t.space]
    vals = np.array([family_ratio(spaces, *(int(x) for x in row)) for row in uniq], float)
    return vals[np.asarray(inv).reshape(-1)]
