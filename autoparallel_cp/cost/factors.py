"""The cost model in factor form (docs/design.md): per-layer and per-stage numbers, vectorized.

API summary for the solver (all functions are pure; array arguments broadcast with numpy; `g`
is a scalar node-group index into `job.cluster.node_groups`; `mode` is 0 none / 1 selective /
2 full or the string):

- ``layer_factors(job, g, tp, cp, ep, sp, mbs, mode, moe=False, options=None, etp=None)
  -> LayerFactors``
  per layer, per micro-batch: ``act_bytes`` (kept per in-flight micro-batch), ``ckpt_bytes``
  (kept when the layer is fully recomputed), ``work_bytes`` (transient while this layer runs its
  backward), ``time_s`` (fwd + bwd incl. exposed TP/CP/EP comm), ``recompute_s`` (extra time when
  fully recomputed), and the parts ``compute_s``, ``tp_s``, ``cp_s``, ``ep_s``.
  Use ``mode=2`` rows for the recomputed layers (``ckpt_bytes`` / ``recompute_s``) and the
  plan's base mode (0 or 1) for the others (``act_bytes``): a plan with ``recompute=full`` and
  ``recompute_layers=r`` has ``l - r`` layers in mode 0 (none).
- ``layer_param_counts(job, moe, tp, ep, etp=None) -> (dense, expert)`` parameters per GPU of
  one layer. ``etp`` everywhere is the expert-tensor-parallel size of MoE parallel folding
  (spec/plan.py); None is Megatron's default etp = tp, with exactly the costs before folding.
- ``state_bytes_per_param(recipe, zero, shard) -> (weights, grads, optimizer)`` bytes per
  parameter held on a GPU whose ZeRO shard group has ``shard`` members
  (dense params: ``shard = dp*cp``; expert params: ``shard = expert_dp_size(tp, cp, dp, ep,
  etp)``, dp*cp/ep by default; both divided by ``dp_replicate`` under hybrid sharding).
- ``edge_factors(job, g, tp, cp, sp, mbs, options) -> EdgeFactors`` first stage (embedding:
  ``emb_*``) and last stage (final norm + LM head + loss: ``head_*``): params per GPU, bytes per
  in-flight micro-batch (first stage), transient bytes (last stage), time per micro-batch.
- ``mtp_factors(job, g, tp, cp, sp, mbs, options) -> MtpFactors`` one DeepSeek-V3 MTP depth
  without its transformer layer (last stage; ``mtp_layer_kind(job)`` is that layer's kind,
  ``mtp_recomputed(plan)`` whether the plan's recompute replays it).
- ``buffer_bytes_per_param(job, zero)`` transient copies per parameter on the GPU
  (pytorch-amp autocast weight copies); ``zero3_buffer_bytes(job, tp, ep, zero)``.
- ``p2p_factor(job, g, tp, cp, sp, mbs, pp, vpp, dp)`` per micro-batch pipeline send/recv time.
- ``dp_sync_factors(job, g, tp, cp, dp, ep, zero, etp=None, rep=1)`` -> (s per dense param on
  the GPU, s per expert param, zero3 all-gather s per dense param per micro-batch, fixed latency s).
- ``fsdp_call_latency(job, g, tp, cp, dp, zero, rep=1)`` -> (s per layer per micro-batch, s per
  layer per step) of PyTorch FSDP's per-unit collective calls (NCCL ring latency).
- ``optimizer_factor(job, g)`` -> s per parameter shard element updated.
- ``inflight(pp, vpp, m, stage)`` in-flight micro-batches of a stage (1F1B / interleaved);
  ``stage_inflight(pp, vpp, m, stage, chunks)`` the same for a stage whose model chunks hold
  unequal layer counts (``Plan.chunks_per_stage``).
- ``OTHER_BYTES``, ``overhead_bytes(peak, persistent)``: constant allowances and the
  allocator's fragmentation on the transient bytes; ``charged_bytes``, ``transient_charge``,
  ``grad_charge``: the same rule as the per-byte charges the search's tables apply.

This module is the contract between the cost model and the search: it gathers the factor
functions, which live one concern per module in this package. The composition (docs/design.md)
is implemented once in memory.py / steptime.py.
"""

from __future__ import annotations

from autoparallel_cp.cost.activations import (
    ActBreakdown,
    korthikanti_gpt_layer_bytes,
    layer_activation_per_token,
)
from autoparallel_cp.cost.comm import overlap_exposed
from autoparallel_cp.cost.common import CostOptions, options_for, recipe_options
from autoparallel_cp.cost.constants import (
    ALLOCATOR_FRAGMENTATION,
    CE_BYTES_PER_LOGIT,
    COMM_SM_SHARE,
    CUDA_CONTEXT_BYTES,
    DP_TAIL_FRACTION,
    MODE_CODES,
)
from autoparallel_cp.cost.embedding_head import EdgeFactors, edge_factors
from autoparallel_cp.cost.layer_factors import LayerFactors, layer_factors
from autoparallel_cp.cost.model_state import (
    OTHER_BYTES,
    buffer_bytes_per_param,
    charged_bytes,
    fragmentation_bytes,
    grad_charge,
    layer_param_counts,
    other_bytes,
    overhead_bytes,
    persistent_bytes,
    persistent_grads,
    state_bytes_per_param,
    transient_charge,
    zero3_buffer_bytes,
)
from autoparallel_cp.cost.mtp import MtpFactors, mtp_factors, mtp_layer_kind, mtp_recomputed
from autoparallel_cp.cost.optimizer_step import optimizer_factor
from autoparallel_cp.cost.sync import (
    dp_sync_factors,
    expert_dp_size,
    fsdp_call_latency,
    inflight,
    microbatch_grad_factors,
    p2p_factor,
    stage_inflight,
    zero3_copy_factor,
)
from autoparallel_cp.cost.tied_embedding_sync import tied_embedding_sync_s
from autoparallel_cp.cost.zero3_edges import zero3_edge_bytes, zero3_edge_s

__all__ = [
    "ActBreakdown", "korthikanti_gpt_layer_bytes", "layer_activation_per_token", "CostOptions",
    "options_for", "recipe_options", "ALLOCATOR_FRAGMENTATION", "CE_BYTES_PER_LOGIT",
    "COMM_SM_SHARE", "CUDA_CONTEXT_BYTES", "DP_TAIL_FRACTION", "MODE_CODES", "EdgeFactors",
    "edge_factors", "LayerFactors", "layer_factors", "overlap_exposed", "OTHER_BYTES",
    "buffer_bytes_per_param", "layer_param_counts", "other_bytes", "overhead_bytes",
    "state_bytes_per_param", "zero3_buffer_bytes", "dp_sync_factors", "inflight",
    "optimizer_factor", "p2p_factor", "zero3_copy_factor", "stage_inflight", "expert_dp_size",
    "microbatch_grad_factors", "fsdp_call_latency", "MtpFactors", "mtp_factors",
    "mtp_layer_kind", "mtp_recomputed",
    "charged_bytes", "fragmentation_bytes", "grad_charge",
    "persistent_bytes", "persistent_grads", "transient_charge", "zero3_edge_s",
    "zero3_edge_bytes", "tied_embedding_sync_s",
]
