"""Capability rows of the frameworks the tool costs but emits no settings for: Megatron-DeepSpeed
(the `deepspeed` recipe) and PyTorch FSDP1 (the `pytorch-fsdp` recipe). Read by
`frameworks.rules_for` with the emitted frameworks' rows (spec/frameworks.py)."""

from __future__ import annotations

from autoparallel_cp.spec.framework_rule import Rule

_FSDP = "PyTorch FSDP1 torch/distributed/fsdp"
_FSDP1_ONLY = ("FullyShardedDataParallel shards one data-parallel group (a second, replicated "
               "level only with HYBRID_SHARD); the recipe costs no tensor, pipeline, context "
               "or expert parallelism from another library")

_MDS = "Megatron-DeepSpeed f4157bea"

#: Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed), which the `deepspeed` recipe costs:
#: Megatron's TP (and sequence-parallel) layers in DeepSpeed's PipelineModule and engine. No
#: emitter: `--recipe deepspeed` searches its plans, `--emit deepspeed` DeepSpeed's own.
MDS_RULES: tuple[Rule, ...] = (
    Rule("megatron-deepspeed", "zero",
         "with pp > 1 deepspeed.initialize returns DeepSpeed's PipelineEngine, which asserts "
         "ZeRO stage < 2",
         f"{_MDS} megatron/training.py:504-509 (the PipelineEngine) and DeepSpeed 0.19.8 "
         "deepspeed/runtime/pipe/engine.py:76-77",
         lambda j, p: {"zero": 1} if p.pp > 1 and p.zero >= 2 else None),
    Rule("megatron-deepspeed", "vpp",
         "the pipeline is DeepSpeed's PipelineModule (GPTModelPipe) run by its TrainSchedule, "
         "one stage per rank; Megatron's interleaved schedule is not used with --deepspeed",
         f"{_MDS} megatron/model/gpt_model.py:322,454-461 and DeepSpeed 0.19.8 "
         "deepspeed/runtime/pipe/schedule.py:189 (TrainSchedule)",
         lambda j, p: {"vpp": 1} if p.vpp > 1 else None, domain=lambda j: {"vpp": (1,)}),
    Rule("megatron-deepspeed", "schedule",
         "DeepSpeed's PipelineEngine runs its TrainSchedule, a 1F1B schedule; no GPipe, "
         "zero-bubble or DualPipe schedule",
         f"{_MDS} megatron/training.py:504-509 (the PipelineEngine) and DeepSpeed 0.19.8 "
         "deepspeed/runtime/pipe/schedule.py:189 (TrainSchedule)",
         lambda j, p: {"schedule": "1f1b"} if p.pipeline_schedule not in ("1f1b",) else None),
    Rule("megatron-deepspeed", "cp",
         "no ring context parallelism: its sequence parallelism over ranks is DeepSpeed "
         "Ulysses (--ds-sequence-parallel-size, an all-to-all on heads), a different cost",
         f"{_MDS} megatron/arguments.py:974-975 (--ds-sequence-parallel-size)",
         lambda j, p: {"cp": 1} if p.cp > 1 else None, domain=lambda j: {"cp": (1,)}),
    Rule("megatron-deepspeed", "dp_replicate",
         "no hybrid sharding: the ZeRO engine is DeepSpeed's, whose MiCS is removed (its "
         "mics_shard_size key rejected) and whose hpZ keeps the states sharded over all of dp",
         f"{_MDS} megatron/training.py:504-509 (deepspeed.initialize) and DeepSpeed 0.19.8 "
         "deepspeed/runtime/config.py:119-125,133-141 (_reject_removed_config_keys)",
         lambda j, p: {"dp_replicate": 1} if p.dp_replicate > 1 else None),
)

#: PyTorch FSDP1 as the `pytorch-fsdp` recipe runs it (llm-foundry / Composer, HF Accelerate)
FSDP1_RULES: tuple[Rule, ...] = tuple(
    Rule("pytorch-fsdp", axis, _FSDP1_ONLY,
         f"{_FSDP}/fully_sharded_data_parallel.py (FullyShardedDataParallel(process_group | "
         "device_mesh, sharding_strategy)), api.py:31 (ShardingStrategy)",
         (lambda a: lambda j, p: {a: 1} if getattr(p, a) > 1 else None)(axis),
         domain=(lambda a: lambda j: {a: (1,)})(axis))
    for axis in ("tp", "pp", "cp", "ep", "vpp")
) + (
    Rule("pytorch-fsdp", "zero",
         "ShardingStrategy is FULL_SHARD (zero=3), SHARD_GRAD_OP (zero=2) or NO_SHARD "
         "(zero=0): no optimizer-only sharding",
         f"{_FSDP}/api.py:31-61 (ShardingStrategy)",
         lambda j, p: {"zero": 2} if p.zero == 1 else None,
         domain=lambda j: {"zero": (0, 2, 3)}),
    Rule("pytorch-fsdp", "recompute",
         "activation checkpointing wraps whole modules (checkpoint_wrapper through "
         "apply_activation_checkpointing's check_fn); no attention-core-only recompute",
         "PyTorch torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py "
         "(apply_activation_checkpointing)",
         lambda j, p: {"recompute": "full"} if p.recompute == "selective" else None,
         domain=lambda j: {"recompute": ("none", "full")}),
)
