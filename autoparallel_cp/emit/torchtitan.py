"""torchtitan job settings (`torchtitan/config/job_config.py` sections) for a plan."""

from __future__ import annotations

import json
from typing import Any

from autoparallel_cp.emit.common import plan_comment, uniform_layers
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def torchtitan_settings(job: Job, plan: Plan) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """torchtitan job-config sections (`[training]`, `[parallelism]`, ...) and notes."""
    notes: list[str] = []
    # torchtitan has DDP (replicate) and FSDP (shard, = ZeRO-3 with resharding); no ZeRO-1/2.
    if plan.zero == 0:
        replicate, shard, reshard = plan.dp, 1, "default"
    elif plan.zero in (1, 2):
        replicate, shard, reshard = 1, plan.dp, "never"
        notes.append(
            f"zero={plan.zero}: torchtitan has no optimizer-only sharding; FSDP without "
            "resharding after forward (ZeRO-2-like) is emitted"
        )
    else:
        replicate, shard, reshard = 1, plan.dp, "always"
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": plan.tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
    }
    local_batch = plan.mbs
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan.vpp > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = plan.mbs
        if uniform_layers(job, plan):
            par["pipeline_parallel_layers_per_stage"] = job.model.num_layers // (
                plan.pp * plan.vpp)
        else:
            notes.append("non-uniform stage layer counts: set pipeline_parallel_split_points "
                         "by hand (" + ":".join(
                             map(str, plan.layers_per_stage(job.model.num_layers))) + ")")
        # the whole per-replica batch goes through the pipeline schedule in one step
        local_batch = plan.mbs * plan.num_microbatches
    if plan.tp > 1 and not plan.sp:
        notes.append("torchtitan's tensor parallelism always shards norms/dropout along the "
                     "sequence (sp=1); the plan has sp=0")
    if plan.recompute == "full" and plan.recompute_layers is not None:
        notes.append(f"partial full recompute ({plan.recompute_layers} layers/stage) is not a "
                     "torchtitan option; emitted as full")
    ac: dict[str, Any] = {"mode": plan.recompute}
    if plan.recompute == "selective":
        # torchtitan's `selective` needs an option; "op" is the op-level SAC the
        # torchtitan-fsdp recipe costs (its default "2" would checkpoint every 2nd layer)
        ac["selective_ac_option"] = "op"
        if job.recipe.behaviour.selective_policy != "op":
            notes.append("torchtitan has no attention-core-only recompute; op-level SAC (which "
                         "also replays every second matmul) is emitted: evaluate the plan with "
                         "--recipe torchtitan-fsdp for its cost")
    sections: dict[str, dict[str, Any]] = {
        "training": {
            "local_batch_size": local_batch,
            "global_batch_size": job.global_batch,
            "seq_len": job.seq_len,
        },
        "parallelism": par,
        "activation_checkpoint": ac,
    }
    if job.recipe.compute_dtype == "fp8":
        sections["model"] = {"converters": ["float8"]}
    return sections, notes


def torchtitan_toml(job: Job, plan: Plan) -> tuple[str, list[str]]:
    """The torchtitan TOML sections as text, and notes."""
    sections, notes = torchtitan_settings(job, plan)
    lines = [
        f"# torchtitan config sections: {job.model.name} on {job.num_gpus} GPUs",
        f"# plan: {plan_comment(plan)}",
    ]
    lines += [f"# note: {n}" for n in notes]
    for name, values in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n", notes
