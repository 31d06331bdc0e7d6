"""The one-node-group H100 cluster the hand-derived cost tests share: HBM 3,350 GB/s, NVLink
450 GB/s per direction (3 us), InfiniBand 50 GB/s per GPU (8 us), as the H100 SXM5 datasheet
and the dgx-h100 preset state; a plain helper module, not a test file."""

from __future__ import annotations

from autoparallel_cp.spec import ClusterSpec, GPUSpec, LinkSpec, NodeGroup


def h100_cluster(num_nodes: int = 1, hbm_gbps: float = 3350.0,
                 sm_count: int | None = None) -> ClusterSpec:
    """`num_nodes` nodes of 8 H100s (80 GB, 989 / 1,979 TFLOP/s bf16 / fp8; `sm_count` 132
    in the H100 whitepaper, unset unless a test needs it)."""
    gpu = GPUSpec(name="H100", memory_gib=80, bf16_tflops=989, fp8_tflops=1979,
                  hbm_gbps=hbm_gbps, sm_count=sm_count)
    nd = NodeGroup(name="n", gpu=gpu, gpus_per_node=8, num_nodes=num_nodes,
                   intra_node=LinkSpec(bandwidth_gbps=450, latency_us=3.0),
                   inter_node=LinkSpec(bandwidth_gbps=50, latency_us=8.0))
    return ClusterSpec(name="c", node_groups=[nd])
