"""Input specifications: model architecture, cluster hardware, training recipe, job.

Every spec is a strict pydantic v2 model: unknown fields (typos) are rejected, sizes must be
positive, and cross-field rules (heads divide hidden, KV heads divide heads, top-k <= experts)
are checked so that a bad file fails with a message naming the field.

Units used throughout the project:
- memory in bytes (GPU memory in the files is given in GiB or GB, see `GPUSpec`),
- compute peaks in TFLOP/s (1e12 FLOP/s), dense (no 2:4 sparsity),
- bandwidths in GB/s (1e9 bytes/s) per GPU and per direction, latencies in microseconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

GIB = 1024**3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class MoESpec(_Strict):
    """Mixture-of-experts MLP (Mixtral, DeepSeek-V3 style)."""

    num_experts: PositiveInt
    top_k: PositiveInt
    expert_ffn_hidden_size: PositiveInt
    num_shared_experts: int = Field(0, ge=0)
    shared_expert_ffn_hidden_size: PositiveInt | None = None  # default: expert_ffn_hidden_size
    first_k_dense_layers: int = Field(0, ge=0)  # DeepSeek `first_k_dense_replace`
    moe_layer_freq: PositiveInt = 1  # every n-th layer (after the dense prefix) is MoE
    router_bias: bool = False  # DeepSeek-V3 `e_score_correction_bias` (num_experts floats)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        return self

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size


class MLASpec(_Strict):
    """DeepSeek multi-head latent attention (arXiv 2405.04434 §2.1)."""

    q_lora_rank: PositiveInt | None  # None: plain q projection (DeepSeek-V2-Lite)
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class ModelSpec(_Strict):
    """A decoder-only transformer (dense or MoE)."""

    name: str
    num_layers: PositiveInt
    hidden_size: PositiveInt
    ffn_hidden_size: PositiveInt  # dense MLP width (for MoE models: the dense layers' width)
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None  # default: num_attention_heads (MHA)
    head_dim: PositiveInt | None = None  # default: hidden_size // num_attention_heads
    vocab_size: PositiveInt
    max_position_embeddings: PositiveInt = 4096
    position_embedding: Literal["rope", "learned", "alibi"] = "rope"
    tie_embeddings: bool = False
    mlp: Literal["gelu", "swiglu"] = "swiglu"
    norm: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    embedding_norm: bool = False  # norm right after the word embedding (BLOOM)
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mtp_layers: int = Field(0, ge=0)  # DeepSeek-V3 multi-token-prediction modules
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        a = self.num_attention_heads
        if self.mla is None:
            if self.head_dim is None and self.hidden_size % a != 0:
                raise ValueError(
                    f"num_attention_heads ({a}) must divide hidden_size ({self.hidden_size}) "
                    "unless head_dim is given"
                )
            if self.num_kv_heads is not None and a % self.num_kv_heads != 0:
                raise ValueError(
                    f"num_kv_heads ({self.num_kv_heads}) must divide num_attention_heads ({a})"
                )
        if self.moe is not None and self.moe.first_k_dense_layers > self.num_layers:
            raise ValueError(
                f"moe.first_k_dense_layers ({self.moe.first_k_dense_layers}) exceeds "
                f"num_layers ({self.num_layers})"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer `i` (0-based) has an MoE MLP (DeepSeek/HF `first_k_dense_replace`)."""
        m = self.moe
        if m is None:
            return False
        return i >= m.first_k_dense_layers and (i - m.first_k_dense_layers) % m.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))


# --------------------------------------------------------------------------------------------
# Cluster
# --------------------------------------------------------------------------------------------


class GPUSpec(_Strict):
    """One accelerator type. `memory_gib` is the usable HBM size in GiB (2^30 bytes)."""

    name: str
    memory_gib: PositiveFloat
    bf16_tflops: PositiveFloat  # dense peak
    fp8_tflops: PositiveFloat | None = None  # dense peak; None: no fp8 tensor cores
    fp32_tflops: PositiveFloat | None = None  # non-tensor-core fp32 (for memory-bound estimates)
    hbm_gbps: PositiveFloat  # HBM bandwidth, GB/s
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


