"""The constants of one key read from the factor tables (`KeyCoefs`, `key_coefs`), and the
same for many keys as arrays (`coef_arrays`): what the per-key CP-SAT model
(`cpsat_partition`) is linear in and what the bounds (`key_bounds`) compose. Reading only:
each field is one table entry at the key's axis values (per node group), no formula.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.search.mtp_coefs import mtp_coefs
from autoparallel_cp.search.schedule_axis import BOUND_RATIO, bubble_divisor
from autoparallel_cp.search.tables import Tables


@dataclass
class KeyCoefs:
    """The key's factors per node group (seconds / bytes), read from the tables."""

    tau: list[float]  # main-kind layer time (base mode)
    rho: list[float]  # extra time of a recomputed main-kind layer
    act: list[float]
    ckpt: list[float]
    sigma: float  # model-state bytes of one main-kind layer (group independent)
    dsync: list[float]
    opt: list[float]
    work: list[float]
    work_full: list[float]
    z3l: list[float]
    z3f: list[float]
    # dense prefix (first stage, MoE models with first_k_dense_layers)
    tau_d: list[float]
    rho_d: list[float]
    act_d: list[float]
    ckpt_d: list[float]
    sigma_d: float
    dsync_d: list[float]
    opt_d: list[float]
    work_d: list[float]
    work_full_d: list[float]
    z3l_d: list[float]
    z3f_d: list[float]
    # edges
    emb_time: list[float]
    emb_act: list[float]
    emb_states: float
    emb_dps: list[float]
    emb_opt: list[float]
    head_time: list[float]
    head_act: list[float]
    head_work: list[float]
    head_states: float
    head_dps: list[float]
    head_opt: list[float]
    dps_fixed: list[float]
    p2p: list[float]
    const_mem: float  # ZeRO-3 buffers + other allocations
    capacity: list[float]
    # DeepSeek-V3 MTP on the last stage (`mtp_coefs.MtpCoefs`; zeros without MTP)
    mtp_time: list[float]
    mtp_rec: list[float]  # added when the MTP layers are replayed
    mtp_act: list[float]  # kept bytes (one micro-batch), not replayed
    mtp_ckpt: list[float]  # kept bytes, replayed
    mtp_states: float
    mtp_dps: list[float]
    mtp_opt: list[float]
    # the bubble's divisor vpp / rho of the key (search/schedule_axis.py `bubble_divisor`)
    vdiv: float = 1.0


def key_coefs(t: Tables, key: Any) -> KeyCoefs:
    """Read one key's factor values from the tables (the indexing of `tables.plan_cost`)."""
    mode = key.mode
    itp, icp, iep, imb = t.i("tp", key.tp), t.i("cp", key.cp), t.i("ep", key.ep), \
        t.i("mbs", key.mbs)
    iz, idp = t.i("zero", key.zero), t.i("dp", key.dp)
    i6 = (itp, icp, iep, key.sp, imb)
    i6m = i6 + (mode,)
    i7 = i6m + (idp,)
    iz4 = (itp, icp, iep, idp)
    i5 = (itp, iep, iz, idp, icp)
    i4 = (itp, iz, idp, icp)
    ie = (itp, icp, key.sp, imb)
    G = range(t.groups)
    main = t.main_kind
    z3 = key.zero >= 3
    dense = bool(t.dense_prefix and main)

    def per(kind: bool, tab: dict[tuple[int, bool], Any], idx: tuple[int, ...]) -> list[float]:
        return [float(tab[g, kind][idx]) for g in G]

    def zero_l() -> list[float]:
        return [0.0 for _ in G]

    def kind_vals(kind: bool) -> dict[str, Any]:
        return dict(
            tau=[a + b for a, b in zip(per(kind, t.time, i6m), per(kind, t.mbl, i5),
                                        strict=True)],
            rho=per(kind, t.rec, i6), act=per(kind, t.act, i6m),
            ckpt=per(kind, t.ckpt, i6), sigma=float(t.states[kind][i5]),
            dsync=per(kind, t.dpsync, i5), opt=per(kind, t.opt, i5),
            work=per(kind, t.work, i6m), work_full=per(kind, t.work_full, i6),
            z3l=per(kind, t.z3l, i7) if z3 else zero_l(),
            z3f=per(kind, t.z3f, iz4) if z3 else zero_l())

    mv: dict[str, Any] = kind_vals(main)
    dv: dict[str, Any] = kind_vals(False) if dense else {
        k: (0.0 if k.startswith("sigma") else zero_l()) for k in mv}
    p2p = ([float(t.p2p[g][ie + (t.i("vpp", key.vpp), idp)]) for g in G] if key.pp > 1
           else zero_l())
    mc = mtp_coefs(t, key)
    return KeyCoefs(
        **mv, **{k + "_d": v for k, v in dv.items()},
        emb_time=[float(t.emb_time[g][ie]) + float(t.emb_mb[g][i4]) for g in G],
        emb_act=[float(t.emb_act[g][ie]) for g in G],
        emb_states=float(t.emb_states[i4]),
        emb_dps=[float(t.emb_dpsync[g][i4]) for g in G],
        emb_opt=[float(t.emb_opt[g][i4]) for g in G],
        head_time=[float(t.head_time[g][ie]) + float(t.head_mb[g][i4]) for g in G],
        head_act=[float(t.head_act[g][ie]) for g in G],
        head_work=[float(t.head_work[g][ie]) for g in G],
        head_states=float(t.head_states[i4]),
        head_dps=[float(t.head_dpsync[g][i4]) for g in G],
        head_opt=[float(t.head_opt[g][i4]) for g in G],
        dps_fixed=[float(t.dps_fixed[g][i4]) for g in G],
        p2p=p2p,
        const_mem=float(t.z3[itp, iep, iz]) + float(t.other),
        capacity=list(t.capacity),
        mtp_time=mc.time if mc else zero_l(), mtp_rec=mc.rec if mc else zero_l(),
        mtp_act=mc.act if mc else zero_l(), mtp_ckpt=mc.ckpt if mc else zero_l(),
        mtp_states=mc.states if mc else 0.0, mtp_dps=mc.dps if mc else zero_l(),
        mtp_opt=mc.opt if mc else zero_l(),
        vdiv=bubble_divisor(t.space, key),
    )


