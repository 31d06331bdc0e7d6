"""Held-out rows of the Zero Bubble paper (source `zero-bubble-iclr24`: Qi, Wan, Huang, Lin,
"Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241; the PDF with ZB-V that the
authors committed to sail-sg/zero-bubble-pipeline-parallelism @3a91d0c8): the schedule each
row ran, as the plan's `schedule` (spec/schedules.py), and the ZB-V rows' layer layout.

The row's `extra_config` names the paper's schedule (`schedule=<name>`); the plan takes:
- `1F1B`: Megatron-LM's 1F1B, the default (None);
- `ZB-1p`: `zb-h1`. ZB-1p is the automatic search under 1F1B's activation memory (p·M_B);
  the paper's Table 5 gives it exactly ZB-H1's bubble in all twelve settings ("this
  improvement is not observed in ZB-1p vs ZB-H1", §5.3);
- `ZB-2p`: `zb-h2`, the handcrafted schedule of the same 2p·M_B memory; the searched ZB-2p's
  bubble is at most ZB-H2's in Table 5 (0.1-4.3% against 2.6-10.8%), so the plan's bubble is
  an upper bound of the run's;
- `ZB-V`: `zbv`, two chunks per rank in a V (§6).
Every ZB row ran with the optimizer post-validation (§4, `--enable-optimizer-post-validation`,
which examples/pretrain_zero_bubble.sh @6574e0ea adds with fp16); the cost model charges the
step-closing synchronisation (cost/schedules.py module docstring), so its ZB bubbles carry the
(p-1)·F floor the post-validation removes.

ZB-V layout: `--allow-padding-num-layers` pads the layers to a multiple of the stages and the
fork's `ParallelTransformer.get_offset` (megatron/model/transformer.py @legacy-main) takes the
padding from chunk indices -1, 0, ...: for the paper's 2·pp - 2 layers, chunks 0 and 2p-1,
both on rank 0 in the V. The plan's chunk_layers say so (chunk v of rank j at v·pp + j).
"""

from __future__ import annotations

import re

from autoparallel_cp.spec.schedules import Schedule

SOURCE = "zero-bubble-iclr24"

#: the paper's schedule names -> the plan's (module docstring)
PLAN_SCHEDULE: dict[str, Schedule | None] = {
    "1F1B": None, "ZB-1p": "zb-h1", "ZB-2p": "zb-h2", "ZB-V": "zbv"}


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
    return plan, (f"{name} as schedule={plan} (2401.10241 Table 5; optimizer post-validation "
                  "not modelled)")


def chunk_layers(r: dict[str, str], layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """The ZB-V rows' layers per chunk (module docstring), None for every other row."""
    if r["source_id"] != SOURCE or vpp != 2:
        return None
    per = -(-layers // (pp * vpp))
    sizes = [per] * (pp * vpp)
    for i in range(-1, pp * vpp * per - layers - 1):  # the fork's padding, stage order
        sizes[i] -= 1
    # stage s of the V sits on rank s (s < pp) or 2pp-1-s: chunk (v=1, rank j) is stage 2pp-1-j
    return tuple(sizes[j] for j in range(pp)) + tuple(sizes[2 * pp - 1 - j] for j in range(pp))
