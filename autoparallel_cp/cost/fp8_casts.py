"""FP8 quantization traffic around each GEMM of a layer, op by op, per fp8 library and scaling.

An fp8 GEMM reads fp8 operands that something must write first: the library quantizes each
GEMM input (forward), each gradient output (backward) and each weight, and on Hopper also
writes a transposed fp8 copy of the tensors the backward GEMMs consume in the other layout
(cuBLASLt fp8 GEMMs take only the TN layout on sm90; on Blackwell tensor-scaled fp8 GEMMs take
any layout, TE v2.9 `transformer_engine/pytorch/utils.py` `is_non_tn_fp8_gemm_supported`:
sm100-sm11x, `GPUSpec.fp8_transpose_free`). Bytes are counted per element: read bf16 2 B,
write fp8 1 B, E8M0 scales 1 B per 32 elements.

Transformer Engine (`fp8_linear` "te"; Megatron-Core's TE layers: `TELayerNormColumnParallel-
Linear` for qkv and a dense MLP's fc1, TE `Linear` for the others, `TEGroupedLinear` for the
routed experts):

- delayed scaling (TE 1.x/2.x `DelayedScaling`, NeMo's default `fp8_recipe="delayed"`,
  nemo/lightning/pytorch/plugins/mixed_precision.py @8cfedd7203 l. 71): the amax is a by-product
  of the cast kernel and the scale comes from the history, so a quantize is one pass.
  TE v1.13 module/linear.py l. 110-137: with sequence parallelism the input is cast (read 2,
  write 1 on the local shard), gathered in fp8 and transposed in backward (`fp8_transpose`,
  l. 530: read 1, write 1 on the gathered tensor); without it one `fp8_cast_transpose_fused`
  (read 2, write 1 + 1). LayerNormLinear writes the norm output in fp8 directly
  (layernorm_linear.py l. 129-147: 1 B instead of the bf16 2 B, a saving of 1 B per element)
  and transposes the gathered copy in backward (l. 599). The gradient output
  (module/base.py `grad_output_preprocess` l. 797-872): a row-parallel layer under sequence
  parallelism casts the local shard, gathers fp8 and transposes the gathered tensor; otherwise
  one fused cast-transpose (read 2, write 1 + 1).
- current scaling (TE 2.x `Float8CurrentScaling`, Megatron-Bridge's `fp8_cs`): the amax must be
  known before the cast, so every quantize first reads the bf16 tensor once more for its amax
  (read 2); the norm computes its amax while it writes bf16 and a second kernel quantizes
  (TE v2.9 csrc/extensions/normalization.cpp `FUSED_NORM_AMAX_FP8`: write 2 as in bf16, then
  read 2 write 1).
- MXFP8 (TE 2.x `MXFP8BlockScaling`, Blackwell): rowwise and columnwise block-scaled copies of
  each quantized tensor in one kernel (read 2, write 1 + 1 + 2/32 scales); the norm runs
  unfused (normalization.cpp `UNFUSED` unless NVTE_NORM_FWD_USE_CUDNN), so its bf16 output is
  quantized by a separate kernel.
- Weights are cast (and transposed) once per step: Megatron-Core passes `is_first_microbatch`
  (extensions/transformer_engine.py @d98e8a64 l. 1338-1345) so later micro-batches reuse TE's
  cached fp8 weight; once per step (read 2, write 1 + 1 per weight element: about 11 ms for
  Llama 3.1 8B at tp 1 on H100 against dgxc's 9.4 s step) it is not charged here.

torchao float8 (`fp8_linear` "torchao", tensorwise dynamic scaling under torch.compile, as
torchtitan runs it): torchao's own roofline (torchao/testing/training/roofline_utils.py
`get_tensor_memory_traffic_ovhd_s`, tensorwise, `fuse_with_prev=False`): an input or gradient
output costs an amax pass (read 2), a second-stage amax kernel (no traffic) and one cast writing
both layouts (read 2, write 1 + 1); a weight costs an amax pass and one cast each in forward and
backward (read 2, write 1 each), every micro-batch (no cache across micro-batches).

XLA (`fp8_linear` "xla", MaxText): the quantize is fused into the producing fusion and the
dequantize into the cuBLASLt call (XLA's fp8 GEMM rewrite), so no separate kernel is charged;
only the fp8 GEMM rate applies.

Per-kernel floor: every cast kernel takes at least `FP8_KERNEL_FLOOR_S`, the H100 GPU time of
a one-element Triton kernel (torchao roofline_utils.py `KERNEL_LAUNCH_OVERHEAD_SEC` = 2 us,
measured from an H100 trace).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoparallel_cp.cost.common import ArrayLike, CostOptions, FloatArray, _f, _fp8_lib
from autoparallel_cp.cost.efficiency import hbm_time
from autoparallel_cp.cost.flops import Gemm
from autoparallel_cp.spec import GPUSpec, Job

#: GPU time of one minimal kernel on H100 (torchao roofline_utils.py KERNEL_LAUNCH_OVERHEAD_SEC).
FP8_KERNEL_FLOOR_S = 2e-6
#: Bytes per element an MXFP8 quantize writes: rowwise + columnwise fp8 and one E8M0 scale per
#: 32 elements for each (TE MXFP8BlockScaling, block 1x32).
MXFP8_WRITE_BYTES = 2.0 + 2.0 / 32.0

#: TE layers whose input is the sequence-parallel (gathered) norm output, per Megatron-Core's
#: layer specs: qkv and a dense MLP's fc1 are `TELayerNormColumnParallelLinear` (norm fused).
LN_FUSED = frozenset({"qkv", "mlp_fc1"})
#: Column-parallel layers whose input is gathered over tp under sequence parallelism.
GATHERED_INPUT = frozenset({"qkv", "q_proj", "q_down", "kv_down", "mlp_fc1", "shared_fc1"})
#: Row-parallel layers whose gradient output is gathered over tp under sequence parallelism.
GATHERED_GRAD = frozenset({"out_proj", "mlp_fc2", "shared_fc2"})
#: GEMMs that do not run in fp8: Megatron-Core's router is a plain linear in fp32/bf16
#: (moe/router.py `router_gating_linear`); torchtitan filters the router gate too.
NOT_FP8 = frozenset({"router"})


@dataclass(frozen=True)
class CastCost:
    """Quantization traffic of one layer and micro-batch on one rank: bytes and kernel counts,
    forward and backward (each array broadcasts like the GEMM shapes)."""

    fwd_bytes: FloatArray
    bwd_bytes: FloatArray
    fwd_kernels: FloatArray
    bwd_kernels: FloatArray


def _quantize(elems: FloatArray, local: FloatArray, scaling: str, transpose: bool,
              gathered: FloatArray, ln_fused: bool
              ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """TE bytes and kernels of quantizing one tensor of `elems` elements (`local` of them on
    this rank before a sequence-parallel gather; `gathered` 1 where it is gathered):
    (forward-side bytes, wgrad-side bytes, kernels, wgrad-side kernels). The wgrad side is
    the transposed copy a gathered (or norm-fused) tensor gets in backward; any other tensor
    writes it in the same kernel (fused cast-transpose)."""
    t = 1.0 if transpose else 0.0
    zero = 0.0 * elems * gathered
    if scaling == "mxfp8":
        # norm output written in bf16 already (unfused), then one kernel: read 2, write both
        return (2.0 + MXFP8_WRITE_BYTES) * local + zero, zero, 1.0 + zero, zero
    cur = 1.0 if scaling == "current" else 0.0
    if ln_fused:
        # delayed: the norm kernel writes fp8 instead of bf16 (-1 B); current: it writes
        # bf16 + amax as in bf16 and a second kernel quantizes (read 2, write 1)
        first = (3.0 * local if cur else -1.0 * local) + zero
        return first, 2.0 * t * elems + zero, cur + zero, t + zero
    amax = 2.0 * cur * local
    split = (amax + 3.0 * local, 2.0 * t * elems, 1.0 + cur + zero, t + zero)
    fused = (amax + (3.0 + t) * local, zero, 1.0 + cur + zero, zero)
    g = gathered > 0
    return tuple(np.where(g, a, b) for a, b in zip(split, fused, strict=True))  # type: ignore[return-value]


def te_cast_cost(gemms: list[Gemm], tp: ArrayLike, sp: ArrayLike, scaling: str,
                 transpose: bool) -> CastCost:
    """Transformer Engine quantization of the inputs and gradient outputs of `gemms` (the
    layer's forward GEMMs on one rank, `flops.layer_gemms`) under `scaling` ("delayed",
    "current", "mxfp8"); `transpose`: the GPU needs TN fp8 GEMMs (Hopper)."""
    tp_ = _f(tp)
    rep = np.where(_f(sp) > 0, 1.0 / tp_, 1.0)
    fb = fk = bb = bk = 0.0 * rep
    on = (_f(sp) > 0) & (tp_ > 1)
    for g in gemms:
        if g.name in NOT_FP8:
            continue
        x = g.m * g.k * g.count  # input elements (gathered)
        gy = g.m * g.n * g.count  # gradient-output elements (gathered)
        gin = np.where(on & (g.name in GATHERED_INPUT), 1.0, 0.0)
        ggr = np.where(on & (g.name in GATHERED_GRAD), 1.0, 0.0)
        lx = np.where(gin > 0, x * rep, x)
        lg = np.where(ggr > 0, gy * rep, gy)
        b0, b1, k0, k1 = _quantize(x, lx, scaling, transpose, gin, g.name in LN_FUSED)
        fb, fk = fb + b0, fk + k0
        bb, bk = bb + b1, bk + k1  # the input's transposed copy is made for wgrad
        c0, c1, q0, q1 = _quantize(gy, lg, scaling, transpose, ggr, False)
        bb, bk = bb + c0 + c1, bk + q0 + q1
    return CastCost(fb, bb, fk, bk)


def torchao_cast_cost(gemms: list[Gemm], tp: ArrayLike, sp: ArrayLike) -> CastCost:
    """torchao float8 tensorwise quantization of `gemms` (roofline_utils.py counts, see the
    module docstring): input and gradient output 2 + (2 + 1 + 1) B per element in 3 kernels
    each, weight 2 + 3 B forward (3 kernels with the second-stage amax) and 3 B backward
    (1 kernel). DTensor sequence parallelism casts the local shard before its gather."""
    tp_ = _f(tp)
    rep = np.where(_f(sp) > 0, 1.0 / tp_, 1.0)
    fb = fk = bb = bk = 0.0 * rep
    for g in gemms:
        if g.name in NOT_FP8:
            continue
        lx = g.m * g.k * g.count * (rep if g.name in GATHERED_INPUT else 1.0)
        lg = g.m * g.n * g.count * (rep if g.name in GATHERED_GRAD else 1.0)
        w = g.k * g.n * g.count
        fb = fb + 6.0 * lx + 5.0 * w
        fk = fk + 3.0 + 3.0
        bb = bb + 6.0 * lg + 3.0 * w
        bk = bk + 3.0 + 1.0
    return CastCost(fb, bb, fk, bk)


def layer_cast_cost(lib: str, scaling: str, gemms: list[Gemm], tp: ArrayLike, sp: ArrayLike,
                    transpose: bool) -> CastCost:
    """Quantization traffic of one layer for fp8 library `lib` ("te", "torchao", "xla")."""
    if lib == "te":
        return te_cast_cost(gemms, tp, sp, scaling, transpose)
    if lib == "torchao":
        return torchao_cast_cost(gemms, tp, sp)
    zero = 0.0 * _f(tp) * _f(sp)
    return CastCost(zero, zero, zero, zero)


def dtype_of(gemm: Gemm, dtype: str) -> str:
    """The precision `gemm` runs in under a recipe computing in `dtype` (`NOT_FP8` stay bf16)."""
    return "bf16" if gemm.name in NOT_FP8 else dtype


def with_cast_time(job: Job, opts: CostOptions, gpu: GPUSpec, gemms: list[Gemm], tp: ArrayLike,
                   sp: ArrayLike, fwd_s: FloatArray, bwd_s: FloatArray
                   ) -> tuple[FloatArray, FloatArray]:
    """(`fwd_s`, `bwd_s`) plus the layer's quantization time when the recipe computes in fp8:
    its bytes at the achieved HBM bandwidth, at least `FP8_KERNEL_FLOOR_S` per kernel. The
    library is behaviour `fp8_linear` (None: TE for Megatron recipes, torchao for PyTorch)."""
    if job.recipe.compute_dtype != "fp8":
        return fwd_s, bwd_s
    lib = opts.fp8_linear or _fp8_lib(job)
    cc = layer_cast_cost(lib, opts.fp8_scaling, gemms, tp, sp, not gpu.fp8_transpose_free)
    return (fwd_s + np.maximum(hbm_time(gpu, cc.fwd_bytes), cc.fwd_kernels * FP8_KERNEL_FLOOR_S),
            bwd_s + np.maximum(hbm_time(gpu, cc.bwd_bytes), cc.bwd_kernels * FP8_KERNEL_FLOOR_S))
