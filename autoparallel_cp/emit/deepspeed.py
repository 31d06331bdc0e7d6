"""DeepSpeed JSON config keys for a plan."""

from __future__ import annotations

from typing import Any

from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


def deepspeed_config(job: Job, plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """A DeepSpeed JSON config (as a dict) for the plan, and notes."""
    notes: list[str] = []
    cfg: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": plan.zero},
        "bf16": {"enabled": True},
    }
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.pp > 1:
        notes.append(f"pipeline stages are set in code: PipelineModule(num_stages={plan.pp}); "
                     "DeepSpeed's pipeline engine uses gradient_accumulation_steps as the "
                     "number of micro-batches")
        if plan.zero >= 2:
            notes.append("DeepSpeed's pipeline engine supports ZeRO stage 0/1 only")
    if plan.vpp > 1:
        notes.append("DeepSpeed has no interleaved (virtual) pipeline schedule")
    if plan.cp > 1:
        notes.append(f"context parallelism cp={plan.cp} has no DeepSpeed config key "
                     "(Ulysses sequence parallelism is configured in code)")
    if plan.ep > 1:
        notes.append(f"expert parallelism: pass ep_size={plan.ep} to deepspeed.moe.layer.MoE")
    if plan.recompute != "none":
        notes.append(f"recompute={plan.recompute}: wrap layers with "
                     "deepspeed.checkpointing.checkpoint in the model code")
    if job.recipe.compute_dtype == "fp8":
        notes.append("fp8 GEMMs come from Transformer Engine in the model code, not the config")
    return cfg, notes
