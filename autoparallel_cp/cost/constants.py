"""Named constants of the cost model, each with its source or the measurement it was fitted on."""

from __future__ import annotations

from autoparallel_cp.spec import GIB

MODE_CODES = {"none": 0, "selective": 1, "full": 2}

# ---------------------------------------------------------------------------------------------
# Named constants (each justified)
# ---------------------------------------------------------------------------------------------

#: CUDA context + cuBLAS workspaces + NCCL communicator buffers, outside the caching allocator
#: (typical `nvidia-smi` minus `memory_reserved` on H100 with NCCL initialised: 0.7-1.2 GiB).
CUDA_CONTEXT_BYTES = 1.0 * GIB
#: Caching-allocator fragmentation: cached-but-free bytes per byte of *transient* (per-step)
#: allocations at the peak, `model_state.fragmentation_bytes`. The allocator splits cached
#: segments to serve smaller requests (best fit) and packs 1-10 MiB requests into 20 MiB
#: segments (PyTorch docs, "CUDA semantics > Memory management", `max_split_size_mb`;
#: c10/cuda/CUDACachingAllocator.cpp header and `kLargeBuffer`), so the free space lies in the
#: segments that activations come and go in; buffers allocated once at start-up and never
#: freed get segments of their own size (> 10 MiB requests are rounded up to 2 MiB) and leave
#: none. Fitted on the one fresh-cache point we have: benchmarks/data/h200_pytorch_amp_train
#: row 0 (tiny1b, seq 2048, mbs 1, first row after `torch.cuda.empty_cache()`; params, grads
#: and Adam states all persistent there, `zero_grad(set_to_none=False)`): (max reserved - max
#: allocated) / (max allocated - static) = (21.202 - 20.728) / (20.728 - 15.319) GB = 0.088.
#: The other 17 rows of that file reuse a cache grown by earlier shapes (not fresh).
ALLOCATOR_FRAGMENTATION = 0.088
#: Layers whose full (unsharded) bf16 parameters are resident at once under ZeRO-3 / FSDP:
#: the layer being computed and the prefetched next one (FSDP `forward_prefetch` / FSDP2).
ZERO3_RESIDENT_LAYERS = 2
#: Gradient-reduction buckets not aliased to the gradient buffer (PyTorch DDP default
#: `bucket_cap_mb=25`, two in flight); Megatron's buckets are views of its grad buffer (0).
DDP_BUCKET_BYTES = 2 * 25 * 2**20
#: Share of the DP gradient reduction that runs after backward even when overlapped: the last
#: bucket starts after the last layer's backward (Megatron default bucket 40M params).
DP_LAST_BUCKET_FRACTION = 0.1
#: Share of the GPU's SMs a collective's kernel occupies while it overlaps compute (one CTA per
#: NCCL channel): an H100 `ncclAllGather` overlapped with a GEMM runs 24 CTAs on 132 SMs and
#: the GEMM slows accordingly (NVIDIA developer forum, "Compute-communication overlap causes
#: severe GEMM performance degradation because of tail effect", nsys trace; DeepSeek-V3 report
#: §3.2.2 likewise reserves 20 of 132 SMs for communication). See `overlap_exposed`.
COMM_SM_SHARE = 24.0 / 132.0
#: Least exposed share of an overlapped DP gradient synchronisation: the last bucket runs after
#: backward, the rest slows the backward it overlaps by COMM_SM_SHARE of its duration
#: (`overlap_exposed` on the overlapped part): exposed = max(DP_TAIL_FRACTION·d, d - window).
DP_TAIL_FRACTION = DP_LAST_BUCKET_FRACTION + COMM_SM_SHARE * (1.0 - DP_LAST_BUCKET_FRACTION)
#: Bytes of HBM traffic per parameter of one Adam step (fp32 master r/w 8, m r/w 8, v r/w 8,
#: fp32 grad read 4, bf16 weight write 2): memory-bound (Megatron fused Adam / torch fused AdamW).
ADAM_BYTES_PER_PARAM = 30.0
#: HBM traffic per parameter of torch's multi-tensor (foreach) AdamW over fp32 params
#: (torch/optim/adam.py `_multi_tensor_adam`, decoupled weight decay): param *= (1 - lr·wd)
#: r4 w4; lerp m toward g r8 w4; v *= b2 r4 w4; v += (1-b2)·g² r8 w4; sqrt(v) r4 w4; / bias
#: correction r4 w4; + eps r4 w4; param addcdiv r12 w4 = 80 (vs 28 fused).
ADAM_FOREACH_BYTES_PER_PARAM = 80.0
#: HBM traffic per parameter of global gradient-norm clipping on fp32 gradients: the norm pass
#: reads 4, the scaling pass reads and writes 8 (Megatron `clip_grad_norm_fp32`: multi-tensor
#: l2norm + scale; torch `clip_grad_norm_`: foreach norm + foreach mul).
GRAD_CLIP_BYTES_PER_PARAM = 12.0
#: HBM traffic per (tp-local) parameter of one ZeRO-3 layer per micro-batch in PyTorch FSDP2
#: (torch/distributed/_composable/fsdp/_fsdp_collectives.py): the all-gather output is copied
#: out into the unsharded parameters in forward and again in backward (`split_with_sizes_copy`,
#: r2 w2 each), and the bf16 unsharded gradients are packed into the reduce-scatter input in
#: the reduce dtype (`_chunk_cat`, r2 w grad_reduce_bytes). The shard-sized copy-in is /dp and
#: ignored. Megatron's buffers are views of the communication buffers (no copies).
FSDP_COPY_OUT_BYTES_PER_PARAM = 8.0
#: Bytes per logits element held at the loss peak (per token per vocab entry):
#: Megatron vocab-parallel CE keeps bf16 logits 2 + fp32 copy 4 (softmax computed in place,
#: backward turns it into the gradient in place, then casts it to bf16: 4 + 2).
#: PyTorch `cross_entropy(logits.float())`: the forward holds bf16 logits 2 + fp32 copy 4 +
#: log-softmax output 4 = 10, but the backward is higher: `nll_loss_backward` materialises a
#: dense fp32 gradient (4) and `_log_softmax_backward_data` writes another (4) while the saved
#: log-softmax output (4) is still alive = 12 (the bf16 logits are gone by then when the
#: caller drops them, as torchtitan's `del pred` does). Autocast weight copies (pytorch-amp)
#: are freed at that moment but stay counted in the buffers: pytorch-amp peaks come out up
#: to 2 B/param high (+1..5% on the H200 rows), on the safe side.
LOGITS_BYTES = {"megatron": 6.0, "pytorch": 12.0}
#: PyTorch with tensor parallelism computes the loss on vocab-sharded DTensor logits (loss
#: parallelism, torchtitan's default with TP): `torch.distributed.tensor.parallel.loss.
#: _log_softmax` keeps the fp32 input, `shifted = x - max` and `exp(shifted)` (or the result)
#: alive at once, beside the bf16 logits: 2 + 4 + 4 + 4 = 14 B per logit in forward.
LOSS_PARALLEL_LOGITS_BYTES = 14.0
#: HBM bytes moved per logits element by the (unfused) cross entropy, forward + backward, after
#: the head GEMM wrote the bf16 logits. Megatron `_VocabParallelCrossEntropy`
#: (megatron/core/tensor_parallel/cross_entropy.py): `.float()` r2 w4, max r4, in-place
#: subtract r4 w4, in-place exp r4 w4, sum r4, in-place div (softmax) r4 w4 = 38 forward;
#: backward `grad_input.mul_(grad_output)` r4 w4, cast back to bf16 r4 w2 = 14; total 52.
#: PyTorch `F.cross_entropy(logits.float(), labels)`: cast r2 w4, log_softmax (max pass r4,
#: sum-exp pass r4, write pass r4 w4) = 22 forward; backward: nll_loss grad zero-fill w4,
#: log_softmax backward (sum pass r4, r4 r4 w4), cast back r4 w2 = 26; total 48.
CE_BYTES_PER_LOGIT = {"megatron": 52.0, "pytorch": 48.0}
#: Of those, the forward passes' (the itemization above): 38 of Megatron's 52, 22 of eager
#: PyTorch's 48; the rest is the loss's backward (a split backward's B: cost/pass_split.py).
CE_FWD_BYTES_PER_LOGIT = {"megatron": 38.0, "pytorch": 22.0}
#: The compiled loss (behaviour `compiled_loss`, spec/recipe.py): at its backward the loss
#: holds its bf16 input and the bf16 gradient it writes, 2 + 2 B per logit (the fp32 upcast,
#: log-softmax and their gradients stay in registers of Inductor's fused kernels).
COMPILED_LOGITS_BYTES = 4.0
#: Its HBM traffic per logit: forward, two looped reductions over the bf16 row (max, then the
#: sum of exponentials: r2 + r2; the target logit and the z-loss read the result); backward,
#: one fused pass (r2 w2) writing softmax minus one-hot in bf16. 8 B against eager's 48.
COMPILED_CE_BYTES_PER_LOGIT = 8.0
#: Of those, the forward's two reductions (r2 + r2), the backward the fused r2 w2 pass.
COMPILED_CE_FWD_BYTES_PER_LOGIT = 4.0
#: HBM passes (read+write) of one elementwise op per byte of its input in backward relative to
#: forward (grad in + saved input read, grad out write): backward traffic = 2x forward.
ELEMENTWISE_BWD_FACTOR = 2.0
#: Extra HBM traffic of unfused eager PyTorch elementwise ops (separate cast, scale, mul kernels)
#: relative to fused Megatron/compiled kernels. Chosen on the H200 eager rows (development
#: file) before session 15; checked since against session 15's kernel microbenchmarks
#: (data/h200_s15/probe_set1.jsonl, kind=op): the measured fp32 RMSNorm (fwd+bwd 14.6 ps per
#: element at hidden 4096) and bf16 SwiGLU (17.4 ps per ffn element) kernels plus the residual
#: adds sum to ~740 KB of traffic-equivalent per token and layer of tiny1b, against 645 KB from
#: the fused byte list x this factor (x3 for forward + backward): within 15%. Applying those two
#: ops' own ratio (3.7x their fused bytes) to the whole list instead over-predicts the
#: development rows by +14.6%: the list's adds and copies are not eager-inflated that much.
EAGER_ELEMENTWISE_FACTOR = 2.0
#: Eager HBM bytes per element of the Llama modules as torchtitan (2024) and HF transformers
#: write them (`CostOptions.eager_ops="llama-upcast"`), one kernel per op on bf16 inputs:
#: RMSNorm `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w`: cast r2 w4,
#: pow r4 w4, mean r4, mul r4 w4, cast back r4 w2, weight mul r2 w2 = 36 (fused: 4).
EAGER_LLAMA_NORM_BYTES = 36.0
#: RoPE through fp32 (torchtitan: `view_as_complex(x.float())` times `freqs_cis`, then
#: `type_as`): cast r2 w4, complex multiply r4 w4, cast back r4 w2 = 20 per q/k element
#: (fused: 4).
EAGER_LLAMA_ROPE_BYTES = 20.0
#: `silu(w1(x)) * w3(x)`: silu r2 w2, mul r4 w2 = 10 per ffn element (fused: 6).
EAGER_LLAMA_SWIGLU_BYTES = 10.0
#: Eager attention core between its two batched GEMMs (`CostOptions.eager_attention`
#: "scale-mask-clamp": Baichuan2-13B's remote code, modeling_baichuan.py
#: `BaichuanAttention.forward` as FlagPerf @b3382b9b bundles it, the path without xformers):
#: activation-dtype reads + writes per score element, forward: `/ math.sqrt(head_dim)` r1 w1,
#: `+ attention_mask` (the ALiBi mask in the activation dtype, `_buffered_future_mask`) r2 w1,
#: `torch.max(w, finfo.min)` r1 w1, softmax r1 w1 = 9 (Megatron's fused scale-mask-softmax:
#: 2).
EAGER_ATTN_FWD_PASSES = 9.0
#: Backward, per score element: softmax backward reads y and dy and writes dx (3); `torch.max`
#: against a tensor is `maximum`, whose gradient PyTorch computes as
#: `at::where(self == other, grad / 2, grad).masked_fill_(self < other, 0)`
#: (tools/autograd/derivatives.yaml `maximum`): grad / 2 r1 w1, self == other r1, where r2 w1,
#: self < other r1, masked_fill_ r1 w1 = 9 activation-dtype passes; the scale's gradient
#: `grad / sqrt(d)` r1 w1; the mask add passes its gradient through (the mask needs none):
#: 3 + 9 + 2 = 14 (fused: 4).
EAGER_ATTN_BWD_PASSES = 14.0
#: ... plus the two 1-byte bool masks of the `maximum` gradient, each written once and read
#: once: 4 bytes per score element.
EAGER_ATTN_BWD_MASK_BYTES = 4.0
#: Host (Python + dispatcher + launch) time of one eager PyTorch decoder layer's forward +
#: backward under autocast; an unfused, uncompiled layer cannot run faster than its host issues
#: kernels. Measured on the H200 machine (session 15, data/h200_s15/probe_set1.jsonl kind=host,
#: benchmarks/measure_h200_ops.py `host_section`): a 4- and a 16-layer decoder of hidden 256
#: on 64 tokens (GPU work negligible) took 7.26 and 29.49 ms per forward + backward: slope
#: 1.852 ms per layer. Host speed is the machine's: the blind set of the third lease ran a
#: 32-layer decoder at 0.9 ms per layer (train_set3 row 14, predicted +119%);
#: benchmarks/measure_h200_host.py is the same-machine check that would settle it.
EAGER_HOST_S_PER_LAYER = 1.852e-3
#: Extra host time of a `torch.utils.checkpoint` layer (replayed forward + saved-tensor hooks):
#: same microbenchmark with recompute, 15.61 and 55.55 ms: slope 3.328 ms, i.e. 1.476 ms more.
EAGER_HOST_S_RECOMPUTE = 1.476e-3
#: Host time of one operation issued from Python on a DGX-class x86 host: CPU time of one
#: `torch.nn.Linear` forward (Python, ATen dispatch, autograd record, cuBLAS launch), BF16,
#: hidden 2048, 8192 tokens, on a DGX H100 (Intel Xeon Platinum 8480C): 13.48 us
#: (NVIDIA/TransformerEngine issue #2053, "[PyTorch] High CPU overhead on Grace systems",
#: 2025-08-11, table "H100 DGX / torch"). Used for every host operation Megatron-Core's MoE
#: layer issues (cost/moe_host.py); DGX B200's Xeon Platinum 8570 is the same core generation.
MCORE_HOST_S_PER_OP = 13.48e-6
