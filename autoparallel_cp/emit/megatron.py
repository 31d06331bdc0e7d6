"""Megatron-LM arguments (`megatron/training/arguments.py` option names) for a plan."""

from __future__ import annotations

from autoparallel_cp.emit.common import first_last_split, plan_comment, uniform_layers
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan


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
        if uniform_layers(job, plan):
            a += ["--num-layers-per-virtual-pipeline-stage",
                  str(m.num_layers // (plan.pp * plan.vpp))]
        else:
            a += ["--num-virtual-stages-per-pipeline-rank", str(plan.vpp)]
            notes.append("non-uniform stages with interleaving: check Megatron's layer layout")
    split = first_last_split(job, plan)
    if split is not None:
        a += ["--decoder-first-pipeline-num-layers", str(split[0]),
              "--decoder-last-pipeline-num-layers", str(split[1])]
    elif plan.pp > 1 and not uniform_layers(job, plan):
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


def megatron_text(job: Job, plan: Plan, args: list[str], notes: list[str]) -> str:
    g0 = job.cluster.node_groups[0]
    nodes = sum(g.num_nodes for g in job.cluster.node_groups)
    lines = [
        f"# Megatron-LM arguments: {job.model.name} on {job.num_gpus} GPUs, "
        f"recipe {job.recipe.name}",
        f"# plan: {plan_comment(plan)}  (data-parallel size dp={plan.dp} is implied)",
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
