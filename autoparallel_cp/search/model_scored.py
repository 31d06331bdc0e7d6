"""DualPipe, and DualPipeV on MoE models, as searched schedules (issues 28 and 31.1): keys
whose plans the search scores with the cost model itself, never with a table composition.

DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1; cost/schedules.py, cost/steptime.py
`_dualpipe_rank`, cost/memory.py): rank j holds stage j and its mirror p-1-j
(`dualpipe_mirror`) and runs both on its own GPUs, so its per-micro-batch time is the mean of
the two stages' times on its node group, its DP sync and optimizer step the sum, its memory
both stages' (parameters twice, each stage with its own in-flight count min(p - j, m/2)); the
bubble is rho·(S - T_rank) with rho =
`bubble_ratio("dualpipe", p, (F, B, W), m)`. DualPipe and DualPipeV also hide a share h(m) =
`ep_hidden_share` of each MoE layer's EP dispatch / combine, unless the recipe overlaps every
micro-batch's (`schedule_axis.hides_ep`): stage time = t_base + h·Σ_layers (ep_ov - ep).
A per-stage table cannot hold a rank that averages two stages, nor h, which depends on m, so:

- per-key scoring (search/model_scan.py `best_of_key`): a key's plans are its named
  layouts (or a uniform or pinned split; DualPipe's free per-stage counts on one node group
  are searched by search/dualpipe_splits.py, whose exact loop scores each candidate split
  with the same scan, `best_of_split`),
  the recompute count (all layers or a pinned one: `narrow_recompute`) and the stage
  placement; each is scored by `plan_terms`, which is steptime.py / memory.py themselves
  (`tables.plan_cost` returns it too: plan_cost equals evaluate by construction), and the
  best is the least (step, `Plan.key()`), the enumerator's order. The enumerator
  (search/enumerate.py) scores the same plans the same way, so CP-SAT equals it when no
  bound skips a key's best: what tests/search/test_dualpipe_search.py checks;
- per-key bounds (key_bounds.py): DualPipe's own (search/dualpipe_bound.py, over each
  (split, placement): the slowest rank pair, the bubble, the ranks' tail and memory); a
  DualPipeV hiding EP none beyond the master's (`key_bound` 0); solve.py takes the max with
  the master's LB;
- the master (cpsat_master.py), valid for every DualPipe plan: rho' = the family's least
  DualPipe rho (`family_ratio`; 0 for a DualPipeV), so the pipeline bound is
  (m - rho')·V/pp + rho'·S_lb with V = max(S_lb, L·Hd): m·T + rho·(S - T) =
  (m - rho)·T + rho·S grows with T and S (0 <= rho' <= rho < 1 <= m). The ranks' times
  sum to S (each stage's time appears in two ranks at weight 1/2), so
  T_rank >= S/pp >= S_lb/pp. On one group of per-layer time u, S >= L·u, so
  T_rank >= L·u/pp (Hd = u). On several node groups
  the harmonic Hu of the other schedules bounds the slowest *stage*, not a rank that averages
  two stages of different groups, so the master takes `pair_harmonic` Hd <= Hu instead:
  rank j of group g_j runs stage j and its mirror p-1-j on its own GPUs, each layer taking
  >= u_{g_j} (the tables' least per-layer time of the group), so each rank pair
  {j, p-1-j} (p even, `degree_ok`) has T_rank >= (l_j + l_{p-1-j})·u_g/2 on each of its two
  ranks' groups g, so l_j + l_{p-1-j} <= 2·T_rank·min(x_j, x_{p-1-j}) with x = 1/u. The p/2
  pairs are disjoint, so summing, L <= 2·T_rank·Σ_pairs min(x) <= 2·T_rank·(x_(2) + x_(4) +
  ... + x_(p)), the ranks' x sorted descending (pairing sorted neighbours maximises a sum of
  minima: exchange two ranks of different pairs and the sum does not fall). Group g holds
  c_g = frac_g·p stages whatever the placement (`SearchSpace.stage_group_counts`: every
  permutation of them is searched), so with the groups fastest first that sum is
  Σ_g x_g·e_g, e_g the even positions in g's block, and T_rank >= L·Hd/p with
  Hd = p/(2·Σ_g x_g·e_g), the least over the space's pp (`pair_harmonic`; a pp where some
  c_g is not whole takes the weaker 1/(2·Σ_g f'_g/u_g), f' the fractions fastest first up to
  1/2, as before: Σ_pairs min(x) <= the p/2 largest x). One group: Hd = u; two equal groups
  at pp 2: the slower u, at pp 4 and 8: their harmonic mean Hu.
  tests/search/test_dualpipe_search.py checks the master's LB <= every key's exact best on
  mixed H100 / A100 clusters. Tail: rank j syncs d_j + d_{p-1-j} and steps
  o_j + o_{p-1-j}, so the max over ranks of DP_TAIL_FRACTION·d and
  of o is >= twice the mean over stages >= the mean the master takes; the second bound
  (exposed >= d - 2/3 t) holds per rank with the rank's d and t, whose sums are 2·D and S:
  max >= (2D - 2/3 S)/pp >= (D - 2/3 S)/pp. Memory: the master's condition sums the stage
  peaks with >= 1 micro-batch in flight; the ranks' peaks sum every stage's states and
  activations twice (min(p - j, m/2) >= 1 as m >= 2p), the work buffers as
  Σ_r max(w_r, w_{p-1-r}) >= Σ_j w_j and the per-rank constants once per rank: >= that sum.
  ZeRO-3: the master adds every stage's first-layer gather; a stage pays the largest over
  its layer kinds, but a rank averages two stages, so for DualPipe the master takes the least
  over the kinds (a stage pays at least that; tests/search/test_dualpipe_search.py found
  the largest above a MoE key's exact best).
- the EP hidden share (tables.py `_build_tables`, `hidden_lb`): the overlapped EP time of a
  layer (moe_comm.py `ep_overlapped`: four exposures of half an all-to-all, each
  max(c - compute, COMM_SM_SHARE·c) <= c) is <= its plain one, so with 0 <= h <= 1 a stage's
  time t_base + h·Δ is >= t_base + min(Δ, 0): the tables of such a space hold that (h = 1)
  per layer, a lower bound of every stage time whatever m (the DP and optimizer tables, which
  the share leaves unchanged, are exact), and the master's bounds grow with every stage time
  (LB1; LB2 composes the exposed DP d - 2/3·t, which falls as t grows, with m·T, m >= 1:
  its S coefficient stays > 0, cpsat_master.py), so they stay valid. DualPipeV's own
  per-key bounds (key_grid.py) are not used for such a space (`key_bound` is 0 above).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.evaluate import host_fits
from autoparallel_cp.cost.memory import stage_memory
from autoparallel_cp.cost.steptime import step_time
from autoparallel_cp.search.act_offload import scored
from autoparallel_cp.search.schedule_axis import hides_ep
from autoparallel_cp.spec.plan import Plan

Terms = tuple[float, float, float, tuple[float, ...], tuple[float, ...], bool]


def model_scored(space: Any) -> bool:
    """Whether the keys of `space` are scored by the cost model (module docstring)."""
    s = space.schedule
    return s == "dualpipe" or (s == "dualpipev" and hides_ep(s, space.job)) or scored(space)


def pair_harmonic(fr: Sequence[float], u: Sequence[npt.NDArray[np.float64]],
                  pps: Sequence[int] = ()) -> npt.NDArray[np.float64]:
    """Hd, elementwise over the tables' axes: the per-layer time that bounds a DualPipe rank,
    T_rank >= L·Hd/p, on node groups of GPU fractions `fr` and least per-layer times `u`, at
    every pp of `pps` (the module docstring's proof). At a pp where each group holds a whole
    count of stages c_g = f_g·p: p/(2·Σ_i x_(2i)), the ranks' x = 1/u sorted descending
    (every second one); else (and with no `pps`) 1/(2·Σ_g f'_g/u_g), the fractions f' taken
    fastest group first up to a total of 1/2. Hd is the least over `pps`."""
    x = np.stack(np.broadcast_arrays(*[1.0 / np.maximum(np.asarray(ug, float), 1e-30)
                                       for ug in u]))
    order = np.argsort(-x, axis=0, kind="stable")
    xs = np.take_along_axis(x, order, axis=0)
    f = np.broadcast_to(np.asarray(fr, float).reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
    fs = np.take_along_axis(f, order, axis=0)
    before = np.cumsum(fs, axis=0) - fs
    take = np.clip(0.5 - before, 0.0, fs)
    top_half = np.asarray(1.0 / (2.0 * np.sum(take * xs, axis=0)), float)
    out: npt.NDArray[np.float64] | None = None
    for p in sorted(set(pps)):
        c = [fg * p for fg in fr]
        if any(abs(cg - round(cg)) > 1e-9 for cg in c):
            h = top_half
        else:
            cs = np.take_along_axis(np.broadcast_to(
                np.asarray([round(cg) for cg in c], float).reshape((-1,) + (1,) * (x.ndim - 1)),
                x.shape), order, axis=0)
            start = np.cumsum(cs, axis=0) - cs
            even = np.floor((start + cs) / 2.0) - np.floor(start / 2.0)
            h = np.asarray(p / (2.0 * np.sum(even * xs, axis=0)), float)
        out = h if out is None else np.minimum(out, h)
    return top_half if out is None else out


def plan_terms(job: Any, plan: Plan) -> Terms:
    """(step, pipeline, tail, rank times, rank charged bytes, fits) of `plan`: steptime.py and
    memory.py, the step without the calibrated fixed time (as every search composition),
    fits as evaluate.py decides it."""
    st = step_time(job, plan)
    mem = stage_memory(job, plan)
    fits = all(s.required_bytes <= s.capacity_bytes for s in mem) and host_fits(job, plan, mem)
    times = tuple(s.total_s for s in st.stages)
    pipeline = plan.num_microbatches * max(times) + st.bubble_s
    step = st.step_s - st.fixed_s
    return (step, pipeline, step - pipeline, times, tuple(s.charged_bytes for s in mem), fits)


def hidden_lb(job: Any, space: Any, g: int, ax6: Any, moe: bool, lf: Any,
              tim: npt.NDArray[np.float64], full_t: npt.NDArray[np.float64]) -> None:
    """Lower the per-layer times `tim` (modes none, selective, full's kept layers) and
    `full_t` (a recomputed layer) of a space that hides a share of the EP all-to-all
    (`hides_ep`) to their values at share 1, in place (module docstring: a lower bound of
    every stage time whatever m). The kept layer's bound is also held <= the recomputed
    one's, so the tables' replay term (full - kept) stays >= 0 (the master drops it)."""
    if not moe or not hides_ep(space.schedule, job):
        return
    from autoparallel_cp.cost import factors as fx
    from autoparallel_cp.cost.common import recipe_options

    opts = recipe_options(job.recipe).model_copy(update={"ep_overlap": True})
    ov = fx.layer_factors(job, g, ax6[0], ax6[1], ax6[2], ax6[3], ax6[4], ax6[5], moe=moe,
                          options=opts, etp=space.etp)
    d = np.minimum(np.asarray(ov.ep_s, float) - np.asarray(lf.ep_s, float), 0.0)
    d = np.broadcast_to(d, tim.shape)
    dfull = np.asarray(ov.ep_s, float) + np.asarray(ov.rc_ep_s, float) \
        - np.asarray(lf.ep_s, float) - np.asarray(lf.rc_ep_s, float)
    full_t += np.minimum(np.broadcast_to(dfull, tim.shape)[..., 2], 0.0)
    tim[..., :2] += d[..., :2]
    tim[..., 0] = np.minimum(tim[..., 0], full_t)
    tim[..., 2] = tim[..., 0]