def stack_coefs(cs: Sequence[KeyCoefs]) -> dict[str, npt.NDArray[np.float64]]:
    """The fields of `KeyCoefs` of several keys as arrays: (B, G) per node group, (B,)."""
    return {f.name: np.array([getattr(c, f.name) for c in cs], float) for f in fields(KeyCoefs)}


def coef_arrays(t: Tables, keys: Sequence[Any]) -> dict[str, npt.NDArray[np.float64]]:
    """`key_coefs` of every key as `stack_coefs` arrays, the same floats, read by numpy indexing of
    the tables for all keys at once (the indexing of `key_coefs`)."""
    B = len(keys)
    G = range(t.groups)

    def ix(axis: str, attr: str | None = None) -> npt.NDArray[np.intp]:
        dom = {"dp": t.dp, "m": t.m}.get(axis) or getattr(t.space, axis)
        pos = {v: i for i, v in enumerate(dom)}
        return np.array([pos[getattr(k, attr or axis)] for k in keys], np.intp)

    itp, icp, iep, imb, iz, idp = ix("tp"), ix("cp"), ix("ep"), ix("mbs"), ix("zero"), ix("dp")
    sp = np.array([k.sp for k in keys], np.intp)
    mode = np.array([k.mode for k in keys], np.intp)
    z3 = np.array([k.zero >= 3 for k in keys], bool)
    i6 = (itp, icp, iep, sp, imb)
    i6m = (*i6, mode)
    i5 = (itp, iep, iz, idp, icp)
    i4 = (itp, iz, idp, icp)
    ie = (itp, icp, sp, imb)
    main = t.main_kind
    dense = bool(t.dense_prefix and main)

    def per(tab: Any, idx: tuple[Any, ...], rows: Any = None) -> npt.NDArray[np.float64]:
        """(B, G) of tab[g][idx] (tab a dict by group); only `rows` read, the others 0."""
        out = np.zeros((B, len(G)))
        if rows is None:
            for g in G:
                out[:, g] = tab[g][idx]
        elif rows.any():
            for g in G:
                out[rows, g] = tab[g][tuple(i[rows] for i in idx)]
        return out

    def kind_vals(kind: bool) -> dict[str, Any]:
        def k_(tab: dict[tuple[int, bool], Any]) -> dict[int, Any]:
            return {g: tab[g, kind] for g in G}

        return dict(
            tau=per(k_(t.time), i6m) + per(k_(t.mbl), i5), rho=per(k_(t.rec), i6),
            act=per(k_(t.act), i6m),
            ckpt=per(k_(t.ckpt), i6), sigma=np.asarray(t.states[kind][i5], float),
            dsync=per(k_(t.dpsync), i5), opt=per(k_(t.opt), i5),
            work=per(k_(t.work), i6m), work_full=per(k_(t.work_full), i6),
            z3l=per(k_(t.z3l), (*i6m, idp), z3), z3f=per(k_(t.z3f), (itp, icp, iep, idp), z3))

    mv = kind_vals(main)
    dv = kind_vals(False) if dense else {k: np.zeros_like(v) for k, v in mv.items()}
    multi = np.array([k.pp > 1 for k in keys], bool)
    co = {**mv, **{k + "_d": v for k, v in dv.items()},
          "emb_time": per(t.emb_time, ie) + per(t.emb_mb, i4), "emb_act": per(t.emb_act, ie),
          "emb_states": np.asarray(t.emb_states[i4], float), "emb_dps": per(t.emb_dpsync, i4),
          "emb_opt": per(t.emb_opt, i4), "head_time": per(t.head_time, ie) + per(t.head_mb, i4),
          "head_act": per(t.head_act, ie), "head_work": per(t.head_work, ie),
          "head_states": np.asarray(t.head_states[i4], float),
          "head_dps": per(t.head_dpsync, i4), "head_opt": per(t.head_opt, i4),
          "dps_fixed": per(t.dps_fixed, i4),
          "p2p": per(t.p2p, (*ie, ix("vpp"), idp), multi),
          "const_mem": np.asarray(t.z3[itp, iep, iz], float) + float(t.other),
          "capacity": np.tile(np.asarray(t.capacity, float), (B, 1)),
          "vdiv": np.array([bubble_divisor(t.space, k) for k in keys] if t.space.schedule
                           in BOUND_RATIO else [k.vpp for k in keys], float)}
    return co | _mtp_arrays(t, per, i6, i6m, i5, i4, ie, idp, z3, multi)


