"""Microbenchmark rows of RUNS.csv (written by `ap-solve measure`) and their predictions.

Columns (besides `kind`), all rows: `cluster` (preset or YAML: which GPU and links), `time_s`
(measured seconds of one call, the median of the timed repetitions).

- `kind=gemm`: `gpu` (GPU type name in the cluster), `m`, `k`, `n` (one `[m,k] @ [k,n]`),
  `dtype` (bf16 / fp8; fp32 from the CPU kit, costed as bf16). Predicted by
  `cost.efficiency.gemm_time` on that GPU; fits the GPU's compute knob.
- `kind=all_gather | reduce_scatter | all_reduce`: `gpus` (group size), `gpus_per_node`
  (members per node; fewer than `gpus` means the group crosses nodes), `size_bytes` (the
  unsharded buffer, nccl-tests convention). Predicted by `cost.comm` on the cluster's first
  node group with that many GPUs per node; fits `net_intra` (one node) or `net_inter`.

Rows measured on a machine that is not the modelled cluster (e.g. the CPU / gloo test run)
still round-trip: their knobs then come out at a bound, which the report says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.efficiency import gemm_time
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ClusterSpec
from autoparallel_cp.spec.base import MAX_GPUS, MAX_GPUS_PER_NODE
from autoparallel_cp.spec.calibration import Calibration
from autoparallel_cp.spec.loaders import load_cluster

MICRO_KINDS = ("gemm", "all_gather", "reduce_scatter", "all_reduce")


@dataclass(frozen=True)
class MicroRow:
    """One microbenchmark row (the module docstring lists its columns)."""

    row: int
    kind: str
    fields: Mapping[str, str]


@lru_cache(maxsize=32)
def _cluster(name: str) -> ClusterSpec:
    return load_cluster(name)


#: Plausible ranges of the columns: a call of 1 us (a kernel launch) to an hour; GEMM sides up
#: to 2^24 (16M tokens or features); buffers up to 1 TiB; groups up to spec/base.py MAX_GPUS.
RANGES: dict[str, tuple[float, float]] = {
    "time_s": (1e-6, 3600.0), "m": (1, 2**24), "k": (1, 2**24), "n": (1, 2**24),
    "size_bytes": (1, 2**40), "gpus": (2, MAX_GPUS), "gpus_per_node": (1, MAX_GPUS_PER_NODE)}
_WHOLE = ("m", "k", "n", "size_bytes", "gpus", "gpus_per_node")


def _f(m: MicroRow, key: str) -> float:
    raw = (m.fields.get(key) or "").strip()
    where = f"row {m.row}"
    try:
        v = float(raw)
    except ValueError:
        raise InputError(f"not a number: {raw[:40]!r}", source=where, field=key) from None
    if not math.isfinite(v):
        raise InputError(f"not a finite number: {raw!r}", source=where, field=key)
    if v <= 0:
        raise InputError(f"must be positive, got {raw}", source=where, field=key)
    if key in _WHOLE and v != int(v):
        raise InputError(f"must be a whole number, got {raw}", source=where, field=key)
    lo, hi = RANGES.get(key, (0.0, math.inf))
    if not lo <= v <= hi:
        why = (" (a collective of one process moves no data: measure with >= 2 processes)"
               if key == "gpus" and v < lo else "")
        raise InputError(f"{raw} is outside [{lo:g}, {hi:g}]{why}", source=where, field=key)
    return v


def check_micro(m: MicroRow) -> None:
    """Raise InputError (naming row and field) when a microbenchmark row cannot be used."""
    _f(m, "time_s")
    name = (m.fields.get("cluster") or "").strip()
    if not name:
        raise InputError("missing value", source=f"row {m.row}", field="cluster")
    try:
        cl = _cluster(name)
    except Exception as exc:  # noqa: BLE001 - any loader failure is the row's cluster field
        raise InputError(f"unknown or invalid cluster {name!r} ({exc})", source=f"row {m.row}",
                         field="cluster") from None
    if m.kind == "gemm":
        for k in ("m", "k", "n"):
            _f(m, k)
        gpu = (m.fields.get("gpu") or "").strip()
        if gpu not in {g.gpu.name for g in cl.node_groups}:
            raise InputError(f"GPU {gpu!r} is not in cluster {name!r}", source=f"row {m.row}",
                             field="gpu")
    else:
        n, per = (_f(m, k) for k in ("gpus", "gpus_per_node"))
        _f(m, "size_bytes")
        if per > n:
            raise InputError(f"{per:g} members per node, more than the group's {n:g} GPUs",
                             source=f"row {m.row}", field="gpus_per_node")


def micro_predict(m: MicroRow, cal: Calibration | None) -> float:
    """Predicted seconds of one microbenchmark row under calibration `cal` (module docstring)."""
    cl = _cluster(m.fields["cluster"].strip())
    if cal is not None:
        cl = cal.scale_cluster(cl)
    if m.kind == "gemm":
        gpu_name = m.fields["gpu"].strip()
        gpu = next(g.gpu for g in cl.node_groups if g.gpu.name == gpu_name)
        # fp8 on the fp8 curve; bf16 (and the CPU kit's fp32) on the bf16 curve
        dtype = "fp8" if (m.fields.get("dtype") or "").strip() == "fp8" else "bf16"
        return float(gemm_time(gpu, _f(m, "m"), _f(m, "k"), _f(m, "n"), dtype))
    node = cl.node_groups[0]
    n, per = _f(m, "gpus"), _f(m, "gpus_per_node")
    node = node.model_copy(update={"gpus_per_node": int(per)})
    fn = {"all_gather": comm.all_gather, "reduce_scatter": comm.reduce_scatter,
          "all_reduce": comm.all_reduce}[m.kind]
    return float(fn(node, n, 1, _f(m, "size_bytes")))
