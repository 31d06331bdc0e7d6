"""The context-parallel ring of one layer: its K, V exchange (and dK, dV return), how much of it
the ring's attention steps hide, and the HBM traffic of torch's per-step fp32 merge (the CP part
of `layer_factors`).

Two rings (`FrameworkBehaviour.cp_ring`):
- "p2p" (Megatron-Core / Transformer Engine): one K, V send per ring step, hidden behind that
  step's attention (Megatron CP doc); backward shifts dK, dV (twice the bytes) the same way.
- "torch-allgather": PyTorch's `_templated_ring_attention` and its backward
  (torch/distributed/tensor/experimental/_attention.py, torch nightly 2024-12) with torchtitan's
  default `context_parallel_rotate_method="allgather"` (torchtitan 9dec370 config_manager.py):
  the K, V of all cp ranks are gathered once (`_AllGatherRotater`), in forward and again in
  backward; dK, dV accumulate in fp32 (`_cp_options.convert_to_f32=True`) and are shifted to
  the next rank after every step (`_AllToAllRotater`, cp shifts, the last waited after the loop).
"""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.comm import overlap_exposed
from autoparallel_cp.cost.common import FloatArray
from autoparallel_cp.spec import NodeGroup

#: HBM bytes per element of an fp32 running accumulator that one ring step after the first
#: updates: read the fp32 running value (4), read the step's bf16 result (2), write fp32 (4).
#: `_SDPAMerger._merge_one` (out), and in backward `grad_query += grad_query_` and the dK, dV
#: `_partial_update` / `+=` before `torch.cat` for the shift; a lower bound however the update
#: is fused (eager runs it as several kernels).
RING_ACCUM_BYTES_PER_ELEMENT = 10.0
#: HBM bytes per element of the final fp32 -> bf16 cast of each accumulator (read 4, write 2):
#: `_SDPAMerger.results` (out) and the backward's `grad_query.to(...)`, `.to(key.dtype)` (dK, dV).
RING_CAST_BYTES_PER_ELEMENT = 6.0


def torch_ring_merge_bytes(tokens: FloatArray, q_elems_per_token: FloatArray,
                           kv_elems_per_token: FloatArray,
                           cp: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(forward, backward) HBM bytes of torch ring attention's fp32 bookkeeping for one layer.

    `q_elems_per_token`: output (= query) elements per token on this rank (heads/tp x head dim);
    `kv_elems_per_token`: K (= V) elements per token as the ring carries them (after a
    `repeat_kv` expansion, every query head). With load balancing every step i >= 1 updates
    the rank's whole fp32 output (rows it did not compute are copied by `_partial_update`'s
    `torch.cat`), and in backward the whole fp32 dQ and dK, dV; cp - 1 such steps per pass.
    Forward: (cp-1) accumulations of out, one cast. Backward: (cp-1) accumulations of dQ, dK, dV,
    three casts. cp = 1 runs no ring: 0.
    """
    steps = np.maximum(cp - 1.0, 0.0)
    ring = (cp > 1).astype(np.float64)
    q = tokens * q_elems_per_token
    kv = tokens * kv_elems_per_token
    fwd = (steps * RING_ACCUM_BYTES_PER_ELEMENT + RING_CAST_BYTES_PER_ELEMENT) * q * ring
    bwd = (steps * RING_ACCUM_BYTES_PER_ELEMENT + RING_CAST_BYTES_PER_ELEMENT) \
        * (q + 2.0 * kv) * ring
    return fwd, bwd


#: Transformer Engine's p2p ring (`AttnFuncWithCPAndKVP2P`, transformer_engine/pytorch/
#: attention/dot_product_attention/context_parallel.py @d0067d0da), bf16 path, HBM bytes per
#: output element: the first step's correction writes the fp32 `out` from its bf16 partial
#: (`flash_attn_fwd_out_correction_init`: read 2, write 4), each later step reads its bf16
#: partial and reads and writes `out` (read 2 + 4, write 4; l. 1980-2027: "out in
#: torch.float32"), and `out` is cast to bf16 twice (`out_part` l. 2030, `out_f16` l. 2073).
TE_RING_INIT_BYTES_PER_ELEMENT = 6.0
TE_RING_STEP_BYTES_PER_ELEMENT = 10.0
TE_RING_CASTS_BYTES_PER_ELEMENT = 12.0
#: ... and in backward each step's dQ and dK, dV partials are added into the bf16 buffers (read
#: 2 + 2, write 2: `dq.add_(dq_)`, `dk.add_(dk_)`, `dv.add_(dv_)`, l. 2664-2800).
TE_RING_GRAD_ADD_BYTES_PER_ELEMENT = 6.0


def te_ring_merge_bytes(tokens: FloatArray, q_elems_per_token: FloatArray,
                        kv_elems_per_token: FloatArray,
                        cp: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(forward, backward) HBM bytes of Transformer Engine's p2p ring bookkeeping for one layer
    on the slowest rank, the last (rank cp - 1 corrects its whole output at every step: its
    steps are all on or below the diagonal, l. 1981-1982).

    Forward: init + (cp - 1) steps + two casts over the output (= query) elements. Backward:
    (cp - 1) adds over dQ and, as a lower bound, over one half-chunk's worth of dK and dV each
    (the steps below the diagonal add into the first half only, `dk[:, 0, ...]`), i.e. the
    `kv_elems_per_token` of K. These kernels run between the attention steps on the compute
    stream (the forward correction after the loop), so they add to the layer's time at HBM
    speed; the cost grows with cp while a chunk's attention shrinks, which is what makes short
    chunks dear. cp = 1 runs no ring: 0.
    """
    steps = np.maximum(cp - 1.0, 0.0)
    ring = (cp > 1).astype(np.float64)
    q = tokens * q_elems_per_token
    kv = tokens * kv_elems_per_token
    fwd = (TE_RING_INIT_BYTES_PER_ELEMENT + steps * TE_RING_STEP_BYTES_PER_ELEMENT
           + TE_RING_CASTS_BYTES_PER_ELEMENT) * q * ring
    bwd = steps * TE_RING_GRAD_ADD_BYTES_PER_ELEMENT * (q + kv) * ring
    return fwd, bwd


