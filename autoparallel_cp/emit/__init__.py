"""Launch settings for a chosen plan, in the option names of Megatron-LM, torchtitan and DeepSpeed.

Each emitter returns the text to paste plus `notes`: the parts of the plan the target framework
cannot express exactly (they are printed next to the text, never silently dropped).

Option names follow the projects' own argument parsers / config classes:
- Megatron-LM `megatron/training/arguments.py` (e.g. `--tensor-model-parallel-size`,
  `--num-layers-per-virtual-pipeline-stage`, `--recompute-granularity`, `--fp8-format`,
  Megatron-FSDP `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params`);
- torchtitan `torchtitan/config/job_config.py` sections `[training]`, `[parallelism]`,
  `[activation_checkpoint]`;
- DeepSpeed's JSON config keys (`train_batch_size`, `train_micro_batch_size_per_gpu`,
  `gradient_accumulation_steps`, `zero_optimization.stage`, `bf16.enabled`,
  `tensor_parallel.autotp_size`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

EMIT_FORMATS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Emitted:
    """Launch settings in one framework's syntax, and what they cannot express."""

    fmt: str
    text: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def emit(job: Job, plan: Plan, fmt: str) -> Emitted:
    """Render `plan` for `job` as launch settings of framework `fmt` (see EMIT_FORMATS)."""
    if fmt == "megatron":
        args, notes = megatron_args(job, plan)
        return Emitted(fmt, _megatron_text(job, plan, args, notes), tuple(notes))
    if fmt == "torchtitan":
        text, notes = torchtitan_toml(job, plan)
        return Emitted(fmt, text, tuple(notes))
    if fmt == "deepspeed":
        cfg, notes = deepspeed_config(job, plan)
        return Emitted(fmt, json.dumps(cfg, indent=2) + "\n", tuple(notes))
    raise UserError(f"--emit: unknown format {fmt!r}; choose one of {', '.join(EMIT_FORMATS)}")


# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------


def _uniform_layers(job: Job, plan: Plan) -> bool:
    layers = plan.layers_per_stage(job.model.num_layers)
    return len(set(layers)) == 1


def _first_last_split(job: Job, plan: Plan) -> tuple[int, int] | None:
    """(first, last) stage layer counts when only those two differ from a uniform middle."""
    layers = plan.layers_per_stage(job.model.num_layers)
    if plan.pp < 2 or len(set(layers)) == 1:
        return None
    middle = layers[1:-1]
    if len(set(middle)) <= 1:
        return layers[0], layers[-1]
    return None


def _plan_comment(plan: Plan) -> str:
    return plan.short() + f",num_microbatches={plan.num_microbatches}"


# --------------------------------------------------------------------------------------------
# Megatron-LM
# --------------------------------------------------------------------------------------------


