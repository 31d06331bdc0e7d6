"""Achieved compute and memory rates: GEMM-shape and attention efficiency curves.

All curves were fitted once on one NVIDIA H200 SXM (`benchmarks/data/h200_microbench.jsonl`,
PyTorch 2.11 / CUDA 13.0, see benchmarks/data/README.md) and are expressed as *fractions of the
dense peak*, so that another GPU gets `fraction x its own peak` (same kernels, same tiling
behaviour; Calculon's `gflops_efficiency` tables make the same assumption). The fit functions
below reproduce the constants from the data (`tests/test_flops.py` re-fits and compares).

GEMM (`A[M,K] @ B[K,N]`, 2MKN FLOP), least squares on relative error, 45 shapes, MAPE 2.9%:

    t = GEMM_FIXED_S + 2MKN / (GEMM_PEAK_FRACTION * peak)
        * (1 + GEMM_K_HALF / K + GEMM_M_DERATE * M / (M + GEMM_M_HALF))

`GEMM_FIXED_S` is the per-call floor seen in eager PyTorch (launch + tail of one kernel);
`GEMM_K_HALF` is the reduction length at which the main loop's prologue/epilogue costs as much
as the loop itself (short K = low arithmetic intensity per output tile); the M term is the
sustained-clock derate of long-running GEMMs (at M = 16384 every shape ran ~8% slower than at
M = 4096: the GPU drops from boost clock under its power limit), saturating in M.

Transfer check on H100 SXM (same peak, same 700 W): stas00/ml-engineering
compute/accelerator/README.md @b9e29720 "Maximum Achievable Matmul FLOPS" (mamf-finder, torch
2.7.0+cu126) gives 794.5 TFLOP/s bf16 at 2048x2048x13312 (MxNxK); the curve above gives 803
(+1%), so the burst rate carries from the H200 to the H100 as a fraction of peak
(tests/cost/test_gemm_transfer.py). The same table's A100 SXM (271.2 at 1024x10240x5120) sits
5% above the curve (259): the A100 runs a larger fraction of its own peak.

Flash attention (causal SDPA; forward FLOP counted 4·b·heads·s²·d/2, backward 2.5x forward):

    rate(s, d) = peak * ATTN_FRACTION * d/(d + ATTN_D_HALF) * (128 + ATTN_D_HALF)/128
                 * s / (s + s_half)

with its own `s_half` for forward and forward+backward.

Memory-bound ops run at `HBM_EFFICIENCY x` the GPU's HBM bandwidth (H200 copy test: 4174 GB/s
of a 4800 GB/s spec = 0.87).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from autoparallel_cp.spec import GPUSpec

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]

#: Dense bf16 peak of the calibration GPU (H200 SXM datasheet, TFLOP/s).
H200_BF16_PEAK_TFLOPS = 989.0
#: HBM bandwidth of the calibration GPU (H200 SXM datasheet, GB/s).
H200_HBM_GBPS = 4800.0

#: Fitted (fit_gemm_curve): boost-clock GEMM rate as a fraction of the dense peak (857/989).
GEMM_PEAK_FRACTION = 0.8667
#: Fitted: reduction length K at which the per-tile prologue doubles the time.
GEMM_K_HALF = 49.5
#: Fitted: relative slow-down of long GEMMs at sustained clock (M -> infinity).
GEMM_M_DERATE = 0.3206
#: Chosen (not fitted): M at which half the sustained-clock derate applies (best of 2k-16k grid).
GEMM_M_HALF = 8192.0
#: Fitted: fixed time per GEMM call in seconds (eager launch floor).
GEMM_FIXED_S = 19.76e-6

#: Fitted (fit_attention_curve): forward flash-attention asymptote, d=128, fraction of peak.
ATTN_FWD_FRACTION = 0.6732
#: Fitted: forward+backward flash-attention asymptote at head_dim 128, fraction of peak.
ATTN_FWDBWD_FRACTION = 0.6099
#: Fitted: sequence length at which forward attention reaches half its asymptote.
ATTN_FWD_S_HALF = 570.0
#: Fitted: sequence length at which forward+backward attention reaches half its asymptote.
ATTN_FWDBWD_S_HALF = 1241.0
#: Fitted: head dim at which attention rate is half its large-d limit (d=64 runs at 0.70x d=128).
ATTN_D_HALF = 96.0

#: Attention kernel generations. The curves above were measured with PyTorch 2.11, whose SDPA
#: dispatches to cuDNN attention on sm90 (cuDNN made opt-in after the 2.5 bugs,
#: pytorch/pytorch#138522, and preferred again once the bundled cuDNN >= 9.15, i.e. torch 2.11;
#: huggingface/transformers#48163): the "modern" kernels (cuDNN / FlashAttention-3 class).
#: PyTorch SDPA between 2.5 and 2.10 uses FlashAttention-2 on H100 unless cuDNN is requested
#: (pytorch/pytorch#142132: nightly 2.6.0.dev20241204 SDPA 329 vs cuDNN 631 TFLOP/s, "expected").
#: FlashAttention-2 on H100 SXM5, head dim 128, from the FlashAttention-3 paper (Shah et al.
#: 2024, Figs. 5/6): causal forward 191/260/298/319/333/335 TFLOP/s and backward
#: 214/260/291/310/318/322 TFLOP/s at s = 512..16k; fitted with the same curve form
#: (fit_attention_points): forward 0.357 of the 989 peak with s_half 420, forward+backward
#: 0.340 with s_half 314 (each point within 4%).
ATTN_KERNELS: dict[str, tuple[float, float, float, float]] = {
    # kernel: (fwd fraction, fwd s_half, fwd+bwd fraction, fwd+bwd s_half)
    "cudnn": (0.6732, 570.0, 0.6099, 1241.0),
    "fa2": (0.3571, 420.0, 0.3395, 314.0),
    # FlashAttention in Triton (HazyResearch `flash_attn_triton.py`, shipped by llm-foundry as
    # `attn_impl: triton` on the pre-MLIR Triton compiler, whose code generator predates
    # Hopper: Ampere `mma.sync`, no wgmma/TMA). No H100 figure publishes it; an Ampere-ISA
    # kernel gains on H100 what the two published ones gained: FlashAttention and
    # FlashAttention-2, causal d=128 fwd+bwd, H100 over A100 1.57-1.78x at every s = 512..16k
    # (FA2 paper Figs. 4d and the H100 figure, flash-attention assets/flash2_{a100,h100}_
    # fwd_bwd_benchmark.png @4f285b35). Points: the A100 Triton bars below x FlashAttention's
    # H100/A100 ratio at the same s = 89/107/106/123/132/132 TFLOP/s; fitted as one curve for
    # forward and forward+backward (the figure gives fwd+bwd only).
    "triton": (0.1315, 241.0, 0.1315, 241.0),
}
#: The same kernels on GPUs without Hopper's tensor-core instructions (A100 / A800: no fp8
#: tensor cores), as fractions of *their* dense peak (312 TFLOP/s): FlashAttention-2 paper
#: (Dao 2023) Fig. 4d, A100 80GB SXM4, causal, head dim 128, forward+backward at s = 512..16k:
#: FlashAttention-2 99/133/155/173/182/189 and FlashAttention Triton 50/61/68/74/78/80
#: TFLOP/s (fit_attention_points; FlashAttention-2's forward curve shares the fwd+bwd fit, the
#: figure gives fwd+bwd only). FA2's 0.62 of the A100 peak against 0.34 of the H100 peak is
#: the Ampere-ISA kernel not using Hopper's wgmma. "cudnn" keeps the calibration fractions.
ATTN_KERNELS_SM80: dict[str, tuple[float, float, float, float]] = {
    "fa2": (0.6208, 487.0, 0.6208, 487.0),
    "triton": (0.2567, 313.0, 0.2567, 313.0),
}

#: Fraction of the HBM spec bandwidth reached by streaming kernels (H200 copy test 4174/4800).
HBM_EFFICIENCY = 0.87
#: Kernel-sustained fractions of the HBM spec bandwidth, measured on the H200 in session 15
#: (`benchmarks/data/h200_s15/probe_set1.jsonl`, kind=op, `benchmarks/measure_h200_ops.py`;
#: each one kernel call of hundreds of MB, CUDA events, median of 8):
#: torch's fused AdamW (`torch.optim.AdamW(fused=True)`, 64 fp32 tensors, 2^28 parameters,
#: 28 B/param: p, g, m, v read, p, m, v written) ran 2.647 ms = 2,840 GB/s = 0.592 of 4,800.
FUSED_ADAMW_HBM_FRACTION = 0.592
#: Eager fp32 cross-entropy forward + backward of bf16 logits (`F.cross_entropy(logits.float(),
#: y)`, t = 4096): 1.874 ms at V = 32,000 and 7.593 ms at V = 128,256, i.e. 14.30 / 14.45 ps per
#: logit; over its 48 B per logit (constants.CE_BYTES_PER_LOGIT["pytorch"]) that is 3.33 TB/s =
#: 0.694 of the spec (mean of the two): the softmax's reductions stream below a copy.
EAGER_CE_HBM_FRACTION = 0.694
#: A bf16 GEMM whose leading dimension is not a multiple of 8 elements (16 bytes) cannot use
#: the Hopper kernels that need 16-byte-aligned rows (TMA descriptors; NVIDIA's "Matrix
#: Multiplication Background User's Guide", "Tensor Core Requirements": dimensions multiples
#: of 8 for 16-bit types). Measured on the H200 (session 15, `h200_s15/gemm_graph.jsonl`, CUDA
#: graphs of 20 calls, t = 4096 tokens, hidden 2048 and 4096) for the LM head of a 50,257-token
#: vocabulary: `x @ W.t()` (the forward, output rows of 50,257) 0.0998 / 0.1002 of the dense
#: peak, `a.t() @ b` (reading a [.., 50257] operand: the backward GEMMs) 0.1563 / 0.1523,
#: against 0.66-0.69 at 50,304 (aligned) in the same run.
GEMM_UNALIGNED_FWD_FRACTION = 0.100
GEMM_UNALIGNED_BWD_FRACTION = 0.154
#: Achieved fraction of the fp8 dense peak relative to the bf16 fraction: the end-to-end figure
#: (Transformer-Engine / torchao report 1.3-1.6x end-to-end speed-ups over bf16, i.e. ~0.75 of
#: the bf16 fraction at twice the peak), kept while the casts are charged op by op
#: (cost/fp8_casts.py). It is not a kernel rate: paired H100 microbenchmarks give 0.983
#: (pytorch/FBGEMM PR #2546, "H100 500W": fp8/bf16 GEMM rate 1.923 / 1.883 / 2.089 at 8192^3,
#: 65536x8192x7168, 65536x3584x8192), which with the casts gives the dgxc FP8/BF16 step
#: speed-ups measured but leaves every FP8 row as optimistic as its BF16 twin (+20% in sample,
#: benchmarks/RESULTS.md); it replaces this figure once the BF16 rows' optimism is resolved.
FP8_FRACTION_SCALE = 0.75


def peak_flops(gpu: GPUSpec, dtype: str = "bf16") -> float:
    """Dense peak FLOP/s of `gpu` for `dtype` ('bf16' or 'fp8'; fp8 falls back to bf16)."""
    if dtype == "fp8" and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


def gemm_time(
    gpu: GPUSpec, m: ArrayLike, k: ArrayLike, n: ArrayLike, dtype: str = "bf16",
    fixed_s: float = GEMM_FIXED_S, batch: ArrayLike = 1.0,
) -> FloatArray:
    """Seconds for one (batched: `batch` x) `[m,k] @ [k,n]` GEMM call on `gpu` (vectorized).

    A batched call pays the fixed per-call time once (one kernel launch)."""
    m_ = np.asarray(m, dtype=np.float64)
    k_ = np.asarray(k, dtype=np.float64)
    n_ = np.asarray(n, dtype=np.float64)
    frac = GEMM_PEAK_FRACTION
    if dtype == "fp8" and gpu.fp8_tflops:
        frac *= FP8_FRACTION_SCALE
    rate = frac * peak_flops(gpu, dtype)
    flops = 2.0 * m_ * k_ * n_ * np.asarray(batch, dtype=np.float64)
    slow = 1.0 + GEMM_K_HALF / np.maximum(k_, 1.0) + GEMM_M_DERATE * m_ / (m_ + GEMM_M_HALF)
    return np.where(flops > 0, fixed_s + flops / rate * slow, 0.0)


def hbm_time_at(gpu: GPUSpec, nbytes: ArrayLike, fraction: float) -> FloatArray:
    """Seconds to stream `nbytes` through HBM at `fraction` of the spec bandwidth (a kernel's
    own sustained rate, e.g. `FUSED_ADAMW_HBM_FRACTION`)."""
    return np.asarray(nbytes, dtype=np.float64) / (gpu.hbm_gbps * 1e9 * fraction)


def unaligned_gemm_time(gpu: GPUSpec, m: ArrayLike, k: ArrayLike, n: ArrayLike,
                        fraction: float) -> FloatArray:
    """Seconds of a bf16 GEMM with a leading dimension that is not a multiple of 8 elements,
    at `fraction` of the dense peak (`GEMM_UNALIGNED_*_FRACTION`)."""
    flops = 2.0 * np.asarray(m, np.float64) * np.asarray(k, np.float64) * np.asarray(n, np.float64)
    return np.where(flops > 0, GEMM_FIXED_S + flops / (fraction * peak_flops(gpu, "bf16")), 0.0)


def sm_reserve_stretch(gpu: GPUSpec, reserved: float) -> float:
    """Time factor of a GEMM run on `gpu.sm_count - reserved` of the GPU's SMs.

    Transformer Engine's userbuffers overlap with `set_sm_margin` hands cuBLAS
    `_math_sms = sm_count - num_comm_sm` (common/comm_gemm_overlap/comm_gemm_overlap.cpp
    l. 75 @v1.13, the same line in pytorch/csrc/comm_gemm_overlap.h @v1.7-v1.12), leaving
    `num_comm_sm` SMs to the communication kernel: a GEMM of many tile waves runs at the rate
    of the SMs it gets, sm_count / (sm_count - reserved) times as long. 1 when nothing is
    reserved; `Job` refuses a reservation on a GPU without `sm_count` or with no SM left.
    """
    if reserved <= 0:
        return 1.0
    if gpu.sm_count is None or gpu.sm_count <= reserved:
        raise ValueError(f"{gpu.name}: sm_count {gpu.sm_count} cannot spare {reserved:g} SMs")
    return gpu.sm_count / (gpu.sm_count - reserved)


def _attn_rate(gpu: GPUSpec, s: FloatArray, d: FloatArray, frac: float,
               s_half: float) -> FloatArray:
    dfac = d / (d + ATTN_D_HALF) * (128.0 + ATTN_D_HALF) / 128.0
    return peak_flops(gpu, "bf16") * frac * dfac * s / (s + s_half)


def flash_attention_time(
    gpu: GPUSpec, flops_fwd_causal: ArrayLike, seq: ArrayLike, head_dim: ArrayLike,
    kernel: str = "cudnn",
) -> tuple[FloatArray, FloatArray]:
    """(forward_s, backward_s) of causal flash attention doing `flops_fwd_causal` forward FLOP.

    `seq` is the key length each query block sees (sets the curve's position). Backward does
    2.5x the forward FLOP (FlashAttention-2 paper, §3.1 counting) at the fwd+bwd rate.
    `kernel` selects the kernel generation (`ATTN_KERNELS`; "fa3" is treated as "cudnn");
    on a GPU without fp8 tensor cores (Ampere) an Ampere-ISA kernel takes its
    `ATTN_KERNELS_SM80` fractions.
    """
    f = np.asarray(flops_fwd_causal, dtype=np.float64)
    s = np.asarray(seq, dtype=np.float64)
    d = np.minimum(np.asarray(head_dim, dtype=np.float64), 128.0)
    if kernel in ("cudnn", "fa3"):
        ff, fs, bf, bs = ATTN_FWD_FRACTION, ATTN_FWD_S_HALF, ATTN_FWDBWD_FRACTION, \
            ATTN_FWDBWD_S_HALF
    elif not gpu.fp8_tflops and kernel in ATTN_KERNELS_SM80:
        ff, fs, bf, bs = ATTN_KERNELS_SM80[kernel]
    else:
        ff, fs, bf, bs = ATTN_KERNELS[kernel]
    fwd = f / _attn_rate(gpu, s, d, ff, fs)
    both = 3.5 * f / _attn_rate(gpu, s, d, bf, bs)
    return fwd, np.maximum(both - fwd, 0.0)


def hbm_time(gpu: GPUSpec, nbytes: ArrayLike) -> FloatArray:
    """Seconds to stream `nbytes` (read + write) through HBM at the achieved bandwidth."""
    return hbm_time_at(gpu, nbytes, HBM_EFFICIENCY)


# ----------------------------------------------------------------------------------------------
# Fitting (run offline; tests check the constants above against the data)
# ----------------------------------------------------------------------------------------------


def fit_gemm_curve(rows: list[dict[str, float]]) -> tuple[float, float, float, float]:
    """Fit (peak_fraction, k_half, m_derate, fixed_s) on H200 `gemm` rows by least squares.

    Model t = c0 + c1·F + c2·F/K + c3·F·M/(M + GEMM_M_HALF) (F = 2MKN), rows weighted by 1/t.
    """
    m = np.array([r["M"] for r in rows], float)
    k = np.array([r["K"] for r in rows], float)
    n = np.array([r["N"] for r in rows], float)
    t = np.array([r["s"] for r in rows], float)
    f = 2 * m * k * n
    a = np.stack([np.ones_like(f), f, f / k, f * m / (m + GEMM_M_HALF)], 1) / t[:, None]
    c, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    rate = 1.0 / c[1]
    return rate / (H200_BF16_PEAK_TFLOPS * 1e12), c[2] / c[1], c[3] / c[1], c[0]


def fit_attention_curve(rows: list[dict[str, float]], key: str) -> tuple[float, float]:
    """Fit (fraction_at_d128, s_half) of `rate = R·s/(s+s_half)` on head_dim-128 `attn` rows.

    `key` is 'fwd_tflops' or 'fwdbwd_tflops'. Linear in 1/rate = 1/R + (s_half/R)·(1/s).
    """
    sel = [r for r in rows if r["head_dim"] == 128]
    s = np.array([r["seq"] for r in sel], float)
    rate = np.array([r[key] for r in sel], float)
    a = np.stack([np.ones_like(s), 1.0 / s], 1)
    c, *_ = np.linalg.lstsq(a, 1.0 / rate, rcond=None)
    r_inf = 1.0 / c[0]
    return r_inf / H200_BF16_PEAK_TFLOPS, c[1] * r_inf


def fit_attention_points(seq: Sequence[float], tflops: Sequence[float],
                         peak_tflops: float) -> tuple[float, float]:
    """Fit (fraction of `peak_tflops`, s_half) of `rate = R·s/(s+s_half)` on published points."""
    s = np.asarray(seq, dtype=np.float64)
    rate = np.asarray(tflops, dtype=np.float64)
    a = np.stack([np.ones_like(s), 1.0 / s], 1)
    c, *_ = np.linalg.lstsq(a, 1.0 / rate, rcond=None)
    r_inf = 1.0 / c[0]
    return r_inf / peak_tflops, c[1] * r_inf