def _mtp_arrays(t: Tables, per: Callable[..., npt.NDArray[np.float64]], i6: Any, i6m: Any,
                i5: Any, i4: Any, ie: Any, idp: Any, z3: Any, multi: Any
                ) -> dict[str, npt.NDArray[np.float64]]:
    """The `mtp_*` fields of `coef_arrays`: `mtp_coefs.mtp_coefs` of every key, the same
    operations in the same order (the same floats; zeros without MTP)."""
    B = len(z3)
    G = range(t.groups)
    if not t.mtp:
        zg = np.zeros((B, len(G)))
        return {"mtp_time": zg, "mtp_rec": zg, "mtp_act": zg, "mtp_ckpt": zg,
                "mtp_states": np.zeros(B), "mtp_dps": zg, "mtp_opt": zg}
    k, n = t.mtp_kind, float(t.mtp)

    def kg(tab: dict[tuple[int, bool], Any]) -> dict[int, Any]:
        return {g: tab[g, k] for g in G}

    def cpy(tab: Any, idx: tuple[Any, ...]) -> npt.NDArray[np.float64]:
        """The embedding copy's term (pp > 1 keys only, else 0.0)."""
        return np.where(multi[:, None], per(tab, idx), 0.0) if isinstance(tab, dict) \
            else np.where(multi, np.asarray(tab[idx], float), 0.0)

    time = n * per(kg(t.time), i6m) + n * per(kg(t.mbl), i5) + per(t.mtp_time, ie) \
        + per(t.mtp_mb, i4)
    time = np.where(z3[:, None], time + n * per(kg(t.z3l), (*i6m, idp), z3), time)
    mact = per(t.mtp_act, ie)
    return {
        "mtp_time": time + cpy(t.mtpc_mb, i4),
        "mtp_rec": n * per(kg(t.rec), i6),
        "mtp_act": n * per(kg(t.act), i6m) + mact,
        "mtp_ckpt": n * per(kg(t.ckpt), i6) + mact,
        "mtp_states": n * np.asarray(t.states[k][i5], float)
        + np.asarray(t.mtp_states[i4], float) + cpy(t.mtpc_states, i4),
        "mtp_dps": n * per(kg(t.dpsync), i5) + per(t.mtp_dpsync, i4) + cpy(t.mtpc_dpsync, i4),
        "mtp_opt": n * per(kg(t.opt), i5) + per(t.mtp_opt, i4) + cpy(t.mtpc_opt, i4)}
