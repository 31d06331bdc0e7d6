"""DeepSpeed 0.19 JSON config keys for a plan, and the code-side settings it needs.

Batch identity: DeepSpeedConfig asserts train_batch_size == micro_batch_per_gpu *
gradient_accumulation_steps * world_size (0.19.8 deepspeed/runtime/config.py:600-604), where
world_size is the mpu's data-parallel size, or every rank when no mpu is given (config.py:456-470).
The JSON therefore holds the plan's batch only with the mpu/topology printed in the notes: a
PipelineModule topology for pp > 1 (deepspeed/__init__.py:582-583 takes model.mpu()), and for
tp > 1 an mpu whose data-parallel size is dp.
"""

from __future__ import annotations

from typing import Any

from autoparallel_cp.emit.common import refuse_unrunnable
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import fp8_library
from autoparallel_cp.spec.plan import Plan


def deepspeed_config(job: Job, plan: Plan) -> tuple[dict[str, Any], list[str]]:
    """A DeepSpeed JSON config (as a dict) for the plan, and the code-side settings it needs."""
    refuse_unrunnable(job, plan, "deepspeed")
    notes: list[str] = []
    cfg: dict[str, Any] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": plan.mbs,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": plan.zero},
    }
    if plan.optimizer_offload:  # ZeRO-Offload; a partial `ratio` on ZeRO-3 (frameworks.py)
        off: dict[str, Any] = {"device": "cpu", "pin_memory": True}
        if plan.optimizer_offload < 1:
            off["ratio"] = plan.optimizer_offload
        cfg["zero_optimization"]["offload_optimizer"] = off
    if job.recipe.weight_bytes == 2:
        # the recipe's layout: bf16 weights, fp32 master and fp32 gradient accumulation
        # (0.19.8 runtime/constants.py:384 grad_accum_dtype)
        cfg["bf16"] = {"enabled": True}
        # a recipe that accumulates in the bf16 `.grad` (behaviour autograd_grad_accum)
        # asks for bf16 accumulation instead
        accum = "bf16" if job.recipe.behaviour.autograd_grad_accum else "fp32"
        cfg["data_types"] = {"grad_accum_dtype": accum}
    else:
        # fp32 weights and grads with bf16 autocast (constants.py:177-186 torch_autocast)
        cfg["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        notes.append(f"required: deepspeed.initialize(..., mpu=...) with an mpu whose "
                     f"get_data_parallel_world_size() is {plan.dp} (tp={plan.tp}); without it "
                     "DeepSpeed counts every rank as data-parallel and its batch check fails")
    if plan.pp > 1:
        notes.append(
            f"required: model = PipelineModule(layers, topology=PipeDataParallelTopology("
            f"num_pp={plan.pp}, num_dp={plan.dp}), partition_method='parameters' replaced by "
            f"the layer counts {':'.join(map(str, plan.layers_per_stage(job.model.num_layers)))}"
            "); its engine runs gradient_accumulation_steps micro-batches per step")
    if plan.ep > 1:
        # AutoEP (0.19.8 module_inject/auto_ep_config.py:42-50): native deepspeed.moe MoE
        # layers refuse ZeRO-3 (runtime/engine.py:2214-2218), AutoEP does not
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": plan.ep}
    if plan.recompute == "full":
        k = plan.recompute_layers
        which = "every transformer layer" if k is None else f"the first {k} layers of each stage"
        notes.append(f"required: wrap {which} with deepspeed.checkpointing.checkpoint")
    if job.recipe.compute_dtype == "fp8":
        # the library the recipe was costed with (spec.frameworks.fp8_library): it sets what
        # the fp8 linears save for backward and the casts each GEMM pays (cost/fp8_casts.py)
        lib = fp8_library(job)
        notes.append({
            "te": "required: fp8 GEMMs from Transformer Engine layers (te.Linear / "
                  "te.LayerNormLinear under te.fp8_autocast) in the model code, as costed",
            "torchao": "required: fp8 GEMMs from torchao float8 training "
                       "(torchao.float8.convert_to_float8_training on the model, tensorwise "
                       "scaling, under torch.compile), as costed; not Transformer Engine layers",
        }.get(lib, f"required: fp8 GEMMs as the recipe's {lib!r} library runs them"))
    m = job.model
    if m.sliding_window_left is not None:
        # DeepSpeed trains the module it is given and has no attention setting of its own
        # (0.19.8 deepspeed/__init__.py:433 initialize(model=...)); the windowed layers are
        # costed as a local flash kernel that skips the masked-out tiles
        # (cost/flops.py window_kernel_length)
        pat = m.sliding_window_layers
        which = "every layer" if pat is None else (
            f"the layers i with i mod {len(pat)} in "
            "{" + ",".join(str(i) for i, w in enumerate(pat) if w) + "}")
        notes.append(f"required: the model's attention runs the sliding window on {which} "
                     f"(0-based) with a kernel that skips the masked-out keys, e.g. flash-attn "
                     f"window_size=({m.sliding_window_left}, 0) (Hugging Face sliding_window "
                     f"{m.sliding_window_left + 1}); a dense kernel under a window mask costs "
                     "full causal attention")
    return cfg, notes
