"""What each pipeline schedule costs: bubble, in-flight micro-batches, parameter copies and
the EP all-to-all it hides (the names and rules: spec/schedules.py; the per-stage pass orders
the timeline draws: cost/pass_order.py).

Notation: per stage and micro-batch, F = forward, B = input-gradient backward, W =
weight-gradient backward, t = F + B + W (the stage time t_j of steptime.py). 1F1B's bubble
is (p-1)·t for p equal stages (Narayanan et al. 2021 §2.2); steptime.py charges it as
(Σ_j t_j - T_max)/vpp. Every schedule here is that term times `bubble_ratio`, the paper's
bubble over 1F1B's, with (F, B, W) = cost/pass_split.py `backward_split` shares of t (the
cost model's own per-op times: W the weight-gradient GEMMs alone):

| schedule | bubble (equal stages) | source |
|---|---|---|
| 1f1b, gpipe | (p-1)(F+B+W) | Narayanan §2.2; GPipe (p-1)/(m+p-1) of the step (Huang 2019 §2.2) |
| interleaved | (p-1)(F+B+W)/v | Narayanan §2.2 |
| zb-h1 | (p-1)·max(F+B-W, B, F) | Qi et al. arXiv 2401.10241 §2.1, Table 1 (ZB-H1) |
| zb-h2 | (p-1)·max(F+B-2W, B-F, F) | same, §2.2, Table 1 (ZB-H2) |
| dualpipe | (p/2-1)(F&B+B'-3W), B' = B+W | DeepSeek-V3 arXiv 2412.19437 §3.2.1 Table 2 |
| zbv, dualpipev | PyTorch's own action order, replayed | cost/pipeline_sim.py (torch v2.13.0) |

F&B (a forward and a backward chunk run together) costs F + B' of compute: the overlap hides
the communication (below), not FLOPs; so DualPipe's bubble is (p/2-1)(F + 2B - W). A negative
bracket means the W passes more than fill the warm-up: the bubble is then 0, not negative (the
max). ZB-H1 / ZB-H2 are the paper's handcrafted schedules (the authors' Megatron fork runs
them). The paper's Table 1 counts each rank's idle time, which is the step's bubble only with
its optimizer post-validation (Qi §4), letting the next step start on each rank as soon as it
is done; without it (PyTorch, Megatron: the gradient-norm all-reduce closes the step) the step
also waits for the last rank, which starts (p-1)·F late and then runs its m·t: the bubble is at
least (p-1)·F, the F of the max (ZB-H2's zero becomes (p-1)·F). The paper's brackets assume
F = B = W (its Figure 3); for another split the memory bound sets a third floor: the first
rank may hold k micro-batches before its first B (ZB-H1 k = p, 1F1B's; ZB-H2 k = 2p-1, Qi
Table 1), and that B can start only after micro-batch 0's forward through p stages and its B
back through p-1, at pF + (p-1)B, while the rank's k forwards end at kF: it idles
(p-1)B - (k-p)F with no W to run (none is ready before its first B), (p-1)·B for ZB-H1 and
(p-1)·(B-F) for ZB-H2 (F, B, W = .2, .5, .3: .3 against F+B-2W = .1). The three terms are
the replay of cost/pass_order.py's ZB-H1/ZB-H2 orders for equal stages, exactly, for every
split and m >= 2p; with fewer micro-batches (m < p for ZB-H1, m < 2p-1 for ZB-H2) the m W
passes no longer fill the ramp and `bubble_ratio` takes the replay's further paths, among
them Qi's Appendix H (p-1)(F+B) - (m-1)W (tests/cost/test_schedules.py, hypothesis, every
m). The V-shaped ones are
PyTorch's classes, whose real order `simulated_bubble` replays with each chunk's F, B, W
times: for DualPipeV it reproduces DeepSeek's (p-1)(F&B+B-3W) over the 2p chunks when
F = B = W, and for ZBV it keeps the same (p-1)-chunk ramp, where the paper's ZB-V, with the
post-validation, tiles steps into a parallelogram with no bubble.

In-flight micro-batches (`inflight_units`, in units of one micro-batch through one rank's
layers; steptime/memory multiply the stage's per-micro-batch activations by it):
- 1f1b: min(p - j, m); interleaved: Megatron's warm-up (cost/sync.py `inflight`);
- gpipe: m, every forward before any backward (torch v2.13.0 schedules.py:872 `ScheduleGPipe`);
- zb-h1: min(p, m): rank j holds 1F1B's p - j micro-batches plus the inputs of its j deferred
  W passes (Qi §2.1: "the same number of in-flight micro-batches" on every stage; a deferred
  W's inputs are counted as a whole micro-batch, an upper bound, Qi Table 1 M_W < M_B);
- zb-h2: min(2p - 1, m): rank j's 2(p-j)-1 forwards before its first B plus the inputs of its 2j
  deferred W (cost/pass_order.py `zb_h2`: the held W keep the parallelogram of Qi §2.2,
  Figure 3, every stage at the peak, Table 1's (2p-1)·M_B; a deferred W counted whole, as
  for zb-h1);
- zbv: min(p, m): torch's ZBV warm-up holds 2(p-r)-1 + 2r + 1 = 2p half-size chunks on
  every rank before its first backward (2401.10241 §6: 1F1B's peak, balanced);
- dualpipe: stage j holds min(p - j, m/2), so rank j, holding stage j and stage p-1-j
  (`dualpipe_mirror`, parameters 2x), holds (p - j) + (j + 1) = p + 1 micro-batches through a
  stage (2412.19437 Table 2, "Activation PP+1", in units of one micro-batch through one of
  the p stages). The split is deepseek-ai/DualPipe dualpipe.py `DualPipe.step` (@3da1bbe):
  on the rank with half_rank h = min(r, p-1-r) steps 1-2 run 2(p/2-h-1) + (h+1) forwards of
  its shallow stage h (schedule phase 0, both halves: `phase ^= is_in_second_half` with
  module 0 = stage r, module 1 = stage p-1-r, examples/example_dualpipe.py) and h+1 of its
  deep stage p-1-h; step 3 keeps that count (B1, W1, F1); step 4's first F0 beside B1
  brings the shallow stage to p - h: stage j holds p - j, as under 1F1B. Each direction
  carries m/2 micro-batches (`half_num_chunks`);
- dualpipev: PP+1 of DualPipeV's 2p half-size chunks = p + 1/2 (DualPipe README).
All capped at m.

EP all-to-all: DualPipe and DualPipeV run a forward chunk of one micro-batch with a backward
chunk of another and hide each one's dispatch/combine behind the other's compute (2412.19437
§3.2.1, Figure 4). Overlapped (forward, backward) pairs per rank, on the outer ranks that
have the fewest: DualPipe m - 3p/2 + 1 of its m forward chunks (deepseek-ai/DualPipe
dualpipe.py `DualPipe.step`: two per step-4 iteration, m/2 - p + 1 of them, and p/2 - 1 in
step 5); DualPipeV 2m - 3p + 1 of its 2m (torch v2.13.0 schedules.py:3564-3590: two per
step-4 iteration, m - 2p + 1 of them on rank 0, and p - 1 in step 5). `ep_hidden_share`
is that share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from autoparallel_cp.cost.pipeline_sim import v_makespan
from autoparallel_cp.cost.replay_bound import span_floor
from autoparallel_cp.cost.sync import stage_inflight
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import V_SHAPED

#: micro-batches per rank replayed by `simulated_bubble` at most (the bubble is the same beyond)
SIM_MICROBATCHES_PER_RANK = 8


def bubble_ratio(schedule: str, pp: int, split: tuple[float, float, float], m: int) -> float:
    """The schedule's bubble over 1F1B's (p-1)·t (or interleaved's, same vpp) for p equal stages
    and m micro-batches (module table), with `split` = (F, B, W) shares of t. For ZB-H1 / ZB-H2
    the bubble is the longest path of their pass orders' replay (cost/pass_order.py), in units
    of t, minus m·t; with k = min(m, p) (ZB-H1) or min(m, 2p-1) (ZB-H2) in flight, q = p - 1:

    - ZB-H1: max((p-k)F + qB, qF + [m < p]B, q(F+B) - (k-1)W);
    - ZB-H2: max((p-k)F + qB, qF, q(F+B) - (k-1)W), and for p <= m < 2p-1 also (p-2)F + B and
      qF + B - W, for 2 <= m < p with h = ceil(m/2) also (p-h)(F+B) (m odd) or
      (p-h-1)F + (p-h)B and (p-h)(F+B) - W (m even).

    The third term is Qi et al.'s Appendix H bound (m <= p: "(m+p-1)(T_F+T_B) + T_W" a step):
    the first rank's m W passes fill the drain but the last one; the first is the first rank's
    wait for its first B beyond its k forwards, the second the last rank's ramp. For m >= p
    (ZB-H1) or m >= 2p-1 (ZB-H2) the list is the steady one of the module table. Each path is
    one the replay runs: tests/cost/test_schedules.py checks the max equals the replay for
    every split and m (hypothesis, p <= 8, m <= 3p). 0 <= ratio <= F + B <= 1: every term is
    at most q(F+B), and qF >= 0 (m >= 2) or q(F+B) (m = 1) is among them. Nonincreasing in m
    (search/schedule_axis.py's family bound uses it; tested there too): every term at m + 1
    is at most one at m. The base terms fall with k; ZB-H1's [m < p]B term drops; ZB-H2's
    p <= m < 2p-1 pair is constant and, where it appears (m = p), below the max already:
    (p-2)F + B and qF + B - W are convex combinations of qF with qB and with q(F+B-W); its
    2 <= m < p terms: from m odd, (p-h)(F+B) is above both even-m terms of the same h, and
    from m even, (p-h-1)F + (p-h)B is above the next odd m's (p-h-1)(F+B); at m = 1,
    q(F+B) is above every term."""
    f, b, w = split
    if schedule in ("1f1b", "interleaved", "gpipe") or pp == 1:
        return 1.0
    q = pp - 1.0
    if schedule == "zb-h1":
        k = min(m, pp)
        terms = [(pp - k) * f + q * b, q * f + (b if m < pp else 0.0),
                 q * (f + b) - (k - 1) * w]
        return max(terms) / q
    if schedule == "zb-h2":
        k = min(m, 2 * pp - 1)
        terms = [(pp - k) * f + q * b, q * f, q * (f + b) - (k - 1) * w]
        if pp <= m < 2 * pp - 1:
            terms += [(pp - 2) * f + b, q * f + b - w]
        elif 2 <= m < pp:
            h = (m + 1) // 2
            terms += ([(pp - h) * (f + b)] if m % 2 else
                      [(pp - h - 1) * f + (pp - h) * b, (pp - h) * (f + b) - w])
        return max(terms) / q
    if schedule == "dualpipe":
        return (pp / 2.0 - 1.0) / (pp - 1.0) * max(f + 2.0 * b - w, 0.0)
    raise ValueError(f"schedule {schedule!r} has no closed form: `simulated_bubble`")


def sim_microbatches(pp: int, m: int) -> int:
    """The micro-batches `simulated_bubble` replays: m, at most SIM_MICROBATCHES_PER_RANK x pp."""
    return min(m, SIM_MICROBATCHES_PER_RANK * pp)


def simulated_bubble(plan: Plan, rank_times: Sequence[float],
                     split: tuple[float, float, float]) -> float:
    """Pipeline time beyond m x the slowest rank's per-micro-batch time, PyTorch's zbv /
    dualpipev action order replayed (cost/pipeline_sim.py): each of rank r's two chunks (stage
    r and stage 2p-1-r) takes half of its time `rank_times[r]`, split (F, B, W) = `split`.
    Past the warm-up every further micro-batch adds the slowest rank's time and no bubble
    (the steady state runs the same actions per micro-batch; tests/cost/test_schedules.py
    checks the bubble is the same at 8p and 32p micro-batches), so at most SIM_MICROBATCHES_PER
    _RANK x p micro-batches are replayed."""
    p = plan.pp
    m = sim_microbatches(p, plan.num_microbatches)
    span = _v_span(plan.pipeline_schedule, p, m, tuple(map(float, rank_times)),
                   tuple(map(float, split)))
    return max(span - m * max(rank_times), 0.0)


@functools.lru_cache(maxsize=4096)
def _v_span(schedule: str, p: int, m: int, rank_times: tuple[float, ...],
            split: tuple[float, ...]) -> float:
    """`simulated_bubble`'s replayed span, memoized (the same float: the replay is a function
    of these arguments; Python floats, the same IEEE doubles as numpy's): a search scores the
    same rank times more than once (a key's columns, its exact loop, the re-scoring)."""
    return v_makespan(schedule, p, m, _v_dur(p, rank_times, split))


def simulated_bubble_floor(plan: Plan, rank_times: Sequence[float],
                           split: tuple[float, float, float]) -> float:
    """A lower bound of `simulated_bubble(plan, rank_times, split)` in floating point: the
    same operations on the length of one path (cost/replay_bound.py `span_floor`, <= the
    span), and x -> max(x - c, 0.0) is monotone under rounding."""
    p = plan.pp
    m = sim_microbatches(p, plan.num_microbatches)
    dur = _v_dur(p, tuple(map(float, rank_times)), tuple(map(float, split)))
    return max(span_floor(plan.pipeline_schedule, p, m, dur) - m * max(rank_times), 0.0)


def _v_dur(p: int, rank_times: tuple[float, ...], split: tuple[float, ...]
           ) -> Callable[[str, int], float]:
    """Each action's duration in `simulated_bubble`: half its rank's time x its share."""
    part = {"F": split[0], "I": split[1], "W": split[2]}

    def dur(kind: str, stage: int) -> float:
        rank = stage if stage < p else 2 * p - 1 - stage
        return 0.5 * rank_times[rank] * part[kind]

    return dur


def inflight_units(plan: Plan, stage: int, chunks: Sequence[int]) -> float:
    """Micro-batches (in whole-rank units) whose activations rank `stage` holds at its peak
    (module docstring), `chunks` = the layers of the rank's model chunks."""
    s, pp, m, j = plan.pipeline_schedule, plan.pp, plan.num_microbatches, stage
    if s in ("1f1b", "interleaved"):
        return stage_inflight(pp, plan.vpp, m, j, chunks)
    if s == "gpipe":
        return float(m)
    if s in ("zb-h1", "zbv"):
        return float(min(pp, m))
    if s == "zb-h2":
        return float(min(2 * pp - 1, m))
    if s == "dualpipe":  # stage j: p - j of each direction's m/2 (module docstring)
        return float(min(pp - j, m / 2.0))
    if s == "dualpipev":
        return min(pp + 0.5, float(m))
    raise ValueError(f"unknown schedule {s!r}")


def head_stage(plan: Plan) -> int:
    """The rank holding the final norm, LM head and loss: the last one, or rank 0 in a V
    (the V's last chunk, stage 2p-1, sits on rank 0: torch `generate_stage_to_rank_mapping`
    style "v", which torchtitan b5bcd76c picks for ZBVZeroBubble and DualPipeV,
    torchtitan/distributed/pipeline_parallel.py:552, and logs their loss on rank 0,
    components/metrics.py:211)."""
    return 0 if plan.pipeline_schedule in V_SHAPED else plan.pp - 1


def dualpipe_mirror(plan: Plan, stage: int) -> int | None:
    """The second stage DualPipe places on rank `stage` (p - 1 - stage: 2412.19437 §3.2.1,
    two copies of the parameters), or None for every other schedule."""
    if plan.pipeline_schedule != "dualpipe":
        return None
    return plan.pp - 1 - stage


def mtp_shares_embedding(plan: Plan) -> bool:
    """Whether the rank holding the MTP module (the last stage) also holds the embedding, so
    the MTP module shares its embedding and output head physically: DualPipe places stage p-1
    on rank 0 with stage 0 (2412.19437 §3.2.3, "Shared Embedding and Output Head for
    Multi-Token Prediction": "the physical sharing of parameters and gradients, of the shared
    embedding and output head, between the MTP module and the main model")."""
    return dualpipe_mirror(plan, plan.pp - 1) == 0


def ep_hidden_share(plan: Plan) -> float:
    """Share of the micro-batches whose EP dispatch/combine runs beside a paired chunk's
    compute (module docstring): 0 except DualPipe / DualPipeV."""
    s, pp, m = plan.pipeline_schedule, plan.pp, plan.num_microbatches
    if s == "dualpipe":
        return max(m - 1.5 * pp + 1.0, 0.0) / m
    if s == "dualpipev":
        return max(2.0 * m - 3.0 * pp + 1.0, 0.0) / (2.0 * m)
    return 0.0
