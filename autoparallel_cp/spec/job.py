"""Job spec: what is to be trained, where (a model, the GPUs used, a recipe, sequence, batch)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import (
    MAX_ACTIVATION_SCALE_BYTES,
    MAX_GLOBAL_BATCH,
    MAX_SEQ_LEN,
    MAX_STEP_ESTIMATE_S,
    MAX_TOKENS_PER_STEP,
    Bounded,
    Strict,
)
from .calibration import Calibration
from .cluster import ClusterSpec
from .model import ModelSpec
from .recipe import RECIPES, TrainingRecipe

SeqLen = Annotated[int, Bounded(1, MAX_SEQ_LEN, "3x the longest published context")]
GlobalBatch = Annotated[int, Bounded(1, MAX_GLOBAL_BATCH,
                                         "~1000x the largest published batch")]


class Job(Strict):
    """One planning problem: a model, the GPUs used, a recipe, sequence length and global batch."""

    model: ModelSpec
    cluster: ClusterSpec  # already cut to the GPUs used (see ClusterSpec.take_gpus)
    recipe: TrainingRecipe = RECIPES["megatron-bf16"]
    seq_len: SeqLen = 4096
    global_batch: GlobalBatch = 512  # sequences per optimizer step

    #: applied calibration (spec/calibration.py; the cluster above is already scaled by it)
    calibration: Calibration | None = None
    #: fraction of each GPU's memory kept free (--mem-headroom): a capacity reduction
    mem_headroom: float = Field(0.0, ge=0.0, lt=0.5)
    #: --moe-load-imbalance: the user's statement of the most-loaded EP rank's routed tokens over
    #: the mean rank's, per MoE layer and micro-batch (1 = balanced routing; cost/common.py
    #: `routed_load` applies it). Read from the run's own Megatron `tokens_per_expert` logs, it
    #: is not a fitted number.
    moe_load_imbalance: float = 1.0
    #: --search-also: plan axes the search adds to its default space (search/space.py
    #: `SearchSpace.for_job`): "schedule" (the zero-bubble schedules beside 1F1B and
    #: interleaved, search/schedule_axis.py) and "offload" (the host optimizer shares,
    #: search/offload_axis.py). Off by default: each multiplies the keys the proof scores
    #: (benchmarks/command_bench.py), and a pinned value (`--fix schedule=zb-h1`) is searched
    #: either way.
    search_also: tuple[Literal["schedule", "offload"], ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Job:
        self._check_moe_load_imbalance()
        if self.tokens_per_step > MAX_TOKENS_PER_STEP:
            raise ValueError(
                f"global_batch x seq_len = {self.tokens_per_step:,} tokens per step, more than "
                f"{MAX_TOKENS_PER_STEP:,} (~1000x the largest published batch)"
            )
        if self.recipe.compute_dtype == "fp8":
            for g in self.cluster.node_groups:
                if g.gpu.fp8_tflops is None:
                    raise ValueError(
                        f"recipe {self.recipe.name!r} computes in fp8, but GPU {g.gpu.name!r} "
                        f"(node group {g.name!r}) has no fp8_tflops: use a bf16 recipe, or "
                        "give the GPU's fp8_tflops"
                    )
        reserved = max(self.recipe.behaviour.ub_rs_sm_margin)
        if reserved > 0:
            for g in self.cluster.node_groups:
                if g.gpu.sm_count is None or g.gpu.sm_count <= reserved:
                    raise ValueError(
                        f"recipe {self.recipe.name!r} reserves {reserved} SMs for userbuffers "
                        f"(ub_rs_sm_margin), but GPU {g.gpu.name!r} (node group {g.name!r}) "
                        f"has sm_count {g.gpu.sm_count}: give the GPU's sm_count (more than "
                        "the reserved SMs)"
                    )
        act = 34.0 * self.tokens_per_step * self.model.hidden_size * self.model.num_layers
        if act > MAX_ACTIVATION_SCALE_BYTES:
            raise ValueError(
                f"global_batch x seq_len x hidden_size x num_layers x 34 bytes = {act:.3g} "
                f"bytes of activations per step, more than 2^70 (~1000x the largest published "
                "step): lower global_batch or seq_len"
            )
        est = self.step_time_scale_s()
        if est > MAX_STEP_ESTIMATE_S:
            raise ValueError(
                f"one optimizer step would take about {est:.3g} s even at peak speed, more than "
                f"{MAX_STEP_ESTIMATE_S:.0e} s (11.6 days): lower global_batch or seq_len, or "
                "use more or faster GPUs"
            )
        return self

    def _check_moe_load_imbalance(self) -> None:
        rho = self.moe_load_imbalance
        if not math.isfinite(rho) or rho < 1.0:
            raise ValueError(
                f"moe_load_imbalance must be a finite number >= 1 (the most-loaded EP rank's "
                f"routed tokens over the mean rank's; 1 = balanced), got {rho}")
        moe = self.model.moe
        if moe is None and rho != 1.0:
            raise ValueError(
                f"moe_load_imbalance {rho:g} given for {self.model.name!r}, a dense model "
                "(no routed experts): leave it at 1")
        if moe is not None and rho > moe.num_experts:
            # an EP rank holds at most all ep <= num_experts ranks' tokens: rho <= ep
            raise ValueError(
                f"moe_load_imbalance {rho:g} exceeds num_experts ({moe.num_experts}): the "
                "most-loaded of ep ranks holds at most ep times the mean, and ep <= num_experts")

    def with_moe_load_imbalance(self, rho: float) -> Job:
        """This job with the stated MoE load imbalance (validated: ValueError on bad input)."""
        job = self.model_copy(update={"moe_load_imbalance": float(rho)})
        job._check_moe_load_imbalance()
        return job

    def calibrated(self, calibration: Calibration | None = None,
                   mem_headroom: float | None = None) -> Job:
        """This job with `calibration` applied (its cluster scaled) and/or a memory headroom."""
        upd: dict[str, object] = {}
        if calibration is not None:
            if self.calibration is not None:
                raise ValueError("the job already carries a calibration")
            upd["calibration"] = calibration
            upd["cluster"] = calibration.scale_cluster(self.cluster)
        if mem_headroom is not None:
            if not 0.0 <= mem_headroom < 0.5:
                raise ValueError(f"mem_headroom must be in [0, 0.5), got {mem_headroom}")
            upd["mem_headroom"] = float(mem_headroom)
        return self.model_copy(update=upd) if upd else self

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch

    def step_time_scale_s(self) -> float:
        """A coarse scale of one step's time on the slowest parts of the cluster (seconds).

        Compute: 6 FLOPs per parameter and token (Kaplan et al. 2020, §2.1) plus attention's
        12*s*heads*head_dim per token and layer (no causal halving), over all GPUs at the slowest
        bf16 peak; traffic: fp32 gradients plus 8 bytes per token, layer and hidden unit, over
        all GPUs on the slowest link; latency: 8 messages per layer and sequence on the slowest
        link, one after the other. It bounds the problem's size (`MAX_STEP_ESTIMATE_S`) so that
        the solver's integer times (microseconds) stay far below 2^63; it is no prediction.
        """
        m, n, t = self.model, self.num_gpus, self.tokens_per_step
        total, active = m.param_scale()
        width = m.num_attention_heads * (m.head_size if m.mla is None else
                                         m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim)
        flops = 6.0 * active * t + 12.0 * m.num_layers * t * self.seq_len * width
        groups = self.cluster.node_groups
        peak = min(g.gpu.bf16_tflops for g in groups) * 1e12
        links = [lk for g in groups for lk in (g.intra_node, g.inter_node)]
        bw = min(lk.bandwidth_gbps for lk in links) * 1e9
        latency = max(lk.latency_us for lk in links) * 1e-6
        traffic = 4.0 * total + 8.0 * t * m.num_layers * m.hidden_size
        return (flops / peak + traffic / bw) / n + 8.0 * m.num_layers * self.global_batch * latency
