"""The measurement kit (`ap-solve measure`, optional extra `[measure]`: torch).

Writes microbenchmark rows that `ap-solve calibrate` reads (columns: calibrate/micro.py):

- `gemm`: sustained `[m,k] @ [k,n]` time at training shapes (the MLP and QKV GEMMs of a
  hidden size h, tokens t: (t, h, 4h), (t, 4h, h), (t, h, 3h)), on every rank at once (all GPUs
  of a node busy: power and clocks as in training), median of the timed repetitions;
- `all_gather`, `reduce_scatter`, `all_reduce`: `torch.distributed` collectives over all ranks,
  buffer sizes as nccl-tests count them (the unsharded buffer), median time;
- optionally (`train_steps > 0`) a few training steps of a small Llama-style decoder (RMSNorm,
  RoPE, SDPA attention, SwiGLU; the `pytorch-amp` recipe: fp32 weights, bf16 autocast on GPUs,
  AdamW, gradient clipping) under data parallelism over all ranks (DDP), written as a training
  row (`kind=train`, the model spec written next to the CSV as `<out>.model.yaml`, named
  relative to it), with
  `torch.cuda.max_memory_allocated` as `peak_gib` on GPUs.

Runs under `torchrun` (RANK / WORLD_SIZE / LOCAL_WORLD_SIZE set; NCCL on GPUs) or, without it,
spawns `--world-size` local processes (gloo on the CPU: tiny sizes, for tests). Only rank 0
writes the CSV. torch is imported inside the functions: the package does not need it.
"""

from __future__ import annotations

import csv
import io
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from autoparallel_cp.errors import UserError

COLUMNS = ("kind", "cluster", "gpu", "m", "k", "n", "dtype", "gpus", "gpus_per_node",
           "size_bytes", "time_s", "model", "seq_len", "global_batch", "recipe", "plan",
           "step_s", "peak_gib", "device")
#: Largest collective buffer: 8 GiB, the largest nccl-tests sweeps usually go (`-e 8G`).
MAX_SIZE_BYTES = 8 << 30
#: Largest GEMM operands (bf16 A, B and C of the biggest shape): 16 GiB fits any training GPU.
MAX_GEMM_BYTES = 16 << 30
DEFAULT_PORT = 29517


def gemm_bytes(hidden: int, tokens: int) -> int:
    """bf16 bytes of A, B and C of the largest GEMM shape (t x 4h x h or t x h x 4h)."""
    return 2 * (tokens * 4 * hidden + 4 * hidden * hidden + tokens * 4 * hidden)


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise UserError(f"environment variable {name} is not set (torchrun sets it)")
        return default
    try:
        v = int(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw[:40]!r}: not a whole number") \
            from None
    if v < 0 or v > 1 << 22:
        raise UserError(f"environment variable {name}={v}: out of range")
    return v


