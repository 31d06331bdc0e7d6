# ruff: noqa: B023, F821, E501 -- kept as it ran on the device (closures timed in place; long run tables)
"""The H200 measurement kit of session 15 (the code `measure_h200_ops.py`, `measure_h200_gemm.py`
and `measure_h200_host.py` run; torch only, imported by those scripts, never by the tool).

Mechanism microbenchmarks and held-out training steps on one GPU (session 15, H200).

What one GPU can measure of the mechanisms the cost model charges (issues #29, #31), as JSON
lines under $OUT (`probe.jsonl`: one row per measurement, field `kind`; `train.jsonl`: training
steps of the Llama-style decoder of `benchmarks/data/README.md`'s h200_pytorch_amp_train, same
model class and recipe, on shapes that file does not hold):

- `gemm`: bf16 forward, data-gradient and weight-gradient GEMMs of tensor-parallel shards of
  real models (hidden 2048..8192, tp 1..8; not the power-of-two grid of h200_microbench);
- `attn`: flash SDPA forward and forward+backward at context-parallel chunk sizes: the causal
  diagonal block and the two half blocks of the load-balanced ring (q s/cp vs kv s/2cp and
  q s/2cp vs kv s/cp), and `attn_merge`: the fp32 log-sum-exp merge of two partial outputs;
- `op`: eager elementwise kernels of the decoder (fp32 RMSNorm, SwiGLU, fp32 cross-entropy,
  the autocast weight cast, fused AdamW, gradient accumulation, zero_grad) with their bytes;
- `host`: host time of the eager decoder layer (forward + backward, with and without
  `torch.utils.checkpoint`) on tensors too small for the GPU to matter, and of one empty launch;
- `link`: pinned and pageable host<->device copies, both directions at once, and the CPU AdamW
  step (optimizer offload);
- `train.jsonl`: full training steps (fp32 params, bf16 autocast, fused AdamW) including
  gradient accumulation over several micro-batches (`num_microbatches`).

Run through `python benchmarks/measure_h200_ops.py [--smoke]` (`--smoke`: tiny sizes on the
CPU, for checking the script). Each section stops at its time budget and keeps what it measured.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812
from torch.utils.checkpoint import checkpoint

SMOKE = "--smoke" in sys.argv
OUT = os.environ.get("OUT", "out")
DEV = torch.device("cpu" if SMOKE or not torch.cuda.is_available() else "cuda")
BF16 = torch.bfloat16
T0 = time.time()
os.makedirs(OUT, exist_ok=True)
_probe = open(os.path.join(OUT, "probe.jsonl"), "a")  # noqa: SIM115


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def emit(row: dict[str, Any]) -> None:
    _probe.write(json.dumps(row) + "\n")
    _probe.flush()


def sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn: Callable[[], Any], reps: int = 8, warm: int = 2) -> float:
    """Median seconds of `fn` (CUDA events on the GPU, wall clock on the CPU)."""
    for _ in range(warm):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        if DEV.type == "cuda":
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def walltime(fn: Callable[[], Any], reps: int = 8, warm: int = 2) -> float:
    """Median wall seconds of `fn` with a sync after it (host-bound timings)."""
    for _ in range(warm):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def over(budget_end: float) -> bool:
    return time.time() - T0 > budget_end


def meta() -> None:
    row: dict[str, Any] = {"kind": "meta", "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cpus": os.cpu_count(), "threads": torch.get_num_threads()}
    if DEV.type == "cuda":
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, sms=p.multi_processor_count, mem_gib=p.total_memory / 2**30)
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        row["cpu"] = names[0] if names else ""
    except OSError:
        row["cpu"] = ""
    emit(row)
    log(str(row))


# ---------------------------------------------------------------------------------- host
class Block(nn.Module):
    """The decoder layer of measure_h200.py (data/README.md: h200_pytorch_amp_train)."""

    def __init__(self, h: int, nh: int, nkv: int, ffn: int) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, h // nh
        self.n1 = nn.RMSNorm(h)
        self.n2 = nn.RMSNorm(h)
        self.qkv = nn.Linear(h, (nh + 2 * nkv) * self.hd, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gu = nn.Linear(h, 2 * ffn, bias=False)
        self.d = nn.Linear(ffn, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.n1(x)).split(
            [self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.nkv, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.nkv != self.nh)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        g, u = self.gu(self.n2(x)).chunk(2, -1)
        return x + self.d(F.silu(g) * u)


class LM(nn.Module):
    def __init__(self, L: int, h: int, nh: int, nkv: int, ffn: int, V: int) -> None:  # noqa: N803
        super().__init__()
        self.emb = nn.Embedding(V, h)
        self.blocks = nn.ModuleList(Block(h, nh, nkv, ffn) for _ in range(L))
        self.norm = nn.RMSNorm(h)
        self.head = nn.Linear(h, V, bias=False)
        self.rc = False

    def forward(self, ids: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.rc else b(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


def host_section(end: float) -> None:
    """Host-bound eager layer time: a 16-layer decoder on 1 x 64 tokens of hidden 256."""
    x = torch.zeros(1, device=DEV)
    emit({"kind": "host", "what": "empty_add_launch",
          "s": walltime(lambda: x.add_(1), reps=200, warm=20)})
    for L in (4, 16):
        torch.manual_seed(0)
        with torch.device(DEV):
            m = LM(L, 256, 4, 4, 512, 512)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=DEV.type == "cuda")
        ids = torch.randint(0, 512, (1, 64), device=DEV)
        for rc in (False, True):
            m.rc = rc

            def fb() -> None:
                with torch.autocast(DEV.type, dtype=BF16):
                    loss = m(ids, ids)
                loss.backward()

            def step() -> None:
                fb()
                opt.step()
                opt.zero_grad(set_to_none=False)

            emit({"kind": "host", "what": "fwd_bwd", "layers": L, "recompute": rc,
                  "s": walltime(fb, reps=20, warm=3)})
            emit({"kind": "host", "what": "step", "layers": L, "recompute": rc,
                  "s": walltime(step, reps=20, warm=3)})
            if over(end):
                return
    # one layer's forward alone and the optimizer step alone
    torch.manual_seed(0)
    with torch.device(DEV):
        blk = Block(256, 4, 4, 512)
    xin = torch.randn(1, 64, 256, device=DEV, requires_grad=True)

    def fwd() -> None:
        with torch.autocast(DEV.type, dtype=BF16):
            blk(xin)

    emit({"kind": "host", "what": "layer_fwd", "s": walltime(fwd, reps=50, warm=5)})
    log("host done")


# ---------------------------------------------------------------------------------- ops
def ops_section(end: float) -> None:
    """Eager elementwise kernels with the bytes they move (row field `bytes`)."""
    t, h, ffn = (64, 64, 128) if SMOKE else (8192, 4096, 14336)
    rows: list[tuple[str, Callable[[], Any], float, dict[str, Any]]] = []
    for hh in ((64,) if SMOKE else (2048, 4096, 8192)):
        norm = nn.RMSNorm(hh).to(DEV)
        x32 = torch.randn(t, hh, device=DEV, requires_grad=True)
        gy = torch.randn(t, hh, device=DEV)

        def nfb(norm: nn.Module = norm, x32: torch.Tensor = x32, gy: torch.Tensor = gy) -> None:
            norm(x32).backward(gy)

        def nf(norm: nn.Module = norm, x32: torch.Tensor = x32) -> None:
            with torch.no_grad():
                norm(x32)

        rows.append(("rmsnorm_fp32_fwd", nf, 8.0 * t * hh, {"t": t, "h": hh}))
        rows.append(("rmsnorm_fp32_fwd_bwd", nfb, 8.0 * t * hh, {"t": t, "h": hh}))
    gu = torch.randn(t, 2 * ffn, device=DEV, dtype=BF16, requires_grad=True)
    gout = torch.randn(t, ffn, device=DEV, dtype=BF16)

    def swiglu_fb() -> None:
        g, u = gu.chunk(2, -1)
        (F.silu(g) * u).backward(gout)

    rows.append(("swiglu_bf16_fwd_bwd", swiglu_fb, 2.0 * t * 2 * ffn, {"t": t, "ffn": ffn}))
    for V in ((256,) if SMOKE else (32000, 128256)):
        tt = t if SMOKE else 4096
        logits = torch.randn(tt, V, device=DEV, dtype=BF16, requires_grad=True)
        tgt = torch.randint(0, V, (tt,), device=DEV)

        def ce(logits: torch.Tensor = logits, tgt: torch.Tensor = tgt) -> None:
            F.cross_entropy(logits.float(), tgt).backward()

        rows.append(("cross_entropy_fp32_fwd_bwd", ce, 2.0 * tt * V, {"t": tt, "V": V}))
    n = 1 << 16 if SMOKE else 1 << 28  # 268M fp32 parameters
    w = torch.randn(n, device=DEV)
    rows.append(("cast_fp32_to_bf16", lambda: w.to(BF16), 6.0 * n, {"n": n}))
    g = torch.randn(n, device=DEV)
    rows.append(("grad_accumulate_add", lambda: w.add_(g), 12.0 * n, {"n": n}))
    rows.append(("zero_grad_fill", lambda: g.zero_(), 4.0 * n, {"n": n}))
    ps = [torch.nn.Parameter(torch.randn(n // 64, device=DEV)) for _ in range(64)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-4, fused=DEV.type == "cuda")
    opt.step()
    rows.append(("adamw_fused_fp32_step", opt.step, 28.0 * n, {"n": n, "tensors": 64}))
    for what, fn, nbytes, extra in rows:
        try:
            s = timeit(fn, reps=8, warm=2)
        except RuntimeError as e:  # a kernel the backend lacks
            emit({"kind": "op", "what": what, "error": str(e)[:200], **extra})
            continue
        emit({"kind": "op", "what": what, "s": s, "bytes": nbytes,
              "gbps": nbytes / s / 1e9, **extra})
        log(f"op {what} {extra} {s * 1e3:.3f} ms {nbytes / s / 1e9:.0f} GB/s")
        if over(end):
            break
    del ps, opt, w, g
    gc.collect()


# ---------------------------------------------------------------------------------- link
def link_section(end: float) -> None:
    """Host<->device copies (pinned, pageable, both ways at once) and the CPU AdamW step."""
    if DEV.type == "cuda":
        n = 1 << 30
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host2 = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        page = torch.empty(n, dtype=torch.uint8)
        dev_a = torch.empty(n, dtype=torch.uint8, device=DEV)
        dev_b = torch.empty(n, dtype=torch.uint8, device=DEV)
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        for what, fn in (
                ("h2d_pinned", lambda: dev_a.copy_(host, non_blocking=True)),
                ("d2h_pinned", lambda: host.copy_(dev_a, non_blocking=True)),
                ("h2d_pageable", lambda: dev_a.copy_(page)),
                ("d2h_pageable", lambda: page.copy_(dev_a))):
            s = walltime(fn, reps=5, warm=1)
            emit({"kind": "link", "what": what, "bytes": n, "s": s, "gbps": n / s / 1e9})
            log(f"link {what} {n / s / 1e9:.1f} GB/s")

        def both() -> None:
            with torch.cuda.stream(s1):
                dev_a.copy_(host, non_blocking=True)
            with torch.cuda.stream(s2):
                host2.copy_(dev_b, non_blocking=True)

        s = walltime(both, reps=5, warm=1)
        emit({"kind": "link", "what": "bidirectional_pinned", "bytes": 2 * n, "s": s,
              "gbps": 2 * n / s / 1e9})
        log(f"link both {2 * n / s / 1e9:.1f} GB/s")
        del host, host2, page, dev_a, dev_b
    if over(end):
        return
    n = 1 << 12 if SMOKE else 1 << 26  # 67M fp32 parameters on the CPU
    for fused in (False, True):
        ps = [torch.nn.Parameter(torch.randn(n // 16)) for _ in range(16)]
        for p in ps:
            p.grad = torch.randn_like(p)
        try:
            opt = torch.optim.AdamW(ps, lr=1e-4, fused=fused, foreach=None if fused else True)
            opt.step()
            s = walltime(opt.step, reps=3, warm=1)
        except RuntimeError as e:
            emit({"kind": "link", "what": f"cpu_adamw_fused={fused}", "error": str(e)[:200]})
            continue
        emit({"kind": "link", "what": "cpu_adamw", "fused": fused, "n": n, "s": s,
              "params_per_s": n / s, "threads": torch.get_num_threads()})
        log(f"cpu adamw fused={fused} {n / s / 1e6:.0f} M params/s")
        del ps, opt
        gc.collect()


# ---------------------------------------------------------------------------------- attn
def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def attn_section(end: float) -> None:
    """Flash attention at context-parallel chunk sizes (module docstring)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hd = 128
    backend = [SDPBackend.FLASH_ATTENTION] if DEV.type == "cuda" else [SDPBackend.MATH]
    dtype = BF16 if DEV.type == "cuda" else torch.float32
    chunks = (64,) if SMOKE else (256, 512, 1024, 2048, 4096, 8192)
    heads_set = (2,) if SMOKE else (8, 32)
    tokens = 256 if SMOKE else 32768
    with sdpa_kernel(backend):
        for heads in heads_set:
            for c in chunks:  # c: the tokens one rank holds (s / cp)
                b = max(1, tokens // c)
                for block, (ql, kl, causal) in (("diag_causal", (c, c, True)),
                                                ("q_full_kv_half", (c, c // 2, False)),
                                                ("q_half_kv_full", (c // 2, c, False)),
                                                ("full_noncausal", (c, c, False))):
                    q = torch.randn(b, heads, ql, hd, device=DEV, dtype=dtype, requires_grad=True)
                    k = torch.randn(b, heads, kl, hd, device=DEV, dtype=dtype, requires_grad=True)
                    v = torch.randn_like(k, requires_grad=True)
                    go = torch.randn(b, heads, ql, hd, device=DEV, dtype=dtype)

                    def fo(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v,
                           causal: bool = causal) -> None:
                        with torch.no_grad():
                            _flash(q, k, v, causal)

                    def fb(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v,
                           go: torch.Tensor = go, causal: bool = causal) -> None:
                        _flash(q, k, v, causal).backward(go)

                    tf = timeit(fo, reps=6, warm=2)
                    tfb = timeit(fb, reps=6, warm=2)
                    flops = 4.0 * b * heads * ql * kl * hd * (0.5 if causal else 1.0)
                    emit({"kind": "attn", "block": block, "b": b, "heads": heads, "q": ql,
                          "kv": kl, "head_dim": hd, "causal": causal, "fwd_s": tf,
                          "fwdbwd_s": tfb, "fwd_flops": flops,
                          "fwd_tflops": flops / tf / 1e12,
                          "fwdbwd_tflops": 3.5 * flops / tfb / 1e12})
                    log(f"attn h={heads} c={c} {block} fwd {flops / tf / 1e12:.0f} "
                        f"fb {3.5 * flops / tfb / 1e12:.0f} TF/s")
                    del q, k, v, go
                if over(end):
                    return
                # the fp32 merge of two partial outputs by their log-sum-exp (one ring step)
                o1 = torch.randn(b, heads, c, hd, device=DEV)
                o2 = torch.randn_like(o1)
                l1 = torch.randn(b, heads, c, 1, device=DEV)
                l2 = torch.randn_like(l1)

                def merge(o1: torch.Tensor = o1, o2: torch.Tensor = o2, l1: torch.Tensor = l1,
                          l2: torch.Tensor = l2) -> torch.Tensor:
                    lse = torch.logaddexp(l1, l2)
                    return o1 * torch.exp(l1 - lse) + o2 * torch.exp(l2 - lse)

                s = timeit(merge, reps=6, warm=2)
                emit({"kind": "attn_merge", "b": b, "heads": heads, "q": c, "head_dim": hd,
                      "s": s, "bytes": 12.0 * o1.numel()})
                del o1, o2, l1, l2


# ---------------------------------------------------------------------------------- gemm
#: (name, hidden, heads, kv heads, ffn): Llama 3.2 1B, Llama 3 8B, Qwen 2.5 14B-like
#: (hidden 5120), Llama 3 70B.
GEMM_MODELS = (("h2048", 2048, 32, 8, 8192), ("h4096", 4096, 32, 8, 14336),
               ("h5120", 5120, 40, 8, 13824), ("h8192", 8192, 64, 8, 28672))


def gemm_section(end: float) -> None:
    """bf16 GEMMs of tensor-parallel shards: fwd [t,k]x[k,n], dgrad [t,n]x[n,k], wgrad
    [k,t]x[t,n] (as autograd issues them: A @ B.T and A.T @ B)."""
    dtype = BF16 if DEV.type == "cuda" else torch.float32
    ts = (64,) if SMOKE else (1024, 8192)
    models = GEMM_MODELS[:1] if SMOKE else GEMM_MODELS
    for t in ts:
        for name, h, nh, nkv, ffn in models:
            for tp in (1, 2, 4, 8):
                hd = h // nh
                if SMOKE:
                    h, ffn, hd = 64, 128, 8
                shapes = (("qkv", h, (nh + 2 * nkv) * hd // tp), ("o", h // tp, h),
                          ("gate_up", h, 2 * ffn // tp), ("down", ffn // tp, h))
                for op, k, n in shapes:
                    x = torch.randn(t, k, device=DEV, dtype=dtype)
                    w = torch.randn(n, k, device=DEV, dtype=dtype)  # nn.Linear's [out, in]
                    gy = torch.randn(t, n, device=DEV, dtype=dtype)
                    for pas, fn in (("fwd", lambda x=x, w=w: x @ w.t()),
                                    ("dgrad", lambda gy=gy, w=w: gy @ w),
                                    ("wgrad", lambda gy=gy, x=x: gy.t() @ x)):
                        s = timeit(fn, reps=8, warm=2)
                        emit({"kind": "gemm", "model": name, "tp": tp, "op": op, "pass": pas,
                              "t": t, "k": k, "n": n, "s": s,
                              "tflops": 2.0 * t * k * n / s / 1e12})
                    del x, w, gy
                if over(end):
                    return
            log(f"gemm t={t} {name} done")


# ---------------------------------------------------------------------------------- train
TRAIN_MODELS = {
    "tiny1b": dict(L=16, h=2048, nh=16, nkv=16, ffn=5632, V=32000),
    "l32-1b": dict(L=16, h=2048, nh=32, nkv=8, ffn=8192, V=128256),
    "small24": dict(L=24, h=1024, nh=16, nkv=16, ffn=4096, V=50304),
    "q5120-6L": dict(L=6, h=5120, nh=40, nkv=8, ffn=13824, V=152064),
    "l2-13b-4L": dict(L=4, h=5120, nh=40, nkv=40, ffn=13824, V=32000),
    "l3-70b-2L": dict(L=2, h=8192, nh=64, nkv=8, ffn=28672, V=128256),
    "acc8L": dict(L=8, h=2048, nh=16, nkv=16, ffn=5632, V=32000),
    # second set (`--set 2`): odd vocabularies and hidden sizes, GQA, head dims 64..128
    "gpt2v-12L": dict(L=12, h=1536, nh=12, nkv=12, ffn=6144, V=50257),
    "q3b-like": dict(L=12, h=2048, nh=16, nkv=2, ffn=11008, V=151936),
    "phi-2560": dict(L=12, h=2560, nh=32, nkv=32, ffn=10240, V=51200),
    "m7b-8L": dict(L=8, h=4096, nh=32, nkv=8, ffn=14336, V=32768),
    "y3072-10L": dict(L=10, h=3072, nh=24, nkv=8, ffn=8192, V=128256),
    "l2-70b-1L": dict(L=1, h=8192, nh=64, nkv=8, ffn=28672, V=32000),
}
#: (model, seq, mbs, recompute, micro-batches per step)
TRAIN_RUNS = (
    ("small24", 1024, 8, False, 1), ("small24", 2048, 4, False, 1), ("small24", 4096, 1, True, 1),
    ("l32-1b", 2048, 1, False, 1), ("l32-1b", 4096, 2, False, 1), ("l32-1b", 8192, 1, True, 1),
    ("l32-1b", 4096, 4, True, 1),
    ("acc8L", 2048, 1, False, 1), ("acc8L", 2048, 1, False, 4), ("acc8L", 2048, 1, False, 16),
    ("acc8L", 2048, 4, True, 4),
    ("tiny1b", 16384, 1, True, 1), ("tiny1b", 16384, 1, False, 1), ("tiny1b", 32768, 1, True, 1),
    ("q5120-6L", 4096, 1, False, 1), ("q5120-6L", 8192, 1, True, 1), ("q5120-6L", 2048, 4, False, 1),
    ("l2-13b-4L", 4096, 2, False, 1), ("l2-13b-4L", 4096, 2, True, 1),
    ("l3-70b-2L", 4096, 1, False, 1), ("l3-70b-2L", 8192, 2, True, 1),
)


#: The second set (`--set 2`).
TRAIN_RUNS2 = (
    ("gpt2v-12L", 1024, 8, False, 1), ("gpt2v-12L", 2048, 4, True, 1), ("gpt2v-12L", 1024, 2, False, 8),
    ("q3b-like", 2048, 2, False, 1), ("q3b-like", 4096, 1, False, 2), ("q3b-like", 8192, 2, True, 1),
    ("phi-2560", 2048, 2, False, 1), ("phi-2560", 2048, 8, True, 1), ("phi-2560", 4096, 1, False, 4),
    ("m7b-8L", 4096, 1, False, 1), ("m7b-8L", 8192, 1, False, 1), ("m7b-8L", 8192, 2, True, 2),
    ("m7b-8L", 2048, 4, False, 2),
    ("y3072-10L", 4096, 2, False, 1), ("y3072-10L", 16384, 1, True, 1), ("y3072-10L", 1024, 16, False, 1),
    ("l2-70b-1L", 4096, 1, False, 1), ("l2-70b-1L", 4096, 4, True, 1), ("l2-70b-1L", 2048, 2, False, 8),
    ("tiny1b", 1024, 8, False, 1), ("tiny1b", 1024, 1, False, 1), ("tiny1b", 512, 1, False, 1),
    ("acc8L", 512, 1, False, 32), ("acc8L", 1024, 2, True, 8),
)


def gqa_section(end: float) -> None:
    """SDPA as the decoder calls it with GQA (enable_gqa) against repeated kv heads."""
    for s_len, nh, nkv in ((4096, 32, 8), (8192, 32, 8), (4096, 16, 2), (4096, 40, 8)):
        b = max(1, 16384 // s_len)
        q = torch.randn(b, nh, s_len, 128, device=DEV, dtype=BF16, requires_grad=True)
        k = torch.randn(b, nkv, s_len, 128, device=DEV, dtype=BF16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        go = torch.randn_like(q)

        def gqa() -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(go)

        def rep() -> None:
            kk = k.repeat_interleave(nh // nkv, 1)
            vv = v.repeat_interleave(nh // nkv, 1)
            F.scaled_dot_product_attention(q, kk, vv, is_causal=True).backward(go)

        flops = 3.5 * 4.0 * b * nh * s_len * s_len * 128 * 0.5
        for what, fn in (("enable_gqa", gqa), ("repeat_kv", rep)):
            t = timeit(fn, reps=6, warm=2)
            emit({"kind": "attn_gqa", "what": what, "b": b, "heads": nh, "kv_heads": nkv,
                  "seq": s_len, "head_dim": 128, "fwdbwd_s": t, "fwdbwd_tflops": flops / t / 1e12})
            log(f"gqa {what} s={s_len} {nh}/{nkv} {flops / t / 1e12:.0f} TF/s")
        if over(end):
            return


def train_section(end: float) -> None:
    """Training steps (module docstring); OOM rows are written with ok=false."""
    f = open(os.path.join(OUT, "train.jsonl"), "a")  # noqa: SIM115
    cur: tuple[str, Any, Any] | None = None
    for name, seq, mbs, rc, nmb in (TRAIN_RUNS2 if "--set" in sys.argv else TRAIN_RUNS):
        if over(end):
            log("train budget reached")
            break
        cfg = dict(TRAIN_MODELS[name])
        if SMOKE:
            cfg = dict(L=2, h=64, nh=4, nkv=2 if cfg["nkv"] != cfg["nh"] else 4, ffn=128, V=256)
            seq = 32
        rec: dict[str, Any] = dict(model=name, **cfg, seq=seq, mbs=mbs, recompute=rc,
                                   num_microbatches=nmb)
        try:
            if cur is None or cur[0] != name:
                cur = None
                gc.collect()
                if DEV.type == "cuda":
                    torch.cuda.empty_cache()
                torch.manual_seed(0)
                with torch.device(DEV):
                    m = LM(**cfg)
                opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=DEV.type == "cuda")
                cur = (name, m, opt)
            _, m, opt = cur
            m.rc = rc
            nparam = sum(p.numel() for p in m.parameters())
            ids = [torch.randint(0, cfg["V"], (mbs, seq), device=DEV) for _ in range(nmb)]

            def step(m: Any = m, opt: Any = opt, ids: list[torch.Tensor] = ids) -> None:
                for x in ids:
                    with torch.autocast(DEV.type, dtype=BF16):
                        loss = m(x, x) / len(ids)
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)

            step()
            sync()
            static = torch.cuda.memory_allocated() if DEV.type == "cuda" else 0
            if DEV.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t = timeit(step, reps=3, warm=1)
            peak = torch.cuda.max_memory_allocated() if DEV.type == "cuda" else 0
            reserved = torch.cuda.max_memory_reserved() if DEV.type == "cuda" else 0
            toks = nmb * mbs * seq
            flops_tok = 6 * nparam + 6 * cfg["L"] * seq * cfg["h"]
            rec.update(params=nparam, static_bytes=static, peak_bytes=peak,
                       reserved_bytes=reserved, step_s=t, tokens_per_s=toks / t,
                       model_tflops=flops_tok * toks / t / 1e12, ok=True)
            log(f"train {name} s={seq} b={mbs} rc={rc} m={nmb} {t * 1e3:.1f} ms "
                f"peak {peak / 2**30:.1f} GiB")
        except torch.OutOfMemoryError:
            rec.update(ok=False, error="OOM")
            log(f"train {name} s={seq} b={mbs} rc={rc} OOM")
            cur = None
            gc.collect()
            torch.cuda.empty_cache()
        f.write(json.dumps(rec) + "\n")
        f.flush()
    f.close()
