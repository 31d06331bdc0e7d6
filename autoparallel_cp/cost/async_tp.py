"""PyTorch async tensor parallelism (Inductor's micro-pipeline TP), per layer and pass.

torchtitan's `enable_async_tensor_parallel` sets `torch._inductor.config._micro_pipeline_tp`
(torchtitan models/llama3/parallelize_llama.py @820504e). Inductor's post-grad pass
(torch/_inductor/fx_passes/micro_pipeline_tp.py @5f65158a, `micro_pipeline_tp_pass`, called
from `post_grad_passes` when `config._micro_pipeline_tp` is set, so on every graph
it compiles: forward, backward and the recompute inside backward) rewrites

- an all-gather whose result feeds matmuls as their left operand (`_find_consumer_matmuls`)
  into one `symm_mem.fused_all_gather_matmul` (or `..._scaled_matmul` for float8) over all of
  them, and
- a reduce-scatter whose input is produced by a single matmul (`_find_producer_matmul`: a mm,
  or reshape -> mm -> reshape, with one user) into `fused_matmul_reduce_scatter`.

With sequence parallelism each layer runs an all-gather before the QKV and the MLP up
projections and a reduce-scatter after the output and down projections. Forward: all four
fuse. Backward: the gradient all-gathers before the output / down projections' dgrad fuse
(the dgrad matmul takes the gathered gradient as its left operand; the wgrad reads it
transposed and gets the gathered tensor the fused op returns), but the reduce-scatters after
the QKV and up projections' dgrad do not: their input is the *sum* of two or three matmul
outputs (wq/wk/wv, w1/w3 read the same gathered input), not a matmul. Those two stay plain
NCCL collectives, with the DTensor layout copies around them (`layer_ops.dtensor_sp_copy_bytes`).

Inside a fused op (torch/distributed/_symmetric_memory/__init__.py @006b161f, read in place of
the rows' torch 38410cf9, which was not at hand; `_pipelined_all_gather_and_consume` /
`_pipelined_produce_and_all2all`) the matmul runs as
`tp` row chunks on two alternating streams while each peer's shard is copied over NVLink, one
shard per step: the copies are hidden only behind the chunks' matmuls. With a collective of
`C` seconds and a matmul of `G`, the first chunk's matmul (all-gather: the local shard;
reduce-scatter: the chunk the first copy waits for) has no copy beside it, so the op takes
max(G, C + G/tp) and exposes max(0, C - G (tp-1)/tp) beyond the matmul. Besides that, the
all-gather first copies the local shard into the symmetric-memory buffer and waits on a
barrier before any matmul starts (the source says it deliberately forgoes overlapping that
copy with the first chunk), and the reduce-scatter sums the `tp` pulled partials in one more kernel
(`torch.sum` over the stacked partials: reads the full b·s·h output, writes the shard).

torchtitan's op-level SAC (`_save_list`, parallelize_llama.py @820504e) saves mm, SDPA and
reduce-scatter outputs but not the all-gathers: backward replays both all-gathers of a layer
(the replayed wk / w3 matmuls and every column-parallel wgrad need the gathered input), as
plain collectives with their layout copies, or under async TP fused with the replayed matmuls
that read them (`op_sac_replayed_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.activations import _op_sac_matmuls
from autoparallel_cp.cost.common import FloatArray
from autoparallel_cp.cost.efficiency import gemm_time
from autoparallel_cp.cost.straggler import job_compute_stretch
from autoparallel_cp.spec import GPUSpec, Job

#: the layer's GEMMs that read the all-gathered attention input (Llama: wq/wk/wv)
ATTN_IN = ("qkv", "q_proj", "q_down", "kv_down")


def fused_exposed(comm_s: FloatArray, gemm_s: FloatArray, tp: FloatArray) -> FloatArray:
    """Seconds a micro-pipelined collective + matmul adds beyond the matmul alone.

    `tp` chunks of the matmul (each G/tp) run beside tp-1 shard copies (C/(tp-1) each); the
    first chunk has no copy to hide, so the copies are hidden behind G (tp-1)/tp at most.
    """
    return np.maximum(0.0, comm_s - gemm_s * (tp - 1.0) / tp)


@dataclass(frozen=True)
class AsyncTP:
    """Exposed TP seconds of one layer's forward and backward pass and of the all-gathers
    op-level SAC replays, and the HBM bytes per token of the DTensor layout copies left in
    backward (the unfused reduce-scatters)."""

    fwd_s: FloatArray
    bwd_s: FloatArray
    replay_s: FloatArray
    bwd_copy_bytes: float


def op_sac_replayed_inputs(job: Job, moe: bool, gpu: GPUSpec, tokens: FloatArray,
                           tp: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Seconds of the column-parallel matmuls op-level SAC replays that read the gathered
    attention input and the gathered MLP input (Llama: wk and w3; `_op_sac_matmuls`)."""
    attn = np.zeros_like(tokens)
    mlp = np.zeros_like(tokens)
    mms = _op_sac_matmuls(job, moe)
    if mms is None:
        return attn, mlp
    n_attn = 3  # wq, wk, wv precede wo
    for idx in range(1, len(mms), 2):
        i, o, col = mms[idx]
        if not col:
            continue
        t = job_compute_stretch(job) * gemm_time(gpu, tokens, i, o / tp,
                                                 job.recipe.compute_dtype)
        if idx < n_attn:
            attn = attn + t
        else:
            mlp = mlp + t
    return attn, mlp


