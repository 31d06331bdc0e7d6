"""Attention kernel generations per GPU architecture (efficiency.ATTN_KERNELS[_SM80]).

Expected values are the published figure points, typed in here from the FlashAttention-2 paper
(Dao 2023), Fig. 4d (A100 80GB SXM4) and its H100 80GB SXM5 counterpart (flash-attention
assets/flash2_a100_fwd_bwd_benchmark.png, flash2_h100_fwd_bwd_benchmark.png @4f285b35):
causal, head dim 128, forward+backward TFLOP/s at s = 512, 1k, 2k, 4k, 8k, 16k.
"""

from __future__ import annotations

import pytest

from autoparallel_cp.cost import efficiency as E
from autoparallel_cp.spec import GPUSpec

SEQ = [512, 1024, 2048, 4096, 8192, 16384]
A100_FA2 = [99, 133, 155, 173, 182, 189]
A100_TRITON = [50, 61, 68, 74, 78, 80]
A100_FA1 = [55, 62, 69, 76, 80, 83]
H100_FA1 = [98, 109, 108, 126, 135, 137]

A100 = GPUSpec(name="A100", memory_gib=80, bf16_tflops=312.0, hbm_gbps=2039.0)
H100 = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989.0, fp8_tflops=1979.0,
               hbm_gbps=3350.0)


def _fwdbwd_tflops(gpu: GPUSpec, s: int, kernel: str) -> float:
    flops = 1e12  # forward FLOP; forward+backward does 3.5x
    fwd, bwd = E.flash_attention_time(gpu, flops, s, 128, kernel=kernel)
    return 3.5 * flops / float(fwd + bwd) / 1e12


@pytest.mark.parametrize(("kernel", "points"), [("fa2", A100_FA2), ("triton", A100_TRITON)])
def test_ampere_kernels_reproduce_the_a100_figure(kernel: str, points: list[int]) -> None:
    for s, pub in zip(SEQ, points, strict=True):
        assert _fwdbwd_tflops(A100, s, kernel) == pytest.approx(pub, rel=0.06)


def test_triton_on_hopper_gains_what_flashattention_gained() -> None:
    # an Ampere-ISA kernel on H100: the A100 Triton bar times FlashAttention's H100/A100 gain
    for s, tri, f1a, f1h in zip(SEQ, A100_TRITON, A100_FA1, H100_FA1, strict=True):
        assert _fwdbwd_tflops(H100, s, "triton") == pytest.approx(tri * f1h / f1a, rel=0.10)
    # far below the H100's 989 peak share the A100 kernel reaches of its 312: ~1.7x, not 3.2x
    gain = _fwdbwd_tflops(H100, 16384, "triton") / _fwdbwd_tflops(A100, 16384, "triton")
    assert 1.5 < gain < 1.8


def test_fa2_on_a100_is_a_larger_share_of_peak_than_on_h100() -> None:
    # FA2: 189 of 312 on A100 (61%) against ~330 of 989 on H100 (33%, FA2 and FA3 papers)
    a = _fwdbwd_tflops(A100, 16384, "fa2") / 312.0
    h = _fwdbwd_tflops(H100, 16384, "fa2") / 989.0
    assert a == pytest.approx(189 / 312, rel=0.05)
    assert h < 0.36 < 0.55 < a


def test_cudnn_curve_is_the_same_share_on_every_gpu() -> None:
    # the calibration kernel keeps its fraction of peak (no per-architecture table)
    ra = _fwdbwd_tflops(A100, 4096, "cudnn") / 312.0
    rh = _fwdbwd_tflops(H100, 4096, "cudnn") / 989.0
    assert ra == pytest.approx(rh, rel=1e-9)


def test_kernel_tables_match_fits_of_the_points() -> None:
    ff, fs = E.fit_attention_points(SEQ, A100_FA2, 312.0)
    assert E.ATTN_KERNELS_SM80["fa2"] == pytest.approx((ff, fs, ff, fs), rel=1e-2)
    tf, ts = E.fit_attention_points(SEQ, A100_TRITON, 312.0)
    assert E.ATTN_KERNELS_SM80["triton"] == pytest.approx((tf, ts, tf, ts), rel=1e-2)
    derived = [t * h / a for t, a, h in zip(A100_TRITON, A100_FA1, H100_FA1, strict=True)]
    hf, hs = E.fit_attention_points(SEQ, derived, 989.0)
    assert E.ATTN_KERNELS["triton"] == pytest.approx((hf, hs, hf, hs), rel=1e-2)
