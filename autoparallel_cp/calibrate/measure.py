"""The measurement kit (`ap-solve measure`, optional extra `[measure]`: torch).

Writes microbenchmark rows that `ap-solve calibrate` reads (columns: calibrate/micro.py):

- `gemm`: sustained `[m,k] @ [k,n]` time at training shapes (the MLP and QKV GEMMs of a
  hidden size h, tokens t: (t, h, 4h), (t, 4h, h), (t, h, 3h)), on every rank at once (all GPUs
  of a node busy: power and clocks as in training), median of the timed repetitions;
- `all_gather`, `reduce_scatter`, `all_reduce`: `torch.distributed` collectives over all ranks,
  buffer sizes as nccl-tests count them (the unsharded buffer), median time.

Runs under `torchrun` (RANK / WORLD_SIZE / LOCAL_WORLD_SIZE set; NCCL on GPUs) or, without it,
spawns `--world-size` local processes (gloo on the CPU: tiny sizes, for tests). Only rank 0
writes the CSV. torch is imported inside the functions: the package does not need it.
"""

from __future__ import annotations

import csv
import io
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

COLUMNS = ("kind", "cluster", "gpu", "m", "k", "n", "dtype", "gpus", "gpus_per_node",
           "size_bytes", "time_s")


@dataclass(frozen=True)
class Settings:
    cluster: str  # the cluster preset / YAML the rows describe
    gpu: str  # the GPU type name in that cluster
    hidden: int = 4096
    tokens: int = 4096
    sizes: tuple[int, ...] = (1 << 20, 1 << 24, 1 << 27)  # collective buffers, bytes
    reps: int = 10
    warmup: int = 3
    cpu: bool = False  # gloo + float32 on the CPU (tests, laptops)


def _sync(torch: Any, dev: Any) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _timed(torch: Any, dev: Any, fn: Any, reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    _sync(torch, dev)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(torch, dev)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def gemm_rows(s: Settings, dev: Any) -> list[dict[str, Any]]:
    """Timed GEMMs at the training shapes of hidden size `s.hidden` (module docstring)."""
    import torch

    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    h, t = s.hidden, s.tokens
    rows = []
    for m, k, n in ((t, h, 4 * h), (t, 4 * h, h), (t, h, 3 * h)):
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        sec = _timed(torch, dev, lambda a=a, b=b: torch.matmul(a, b), s.reps, s.warmup)
        rows.append({"kind": "gemm", "cluster": s.cluster, "gpu": s.gpu, "m": m, "k": k, "n": n,
                     "dtype": "fp32" if dev.type == "cpu" else "bf16", "time_s": sec})
    return rows


def collective_rows(s: Settings, dev: Any, world: int, per_node: int) -> list[dict[str, Any]]:
    """Timed all-gather / reduce-scatter / all-reduce over all ranks (module docstring)."""
    import torch
    import torch.distributed as dist

    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for size in s.sizes:
        n = max(size // esize // world, 1) * world  # divisible by the group
        full = torch.ones(n, device=dev, dtype=dtype)
        shard = torch.ones(n // world, device=dev, dtype=dtype)
        ops: dict[str, Callable[[], Any]] = {
            "all_reduce": partial(dist.all_reduce, full),
            "all_gather": partial(dist.all_gather_into_tensor, full, shard),
            "reduce_scatter": partial(dist.reduce_scatter_tensor, shard, full),
        }
        for kind, fn in ops.items():
            try:
                sec = _timed(torch, dev, fn, s.reps, s.warmup)
            except (RuntimeError, NotImplementedError):
                continue  # the backend lacks this collective (older gloo: reduce-scatter)
            t = torch.tensor([sec], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            rows.append({"kind": kind, "cluster": s.cluster, "gpus": world,
                         "gpus_per_node": per_node, "size_bytes": n * esize,
                         "time_s": float(t.item())})
    return rows


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in COLUMNS})
    return buf.getvalue()


def _worker(rank: int, world: int, per_node: int, s: Settings, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    backend = "gloo" if s.cpu or not torch.cuda.is_available() else "nccl"
    if backend == "nccl":
        local = rank % per_node
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        rows = gemm_rows(s, dev) if rank == 0 else []
        if rank != 0:
            gemm_rows(s, dev)  # every GPU busy while rank 0 times (clocks as in training)
        dist.barrier()
        rows += collective_rows(s, dev, world, per_node)
        if rank == 0:
            tmp = out + ".tmp"
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                fh.write(to_csv(rows))
            os.replace(tmp, out)
    finally:
        dist.destroy_process_group()


def run(s: Settings, out: str, world_size: int | None = None, port: int = 29517) -> None:
    """Measure and write `out` (rank 0). Under torchrun use its environment; else spawn."""
    import torch.multiprocessing as mp

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        _worker(int(os.environ["RANK"]), world, per_node, s, out, port)
        return
    world = world_size or 1
    mp.spawn(_worker, args=(world, world, s, out, port), nprocs=world, join=True)