class LinkSpec(_Strict):
    """A link class seen from one GPU: bandwidth per GPU per direction (GB/s), latency (us)."""

    bandwidth_gbps: PositiveFloat
    latency_us: float = Field(5.0, ge=0)
    source: str = ""


class NodeGroup(_Strict):
    """A homogeneous set of nodes: same GPU, same node fabric."""

    name: str
    gpu: GPUSpec
    gpus_per_node: PositiveInt
    num_nodes: PositiveInt
    intra_node: LinkSpec  # NVLink/NVSwitch
    inter_node: LinkSpec  # network bandwidth per GPU (e.g. 8 x 400 Gb/s NICs -> 50 GB/s/GPU)
    price_per_gpu_hour: PositiveFloat | None = None  # USD

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes


class ClusterSpec(_Strict):
    """One or more node groups on one fabric. Several groups = a heterogeneous cluster."""

    name: str
    node_groups: list[NodeGroup] = Field(min_length=1)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        names = [g.name for g in self.node_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"node_groups names must be unique, got {names}")
        return self

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.node_groups)

    @property
    def heterogeneous(self) -> bool:
        return len(self.node_groups) > 1

    def take_gpus(self, n: int) -> ClusterSpec:
        """The sub-cluster of the first `n` GPUs, whole nodes, groups in file order.

        Raises ValueError when `n` is not a whole number of nodes of the groups it spans.
        """
        if n <= 0:
            raise ValueError(f"gpus must be positive, got {n}")
        if n > self.num_gpus:
            raise ValueError(f"gpus ({n}) exceeds the cluster's {self.num_gpus} GPUs")
        left = n
        groups: list[NodeGroup] = []
        for g in self.node_groups:
            if left == 0:
                break
            take = min(left, g.num_gpus)
            if take % g.gpus_per_node != 0 and take > g.gpus_per_node:
                raise ValueError(
                    f"gpus ({n}) is not a whole number of {g.gpus_per_node}-GPU nodes "
                    f"in node group {g.name!r}"
                )
            if take < g.gpus_per_node:
                # a partial single node (e.g. --gpus 4 on 8-GPU nodes)
                groups.append(g.model_copy(update={"num_nodes": 1, "gpus_per_node": take}))
            else:
                groups.append(g.model_copy(update={"num_nodes": take // g.gpus_per_node}))
            left -= take
        return self.model_copy(update={"node_groups": groups})

    def take_nodes(self, n: int) -> ClusterSpec:
        """The sub-cluster of the first `n` nodes, groups in file order."""
        total = sum(g.num_nodes for g in self.node_groups)
        if n <= 0 or n > total:
            raise ValueError(f"nodes must be in 1..{total}, got {n}")
        left = n
        groups = []
        for g in self.node_groups:
            if left == 0:
                break
            take = min(left, g.num_nodes)
            groups.append(g.model_copy(update={"num_nodes": take}))
            left -= take
        return self.model_copy(update={"node_groups": groups})


# --------------------------------------------------------------------------------------------
# Training recipe
# --------------------------------------------------------------------------------------------


class FrameworkBehaviour(_Strict):
    """How the training framework runs a layer, where frameworks differ (not a plan axis).

    The cost model reads it as `factors.CostOptions` through `factors.options_for`; the
    defaults describe Megatron-LM with Transformer Engine.

    - ``dropout``: GPT-style dropout after attention, MLP and embedding (1-byte masks,
      Korthikanti §4.1); modern decoders train without it.
    - ``tp_comm_overlap``: fraction of TP collectives hidden behind GEMMs (Megatron
      ``--tp-comm-overlap``, torchtitan async TP); 0 = exposed (Megatron default).
    - ``tp_comm_overlap_bwd``: the same for the backward pass; None = as forward (Megatron's
      userbuffer overlap covers dgrad/wgrad). torchtitan's 2024 async TP micro-pipelines the
      forward all-gather/matmul and matmul/reduce-scatter (the recompute replays them too);
      its announcement reports "~20% forward pass speedup and ~8% E2E speedup in Llama3 70B",
      i.e. a forward-only effect: 0.
    - ``dp_overlap``: DP gradient reduction overlapped with backward (Megatron
      ``--overlap-grad-reduce``, FSDP/DDP default).
    - ``fused``: fused elementwise kernels (Megatron / torch.compile); None = framework default.
    - ``selective_policy``: what `recompute=selective` means: "attention" (Megatron: recompute
      the attention core, Korthikanti §5) or "op" (torchtitan op-level SAC: keep the layer
      input, the attention output and every other matmul output; recompute the rest).
    - ``attention_kernel``: flash-attention kernel generation, "cudnn" (default: cuDNN /
      FlashAttention-3 class, what the H200 curves measured) or "fa2" (FlashAttention-2, e.g.
      PyTorch SDPA 2.5-2.10 on H100; efficiency.ATTN_KERNELS).
    - ``gqa_repeat_kv``: grouped-query K, V are expanded to all query heads with a copy before
      the attention kernel (torchtitan 2024 Llama `repeat_kv`; SDPA then saves the expanded
      K, V), instead of a kernel that reads the shared heads (TE, SDPA `enable_gqa`).
    - ``eager_ops``: how unfused (eager) elementwise code is costed: "generic" (the fused
      traffic times EAGER_ELEMENTWISE_FACTOR, calibrated on the H200 script) or
      "llama-upcast" (op by op for Llama modules written with an fp32-upcast RMSNorm and fp32
      RoPE, as torchtitan and HF transformers do: EAGER_LLAMA_*).
    - ``cp_ring``: how context parallelism exchanges K, V: "p2p" (Megatron / Transformer
      Engine: one send/recv per ring step, each hidden behind that step's attention; dK, dV
      in bf16) or "torch-allgather" (PyTorch ring attention with torchtitan's default
      `context_parallel_rotate_method="allgather"`: all K, V gathered behind the first step
      only, fp32 dK, dV shifted every step).
    """

    selective_policy: Literal["attention", "op"] = "attention"
    dropout: bool = False
    tp_comm_overlap: float = Field(0.0, ge=0.0, le=1.0)
    tp_comm_overlap_bwd: float | None = Field(None, ge=0.0, le=1.0)
    dp_overlap: bool = True
    fused: bool | None = None  # None: fused for megatron, eager for pytorch
    attention_kernel: Literal["cudnn", "fa3", "fa2"] = "cudnn"
    gqa_repeat_kv: bool = False
    eager_ops: Literal["generic", "llama-upcast"] = "generic"
    cp_ring: Literal["p2p", "torch-allgather"] = "p2p"


class TrainingRecipe(_Strict):
    """Precisions and optimizer: how many bytes each parameter costs, and the GEMM precision.

    Bytes per parameter follow Megatron's distributed-optimizer table
    (docs/user-guide/features/dist_optimizer.md): bf16 params + fp32 main grads = 6 + 12/d.
    """

    name: str
    framework: Literal["megatron", "pytorch"] = "megatron"
    weight_bytes: PositiveInt = 2  # the copy used in forward/backward (bf16=2, fp32=4)
    grad_bytes: PositiveInt = 4  # accumulated (main) gradient
    #: bytes per gradient element on the wire of the DP reduction. Megatron forces fp32
    #: accumulation *and* all-reduce for bf16 (`arguments.py`: "bfloat16 requires gradient
    #: accumulation and all-reduce to be done in fp32") unless --grad-reduce-in-bf16; FSDP2
    #: `reduce_dtype=float32` (torchtitan default). fp16 Megatron (2021) reduced in fp16 (2).
    grad_reduce_bytes: PositiveInt = 4
    master_weight_bytes: int = Field(4, ge=0)  # fp32 master copy; 0 when weights are already fp32
    optimizer_state_bytes: int = Field(8, ge=0)  # Adam m and v in fp32
    activation_bytes: PositiveInt = 2  # bf16 activations
    compute_dtype: Literal["bf16", "fp8"] = "bf16"
    transient_weight_copy_bytes: int = Field(0, ge=0)  # autocast bf16 weight copies (pytorch-amp)
    flash_attention: bool = True
    optimizer: Literal["adam"] = "adam"
    #: Adam implementation: "fused" (Megatron FusedAdam / torch `fused=True`: one pass over
    #: param, grad, m, v) or "foreach" (torch multi-tensor AdamW, torchtitan's 2024 default
    #: `fused=False`: one pass per arithmetic step, factors.ADAM_FOREACH_BYTES_PER_PARAM).
    optimizer_kernel: Literal["fused", "foreach"] = "fused"
    #: global gradient-norm clipping every step (Megatron --clip-grad 1.0, torchtitan
    #: max_norm 1.0 by default): one norm pass and one scaling pass over the local gradients.
    grad_clip: bool = True
    #: framework behaviour the cost model needs (recompute policy, fusion, attention kernel,
    #: TP overlap...); `evaluate(..., options=...)` overrides it for one call.
    behaviour: FrameworkBehaviour = Field(default_factory=FrameworkBehaviour)
    source: str = ""

    @property
    def state_bytes_per_param(self) -> int:
        """Unsharded model-state bytes per parameter (18 for megatron-bf16, 16 for pytorch-amp)."""
        return (
            self.weight_bytes + self.grad_bytes + self.master_weight_bytes
            + self.optimizer_state_bytes
        )


RECIPES: dict[str, TrainingRecipe] = {
    "megatron-bf16": TrainingRecipe(
        name="megatron-bf16",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        source=("Megatron-LM dist_optimizer.md: bf16 params, fp32 main grads, "
                "fp32 Adam (18 B/param)"),
    ),
    "pytorch-amp": TrainingRecipe(
        name="pytorch-amp",
        framework="pytorch",
        weight_bytes=4,
        grad_bytes=4,
        master_weight_bytes=0,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        transient_weight_copy_bytes=2,
        source="PyTorch autocast(bf16) with fp32 params/grads and fused AdamW (16 B/param)",
    ),
    "torchtitan-fsdp": TrainingRecipe(
        name="torchtitan-fsdp",
        framework="pytorch",
        weight_bytes=4,
        grad_bytes=4,
        master_weight_bytes=0,
        optimizer_state_bytes=8,
        compute_dtype="bf16",
        optimizer_kernel="foreach",
        behaviour=FrameworkBehaviour(selective_policy="op", fused=True, attention_kernel="fa2",
                                     gqa_repeat_kv=True, eager_ops="llama-upcast",
                                     cp_ring="torch-allgather"),
        source=("torchtitan 2024-12 Llama: FSDP2 with fp32 sharded params, bf16 compute, fp32 "
                "reduce; foreach AdamW; torch.compile per block; op-level SAC as `selective`; "
                "SDPA on FlashAttention-2; repeat_kv for GQA; all-gather ring attention "
                "(16 B/param)"),
    ),
    "megatron-fp8": TrainingRecipe(
        name="megatron-fp8",
        framework="megatron",
        weight_bytes=2,
        grad_bytes=4,
        master_weight_bytes=4,
        optimizer_state_bytes=8,
        compute_dtype="fp8",
        source="megatron-bf16 with Transformer Engine fp8 GEMMs (delayed scaling)",
    ),
}


# --------------------------------------------------------------------------------------------
# Job: what is to be trained, where
# --------------------------------------------------------------------------------------------


class Job(_Strict):
    """One planning problem: a model, the GPUs used, a recipe, sequence length and global batch."""

    model: ModelSpec
    cluster: ClusterSpec  # already cut to the GPUs used (see ClusterSpec.take_gpus)
    recipe: TrainingRecipe = RECIPES["megatron-bf16"]
    seq_len: PositiveInt = 4096
    global_batch: PositiveInt = 512  # sequences per optimizer step

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
