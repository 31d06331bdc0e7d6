"""FLOP counts and the efficiency-curve constants (re-fitted from the copied data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoparallel_cp.cost import efficiency as E
from autoparallel_cp.cost.flops import model_flops_per_token
from autoparallel_cp.spec import ModelSpec

DATA = Path(__file__).resolve().parents[2] / "benchmarks/data/h200_microbench.jsonl"


def _rows() -> list[dict]:
    return [json.loads(x) for x in open(DATA)]


def test_gemm_constants_match_fit() -> None:
    frac, k_half, m_derate, fixed = E.fit_gemm_curve([r for r in _rows() if r["kind"] == "gemm"])
    assert frac == pytest.approx(E.GEMM_PEAK_FRACTION, rel=1e-3)
    assert k_half == pytest.approx(E.GEMM_K_HALF, rel=1e-2)
    assert m_derate == pytest.approx(E.GEMM_M_DERATE, rel=1e-2)
    assert fixed == pytest.approx(E.GEMM_FIXED_S, rel=1e-2)


def test_attention_constants_match_fit() -> None:
    rows = [r for r in _rows() if r["kind"] == "attn"]
    f, s = E.fit_attention_curve(rows, "fwd_tflops")
    assert f == pytest.approx(E.ATTN_FWD_FRACTION, rel=1e-2)
    assert s == pytest.approx(E.ATTN_FWD_S_HALF, rel=2e-2)


def test_gemm_curve_reproduces_microbench() -> None:
    from autoparallel_cp.spec import GPUSpec
    gpu = GPUSpec(name="H200", memory_gib=141, bf16_tflops=E.H200_BF16_PEAK_TFLOPS, hbm_gbps=4800)
    errs = [abs(float(E.gemm_time(gpu, r["M"], r["K"], r["N"])) / r["s"] - 1)
            for r in _rows() if r["kind"] == "gemm"]
    assert sum(errs) / len(errs) < 0.04
    assert max(errs) < 0.15


def test_model_flops_korthikanti_eq7() -> None:
    h, L, s, v, a = 4096, 24, 2048, 51200, 32
    m = ModelSpec(name="gpt", num_layers=L, hidden_size=h, ffn_hidden_size=4 * h,
                  num_attention_heads=a, vocab_size=v, mlp="gelu", norm="layernorm",
                  tie_embeddings=True)
    eq7 = 72 * L * h * h * (1 + s / (6 * h) + v / (12 * h * L))
    # ours also counts biases-free norms' params (tiny); Eq. 7 ignores them
    assert model_flops_per_token(m, s) == pytest.approx(eq7, rel=2e-3)


# FlashAttention-3 paper (Shah et al. 2024) Figs. 5/6, H100 SXM5, head dim 128:
# FlashAttention-2 causal forward and backward TFLOP/s at s = 512 .. 16k.
FA2_SEQ = [512, 1024, 2048, 4096, 8192, 16384]
FA2_FWD = [191, 260, 298, 319, 333, 335]
FA2_BWD = [214, 260, 291, 310, 318, 322]


def test_fa2_constants_match_published_fit() -> None:
    both = [3.5 / (1 / f + 2.5 / b) for f, b in zip(FA2_FWD, FA2_BWD, strict=True)]
    ff, fs = E.fit_attention_points(FA2_SEQ, FA2_FWD, 989.0)
    bf, bs = E.fit_attention_points(FA2_SEQ, both, 989.0)
    c = E.ATTN_KERNELS["fa2"]
    assert (ff, fs, bf, bs) == pytest.approx(c, rel=1e-2)


def test_fa2_kernel_reproduces_published_h100_rates() -> None:
    from autoparallel_cp.spec import GPUSpec

    h100 = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989.0, fp8_tflops=1979.0,
                   hbm_gbps=3350.0)
    for s, f_pub, b_pub in zip(FA2_SEQ, FA2_FWD, FA2_BWD, strict=True):
        flops = 1e12
        fwd, bwd = E.flash_attention_time(h100, flops, s, 128, kernel="fa2")
        assert flops / float(fwd) / 1e12 == pytest.approx(f_pub, rel=0.05)
        assert 2.5 * flops / float(bwd) / 1e12 == pytest.approx(b_pub, rel=0.08)
        # the default (cuDNN-class) kernel is faster at training lengths
        fwd_new, bwd_new = E.flash_attention_time(h100, flops, s, 128)
        assert fwd_new < fwd
        if s >= 2048:
            assert fwd_new + bwd_new < fwd + bwd
