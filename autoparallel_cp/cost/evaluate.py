"""`evaluate(job, plan) -> Evaluation`: the exact memory / time / throughput of one plan.

`Evaluation.to_json()` is the INTERFACE.md `PLAN` object (plan, fits, memory, time,
throughput), extended with `stages`, `overhead_bytes`, `required_bytes`, `persistent_bytes`,
`fragmentation_bytes` and `model_flops_per_token`. Plans that break a rule of
`plan.plan_violations` raise ValueError listing every broken rule; plans that do not fit are
evaluated (`fits: false`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from autoparallel_cp.cost import factors as F
from autoparallel_cp.cost.efficiency import peak_flops
from autoparallel_cp.cost.evidence import evidence
from autoparallel_cp.cost.flops import model_flops_per_token
from autoparallel_cp.cost.memory import StageMemory, peak_stage, stage_memory
from autoparallel_cp.cost.steptime import step_time
from autoparallel_cp.cost.uncertainty import oom_risk, peak_scale, plan_intervals
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan, plan_violations


class MemoryBreakdown(BaseModel):
    """Bytes on the most loaded GPU (INTERFACE.md `memory`), plus overheads."""

    model_config = ConfigDict(frozen=True)

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    peak_bytes: float  # allocated peak = sum of the five above
    capacity_bytes: float
    overhead_bytes: float  # CUDA context + allocator fragmentation (not allocated tensors)
    required_bytes: float  # peak + overhead, compared with capacity
    stage: int  # which pipeline stage is the most loaded
    peak_bytes_interval: tuple[float, float] | None = None  # nominal 80 % (cost/uncertainty.py)
    # of the peak: bytes in buffers never freed (no fragmentation); fragmentation: the
    # allocator's free cached bytes at the peak, ALLOCATOR_FRAGMENTATION x (peak - persistent)
    persistent_bytes: float = 0.0
    fragmentation_bytes: float = 0.0
    host_bytes: float = 0.0  # host memory per GPU of the most offloading stage (cost/offload.py)
    #: the chance that the plan does not fit the GPU's whole memory (before --mem-headroom),
    #: from the memory interval (cost/uncertainty.py `oom_risk`)
    oom_risk: float | None = None


class TimeBreakdown(BaseModel):
    """Seconds per optimizer step (INTERFACE.md `time`); the parts sum to `step_s`."""

    model_config = ConfigDict(frozen=True)

    step_s: float
    compute_s: float
    bubble_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    slowest_stage: int
    fixed_s: float = 0.0  # calibrated fixed time per step (spec/calibration.py)
    offload_s: float = 0.0  # exposed activation copies to / from the host (cost/offload.py)
    step_s_interval: tuple[float, float] | None = None  # nominal 80 % (cost/uncertainty.py)


class Throughput(BaseModel):
    model_config = ConfigDict(frozen=True)

    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    tokens_per_s_per_gpu_interval: tuple[float, float] | None = None  # nominal 80 %


class Evaluation(BaseModel):
    """One evaluated plan."""

    model_config = ConfigDict(frozen=True)

    plan: Plan
    fits: bool
    memory: MemoryBreakdown
    time: TimeBreakdown
    throughput: Throughput
    stage_peak_bytes: list[float]
    stage_time_s: list[float]
    model_flops_per_token: float
    #: the claim against the best published MFU of its class (cost/evidence.py)
    evidence: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The INTERFACE.md PLAN object (extra fields added, none renamed)."""
        p = self.plan
        plan_d: dict[str, Any] = {
            "dp": p.dp, "tp": p.tp, "pp": p.pp, "vpp": p.vpp, "cp": p.cp, "ep": p.ep,
            "sp": p.sp, "zero": p.zero, "mbs": p.mbs, "num_microbatches": p.num_microbatches,
            "recompute": p.recompute,
        }
        if p.recompute_layers is not None:
            plan_d["recompute_layers"] = p.recompute_layers
        if p.stage_layers is not None:
            plan_d["stage_layers"] = list(p.stage_layers)
        if p.stage_groups is not None:
            plan_d["stage_groups"] = list(p.stage_groups)
        if p.chunk_layers is not None:
            plan_d["chunk_layers"] = list(p.chunk_layers)
        if p.etp is not None:
            plan_d["etp"] = p.etp
        if p.dp_replicate != 1:  # hybrid sharding; absent means plain sharding (INTERFACE.md)
            plan_d["dp_replicate"] = p.dp_replicate
        if p.schedule is not None:
            plan_d["schedule"] = p.schedule
        if p.optimizer_offload:
            plan_d["optimizer_offload"] = p.optimizer_offload
        if p.activation_offload:
            plan_d["activation_offload"] = p.activation_offload
        return {
            "plan": plan_d,
            "fits": self.fits,
            "memory": self.memory.model_dump(),
            "time": self.time.model_dump(),
            "throughput": self.throughput.model_dump(),
            "stages": [
                {"stage": j, "peak_bytes": m, "time_per_microbatch_s": t}
                for j, (m, t) in enumerate(
                    zip(self.stage_peak_bytes, self.stage_time_s, strict=True))
            ],
            "model_flops_per_token": self.model_flops_per_token,
            **({"evidence": self.evidence} if self.evidence is not None else {}),
        }


