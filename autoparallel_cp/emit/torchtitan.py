"""torchtitan settings for a plan: the 0.3.0 Python `Trainer.Config` and the v0.2.2 TOML form.

Field names: torchtitan 0.3.0 torchtitan/config/configs.py (TrainingConfig:37-52,
ParallelismConfig:113-279), torchtitan/trainer.py Trainer.Config (:70-113),
torchtitan/distributed/activation_checkpoint.py (FullAC:166, SelectiveAC:185); for the TOML form,
torchtitan v0.2.2 torchtitan/config/job_config.py.

Pipeline splits: torchtitan counts the embedding and the output as
`pipeline_parallel_first/last_stage_less_layers` layers each (default 1) when it derives stages
from `pipeline_parallel_layers_per_stage` (0.3.0 distributed/pipeline_parallel.py:215-237,
`ceil((layers + first + last) / per_stage)` stages, a multiple of pp). The plan puts them beside
its stage layers, so both weights are emitted as 0 and per_stage = layers / (pp * vpp); any
other split is given module by module (`module_fqns_per_model_part`).
"""

from __future__ import annotations

import json
from typing import Any

from autoparallel_cp.emit.common import chunk_layers, plan_comment, refuse_unrunnable
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import TORCHTITAN_MODELS, TORCHTITAN_SCHEDULES, VERSIONS
from autoparallel_cp.spec.plan import Plan
from autoparallel_cp.spec.schedules import V_SHAPED
from autoparallel_cp.spec.splits import model_order


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def module_fqns(job: Job, plan: Plan, output: str = "lm_head") -> list[list[str]]:
    """Modules of each model chunk (0.3.0 names: tok_embeddings, layers.i, norm, lm_head), in
    torchtitan's stage order. In a V (zbv, dualpipev) stage s sits on rank s (s < pp) or
    2pp-1-s (torch `generate_stage_to_rank_mapping(style="v")`, which 0.3.0
    distributed/pipeline_parallel.py picks for both: spec/splits.py `model_order`); a rank 0
    without layers (spec/plan.py `empty_first_ok`) gives stage 0 the embedding only and stage
    2pp-1 the norm and the head."""
    out: list[list[str]] = []
    first = 0
    chunks = chunk_layers(job, plan)
    chunks = list(model_order(tuple(chunks), plan.pp, plan.pipeline_schedule in V_SHAPED))
    for i, n in enumerate(chunks):
        part = (["tok_embeddings"] if i == 0 else []) + [
            f"layers.{j}" for j in range(first, first + n)]
        if i == len(chunks) - 1:
            part += ["norm", output]
        first += n
        out.append(part)
    return out


def _compiled(job: Job) -> bool:
    """The recipe costs compiled (fused) kernels: `fused`, None meaning the framework's default
    (fused for Megatron, eager for PyTorch: spec/recipe.py)."""
    fused = job.recipe.behaviour.fused
    return fused if fused is not None else job.recipe.framework == "megatron"


