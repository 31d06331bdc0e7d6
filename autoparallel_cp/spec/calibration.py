"""Calibration knobs: physically meaningful multipliers of the cost model, fitted by
`ap-solve calibrate` (autoparallel_cp.calibrate) and applied with `--calibration FILE`.

Every knob enters the cost model through the job, never through the solver:

- ``compute[gpu]``: sustained kernel speed of one GPU type relative to the model's curves
  (clocks, kernels, framework version). `apply_calibration` multiplies the GPU's dense peaks
  (bf16, fp8, fp32) and its HBM bandwidth, so every GEMM, attention and memory-bound kernel time
  of `cost/efficiency.py` is divided by it (MFU keeps the data-sheet peak: `peak_scale`).
- ``net_intra``, ``net_inter``: achieved fraction of the modelled NVLink / network bandwidth
  (NCCL version, fabric, congestion); multiply `LinkSpec.bandwidth_gbps` of every node group,
  so every collective of `cost/comm.py` sees them.
- ``per_microbatch_s``: fixed host / launch time of one micro-batch's forward and backward
  through the whole model, spread over the layers (`cost/layer_factors.py` adds
  ``per_microbatch_s / num_layers`` to each layer's compute time, so a pipeline stage pays its
  share of it per micro-batch, and the solver's tables see it).
- ``per_step_s``: fixed time per optimizer step (data loading, logging, synchronisation) added
  to the step by `cost/steptime.py`; the same for every plan of a job, so it never changes a
  ranking (the search composes without it; `search/recommend.py` subtracts it from the limit).
- ``memory_reserve_gib``: allocated bytes per GPU the model does not count (workspaces, extra
  buffers); added to `other_bytes` (`cost/model_state.py`), hence to every peak the search and
  `evaluate` compute. Never negative: a reserve is bytes added, and a negative one would make
  a small job's peak negative (its memory interval inverted); where the model over-counts, the
  fitted memory interval says so instead.

The identity (`Calibration()`) leaves every number unchanged.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from .base import Strict
from .cluster import ClusterSpec

#: Plausible ranges of the knobs (the fit's bounds; files outside are rejected). Kernel speed
#: 0.5-1.5x of the H200-fitted curves covers power-capped / older-driver clusters up to
#: kernels faster than the curves; network 0.2-1.5x covers a congested fabric up to links
#: faster than their nominal efficiency; fixed times up to 0.5 s per micro-batch and 30 s per
#: step (host-bound or I/O-bound loops); memory reserve 0..16 GiB (module docstring).
BOUNDS: dict[str, tuple[float, float]] = {
    "compute": (0.5, 1.5),
    "net_intra": (0.2, 1.5),
    "net_inter": (0.2, 1.5),
    "per_microbatch_s": (0.0, 0.5),
    "per_step_s": (0.0, 30.0),
    "memory_reserve_gib": (0.0, 16.0),
}
#: Widest interval end, |ln(measured / predicted)|: a factor of 10 either way. A wider 80 %
#: interval says nothing a plan could be chosen by (and exp() of it must stay finite).
MAX_LOG_INTERVAL = math.log(10.0)

#: Version of the calibration file format (docs/user-guide.md, "Calibrating to your cluster").
FORMAT_VERSION = 1


class Interval(Strict):
    """A nominal 80 % interval of a log-ratio error: measured / predicted in [exp(lo), exp(hi)]."""

    lo: float = Field(le=0.0, ge=-MAX_LOG_INTERVAL)
    hi: float = Field(ge=0.0, le=MAX_LOG_INTERVAL)


class Calibration(Strict):
    """Calibration knobs (module docstring) and the prediction intervals of their fit."""

    compute: dict[str, float] = Field(default_factory=dict)  # GPU type name -> speed factor
    net_intra: float = 1.0
    net_inter: float = 1.0
    per_microbatch_s: float = 0.0
    per_step_s: float = 0.0
    memory_reserve_gib: float = 0.0
    #: log(measured / predicted) 10th / 90th percentiles after the fit (time, memory);
    #: None: the uncalibrated tables of cost/uncertainty.py apply.
    time_interval: Interval | None = None
    memory_interval: Interval | None = None
    #: one-sd uncertainty of each fitted knob ("compute:<GPU>", "net_intra", ...), knob units
    std: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _bounds(self) -> Calibration:
        lo, hi = BOUNDS["compute"]
        for name, v in self.compute.items():
            if not lo <= v <= hi:
                raise ValueError(f"compute[{name!r}] = {v} outside its range [{lo}, {hi}]")
        for k in ("net_intra", "net_inter", "per_microbatch_s", "per_step_s",
                  "memory_reserve_gib"):
            lo, hi = BOUNDS[k]
            v = getattr(self, k)
            if not lo <= v <= hi:
                raise ValueError(f"{k} = {v} outside its range [{lo}, {hi}]")
        for name, v in self.std.items():
            kind = name.split(":", 1)[0]
            if kind not in BOUNDS:
                raise ValueError(f"uncertainty of unknown knob {name[:80]!r}")
            lo, hi = BOUNDS[kind]
            if not 0.0 <= v <= hi - lo:  # one sd wider than the whole range says nothing
                raise ValueError(f"uncertainty of {name} = {v} outside [0, {hi - lo:g}]")
        return self

    def compute_factor(self, gpu_name: str) -> float:
        return self.compute.get(gpu_name, 1.0)

    def scale_cluster(self, cluster: ClusterSpec) -> ClusterSpec:
        """The cluster with the compute and network knobs applied (module docstring)."""
        groups = []
        for g in cluster.node_groups:
            c = self.compute_factor(g.gpu.name)
            gpu = g.gpu.model_copy(update={
                "bf16_tflops": g.gpu.bf16_tflops * c,
                "fp8_tflops": None if g.gpu.fp8_tflops is None else g.gpu.fp8_tflops * c,
                "fp32_tflops": None if g.gpu.fp32_tflops is None else g.gpu.fp32_tflops * c,
                "hbm_gbps": g.gpu.hbm_gbps * c,
            })
            groups.append(g.model_copy(update={
                "gpu": gpu,
                "intra_node": g.intra_node.model_copy(
                    update={"bandwidth_gbps": g.intra_node.bandwidth_gbps * self.net_intra}),
                "inter_node": g.inter_node.model_copy(
                    update={"bandwidth_gbps": g.inter_node.bandwidth_gbps * self.net_inter}),
            }))
        return cluster.model_copy(update={"node_groups": groups})
