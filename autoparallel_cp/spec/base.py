"""Base of the input specifications: strict pydantic models and the units they use.

Every spec is a strict pydantic v2 model: unknown fields (typos) are rejected, sizes must be
positive, and cross-field rules (heads divide hidden, KV heads divide heads, top-k <= experts)
are checked so that a bad file fails with a message naming the field.

Units used throughout the project:
- memory in bytes (GPU memory in the files is given in GiB or GB, see `GPUSpec`),
- compute peaks in TFLOP/s (1e12 FLOP/s), dense (no 2:4 sparsity),
- bandwidths in GB/s (1e9 bytes/s) per GPU and per direction, latencies in microseconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GIB = 1024**3


class Strict(BaseModel):
    """Frozen pydantic model that rejects unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)
