"""Offloading to host memory: the optimizer states (`optimizer_offload`) and activations
(`activation_offload`), over the node's GPU-host link (spec/cluster.py `HostSpec`).

Optimizer (Megatron-Core `--optimizer-cpu-offload --optimizer-offload-fraction x`,
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py `HybridDeviceOptimizer`; DeepSpeed
ZeRO-Offload `offload_optimizer: {device: cpu}`; FSDP2 `CPUOffloadPolicy`): a share x of the
locally updated parameters keeps its fp32 master weights and Adam moments in host memory
(GPU optimizer bytes x (1 - x)). Per step those parameters' gradients go to the host
(`grad_bytes` each), Adam runs on the CPU, and the updated weights come back (`weight_bytes`
each); the rest steps on the GPU as before. Adam on the CPU is bound by DRAM bandwidth: it
streams CPU_ADAM_BYTES_PER_PARAM per parameter, at the node's DRAM bandwidth shared by its
GPUs' processes, or slower where the process steps on few threads (torchrun's default 1) and
the host states one core's bandwidth (`cpu_adam_bytes_per_s`).
With Megatron's `--overlap-cpu-optimizer-d2h-h2d` (and DeepSpeed's
pipelined ZeRO-Offload: Ren et al., USENIX ATC 2021, §4.1 "the gradient transfer ... overlaps
with the backward", the parameter swap with the next forward) the three stages run as a
pipeline over parameter groups: max(d2h, cpu, h2d); FSDP2's CPUOffloadPolicy keeps the sharded
parameters, gradients and optimizer states on the CPU and steps there after the backward's
copies (PyTorch docs, torch.distributed.fsdp.CPUOffloadPolicy), so they run one after the
other: d2h + cpu + h2d. The host holds the offloaded
optimizer bytes plus an fp32 gradient copy per offloaded parameter.

Activations (Megatron-Core fine-grained activation offloading; Transformer Engine
`get_cpu_offload_context(num_layers=k)`): k kept (not recomputed) layers per stage send their
saved activations to the host after their forward and fetch them before their backward, on
the copy engines beside the compute. GPU: the stage keeps the other layers' activations per
in-flight micro-batch, plus one offloaded layer's in transit (TE double-buffers one layer).
Host: the offloaded layers' bytes for every in-flight micro-batch. Time per micro-batch: the
copy that sticks out of the forward (D2H) and of the backward (H2D):
max(0, d - F) + max(0, d - (B + W)), d = bytes / link.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoparallel_cp.cost.common import _is_pytorch
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.recipe import TrainingRecipe

#: DRAM bytes per parameter of one Adam step on the CPU: read the fp32 master weight, gradient
#: and both moments (16), write the master and both moments (12), write the bf16 copy sent
#: back (2) -- the arithmetic of Adam (Kingma & Ba 2015, Algorithm 1) on fp32 state.
CPU_ADAM_BYTES_PER_PARAM = 30.0


def host_link_s(job: Job, g: int, nbytes: float) -> float:
    """Seconds to move `nbytes` one way between a GPU of node group `g` and its host."""
    host = job.cluster.node_groups[g].host
    if host is None:
        raise ValueError(f"node group {job.cluster.node_groups[g].name!r} has no host spec")
    return nbytes / (host.link_gbps * 1e9)


#: Threads of the CPU optimizer step per GPU process where the recipe does not say: torchrun's
#: OMP_NUM_THREADS=1 for nproc_per_node > 1 (torch/distributed/run.py `config_from_args`
#: @010929fd), the launcher of Megatron, Megatron-Bridge and torchtitan runs (spec/recipe.py
#: `cpu_optimizer_threads`; the `deepspeed` preset states "all").
TORCHRUN_OMP_THREADS = 1


def cpu_adam_bytes_per_s(job: Job, g: int) -> float:
    """DRAM bytes/s one GPU's process streams its CPU Adam step at: the node's DRAM bandwidth
    split over its GPUs, capped at threads x one core's sustained bandwidth where the host
    states `core_stream_gbps` (threads: behaviour `cpu_optimizer_threads`, else torchrun's 1).
    torch's fused CPU AdamW splits the step over the intra-op pool (at::parallel_for in
    aten/src/ATen/native/cpu/FusedAdamKernel.cpp `adam_fused_step_impl` @000510a6), so its rate
    is at most the pool's threads' streams. "all" (OMP_NUM_THREADS unset under DeepSpeed's
    launcher: one OpenMP thread per CPU) is not capped: with a thread on each of a DGX H100's
    112 cores the cap passes the 76.8 GB/s share once a core streams 76.8 / 112 = 0.69 GB/s,
    by Little's law 1.15 lines of 64 B in flight over the 8480's ~107 ns DRAM latency (Chips
    and Cheese, "Sapphire Rapids: Golden Cove Hits Servers", 2023), where a streaming core's
    prefetchers keep many in flight.
    Bounds: min(share, cap) <= share, so the step never takes less than the share-only time; a
    lower bound priced without the cap stays one."""
    ng = job.cluster.node_groups[g]
    assert ng.host is not None
    share = ng.host.memory_gbps * 1e9 / ng.gpus_per_node
    core = ng.host.core_stream_gbps
    threads = job.recipe.behaviour.cpu_optimizer_threads
    if core is None or threads == "all":
        return share
    return min(share, (threads or TORCHRUN_OMP_THREADS) * core * 1e9)


def cpu_adam_s(job: Job, g: int, params: float) -> float:
    """Seconds of Adam on the CPU over `params` parameters for one GPU's process: DRAM-bound,
    CPU_ADAM_BYTES_PER_PARAM each at `cpu_adam_bytes_per_s`."""
    return params * CPU_ADAM_BYTES_PER_PARAM / cpu_adam_bytes_per_s(job, g)


def overlaps_optimizer_copies(job: Job) -> bool:
    """Whether the framework pipelines the gradient D2H, the CPU step and the weight H2D
    (Megatron's `--overlap-cpu-optimizer-d2h-h2d`, which `--emit megatron` writes; DeepSpeed
    ZeRO-Offload), or runs them in turn (FSDP2's CPUOffloadPolicy; Megatron without the flag:
    behaviour `offload_copies_overlap` False)."""
    stated = job.recipe.behaviour.offload_copies_overlap
    return not _is_pytorch(job.recipe) if stated is None else stated


def optimizer_offload_s(job: Job, g: int, params: float, share: float) -> float:
    """Seconds per step of the host side of the optimizer: `share` of the `params` locally
    updated parameters (module docstring)."""
    if share <= 0.0 or params <= 0.0:
        return 0.0
    n = share * params
    d2h = host_link_s(job, g, n * job.recipe.grad_bytes)
    back = job.recipe.master_weight_bytes if job.recipe.behaviour.offload_gpu_master else 0
    h2d = host_link_s(job, g, n * (back or job.recipe.weight_bytes))
    cpu = cpu_adam_s(job, g, n)
    return max(d2h, cpu, h2d) if overlaps_optimizer_copies(job) else d2h + cpu + h2d


def gpu_kept_optimizer_share(recipe: TrainingRecipe) -> float:
    """Share of an offloaded parameter's optimizer bytes that stays on the GPU: its fp32 main
    copy, master / (master + moments), with behaviour `offload_gpu_master` (Megatron-Core
    without the precision-aware optimizer: 4 of 12 bytes under Adam), else 0. Bounds: the
    behaviours `offload_gpu_master` and `offload_copies_overlap` only raise what the defaults
    charge (GPU optimizer bytes (1 - x(1 - k)) >= (1 - x); a 4-byte H2D >= the 2-byte one;
    d2h + cpu + h2d >= max), so a lower bound taken with the defaults stays one."""
    m, s = recipe.master_weight_bytes, recipe.optimizer_state_bytes
    if not recipe.behaviour.offload_gpu_master or m + s <= 0:
        return 0.0
    return m / (m + s)


def optimizer_host_bytes(job: Job, optimizer_bytes: float, params: float, share: float
                         ) -> float:
    """Host bytes of one GPU's offloaded optimizer: `share` of its optimizer bytes (master
    weights and moments) and an fp32 gradient per offloaded parameter."""
    return share * (optimizer_bytes + 4.0 * params)


def offloaded_activations(k: int, kept: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(bytes per micro-batch sent to the host, bytes of one such layer) when `k` of a
    stage's kept layers offload, `kept` = (layer count, activation bytes per layer) per kind:
    the mean kept layer's bytes x min(k, kept layers)."""
    n = sum(c for c, _ in kept)
    if k <= 0 or n <= 0:
        return 0.0, 0.0
    mean = sum(c * a for c, a in kept) / n
    return min(k, n) * mean, mean