def launch(world_size: int | None, port: int | None) -> tuple[int, int, int, bool]:
    """(world size, ranks per node, this rank, under torchrun) from torchrun's environment
    (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) or `--world-size`; UserError naming a bad variable,
    or a local rendezvous port already in use."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = _env_int("WORLD_SIZE")
        rank = _env_int("RANK")
        per = _env_int("LOCAL_WORLD_SIZE", world)
        if world < 1 or rank >= world or per < 1 or per > world:
            raise UserError(f"environment: RANK={rank}, WORLD_SIZE={world}, "
                            f"LOCAL_WORLD_SIZE={per} do not describe a job")
        return world, per, rank, True
    world = world_size or 1
    p = port if port is not None else _env_int("MASTER_PORT", DEFAULT_PORT)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", p))
        except OSError as exc:
            raise UserError(f"port {p} on 127.0.0.1 is not free ({exc.strerror or exc}): "
                            "pass --port with a free one") from None
    return world, world, 0, False


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
    train_steps: int = 0  # timed training steps of the small decoder (0: none)
    train_layers: int = 2
    train_seq: int = 512
    train_mbs: int = 1
    train_microbatches: int = 2
    train_vocab: int = 32000


def device_name(torch: Any, dev: Any) -> str:
    """What the rows were measured on: the CUDA device's name, or the CPU's."""
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"cpu:{platform.processor() or platform.machine() or 'unknown'}"


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


def _decoder(torch: Any, h: int, heads: int, ffn: int, layers: int, vocab: int) -> Any:
    """A small Llama-style decoder (module docstring), plain torch.nn."""
    nn = torch.nn
    f = torch.nn.functional

    class Block(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv, self.o = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
            self.up = nn.Linear(h, 2 * ffn, bias=False)
            self.down = nn.Linear(ffn, h, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, heads, h // heads).unbind(2)

            def rope(t: Any) -> Any:
                t1, t2 = t.chunk(2, dim=-1)
                return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)

            q, k = rope(q).transpose(1, 2), rope(k).transpose(1, 2)
            a = f.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
            g, u = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(f.silu(g) * u)

    class Decoder(nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, h)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(h)
            self.head = nn.Linear(h, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            s = ids.shape[1]
            d = h // heads
            inv = 1.0 / (10000 ** (torch.arange(0, d // 2, device=ids.device) / (d // 2)))
            ang = torch.outer(torch.arange(s, device=ids.device), inv)[None, :, None, :]
            cos, sin = ang.cos(), ang.sin()
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x, cos, sin)
            return self.head(self.norm(x))

    return Decoder()


def train_row(s: Settings, dev: Any, world: int, out: str) -> dict[str, Any] | None:
    """Time `s.train_steps` data-parallel training steps (module docstring); rank 0's row."""
    import torch
    import torch.distributed as dist

    h = s.hidden
    heads = max(h // 64, 1)
    ffn = max(64, (8 * h // 3 + 63) // 64 * 64)
    model = _decoder(torch, h, heads, ffn, s.train_layers, s.train_vocab).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    ids = torch.randint(0, s.train_vocab, (s.train_mbs, s.train_seq + 1), device=dev)

    def step() -> None:
        for i in range(s.train_microbatches):
            ctx = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" \
                else torch.autocast("cpu", enabled=False)
            sync = ddp.no_sync() if world > 1 and i < s.train_microbatches - 1 \
                else torch.enable_grad()
            with ctx, sync:
                logits = ddp(ids[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, s.train_vocab), ids[:, 1:].reshape(-1))
                (loss / s.train_microbatches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sec = _timed(torch, dev, step, s.train_steps, min(s.warmup, 2))
    t = torch.tensor([sec], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    if dist.get_rank() != 0:
        return None
    spec = out + ".model.yaml"
    with open(spec, "w", encoding="utf-8") as fh:
        fh.write(f"name: measure-decoder-{s.train_layers}x{h}\nnum_layers: {s.train_layers}\n"
                 f"hidden_size: {h}\nffn_hidden_size: {ffn}\nnum_attention_heads: {heads}\n"
                 f"vocab_size: {s.train_vocab}\nmax_position_embeddings: {s.train_seq}\n")
    gb = s.train_mbs * s.train_microbatches * world
    return {"kind": "train", "model": os.path.basename(spec), "cluster": s.cluster,
            "gpus": world,
            "seq_len": s.train_seq, "global_batch": gb, "recipe": "pytorch-amp",
            "plan": f"dp={world},tp=1,pp=1,mbs={s.train_mbs},recompute=none,zero=0",
            "step_s": float(t.item()), "peak_gib": peak}


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c, "") for c in COLUMNS})
    return buf.getvalue()


#: Writes the CSV text to `out`: the CLI passes its output rule (`outputs.write_atomic`:
#: streams `-`, FIFOs and devices, follows symlinks), which this layer cannot import.
Writer = Callable[[str, str], None]


def _replace(out: str, text: str) -> None:
    """The writer of direct callers: replace `out` (a plain file path)."""
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
    os.replace(tmp, out)


def _worker(rank: int, world: int, per_node: int, s: Settings, out: str, port: int,
            write: Writer = _replace) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    backend = "gloo" if s.cpu else "nccl"
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
        if world > 1:  # a one-process collective moves no data (calibrate refuses its rows)
            rows += collective_rows(s, dev, world, per_node)
        if s.train_steps > 0:
            tr = train_row(s, dev, world, out)
            if tr is not None:
                rows.append(tr)
        if rank == 0:
            where = device_name(torch, dev)
            rows = [r | {"device": where} for r in rows]
            write(out, to_csv(rows))
        # every rank leaves together: a rank tearing gloo down while a peer still has work
        # in flight on the group aborts ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run(s: Settings, out: str, world: int = 1, per_node: int | None = None, rank: int = 0,
        torchrun: bool = False, port: int | None = None, write: Writer = _replace) -> None:
    """Measure and write `out` (rank 0) with `write`: this process under torchrun (`launch`
    read its environment), else `world` spawned local processes meeting on `port`."""
    import torch.multiprocessing as mp

    p = port if port is not None else int(os.environ.get("MASTER_PORT", DEFAULT_PORT))
    if torchrun:
        _worker(rank, world, per_node or world, s, out, p, write)
        return
    # the spawned ranks meet on this port, whatever an earlier run left in the environment
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(p)
    if world == 1:
        _worker(0, 1, 1, s, out, p, write)
        return
    mp.spawn(_worker, args=(world, world, s, out, p, write), nprocs=world, join=True)