def megatron_args(job: Job, plan: Plan) -> tuple[list[str], list[str]]:
    """Megatron-LM command-line arguments (flat list) for the plan, and notes."""
    m = job.model
    notes: list[str] = []
    a: list[str] = [
        "--tensor-model-parallel-size", str(plan.tp),
        "--pipeline-model-parallel-size", str(plan.pp),
        "--context-parallel-size", str(plan.cp),
    ]
    if plan.ep > 1:
        a += ["--expert-model-parallel-size", str(plan.ep)]
    if plan.sp:
        a.append("--sequence-parallel")
    if plan.vpp > 1:
        if _uniform_layers(job, plan):
            a += ["--num-layers-per-virtual-pipeline-stage",
                  str(m.num_layers // (plan.pp * plan.vpp))]
        else:
            a += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
            notes.append("non-uniform stages with interleaving: check Megatron's layer layout")
    split = _first_last_split(job, plan)
    if split is not None:
        a += ["--decoder-first-pipeline-num-layers", str(split[0]),
              "--decoder-last-pipeline-num-layers", str(split[1])]
    elif plan.pp > 1 and not _uniform_layers(job, plan):
        notes.append(
            "stage layer counts "
            + ":".join(map(str, plan.layers_per_stage(m.num_layers)))
            + " vary in the middle stages; Megatron's first/last-stage options cannot express them"
        )
    # ZeRO: 1 = distributed optimizer; 2/3 = Megatron-FSDP sharding strategies.
    if plan.zero >= 1:
        a.append("--use-distributed-optimizer")
    if plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
              "--ckpt-format", "fsdp_dtensor"]
    a += [
        "--micro-batch-size", str(plan.mbs),
        "--global-batch-size", str(job.global_batch),
        "--seq-length", str(job.seq_len),
    ]
    if plan.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    elif plan.recompute == "full":
        layers_max = max(plan.layers_per_stage(m.num_layers))
        k = plan.recompute_layers
        if k is None or k >= layers_max:
            a += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"]
        else:
            if plan.vpp > 1:
                # Megatron counts block-recomputed layers per virtual stage (model chunk)
                if k % plan.vpp:
                    notes.append(f"{k} recomputed layers per stage do not split evenly over "
                                 f"vpp={plan.vpp} chunks; rounded up")
                k = -(-k // plan.vpp)
            a += ["--recompute-granularity", "full", "--recompute-method", "block",
                  "--recompute-num-layers", str(k)]
    a.append("--bf16")
    if job.recipe.compute_dtype == "fp8":
        a += ["--fp8-format", "hybrid"]
    if job.recipe.framework != "megatron":
        notes.append(f"recipe {job.recipe.name!r} (fp32 weights) has no exact Megatron "
                     "equivalent; emitted as --bf16 with fp32 main weights")
    a += _megatron_model_args(job)
    return a, notes


def _megatron_model_args(job: Job) -> list[str]:
    m = job.model
    a = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--ffn-hidden-size", str(m.ffn_hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        "--max-position-embeddings", str(max(m.max_position_embeddings, job.seq_len)),
    ]
    if m.kv_heads != m.num_attention_heads and m.mla is None:
        a += ["--group-query-attention", "--num-query-groups", str(m.kv_heads)]
    if m.mlp == "swiglu":
        a.append("--swiglu")
    if m.norm == "rmsnorm":
        a += ["--normalization", "RMSNorm"]
    if m.position_embedding == "rope":
        a += ["--position-embedding-type", "rope"]
    if not m.tie_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if m.moe is not None:
        a += ["--num-experts", str(m.moe.num_experts), "--moe-router-topk", str(m.moe.top_k),
              "--moe-ffn-hidden-size", str(m.moe.expert_ffn_hidden_size)]
    return a


def _megatron_text(job: Job, plan: Plan, args: list[str], notes: list[str]) -> str:
    g0 = job.cluster.node_groups[0]
    nodes = sum(g.num_nodes for g in job.cluster.node_groups)
    lines = [
        f"# Megatron-LM arguments: {job.model.name} on {job.num_gpus} GPUs, "
        f"recipe {job.recipe.name}",
        f"# plan: {_plan_comment(plan)}  (data-parallel size dp={plan.dp} is implied)",
    ]
    lines += [f"# note: {n}" for n in notes]
    lines.append("MEGATRON_ARGS=(")
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"    {args[i]} {args[i + 1]}")
            i += 2
        else:
            lines.append(f"    {args[i]}")
            i += 1
    lines.append(")")
    lines.append(
        f"# torchrun --nnodes {nodes} --nproc-per-node {g0.gpus_per_node} "
        'pretrain_gpt.py "${MEGATRON_ARGS[@]}" ...'
    )
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# torchtitan
# --------------------------------------------------------------------------------------------


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
        if _uniform_layers(job, plan):
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
        f"# plan: {_plan_comment(plan)}",
    ]
    lines += [f"# note: {n}" for n in notes]
    for name, values in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n", notes


# --------------------------------------------------------------------------------------------
# DeepSpeed
# --------------------------------------------------------------------------------------------


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
