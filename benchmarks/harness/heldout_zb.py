"""Held-out rows of the Zero Bubble paper (source `zero-bubble-iclr24`: Qi, Wan, Huang, Lin,
"Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241; the PDF with ZB-V that the
authors committed to sail-sg/zero-bubble-pipeline-parallelism @3a91d0c8): the schedule each
row ran, as the plan's `schedule` (spec/schedules.py), and the chunk layout of its vpp > 1 rows.

The row's `extra_config` names the paper's schedule (`schedule=<name>`); the plan takes:
- `1F1B`: Megatron-LM's 1F1B, the default (None);
- `ZB-1p`: `zb-h1`. ZB-1p is the automatic search under 1F1B's activation memory (p·M_B);
  the paper's Table 5 gives it exactly ZB-H1's bubble in all twelve settings ("this
  improvement is not observed in ZB-1p vs ZB-H1", §5.3);
- `ZB-2p`: `zb-h2`, the handcrafted schedule of the same 2p·M_B memory; the searched ZB-2p's
  bubble is at most ZB-H2's in Table 5 (0.1-4.3% against 2.6-10.8%), so the plan's bubble is
  an upper bound of the run's;
- `ZB-V`: `zbv`, two chunks per rank in a V (§6);
- `1F1B-I`: `interleaved`, Megatron's interleaved 1F1B with "each transformer layer [as] a
  chunk" (§5.1; examples/pretrain_zero_bubble.sh @6574e0ea `INTERLEAVED_1F1B`:
  `--num-layers-per-virtual-pipeline-stage 1`), vpp = the padded layers per stage.
Every ZB row ran with the optimizer post-validation (§4, `--enable-optimizer-post-validation`,
which examples/pretrain_zero_bubble.sh @6574e0ea adds with fp16); the cost model charges the
step-closing synchronisation (cost/schedules.py module docstring), so its ZB bubbles carry the
(p-1)·F floor the post-validation removes. Direction (task zbfid): with the model's split the floor
binds on zb-h2 only (F above F+B-2W and B-F; on zb-h1 F+B-W is larger): there it charges about
(p-1)(F - max(F+B-2W, B-F)), ~110 ms or 7% of the 14.6B m = 48 step, on the pessimistic side; the
paper's Appendix E Table 10 measures synchronised ZB-2p 7.7-10.6% slower than with post-validation.

Chunk layout (vpp > 1): `--allow-padding-num-layers` pads the layers to a multiple of the
stages and the fork's `ParallelTransformer.get_offset` (megatron/model/transformer.py
@6574e0ea ll. 1593-1623) takes the padding from chunk indices -1, 0, 1, ... in model order.
Interleaved, chunk index v·pp + j sits on rank j: the paper's 1F1B-I runs leave model chunk 0
(rank 0) and the last (rank pp-1) empty, each rank keeping layers in its other chunks. In the
V (ZB-V) model chunk s sits on rank s or 2pp-1-s: for the paper's 2·pp - 2 layers chunks 0 and
2pp-1 are empty, both on rank 0, which then holds no layer: the embedding and the head only
(spec/plan.py `empty_first_ok`: a V's rank 0 may be empty; evaluated since task zbvempty).
The plan's chunk_layers list chunk v of rank j at v·pp + j.
"""

from __future__ import annotations

import re

from autoparallel_cp.spec.schedules import Schedule

SOURCE = "zero-bubble-iclr24"

#: the paper's schedule names -> the plan's (module docstring)
PLAN_SCHEDULE: dict[str, Schedule | None] = {
    "1F1B": None, "ZB-1p": "zb-h1", "ZB-2p": "zb-h2", "ZB-V": "zbv", "1F1B-I": "interleaved"}


def schedule(r: dict[str, str]) -> tuple[Schedule | None, str] | None:
    """(plan schedule, `assumed` note) of a Zero Bubble paper row, None for other sources."""
    if r["source_id"] != SOURCE:
        return None
    m = re.match(r"\s*schedule=([\w-]+)", r["extra_config"])
    if m is None or m.group(1) not in PLAN_SCHEDULE:
        raise ValueError(f"held-out row {r['model']}: no known schedule= in extra_config")
    name = m.group(1)
    plan = PLAN_SCHEDULE[name]
    if plan is None:
        return None, "1F1B (Megatron-LM's; the paper's baseline)"
    if plan == "interleaved":
        return plan, "1F1B-I as schedule=interleaved, one layer per chunk (2401.10241 §5.1)"
    return plan, (f"{name} as schedule={plan} (2401.10241 Table 5; optimizer post-validation "
                  "not modelled)")


def chunk_layers(r: dict[str, str], layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """The layers per chunk of a Zero Bubble paper row with vpp > 1 (module docstring), None
    for every other row."""
    if r["source_id"] != SOURCE or vpp == 1:
        return None
    per = -(-layers // (pp * vpp))
    sizes = [per] * (pp * vpp)  # model order
    for i in range(-1, pp * vpp * per - layers - 1):  # the fork's padding
        sizes[i] -= 1
    if "schedule=ZB-V" not in r.get("extra_config", "schedule=ZB-V"):
        return tuple(sizes)  # interleaved: model chunk v*pp + j is chunk v of rank j
    if vpp != 2:
        raise ValueError(f"held-out row {r.get('model')}: ZB-V needs vpp 2, got {vpp}")
    # the V: model chunk s on rank s (s < pp) or 2pp-1-s; chunk (v=1, rank j) is 2pp-1-j
    return tuple(sizes[j] for j in range(pp)) + tuple(sizes[2 * pp - 1 - j] for j in range(pp))