def host_fits(job: Job, plan: Plan, stages: list[StageMemory]) -> bool:
    """Whether every node's host memory holds what its GPUs offload (cost/offload.py): the
    most-offloading stage's host bytes on each of the node's GPUs."""
    for s in stages:
        ng = job.cluster.node_groups[s.group]
        if s.host_bytes > 0 and ng.host is not None and (
                s.host_bytes * ng.gpus_per_node > ng.host.memory_bytes):
            return False
    return True


def evaluate(job: Job, plan: Plan, options: F.CostOptions | None = None) -> Evaluation:
    """Memory and step time of `plan` for `job`. Raises ValueError listing broken rules."""
    bad = plan_violations(job, plan)
    if bad:
        raise ValueError("plan breaks: " + "; ".join(bad))
    opts = F.options_for(job, options)
    if options is not None and options != job.recipe.behaviour:
        # an override: the recipe's behaviour becomes it, so the factors that read the job's
        # recipe (pipeline sends, DP sync, FSDP copies: cost/sync.py) see it as the rest do
        job = job.model_copy(update={"recipe": job.recipe.model_copy(update={"behaviour": opts})})
    stages = stage_memory(job, plan, opts)
    worst = peak_stage(stages)
    fits = all(s.required_bytes <= s.capacity_bytes for s in stages) and host_fits(job, plan,
                                                                                   stages)
    st = step_time(job, plan, opts)
    tokens = job.tokens_per_step
    tps = tokens / st.step_s
    mf = model_flops_per_token(job.model, job.seq_len)
    # data-sheet peak: a calibrated cluster's peaks are scaled by its compute knob
    peak = sum(g.num_gpus * peak_flops(g.gpu, job.recipe.compute_dtype) / peak_scale(job, g.gpu)
               for g in job.cluster.node_groups)
    iv = plan_intervals(job, st.step_s, tps / job.num_gpus, worst.peak_bytes)
    mem = MemoryBreakdown(
        params_bytes=worst.params_bytes, grads_bytes=worst.grads_bytes,
        optimizer_bytes=worst.optimizer_bytes, activations_bytes=worst.activations_bytes,
        other_bytes=worst.other_bytes, peak_bytes=worst.peak_bytes,
        capacity_bytes=worst.capacity_bytes, overhead_bytes=worst.overhead_bytes,
        required_bytes=worst.required_bytes, stage=worst.stage,
        peak_bytes_interval=iv.peak_bytes, persistent_bytes=worst.persistent_bytes,
        fragmentation_bytes=worst.fragmentation_bytes,
        host_bytes=max(s.host_bytes for s in stages),
        # the risk is against the GPU's whole memory: the headroom is a margin, not memory
        oom_risk=oom_risk(job, worst.required_bytes,
                          worst.capacity_bytes / (1.0 - job.mem_headroom)),
    )
    tb = TimeBreakdown(
        step_s=st.step_s, compute_s=st.compute_s, bubble_s=st.bubble_s,
        tp_comm_s=st.tp_comm_s, cp_comm_s=st.cp_comm_s, ep_comm_s=st.ep_comm_s,
        pp_comm_s=st.pp_comm_s, dp_comm_s=st.dp_comm_s, optimizer_s=st.optimizer_s,
        slowest_stage=st.slowest_stage, fixed_s=st.fixed_s, step_s_interval=iv.step_s,
        offload_s=st.offload_s,
    )
    thr = Throughput(tokens_per_s=tps, tokens_per_s_per_gpu=tps / job.num_gpus,
                     mfu=mf * tps / peak, tokens_per_s_per_gpu_interval=iv.tokens_per_s_per_gpu)
    return Evaluation(
        plan=plan, fits=fits, memory=mem, time=tb, throughput=thr,
        stage_peak_bytes=[s.peak_bytes for s in stages],
        stage_time_s=[s.total_s for s in st.stages],
        model_flops_per_token=mf,
        evidence=evidence(job, thr.mfu, tb.model_dump()),
    )
