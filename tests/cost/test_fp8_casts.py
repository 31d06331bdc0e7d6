"""fp8 quantization traffic per GEMM (cost/fp8_casts.py), counted here by hand.

Layer: Llama-3-8B shape (hidden 4096, 32 query / 8 KV heads of 128, SwiGLU FFN 14336), one
token (GEMM m = 1), so each count is elements per token. Bytes per element from the sources the
module cites: Transformer Engine v1.13 `fp8_cast_transpose_fused` reads bf16 (2 B) and writes fp8
and its transpose (1 + 1 B); `cast_to_fp8` reads 2 and writes 1; `fp8_transpose` reads 1 and
writes 1; LayerNormLinear's norm writes fp8 (1 B) where bf16 wrote 2; current scaling reads the
tensor once more (2 B) for its amax; MXFP8 writes rowwise + columnwise fp8 and one E8M0 scale per
32 elements each. torchao tensorwise: roofline_utils.py, amax read 2, cast read 2 write 1 + 1.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.api import load_model
from autoparallel_cp.cost.efficiency import gemm_time
from autoparallel_cp.cost.embedding_head import edge_factors
from autoparallel_cp.cost.factors import layer_factors
from autoparallel_cp.cost.flops import layer_gemms, moe_gemms
from autoparallel_cp.cost.fp8_casts import layer_cast_cost
from autoparallel_cp.spec import RECIPES, Job
from tests.cost.toy_cluster import h100_cluster

H, QKV, FFN = 4096, (32 + 2 * 8) * 128, 14336
MODEL = load_model("llama3-8b")


def _cost(lib: str, scaling: str, tp: int, sp: int, transpose: bool = True):
    gemms = layer_gemms(MODEL, False, 1.0, tp, 1)
    return layer_cast_cost(lib, scaling, gemms, tp, sp, transpose)


def test_te_delayed_hopper_no_sp() -> None:
    c = _cost("te", "delayed", 1, 0)
    # forward: qkv and fc1 norms write 1 B less; out_proj and fc2 inputs cast+transpose (4 B)
    fwd = -1 * H + 4 * H - 1 * H + 4 * FFN
    # backward: the two norm outputs transposed (2 B), every grad output cast+transpose (4 B)
    bwd = 2 * H + 2 * H + 4 * QKV + 4 * H + 4 * (2 * FFN) + 4 * H
    assert float(c.fwd_bytes) == pytest.approx(fwd)
    assert float(c.bwd_bytes) == pytest.approx(bwd)
    assert float(c.fwd_kernels) == 2 and float(c.bwd_kernels) == 6


def test_te_delayed_hopper_sequence_parallel() -> None:
    tp = 2
    c = _cost("te", "delayed", tp, 1)
    # norms write the local shard (h/tp) in fp8; out_proj / fc2 inputs are local (not gathered)
    fwd = -H / tp + 4 * H / tp - H / tp + 4 * FFN / tp
    # gathered norm outputs transposed at full size; out_proj and fc2 grads: cast the local
    # shard (3 B), gather fp8, transpose the gathered tensor (2 B); qkv / fc1 grads fused
    bwd = (2 * H + 2 * H + 4 * QKV / tp + (3 * H / tp + 2 * H)
           + 4 * 2 * FFN / tp + (3 * H / tp + 2 * H))
    assert float(c.fwd_bytes) == pytest.approx(fwd)
    assert float(c.bwd_bytes) == pytest.approx(bwd)


def test_te_current_scaling_adds_the_amax_pass() -> None:
    c = _cost("te", "current", 1, 0)
    # norm writes bf16, quantize reads 2 writes 1; other inputs amax 2 + cast-transpose 4
    fwd = 3 * H + 6 * H + 3 * H + 6 * FFN
    bwd = 2 * H + 2 * H + 6 * (QKV + H + 2 * FFN + H)
    assert float(c.fwd_bytes) == pytest.approx(fwd)
    assert float(c.bwd_bytes) == pytest.approx(bwd)


def test_te_mxfp8_writes_both_layouts_and_scales() -> None:
    c = _cost("te", "mxfp8", 1, 0, transpose=False)
    per = 2 + 1 + 1 + 2 / 32
    assert float(c.fwd_bytes) == pytest.approx(per * (H + H + H + FFN))
    assert float(c.bwd_bytes) == pytest.approx(per * (QKV + H + 2 * FFN + H))


def test_transpose_free_gpu_writes_no_transposes() -> None:
    c = _cost("te", "delayed", 1, 0, transpose=False)
    assert float(c.fwd_bytes) == pytest.approx(-H + 3 * H - H + 3 * FFN)
    assert float(c.bwd_bytes) == pytest.approx(3 * (QKV + H + 2 * FFN + H))


def test_torchao_tensorwise_counts_weights_every_microbatch() -> None:
    c = _cost("torchao", "delayed", 1, 0)
    acts = H + H + H + FFN
    grads = QKV + H + 2 * FFN + H
    weights = H * QKV + H * H + H * 2 * FFN + FFN * H
    assert float(c.fwd_bytes) == pytest.approx(6 * acts + 5 * weights)
    assert float(c.bwd_bytes) == pytest.approx(6 * grads + 3 * weights)
    # 3 kernels per activation (amax, amax stage 2, cast) + 3 per weight; backward 3 + 1
    assert float(c.fwd_kernels) == 4 * 6 and float(c.bwd_kernels) == 4 * 4


def test_xla_charges_no_separate_casts() -> None:
    c = _cost("xla", "delayed", 1, 0)
    assert float(c.fwd_bytes) == 0 and float(c.bwd_bytes) == 0


def test_router_is_not_quantized() -> None:
    mx = load_model("mixtral-8x7b")
    gemms = [g for g in moe_gemms(mx, 1.0, 1, 1) if g.name == "router"]
    c = layer_cast_cost("te", "delayed", gemms, 1, 0, True)
    assert float(c.fwd_bytes) == 0 and float(c.bwd_bytes) == 0


def _job(recipe: str, **behaviour: object) -> Job:
    r = RECIPES[recipe]
    if behaviour:
        r = r.with_behaviour(**behaviour)
    return Job(model=MODEL, cluster=h100_cluster(), recipe=r, seq_len=4096, global_batch=8)


def test_layer_time_carries_the_casts() -> None:
    te = layer_factors(_job("megatron-fp8"), 0, 1, 1, 1, 0, 1, "none")
    xla = layer_factors(_job("megatron-fp8", fp8_linear="xla"), 0, 1, 1, 1, 0, 1, "none")
    # Hopper, delayed, no SP: 65,536 B forward + 188,416 B backward per token (test above)
    # at 3,350 GB/s x 0.87, 4,096 tokens
    bw = 3350e9 * 0.87
    extra = (4 * H - 2 * H + 4 * FFN + 2 * H + 2 * H + 4 * (QKV + 2 * H + 2 * FFN)) * 4096 / bw
    assert float(te.compute_s - xla.compute_s) == pytest.approx(extra, rel=1e-9)


def test_head_stays_bf16_under_fp8() -> None:
    fp8 = edge_factors(_job("megatron-fp8"), 0, 1, 1, 0, 1)
    bf16 = edge_factors(_job("megatron-bf16"), 0, 1, 1, 0, 1)
    assert float(fp8.head_compute_s) == pytest.approx(float(bf16.head_compute_s))
    gpu = h100_cluster().node_groups[0].gpu
    assert gemm_time(gpu, 4096, H, 128256, "fp8") < gemm_time(gpu, 4096, H, 128256, "bf16")
