"""Pipeline schedules and host offload: the plan fields' names and their legality rules.

The names are INTERFACE.md's `schedule` values. A plan without `schedule` keeps today's
meaning (`default_schedule`): 1F1B, or Megatron's interleaved 1F1B when vpp > 1. Their
costs (bubble, in-flight micro-batches, parameter copies, EP overlap) live in
cost/schedules.py; the offload costs in cost/offload.py.

Rules, from the implementations that run each schedule:
- `1f1b`, `gpipe`, `zb-h1`, `zb-h2`, `dualpipe`: one model chunk per rank (vpp = 1):
  torch.distributed.pipelining's single-stage schedules (`Schedule1F1B`, `ScheduleGPipe`);
  ZB-H1 / ZB-H2 are Qi et al.'s one-chunk handcrafted schedules (arXiv 2401.10241 §2).
- `interleaved`: vpp > 1 (and m >= pp, `plan_violations`), Megatron's interleaved 1F1B.
- `zbv`, `dualpipev`: exactly two model chunks per rank in a V (vpp = 2): torch
  schedules.py `ScheduleZBVZeroBubble.__init__` / `ScheduleDualPipeV.__init__` ("requires
  exactly 2 stages per rank"); `dualpipev` also needs m >= the 2·pp stages (same file,
  "DualPipeV requires at least as many microbatches as stages").
- `dualpipe`: pp even and m >= 2·pp, m even (deepseek-ai/DualPipe dualpipe/dualpipe.py,
  `DualPipe.step`: `num_ranks % 2 == 0`, `num_chunks >= num_ranks * 2` and half the
  micro-batches enter from each end).
- every schedule other than the default needs pp > 1 (no pipeline, no schedule).
- `activation_offload`: at most the layers of the smallest stage.
"""

from __future__ import annotations

from typing import Literal

Schedule = Literal["1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev",
                   "gpipe"]
SCHEDULES: tuple[Schedule, ...] = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipe",
                                   "dualpipev", "gpipe")
#: schedules that split the backward into input-gradient (B) and weight-gradient (W) passes
SPLIT_BACKWARD: frozenset[str] = frozenset({"zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev"})
#: schedules with two model chunks per rank in a V (the last chunk on rank 0)
V_SHAPED: frozenset[str] = frozenset({"zbv", "dualpipev"})


def default_schedule(vpp: int) -> Schedule:
    """Today's meaning of a plan without `schedule`: 1F1B, interleaved when vpp > 1."""
    return "interleaved" if vpp > 1 else "1f1b"


def schedule_violations(schedule: str | None, pp: int, vpp: int, m: int) -> list[str]:
    """Every rule (module docstring) that `schedule` breaks for pp, vpp and m micro-batches."""
    if schedule is None:
        return []
    out: list[str] = []
    if pp == 1 and schedule != default_schedule(vpp):
        out.append(f"schedule={schedule} needs pp > 1")
    if schedule == "interleaved" and vpp == 1:
        out.append("schedule=interleaved needs vpp > 1")
    elif schedule in V_SHAPED and vpp != 2:
        out.append(f"schedule={schedule} needs vpp=2 (two model chunks per rank in a V), "
                   f"got vpp={vpp}")
    elif schedule not in V_SHAPED and schedule != "interleaved" and vpp != 1:
        out.append(f"schedule={schedule} runs one model chunk per rank: vpp must be 1, "
                   f"got vpp={vpp}")
    if schedule == "dualpipe":
        if pp % 2:
            out.append(f"schedule=dualpipe needs an even pp, got pp={pp}")
        if m < 2 * pp or m % 2:
            out.append(f"schedule=dualpipe needs an even num_microbatches >= 2*pp: "
                       f"{m} vs 2*{pp}")
    if schedule == "dualpipev" and m < 2 * pp:
        out.append(f"schedule=dualpipev needs num_microbatches >= 2*pp stages: {m} < {2 * pp}")
    return out


def offload_violations(activation_offload: int, optimizer_offload: float,
                       stage_layers: tuple[int, ...], has_host: bool) -> list[str]:
    """`activation_offload` at most the smallest stage's layers; offloading needs every node
    group's `host` (spec/cluster.py HostSpec: link and memory)."""
    out: list[str] = []
    if activation_offload and activation_offload > min(stage_layers):
        out.append(f"activation_offload={activation_offload} exceeds the smallest stage's "
                   f"{min(stage_layers)} layers")
    if (activation_offload or optimizer_offload) and not has_host:
        out.append("offloading needs the cluster's host link and memory (node group field "
                   "`host`: link_gbps, memory_gib, memory_gbps)")
    return out


def axis_key(schedule: str | None, optimizer_offload: float, activation_offload: int
             ) -> tuple[tuple[float, ...], ...]:
    """The fields' part of `Plan.key`: empty where all are neutral (old keys unchanged)."""
    if schedule is None and optimizer_offload == 0.0 and activation_offload == 0:
        return ()
    s = -1 if schedule is None else SCHEDULES.index(schedule)
    return ((s, optimizer_offload, activation_offload),)


def axis_text(schedule: str | None, optimizer_offload: float, activation_offload: int
              ) -> list[str]:
    """The fields' part of `Plan.short`: only those set."""
    return ([f"schedule={schedule}"] if schedule is not None else []) + (
        [f"optimizer_offload={optimizer_offload:g}"] if optimizer_offload else []) + (
        [f"activation_offload={activation_offload}"] if activation_offload else [])


def axis_value(k: str, v: object) -> object:
    """The typed value of `schedule` / `optimizer_offload` given as text or a value; raises
    ValueError with the message (the caller names the field)."""
    if k == "schedule":
        if not isinstance(v, str) or v not in SCHEDULES:
            raise ValueError(f"expected one of {SCHEDULES}, got {v!r}")
        return v
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise ValueError(f"expected a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    return float(v)