def torchtitan_settings(job: Job, plan: Plan, fmt: str = "torchtitan"
                        ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Config sections (training, parallelism, activation_checkpoint) and notes."""
    refuse_unrunnable(job, plan, fmt)
    notes: list[str] = []
    if plan.zero == 0:  # replicated weights, all-reduced gradients
        replicate, shard, reshard = plan.dp, 1, "default"
    else:  # FSDP: zero=2 keeps gathered weights until backward, zero=3 reshards; HSDP
        # (dp_replicate > 1) replicates the dp_shard mesh (configs.py:122-150, the mesh
        # ["pp", "dp_replicate", "dp_shard", "cp", "tp"] of parallel_dims.py:239 @b5bcd76c)
        replicate, shard = plan.dp_replicate, plan.dp_shard
        reshard = "never" if plan.zero == 2 else "always"
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": plan.tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
        "expert_parallel_degree": plan.ep,
    }
    if fmt == "torchtitan-toml" and plan.ep > 1:
        # v0.2.2 defaults expert_tensor_parallel_degree to 1 (job_config.py:464): write the
        # plan's (tp or 1; frameworks.py refuses others)
        par["expert_tensor_parallel_degree"] = plan.expert_tp
    local_batch = plan.mbs
    if plan.pp > 1:
        par["pipeline_parallel_schedule"] = TORCHTITAN_SCHEDULES[plan.pipeline_schedule]
        par["pipeline_parallel_microbatch_size"] = plan.mbs
        stages = plan.pp * plan.vpp
        if job.model.num_layers % stages == 0 and plan.stage_layers in (
                None, plan.layers_per_stage(job.model.num_layers)) and len(
                set(plan.layers_per_stage(job.model.num_layers))) == 1:
            par["pipeline_parallel_layers_per_stage"] = job.model.num_layers // stages
            par["pipeline_parallel_first_stage_less_layers"] = 0
            par["pipeline_parallel_last_stage_less_layers"] = 0
        else:
            par["module_fqns_per_model_part"] = module_fqns(
                job, plan, "lm_head" if fmt == "torchtitan" else "output")
        # the whole per-replica batch goes through the pipeline schedule in one step
        local_batch = plan.mbs * plan.num_microbatches
    sections: dict[str, dict[str, Any]] = {
        "training": {
            "local_batch_size": local_batch,
            "global_batch_size": job.global_batch,
            "seq_len": job.seq_len,
        },
        "parallelism": par,
        "activation_checkpoint": {"mode": plan.recompute},
    }
    if fmt == "torchtitan":
        # 0.3.0 only: TP without sequence parallelism is an option (configs.py:160), and CUDA
        # graphs (on by default) refuse pipelines and host-synchronising EP dispatch
        # (trainer.py:179-209); the plan's step time does not count CUDA graphs
        par["enable_sequence_parallel"] = bool(plan.sp) or plan.tp == 1
        if plan.pp > 1 or plan.ep > 1:
            sections["training"]["disable_cuda_graphs"] = True
    # run what was costed: torch.compile exactly when the recipe fuses (the torchtitan-fsdp
    # recipe costs torch.compile per block), async TP exactly when it costs it
    # (tp_comm_overlap > 0, cost/async_tp.py); both set, so a baseline's own values (the
    # llama3_405b() baseline turns both on: config_registry.py:295-299) never apply.
    # 0.3.0: CompileConfig(enable, enable_async_tensor_parallel) (configs.py:290-310); v0.2.2:
    # [compile] enable (job_config.py:721-723) and [parallelism] enable_async_tensor_parallel
    # (job_config.py:357)
    compiled = _compiled(job)
    async_tp = job.recipe.behaviour.tp_comm_overlap > 0 and plan.tp > 1 and compiled
    sections["compile"] = {"enable": compiled}
    if fmt == "torchtitan":
        sections["compile"]["enable_async_tensor_parallel"] = async_tp
    else:
        par["enable_async_tensor_parallel"] = async_tp
    if plan.recompute == "selective":
        # op-level SAC, which frameworks.py only lets through for a recipe that costs it
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    if job.recipe.compute_dtype == "fp8":
        # v0.2.2 registers the converter as "quantize.linear.float8"
        # (components/quantization/float8.py:238); 0.3.0 takes Float8LinearConverter.Config
        sections["model"] = {"converters": ["quantize.linear.float8"]}
        if job.recipe.behaviour.fsdp_float8_all_gather:
            if fmt == "torchtitan-toml":
                # v0.2.2 job_config.py:732 `Float8Linear.enable_fsdp_float8_all_gather` (used
                # when FSDP shards and no recipe_name is set: float8.py:60-90)
                sections["quantize.linear.float8"] = {"enable_fsdp_float8_all_gather": True}
            else:
                notes.append("the recipe gathers fp8 weights (fsdp_float8_all_gather), but "
                             "torchtitan 0.3.0's float8 converter has no such option (rowwise "
                             "recipes only): its FSDP gathers move bf16, more than the plan's "
                             "step time assumed")
    return sections, notes


def torchtitan_toml(job: Job, plan: Plan) -> tuple[str, list[str]]:
    """The torchtitan v0.2.2 TOML job-config sections as text, and notes."""
    sections, notes = torchtitan_settings(job, plan, "torchtitan-toml")
    lines = [
        f"# torchtitan config sections for {VERSIONS['torchtitan-toml']}: {job.model.name} "
        f"on {job.num_gpus} GPUs (NGPU={job.num_gpus})",
        f"# plan: {plan_comment(plan)}",
    ]
    lines += [f"# note: {n}" for n in notes]
    for name, values in sections.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n", notes


def _py(v: Any) -> str:
    return repr(v)


def torchtitan_python(job: Job, plan: Plan) -> tuple[str, list[str]]:
    """A torchtitan 0.3.0 configuration module: `autoparallel_plan()` returns a Trainer.Config.

    It starts from torchtitan's own baseline for the model (config_registry) and sets every
    plan field; run it with `--module <this module> --config autoparallel_plan`
    (torchtitan/config/manager.py).
    """
    sections, notes = torchtitan_settings(job, plan, "torchtitan")
    module, baseline, flavor = TORCHTITAN_MODELS[job.model.name]
    tr, par = sections["training"], sections["parallelism"]
    ac = sections["activation_checkpoint"]["mode"]
    lines = [
        f"# torchtitan configuration for {VERSIONS['torchtitan']}: {job.model.name} on "
        f"{job.num_gpus} GPUs",
        f"# plan: {plan_comment(plan)}",
        f"# run: NGPU={job.num_gpus} MODULE=<this module> CONFIG=autoparallel_plan "
        "./run_train.sh",
        "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
        f"from torchtitan.models.{module} import model_registry",
        f"from torchtitan.models.{module}.config_registry import {baseline}",
        "from torchtitan.trainer import Trainer",
    ]
    if ac in ("full", "selective"):
        policy = "FullAC" if ac == "full" else "SelectiveAC"
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {policy}")
    if "model" in sections:
        lines.append("from torchtitan.components.quantization import Float8LinearConverter")
    lines += [
        "",
        "",
        "def autoparallel_plan() -> Trainer.Config:",
        f"    config = {baseline}()",
    ]
    extra = ""
    if job.model.mtp_layers:  # the plan costs MTP; torchtitan's 671B flavor defaults to none
        extra += f", num_mtp_layers={job.model.mtp_layers}"
    comp = sections["compile"]
    if "model" in sections:  # the converter is told whether the model is compiled
        extra += (", converters=[Float8LinearConverter.Config(model_compile_enabled="
                  f"{comp['enable']!r})]")
    lines.append(f"    config.model_spec = model_registry({flavor!r}{extra})")
    lines.append("    config.training = TrainingConfig(")
    lines += [f"        {k}={_py(v)}," for k, v in tr.items()]
    lines.append("    )")
    lines.append("    config.compile = CompileConfig(" + ", ".join(
        f"{k}={_py(v)}" for k, v in comp.items()) + ")")
    lines.append("    config.parallelism = ParallelismConfig(")
    lines += [f"        {k}={_py(v)}," for k, v in par.items()]
    lines.append("    )")
    if ac == "full":
        lines.append("    config.activation_checkpoint = FullAC.Config()")
    elif ac == "selective":
        lines.append("    config.activation_checkpoint = SelectiveAC.Config()")
    else:
        lines.append("    config.activation_checkpoint = None")
    lines.append("    return config")
    return "\n".join(lines) + "\n", notes