def ring_exchange(nd: NodeGroup, intra: FloatArray, kv_chunk_bytes: FloatArray, cp: FloatArray,
                  att_f: FloatArray, att_b: FloatArray, ring: str,
                  compiled: bool) -> tuple[FloatArray, FloatArray]:
    """(forward, backward) exposed seconds of one layer's ring exchange.

    `kv_chunk_bytes`: K and V of one rank's chunk (bf16); `att_f`, `att_b`: the layer's
    attention time per pass, split evenly over the cp ring steps. `compiled`: the ring is
    traced by torch.compile (torchtitan compiles each block, `fullgraph=True`): a functional
    collective traced there is waited on right after it is issued
    (torch/distributed/_functional_collectives.py `_maybe_wrap_tensor` returns `wait_tensor`
    when `_are_we_tracing()`), and Inductor moves waits only under
    `reorder_for_compute_comm_overlap`, False by default (torch/_inductor/config.py) and not
    set by torchtitan 9dec370 (which sets only `_micro_pipeline_tp`), so the gather and every
    dK, dV shift run between the attention steps, none hidden. Only the torch ring reads it.
    """
    step = comm.p2p(nd, intra, kv_chunk_bytes)
    on = cp > 1
    att_step_f = att_f / np.maximum(cp, 1)
    att_step_b = att_b / np.maximum(cp, 1)
    if ring == "torch-allgather":
        gather = (cp - 1) * step
        if compiled:
            return (np.where(on, gather, 0.0),
                    np.where(on, gather + cp * 2 * step, 0.0))
        # eager: the gather is waited on at the second step (one step of compute hides it);
        # each dK, dV shift at the next step, the last after the loop
        return (np.where(on, overlap_exposed(gather, att_step_f), 0.0),
                np.where(on, overlap_exposed(gather, att_step_b)
                         + (cp - 1) * overlap_exposed(2 * step, att_step_b) + 2 * step, 0.0))
    return (np.where(on, (cp - 1) * overlap_exposed(step, att_step_f) + step, 0.0),
            np.where(on, (cp - 1) * overlap_exposed(2 * step, att_step_b) + 2 * step, 0.0))
