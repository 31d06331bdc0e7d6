"""Elementwise ops a Megatron layer runs as plain PyTorch ops (behaviour `unfused_ops`,
cost/unfused_ops.py).

Expected bytes are counted here op by op from the framework source: Megatron-Core's
`apply_rotary_pos_emb` (FlagScale @26cd664 / Megatron-LM cac60ce4 rotary_pos_embedding.py),
Megatron-DeepSpeed @6d4c535e megatron/model/rotary_pos_embedding.py, and the legacy
`ParallelMLP` swiglu (`F.silu(chunk(x)[0]) * chunk(x)[1]`), bf16 activations (2 B), fp32
freqs (4 B). Small shape: hidden 64, 4 query heads and 2 KV heads of 16, FFN 96, tp 2,
micro-batch 2.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.unfused_ops import unfused_op_bytes
from autoparallel_cp.spec import (
    RECIPES,
    Job,
    ModelSpec,
    MoESpec,
)
from tests.cost.toy_cluster import h100_cluster

H, A, KV, D, F = 64, 4, 2, 16, 96
TP, MBS, S = 2, 2, 256
GPU = h100_cluster().node_groups[0].gpu

# per token: q and k elements on one tp rank, and ffn-output elements
QK = (A + KV) * D // TP  # 48
FF = F // TP  # 48
# freqs: per sequence position (so / MBS per token) and per call (q, k): cos r4 w4, cast to
# bf16 r4 w2, the same for sin
FREQS = 2 * ((4 + 4) + (4 + 2) + (4 + 4) + (4 + 2)) * D / MBS

# Megatron-Core apply_rotary_pos_emb, per q/k element in bf16:
#   forward: t*cos r2 w2; -x2 on the half r1 w1; cat(-x2, x1) r2 w2; *sin r2 w2;
#            add r4 w2; final cat(t, t_pass) r2 w2
ROPE_FWD = (2 + 2) + (1 + 1) + (2 + 2) + (2 + 2) + (4 + 2) + (2 + 2)
#   backward: grad*sin r2 w2; neg r1 w1; chunk backward cat r2 w2; grad*cos r2 w2;
#             accumulate the sliced t's two gradients r4 w2; slice backward zeros w2 + copy
#             r2 w2; empty t_pass slice backward zeros w2; accumulate r4 w2
ROPE_BWD = (2 + 2) + (1 + 1) + (2 + 2) + (2 + 2) + (4 + 2) + (2 + 2 + 2) + 2 + (4 + 2)
# Megatron-DeepSpeed: no final cat (t_pass empty, returned as is); unbind's backward stacks
LEGACY_FWD = (2 + 2) + (1 + 1) + (2 + 2) + (2 + 2) + (4 + 2)
LEGACY_BWD = (2 + 2) + (1 + 1) + (2 + 2) + (2 + 2) + (4 + 2) + (2 + 2 + 2)
# swiglu per ffn-output element: silu r2 w2; mul r4 w2 | backward: mul's two input gradients
# r4 w2 each; silu backward r4 w2; chunk backward cat r4 w4
SWIGLU_FWD = (2 + 2) + (4 + 2)
SWIGLU_BWD = 2 * (4 + 2) + (4 + 2) + (4 + 4)
# the fc1 bias added before it (per ffn-output element the fc1 output has 2): r4 w4 forward;
# backward: the bias gradient reads the fc1-output gradient r4
BIAS_FWD, BIAS_BWD = 4 + 4, 4


def _model(bias: bool = False, moe: bool = False) -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=2, hidden_size=H, ffn_hidden_size=F,
                     num_attention_heads=A, num_kv_heads=KV, head_dim=D, vocab_size=1024,
                     mlp_bias=bias,
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=F)
                     if moe else None)


def _job(ops: tuple[str, ...], model: ModelSpec | None = None, fused: bool | None = None
         ) -> Job:
    rec = RECIPES["megatron-bf16"].with_behaviour(unfused_ops=ops, fused=fused)
    return Job(model=model or _model(), cluster=h100_cluster(), recipe=rec, seq_len=S,
               global_batch=8)


@pytest.mark.parametrize("ops,fwd,bwd", [
    (("rope",), ROPE_FWD * QK + FREQS, ROPE_BWD * QK),
    (("rope-legacy",), LEGACY_FWD * QK + FREQS, LEGACY_BWD * QK),
    (("swiglu",), SWIGLU_FWD * FF, SWIGLU_BWD * FF),
    (("rope", "swiglu"), ROPE_FWD * QK + FREQS + SWIGLU_FWD * FF,
     ROPE_BWD * QK + SWIGLU_BWD * FF),
])
def test_bytes_per_token(ops: tuple[str, ...], fwd: float, bwd: float) -> None:
    ub = unfused_op_bytes(_model(), ops, False, 2.0, TP, MBS)
    assert float(ub.fwd) == pytest.approx(fwd)
    assert float(ub.bwd) == pytest.approx(bwd)


def test_fc1_bias_is_added_outside_the_fused_kernel() -> None:
    ub = unfused_op_bytes(_model(bias=True), ("swiglu",), False, 2.0, TP, MBS)
    assert float(ub.fwd) == pytest.approx((SWIGLU_FWD + BIAS_FWD) * FF)
    assert float(ub.bwd) == pytest.approx((SWIGLU_BWD + BIAS_BWD) * FF)


def test_layer_time_replaces_the_fused_counts() -> None:
    """The layer's compute grows by the unfused bytes less the fused ones they replace:
    fused RoPE reads + writes each q/k element (2 + 2), fused SwiGLU reads 2 and writes 1 ffn
    elements (4 + 2 per ffn element), backward twice the forward."""
    tokens = MBS * S
    args = (0, TP, 1, 1, 1, MBS, "none")
    base = layer_factors(_job(()), *args)
    unf = layer_factors(_job(("rope", "swiglu")), *args)
    fused_f = 4 * QK + 6 * FF
    extra = (ROPE_FWD * QK + FREQS + SWIGLU_FWD * FF - fused_f) \
        + (ROPE_BWD * QK + SWIGLU_BWD * FF - 2 * fused_f)
    assert float(unf.compute_s - base.compute_s) == pytest.approx(
        float(hbm_time(GPU, extra * tokens)), rel=1e-9)
    # the mul keeps the silu output for its backward: one more ffn tensor per token
    assert float(unf.act_bytes - base.act_bytes) == pytest.approx(2 * FF * tokens)


def test_moe_layer_and_eager_recipes_ignore_swiglu() -> None:
    args = (0, TP, 1, 1, 1, MBS, "none")
    moe = _model(moe=True)
    a = layer_factors(_job((), moe), *args, moe=True)
    b = layer_factors(_job(("swiglu",), moe), *args, moe=True)
    assert float(b.compute_s) == pytest.approx(float(a.compute_s))
    # a whole-eager recipe is costed by its eager path: unfused_ops changes nothing
    c = layer_factors(_job((), fused=False), *args)
    d = layer_factors(_job(("rope", "swiglu"), fused=False), *args)
    assert float(d.compute_s) == pytest.approx(float(c.compute_s))
    assert float(d.act_bytes) == pytest.approx(float(c.act_bytes))


# Megatron-DeepSpeed's slice / select split of the fused QKV output [s, b, kv groups, g+2, d]
# (megatron/model/transformer.py l. 641-644 @6d4c535e), per QKV-output element on one tp rank:
# backward: three zeros tensors of the whole output w2 each; the three copies of the parts'
# gradients r2 w2 (over the parts, once per element in all); two sums r4 w2 each: 6 + 4 + 12
# = 22 B, less Megatron-Core's split backward (one cat, r2 w2 = 4 B) = 18 B
QKV = (A * D + KV * (D + D)) // TP  # 64
SLICE_BWD = (3 * 2 + (2 + 2) + 2 * (4 + 2)) - (2 + 2)
# forward: `.contiguous()` before FlashAttention copies the strided v (r2 w2 per element); with
# a micro-batch over 1 the s, b transpose copies q and k too, and the output is copied back
V_ELEMS = KV * D // TP  # 16
TRANSPOSED = ((A + KV) * D + A * D) // TP  # 80


@pytest.mark.parametrize("mbs,fwd", [(1, 4 * V_ELEMS), (MBS, 4 * (V_ELEMS + TRANSPOSED))])
def test_qkv_slice_bytes(mbs: int, fwd: float) -> None:
    ub = unfused_op_bytes(_model(), ("qkv-slice",), False, 2.0, TP, mbs)
    assert float(ub.fwd) == pytest.approx(fwd)
    assert float(ub.bwd) == pytest.approx(SLICE_BWD * QKV)


def test_rope_after_the_kv_repeat_runs_on_every_query_head() -> None:
    """FlagScale's legacy layer repeats K, V to the 4 query heads before its RoPE: the RoPE
    touches 4 + 4 heads of 16 per token instead of 4 + 2; the layer also pays the repeat
    copies (read 2 K/V heads, write 4, for K and V: 2 x (2 + 4) x 16 / tp elements, bf16,
    backward twice the forward like every plain elementwise copy)."""
    ub = unfused_op_bytes(_model(), ("rope",), False, 2.0, TP, MBS, kv_repeated=True)
    qk_rep = (A + A) * D // TP  # 64
    assert float(ub.fwd) == pytest.approx(ROPE_FWD * qk_rep + FREQS)
    assert float(ub.bwd) == pytest.approx(ROPE_BWD * qk_rep)
    tokens = MBS * S
    args = (0, TP, 1, 1, 1, MBS, "none")
    job = _job(("rope",))
    base = layer_factors(job, *args)
    rep = layer_factors(job.model_copy(update={
        "recipe": job.recipe.with_behaviour(gqa_repeat_kv=True)}), *args)
    copies = 2 * 2 * (KV + A) * D // TP
    extra = (ROPE_FWD + ROPE_BWD) * (A - KV) * D // TP + copies * (1 + 2)
    assert float(rep.compute_s - base.compute_s) == pytest.approx(
        float(hbm_time(GPU, extra * tokens)), rel=1e-9)
