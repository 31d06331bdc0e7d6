"""FLOP counts and the efficiency-curve constants (re-fitted from the copied data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoparallel_cp import efficiency as E
from autoparallel_cp.flops import model_flops_per_token
from autoparallel_cp.specs import ModelSpec

DATA = Path(__file__).resolve().parents[1] / "benchmarks/data/h200_microbench.jsonl"


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
    from autoparallel_cp.specs import GPUSpec
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