def async_tp_layer(ag_s: FloatArray, rs_s: FloatArray, tp: FloatArray,
                   fwd: dict[str, FloatArray], dgrad: dict[str, FloatArray],
                   stage_s: FloatArray, reduce_s: FloatArray,
                   replay: tuple[FloatArray, FloatArray], copy_bytes_rs: float) -> AsyncTP:
    """Exposed TP time of a dense layer under Inductor's micro-pipeline TP (module docstring).

    `ag_s`: one all-gather of the layer's b·s·h activation (or its gradient) over tp, in the
    gather dtype (`layer_ops.sp_gather_bytes`); `rs_s`: one reduce-scatter of b·s·h in the
    activation dtype; `fwd` / `dgrad`: each GEMM's forward / input-gradient seconds by name
    (flops.layer_gemms); `stage_s`: the all-gather's exposed local-shard copy (b·s·h/tp read +
    written); `reduce_s`: the reduce-scatter's partials sum (b·s·h read, b·s·h/tp written);
    `replay`: the op-SAC replayed matmuls reading the attention / MLP gathers
    (`op_sac_replayed_inputs`); `copy_bytes_rs`: HBM bytes per token of one unfused
    reduce-scatter's layout copy. A collective whose matmul is not in the layer (MoE blocks)
    stays a plain collective.
    """
    zero = np.zeros_like(rs_s)

    def gemm(table: dict[str, FloatArray], *names: str) -> FloatArray | None:
        got = [table[n] for n in names if n in table]
        return sum(got, zero) if got else None

    def ag(g: FloatArray | None) -> FloatArray:
        return ag_s if g is None else fused_exposed(ag_s, g, tp) + stage_s

    def rs(g: FloatArray | None) -> FloatArray:
        return rs_s if g is None else fused_exposed(rs_s, g, tp) + reduce_s

    fwd_s = (ag(gemm(fwd, *ATTN_IN)) + rs(gemm(fwd, "out_proj"))
             + ag(gemm(fwd, "mlp_fc1")) + rs(gemm(fwd, "mlp_fc2")))
    # backward: the gradient all-gathers feed the out / down projections' dgrad; the
    # reduce-scatters after the QKV / up projections' summed dgrads stay plain collectives
    bwd_s = ag(gemm(dgrad, "out_proj")) + ag(gemm(dgrad, "mlp_fc2")) + 2.0 * rs_s
    replay_s = ag(replay[0]) + ag(replay[1])
    return AsyncTP(fwd_s, bwd_s, replay_s, 2 * copy_bytes_rs)
