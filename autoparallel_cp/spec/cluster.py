"""Cluster spec: GPU types, links, node groups (heterogeneous clusters; units: base.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from .base import (
    GIB,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_HBM_GBPS,
    MAX_LATENCY_US,
    MAX_LINK_GBPS,
    MAX_MEMORY_GIB,
    MAX_NODE_GROUPS,
    MAX_PRICE,
    MAX_TFLOPS,
    MIN_HBM_GBPS,
    MIN_LINK_GBPS,
    MIN_MEMORY_GIB,
    MIN_TFLOPS,
    Bounded,
    Strict,
)

MemoryGiB = Annotated[float, Bounded(MIN_MEMORY_GIB, MAX_MEMORY_GIB, "64 TiB, ~230x B300",
                                          low_open=False)]
Tflops = Annotated[float, Bounded(MIN_TFLOPS, MAX_TFLOPS, "8x a Cerebras WSE-3 wafer",
                                        low_open=False)]
HbmGBps = Annotated[float, Bounded(MIN_HBM_GBPS, MAX_HBM_GBPS, "5x WSE-3's on-wafer SRAM",
                                         low_open=False)]
LinkGBps = Annotated[float, Bounded(MIN_LINK_GBPS, MAX_LINK_GBPS, "~100x NVLink 5",
                                          low_open=False)]
LatencyUs = Annotated[float, Bounded(0.0, MAX_LATENCY_US, "1 s, 3x a round trip around "
                                           "the world", low_open=False)]
GpusPerNode = Annotated[int, Bounded(1, MAX_GPUS_PER_NODE, "~7x NVIDIA NVL576")]
Nodes = Annotated[int, Bounded(1, MAX_GPUS, "~20x the largest published cluster")]
Price = Annotated[float, Bounded(0.0, MAX_PRICE, "~1000x on-demand H100 prices", low_open=True)]
SmCount = Annotated[int, Bounded(1, 1024, "~8x an H100's 132 SMs")]


class GPUSpec(Strict):
    """One accelerator type. `memory_gib` is the usable HBM size in GiB (2^30 bytes)."""

    name: str
    memory_gib: MemoryGiB
    bf16_tflops: Tflops  # dense peak
    #: dense peak; None: no fp8 tensor cores (pre-Hopper: Ampere-ISA attention kernels then
    #: take their A100-class share of peak, efficiency.ATTN_KERNELS_SM80)
    fp8_tflops: Tflops | None = None
    fp32_tflops: Tflops | None = None  # non-tensor-core fp32 (for memory-bound estimates)
    #: tensor-scaled fp8 GEMMs accept every operand layout, so fp8 training writes no
    #: transposed copies (Blackwell sm100-sm11x: Transformer Engine v2.9
    #: pytorch/utils.py `is_non_tn_fp8_gemm_supported`); False: TN only (Hopper, Ada)
    fp8_transpose_free: bool = False
    hbm_gbps: HbmGBps  # HBM bandwidth, GB/s
    #: streaming multiprocessors (datasheet / whitepaper); only kernels that reserve SMs for
    #: communication read it (cost/efficiency.py `sm_reserve_stretch`). None: not stated, and
    #: a recipe that reserves SMs is then refused with a clear error
    sm_count: SmCount | None = None
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


class LinkSpec(Strict):
    """A link class seen from one GPU: bandwidth per GPU per direction (GB/s), latency (us)."""

    bandwidth_gbps: LinkGBps
    latency_us: LatencyUs = 5.0
    source: str = ""


class HostSpec(Strict):
    """The host side of a node, for offloading: the GPU-host link per GPU per direction (PCIe,
    or NVLink-C2C on Grace Hopper), the node's host memory and its DRAM bandwidth (shared by
    the node's GPUs), and one core's sustained DRAM bandwidth."""

    link_gbps: LinkGBps
    memory_gib: MemoryGiB
    memory_gbps: HbmGBps
    #: one core's sustained DRAM bandwidth, GB/s (a one-thread STREAM-class figure): caps a CPU
    #: optimizer step run on few threads (cost/offload.py `cpu_adam_s`). None: not stated; the
    #: step is then charged at the node's DRAM share alone, the fastest it can run.
    core_stream_gbps: HbmGBps | None = None
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


class NodeGroup(Strict):
    """A homogeneous set of nodes: same GPU, same node fabric."""

    name: str
    gpu: GPUSpec
    gpus_per_node: GpusPerNode
    num_nodes: Nodes
    intra_node: LinkSpec  # NVLink/NVSwitch
    inter_node: LinkSpec  # network bandwidth per GPU (e.g. 8 x 400 Gb/s NICs -> 50 GB/s/GPU)
    price_per_gpu_hour: Price | None = None  # USD
    host: HostSpec | None = None  # host link and memory (offload); None: not stated

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes


class ClusterSpec(Strict):
    """One or more node groups on one fabric. Several groups = a heterogeneous cluster."""

    name: str
    node_groups: list[NodeGroup] = Field(min_length=1, max_length=MAX_NODE_GROUPS)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        names = [g.name for g in self.node_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"node_groups names must be unique, got {names}")
        if self.num_gpus > MAX_GPUS:
            raise ValueError(
                f"node_groups hold {self.num_gpus:,} GPUs in all, more than {MAX_GPUS:,} "
                "(~20x the largest published cluster)"
            )
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
