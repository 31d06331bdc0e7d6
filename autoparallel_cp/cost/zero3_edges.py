"""ZeRO-3 collectives of the parameters outside the transformer layers (embedding, final norm,
LM head), per micro-batch.

PyTorch FSDP shards every transformer block as its own unit and leaves the embedding, the final
norm and the LM head to the root unit: torchtitan and OLMo-core call `fully_shard` on each block
and then on the whole model (allenai/OLMo-core @a7de3f651c src/olmo_core/nn/transformer/
model.py:362-368, "full" wrapping; torchtitan `apply_fsdp` the same). In every micro-batch:

- the root's parameters are all-gathered in the root's pre-forward, before the first block, so
  no compute of the micro-batch is there to hide the gather; the root is not resharded after
  forward ("For the root, do not reshard after forward since for training, the parameters
  would be freed and all-gathered immediately": torch v2.13.0
  torch/distributed/fsdp/_fully_shard/_fsdp_state.py:203-207, unconditional in the 2.5/2.6
  releases the olmo-core and torchtitan rows ran), so it is gathered once, not twice;
- the root's gradients (the embedding's are the last of the backward) are reduce-scattered in
  the root's post-backward, run from the final callback when the forward inputs (token ids)
  need no gradient, and the compute stream waits for the reduce-scatter before the callback
  returns (_fsdp_state.py:395-431 `_root_post_backward_final_callback`), every micro-batch
  unless gradient sync is off (`zero3_reduce == "step"` or `pp_defers_reduce`: then the
  reduction stays in the step's DP synchronisation, `sync.dp_sync_factors`).

Both are charged whole (exposed), in the gather dtype of the layers' bf16 weights (the
embedding is no linear layer and the LM head stays bf16 under float8: OLMo-core's
`modules_to_ignore={"w_out"}`, torchtitan's `output` filter) and the recipe's gradient reduce
dtype, over the ZeRO shard group (dp·cp/rep at stride tp, as the layers' gathers), plus the
replicas' all-reduce under hybrid sharding. The same rule is applied to other frameworks'
ZeRO-3 (Megatron-FSDP, DeepSpeed stage 3): the embedding is the first module of the forward
and the last of the backward, so its gather and reduction have nothing of the micro-batch
after or before them to overlap; for the LM head it is an upper bound by the overlap its
gather could have with the last layers' forward. Before this term the edge parameters were
neither gathered nor (with per-micro-batch reduction) reduced anywhere.

Memory: while the root is gathered (from its pre-forward to its reshard after the backward,
i.e. through the whole micro-batch) every rank holds the unsharded bf16 edge weights,
`zero3_edge_bytes`, charged on the first / last stage as a transient buffer, as the layers'
gathered copies are (`model_state.zero3_buffer_bytes`); search/tables.py adds the same bytes to
its edge state tables (`emb_states`, `head_states`, indexed (tp, zero, dp, cp)).

Solver bounds: the term is a non-negative function of (edge parameters, tp, cp, dp, zero)
only, added per micro-batch to the first / last stage, and search/tables.py adds the same
function to its per-micro-batch edge tables (`emb_mb`, `head_mb`), indexed (tp, zero, dp, cp):
the enumerator, the key master and the per-key model read those tables as before, so CP-SAT
and the enumerator price every plan identically and every bound over those tables stays a
lower bound of this cost.
"""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.common import ArrayLike, FloatArray, _f, node
from autoparallel_cp.cost.pp_grad_sync import pp_deferred
from autoparallel_cp.spec import Job

#: Bytes per gathered edge weight: bf16 (the embedding and the LM head are not fp8 linears).
EDGE_GATHER_BYTES = 2.0


def zero3_edge_s(job: Job, g: int, params: ArrayLike, tp: ArrayLike, cp: ArrayLike,
                 dp: ArrayLike, zero: ArrayLike, rep: ArrayLike = 1) -> FloatArray:
    """Seconds per micro-batch of the ZeRO-3 all-gather (and, with per-micro-batch reduction,
    the reduce-scatter) of `params` edge parameters per GPU (module docstring), exposed; 0 for
    zero < 3, no parameters or a shard group of one rank."""
    nd = node(job, g)
    p, tp_, cp_, dp_, z = (_f(x) for x in (params, tp, cp, dp, zero))
    rep_ = np.maximum(_f(rep), 1.0)
    n_shard = dp_ * cp_ / rep_
    gb = float(job.recipe.grad_reduce_bytes)
    per_mb = np.logical_and(job.recipe.behaviour.zero3_reduce == "microbatch",
                            np.logical_not(pp_deferred(job, tp_, cp_, dp_)))
    gather = comm.all_gather(nd, n_shard, tp_, p * EDGE_GATHER_BYTES)
    reduce = (comm.reduce_scatter(nd, n_shard, tp_, p * gb)
              + comm.replica_all_reduce(nd, n_shard, rep_, tp_, p * gb))
    t = gather + np.where(per_mb, reduce, 0.0)
    on = (z >= 3) & (p > 0) & (dp_ * cp_ > 1)
    return np.where(on, t, 0.0)


def zero3_edge_bytes(params: ArrayLike, zero: ArrayLike) -> FloatArray:
    """Bytes of the unsharded bf16 edge weights a ZeRO-3 rank holds through a micro-batch (the
    root unit gathered, module docstring); 0 below ZeRO-3."""
    return np.where(_f(zero) >= 3, _f(params) * EDGE_GATHER_BYTES, 0.0)
