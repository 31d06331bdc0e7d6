"""Base of the input specifications: strict pydantic models, the units they use, and the bounds
every number must lie within.

Every spec is a strict pydantic v2 model: unknown fields (typos) are rejected, sizes must be
positive, and cross-field rules (heads divide hidden, KV heads divide heads, top-k <= experts)
are checked so that a bad file fails with a message naming the field.

Units used throughout the project:
- memory in bytes (GPU memory in the files is given in GiB or GB, see `GPUSpec`),
- compute peaks in TFLOP/s (1e12 FLOP/s), dense (no 2:4 sparsity),
- bandwidths in GB/s (1e9 bytes/s) per GPU and per direction, latencies in microseconds.

Bounds: every number is bounded to a physically meaningful range (`Bounded`), generously
above the largest published model or machine (each bound says why), and low enough that the
solver's integer model stays far from int64 overflow (the search tabulates times in
microseconds and memory in KiB; `Job` also bounds the step-time scale of the whole problem).
Booleans are refused where a number is expected (YAML `true` would otherwise read as 1), and
so are NaN and infinity.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler
from pydantic_core import core_schema

GIB = 1024**3


class Strict(BaseModel):
    """Frozen pydantic model that rejects unknown fields, NaN and infinity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def not_bool(v: Any) -> Any:
    """Refuse a boolean where a number is expected (pydantic's lax mode reads True as 1)."""
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got a boolean ({v})")
    return v


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


class Bounded:
    """Pydantic metadata for a number in [lo, hi] (lo excluded when `low_open`), e.g.
    `Annotated[int, Bounded(1, MAX_LAYERS, "32x ...")]`: booleans, NaN and infinity are
    refused, and the message names the bound that was hit and why."""

    def __init__(self, lo: float, hi: float, why: str, *, low_open: bool = False) -> None:
        if low_open is False and isinstance(lo, int) and lo == 1:
            lo, low_open = 0, True  # integers >= 1: pydantic's PositiveInt wording
        self.lo, self.hi, self.why, self.low_open = lo, hi, why, low_open

    def check(self, v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
        if v < self.lo or (self.low_open and v == self.lo):
            rel = "greater than" if self.low_open else "greater than or equal to"
            raise ValueError(f"Input should be {rel} {_fmt(self.lo)}, got {_fmt(v)}")
        if v > self.hi:
            raise ValueError(f"must be <= {_fmt(self.hi)} ({self.why}), got {_fmt(v)}")
        return v

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        inner = core_schema.no_info_after_validator_function(self.check, handler(source))
        return core_schema.no_info_before_validator_function(not_bool, inner)


# --------------------------------------------------------------------------------------------
# Bounds. Each is far above the largest published value it cites (so no real input is refused)
# and keeps the solver's integers (microseconds, KiB) far below 2^63 together with `Job`'s
# step-time bound.
# --------------------------------------------------------------------------------------------

#: GPUs in one job or cluster: ~20x xAI Colossus (200k GPUs, 2024), the largest published.
MAX_GPUS = 2**22
#: GPUs per node: ~7x NVIDIA's NVL576 rack-scale domain (576 GPUs).
MAX_GPUS_PER_NODE = 2**12
#: node groups (GPU types) in one cluster.
MAX_NODE_GROUPS = 2**10
#: decoder layers: 32x Llama 3.1 405B's 126 (PaLM 540B: 118).
MAX_LAYERS = 2**12
#: hidden size: ~12x MT-NLG 530B's 20480 (PaLM 540B: 18432).
MAX_HIDDEN = 2**18
#: MLP width: ~14x PaLM 540B's 73728.
MAX_FFN = 2**20
#: attention heads (and KV heads): 128x Llama 3.1 405B / DeepSeek-V3's 128.
MAX_HEADS = 2**14
#: head dimension and MLA ranks: 16x Gemma's 256 head_dim, ~40x DeepSeek-V3's 1536 q rank.
MAX_HEAD_DIM = 2**12
MAX_RANK = 2**16
#: vocabulary: 16x Gemma 3's 262144 tokens.
MAX_VOCAB = 2**22
#: position embeddings: 100x Llama 4 Scout's 10M-token context.
MAX_POSITIONS = 2**30
#: experts per MoE layer: PEER's 1,048,576 experts (He 2024, "Mixture of A Million Experts").
MAX_EXPERTS = 2**20
#: shared experts and MTP modules: 512x DeepSeek-V3's 2 / 1.
MAX_SHARED_EXPERTS = 2**10
MAX_MTP_LAYERS = 2**9
#: total parameters: ~600x Switch-C's 1.6T and Kimi K2's 1T (the largest published).
MAX_PARAMS = 10**15
#: sequence length: 3x Llama 4 Scout's 10M-token context.
MAX_SEQ_LEN = 2**25
#: global batch in sequences: ~1000x DeepSeek-V3's 15360 (65536 for LAMB BERT: 256x).
MAX_GLOBAL_BATCH = 2**24
#: tokens per optimizer step: ~1000x DeepSeek-V3's 63M (Llama 3 405B: 16M).
MAX_TOKENS_PER_STEP = 2**36
#: GPU memory, GiB: 64 TiB, ~230x B300's 288 GB; at least 1 MiB.
MAX_MEMORY_GIB = 2.0**16
MIN_MEMORY_GIB = 2.0**-10
#: dense peak TFLOP/s: 8x Cerebras WSE-3 (125 PFLOP/s, one wafer); at least 0.01 (one CPU core).
MAX_TFLOPS = 1e6
MIN_TFLOPS = 1e-2
#: memory bandwidth GB/s: ~5x WSE-3's 21 PB/s on-wafer SRAM; at least 0.1 GB/s.
MAX_HBM_GBPS = 1e8
MIN_HBM_GBPS = 0.1
#: link bandwidth per GPU GB/s: ~100x NVLink 5's 900 GB/s; at least 10 MB/s (below 100 Mb/s
#: Ethernet).
MAX_LINK_GBPS = 1e5
MIN_LINK_GBPS = 1e-2
#: link latency, microseconds: 1 s, ~3x a round trip around the world.
MAX_LATENCY_US = 1e6
#: USD per GPU-hour: ~1000x on-demand H100 prices (2-10 USD).
MAX_PRICE = 1e4
#: bytes per element of a recipe's state (fp64 = 8; Adam m and v in fp64 = 16).
MAX_BYTES = 64
#: activation bytes of a whole step held at once (`Job`): tokens x hidden x layers x 34 bytes
#: (Korthikanti et al. 2022, eq. 1 without the attention-score term), at most 1 ZiB = 2^70
#: (~1000x DeepSeek-V3's 63M-token step): no single memory coefficient of the solver (KiB)
#: then exceeds 2^60.
MAX_ACTIVATION_SCALE_BYTES = 2.0**70
#: one optimizer step's time scale (`Job`), seconds: 11.6 days per step at peak throughput.
#: Real jobs are below 100 s; 1e6 s x 1e6 us/s keeps the solver's coefficients below 2^63 / 1e6.
MAX_STEP_ESTIMATE_S = 1e6
