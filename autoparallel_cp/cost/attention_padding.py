"""HBM traffic of unpadding q, k, v and padding the attention output back around a variable-
length flash-attention call, forward and backward (recipe behaviour `attention_unpad`).

llm-foundry's `attn_impl: flash` path (`flash_attn_fn`, llmfoundry/models/layers/attention.py
@5e85bd62d, the commit whose sweep.py ran the "Large Scale" H100 table) calls
`flash_attn.bert_padding.unpad_input` on the query, the key and the value, runs
`flash_attn_varlen_func` on the packed tokens, and scatters the output back with `pad_input`,
on every call, padding or not (a missing key-padding mask becomes a mask of ones). In
flash-attn v2.4.2 bert_padding.py, per element of the tensor, in activation-dtype bytes `ab`:

- unpad forward, `IndexFirstAxis`: `torch.gather` of the rows, r1 w1 = 2 (the index is an
  expanded view, one int64 per row);
- unpad backward: a zero-filled gradient w1, then `scatter_` of the rows r1 w1: 3;
- pad forward, `IndexPutFirstAxis`: a zero-filled output w1, then `output[indices] = values`
  r1 w1: 3;
- pad backward: `grad_output[indices]` r1 w1 = 2.

q has `a` heads of dqk, k `kv_heads` of dqk, v `kv_heads` of dv, the output `a` of dv, each
split over tp.
"""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost.common import FloatArray
from autoparallel_cp.cost.flops import attention_dims
from autoparallel_cp.spec import ModelSpec

#: (forward, backward) bytes per q/k/v element of `unpad_input`, in activation-dtype units
UNPAD_RW = (2.0, 3.0)
#: (forward, backward) bytes per output element of `pad_input`, in activation-dtype units
PAD_RW = (3.0, 2.0)


def unpad_pad_bytes(model: ModelSpec, ab: float, tp: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(forward, backward) HBM bytes per token of one layer's unpad / pad around attention."""
    a, dqk, dv = attention_dims(model)
    kvh = model.kv_heads
    qkv = (a * dqk + kvh * dqk + kvh * dv) / np.asarray(tp, dtype=np.float64)
    out = a * dv / np.asarray(tp, dtype=np.float64)
    fwd = ab * (UNPAD_RW[0] * qkv + PAD_RW[0] * out)
    bwd = ab * (UNPAD_RW[1] * qkv + PAD_RW[1] * out)
    return fwd, bwd
