"""Where the dense prefix sits in the per-key CP-SAT model (cpsat_partition.py
`build_partition`): on the first stage, or, in a V's free family whose rank 0 may hold no
layer (search/empty_rank.py), on rank 0 when it holds layers and on rank 1 when it does not
(`empty_rank.prefix_at`; the cost model's layout, spec/splits.py `prefix_counts`, for the
searched splits: the first stage holding layers holds the prefix whole).

One literal e0 (rank 0 empty) decides it: hold_0 = 1 - e0, hold_1 = e0, and every dense term
of stage j is its constant times hold_j (per node group, hold_j AND y_jg: `on_groups`), so the
model stays linear; the recomputed dense layers rd_j = min(rk_j, K) where held, else 0.

A pinned split (`--fix stage_layers` / `chunk_layers`, or a named layout) may hold fewer than
K layers on its first stage: each stage j then holds the constant k_j = prefix_counts(K, l)_j
dense layers (the first of its layers, so rd_j = min(rk_j, k_j): memory.py
`stage_layer_kinds` recomputes a stage's first r_j layers), every dense term k_j times its
constant, as `tables.plan_cost` composes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.spec.splits import prefix_counts


@dataclass
class Holders:
    """Per stage: hold (0, 1, or the expression of a literal), its literal (None where hold
    is a constant) and K where the stage may hold the prefix (else 0)."""

    hold: list[Any]
    lits: list[Any]
    kds: list[int]
    e0: Any = None  # rank 0 empty (a V's free family with a dense prefix), else None


def holders(model: cp_model.CpModel, K: int, pp: int, empty_first: bool,
            pinned: tuple[int, ...] | None = None) -> Holders:
    """The prefix's stage: the first (constants), or under `empty_first` (a V's rank 0 from
    0 layers) rank 0 or 1 by the literal e0; `pinned` (a pinned split's per-stage layers):
    each stage holds its own constant share of the prefix, spread over the first stages as
    the cost model lays it out (spec/splits.py `prefix_counts`)."""
    if pinned is not None:
        kds = list(prefix_counts(K, tuple(int(n) for n in pinned)))
        return Holders([int(kd > 0) for kd in kds], [None] * pp, kds)
    hold: list[Any] = [int(bool(K) and j == 0) for j in range(pp)]
    lits: list[Any] = [None] * pp
    e0 = None
    if K and empty_first and pp > 1:
        e0 = model.new_bool_var("e0")
        hold[0], hold[1], lits[0], lits[1] = 1 - e0, e0, e0.negated(), e0
    kds = [K if (lits[j] is not None or hold[j]) else 0 for j in range(pp)]
    return Holders(hold, lits, kds, e0)


def stage_counts(model: cp_model.CpModel, h: Holders, j: int, u: Any, l_j: Any, rk: Any,
                 rdj: Any) -> None:
    """Stage j's prefix constraints: rank 0's layer units u == 0 iff e0 (u = None: a pinned
    split), l_j >= K where held, rd_j = min(rk_j, K) where held and 0 elsewhere."""
    kd, lit = h.kds[j], h.lits[j]
    if j == 0 and h.e0 is not None and u is not None:
        model.add(u == 0).only_enforce_if(h.e0)
        model.add(u >= 1).only_enforce_if(h.lits[0])
    if not kd:
        return
    con = model.add(l_j >= kd)
    if lit is None:
        model.add_min_equality(rdj, [rk, kd])
        return
    con.only_enforce_if(lit)
    mk = model.new_int_var(0, kd, f"mk{j}")
    model.add_min_equality(mk, [rk, kd])
    model.add(rdj == mk).only_enforce_if(lit)
    model.add(rdj == 0).only_enforce_if(lit.negated())


def on_groups(model: cp_model.CpModel, h: Holders, j: int, yj: list[Any], hetero: bool
              ) -> list[Any]:
    """zd[g]: stage j holds the prefix on node group g (hold_j AND y_jg; y_jg where hold_j is
    1, hold_j itself on one group)."""
    lit = h.lits[j]
    if not h.kds[j] or lit is None:
        return yj
    if not hetero:
        return [h.hold[j]]
    out = []
    for g, yg in enumerate(yj):
        v = model.new_bool_var(f"zd{j}_{g}")
        model.add_implication(v, lit)
        model.add_implication(v, yg)
        model.add_bool_or([v, lit.negated(), yg.negated()])
        out.append(v)
    return out
