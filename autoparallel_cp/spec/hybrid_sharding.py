"""Hybrid sharding (HSDP): the plan field `dp_replicate` and its rules (pure functions of
counts; `spec.plan.Plan` carries the field and applies them).

`dp` stays the whole data-parallel size; the model states shard over a shard group of
dp·cp/dp_replicate ranks (ZeRO within the group) and are replicated across `dp_replicate`
such groups; gradients are reduce-scattered within the group and the reduced share is
all-reduced across the replicas (cost/sync.py). The shard group is the inner one in every
framework that runs it:

- torchtitan @b5bcd76c: `data_parallel_replicate_degree` x `data_parallel_shard_degree`
  (torchtitan/config/configs.py:122-150), mesh ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
  (distributed/parallel_dims.py:239), FSDP2 over dp_shard·cp with dp_replicate replicating
  (distributed/fsdp.py:28-29): zero 2 / 3 (`fsdp_reshard_after_forward` never / always);
  PyTorch FSDP2 all-reduces across the replicate group after every reduce-scatter
  (`FSDPParamGroup.all_reduce_grads` defaults to True, torch/distributed/fsdp/_fully_shard/
  _fsdp_param_group.py), and torchtitan never calls `set_requires_all_reduce(False)`;
- Megatron-LM d98e8a64 `--num-distributed-optimizer-instances` (training/arguments.py:3216):
  (dp·cp) % instances == 0, each instance a consecutive slice of the dp-cp ranks
  (core/parallel_state.py:922-929, 984-990), the distributed optimizer (zero 1) within an
  instance, an all-reduce across instances (distributed/param_and_grad_buffer.py:734-745);
  Megatron-FSDP (zero 2 / 3) reads the same flag as its HSDP switch
  (distributed/fsdp/mcore_fsdp_adapter.py:346);
- DeepSpeed: none. MiCS (`mics_shard_size`, @38327e07 runtime/zero/config.py:326) was
  removed: 0.19.8 rejects the key (runtime/config.py:119-125, 133-141), and ZeRO++ hpZ keeps
  the states sharded over all of dp (a different layout); spec/frameworks.py refuses it.
"""

from __future__ import annotations

import math


def replicate_violations(dp: int, zero: int, expert_dp: int, replicate: int,
                         moe: bool) -> list[str]:
    """Rules of hybrid sharding: dp_replicate divides dp (and the MoE experts' DP group,
    whose states shard over expert_dp/dp_replicate ranks: torchtitan's sparse storage mesh
    dp_replicate x efsdp x ep, fsdp.py:29), and something is sharded (zero >= 1)."""
    r = replicate
    if r == 1:
        return []
    out: list[str] = []
    if dp % r:
        out.append(f"dp % dp_replicate: {dp} % {r} != 0 (the shard group is dp/dp_replicate)")
    if zero == 0:
        out.append(f"dp_replicate={r} needs zero >= 1: hybrid sharding replicates sharded "
                   "states, and zero=0 shards none")
    if moe and expert_dp % r:
        out.append(f"expert-DP group % dp_replicate: {expert_dp} % {r} != 0 (the experts' "
                   "states shard over expert_dp/dp_replicate ranks)")
    return out


def node_shard_replicas(tp: int, cp: int, dp: int, gpus_per_node: int) -> int:
    """The replicas R that the search tries for a key (tp, cp, dp): the shard group is the
    fewest whole nodes that hold at least two state-shard ranks, and R = dp / dp_shard its
    copies; 1 (no such layout) when dp_shard does not divide dp or R < 2.

    The mesh is ["pp", "dp_replicate", "dp_shard", "cp", "tp"] (torchtitan parallel_dims.py:239,
    Megatron's instances are consecutive dp-cp slices), so a shard group is tp·cp·dp_shard
    consecutive GPUs. PyTorch FSDP's HYBRID_SHARD is "FULL_SHARD within a node, and replicate
    parameters across nodes" (torch.distributed.fsdp.ShardingStrategy docs; its default
    process groups are the node's ranks, `_init_intra_and_inter_node_groups`): the shard
    group is one node, dp_shard = gpus_per_node / (tp·cp). Where tp·cp fills a node (no two
    shard ranks in it), torchtitan's dp_shard and Megatron's instance size take any divisor,
    and the fewest whole nodes with two shard ranks keep the per-layer gathers on the fewest
    network hops. A shard group smaller than a node leaves part of the node's NVLink to the
    replicas' all-reduce and saves no network traffic, a larger one is one more search axis
    per key; both stay evaluable and pinnable (`--fix dp_replicate=R` searches R alone)."""
    span = tp * cp
    shard = math.lcm(span, gpus_per_node) // span  # dp_shard: whole nodes
    if cp * shard < 2:
        shard *= 2  # one node holds a single shard rank (tp·cp fills it): two nodes' worth
    if dp % shard or dp // shard < 2:
        return 1
    return dp // shard