def activation_offload_s(job: Job, g: int, nbytes: float, fwd_s: float, bwd_s: float) -> float:
    """Exposed seconds per micro-batch of moving `nbytes` to the host during the forward
    (`fwd_s`) and back during the backward (`bwd_s`) on the copy engines."""
    if nbytes <= 0.0:
        return 0.0
    d = host_link_s(job, g, nbytes)
    return max(d - fwd_s, 0.0) + max(d - bwd_s, 0.0)


def optimizer_offload_s_per_param(job: Job, g: int) -> float:
    """`optimizer_offload_s` per offloaded parameter of node group `g` (0 without a host):
    each of its stages is linear in the parameter count and the share, and so are their max
    (pipelined) and their sum (in turn), so the host side of a share x of P local parameters
    is x·P times this (the search's per-parameter optimizer tables, search/offload_axis.py)."""
    if job.cluster.node_groups[g].host is None:
        return 0.0
    return optimizer_offload_s(job, g, 1.0, 1.0)


def host_bytes_per_param(job: Job, zero: int, shard: float) -> float:
    """`optimizer_host_bytes` per parameter of a stage at share 1, its optimizer sharded over
    `shard` ranks when `zero` >= 1 (memory.py: the master weights and moments,
    `master_weight_bytes + optimizer_state_bytes`, and the fp32 gradient copy, each per
    locally updated parameter)."""
    d = max(shard, 1.0) if zero >= 1 else 1.0
    r = job.recipe
    return (r.master_weight_bytes + r.optimizer_state_bytes + 4.0) / d
