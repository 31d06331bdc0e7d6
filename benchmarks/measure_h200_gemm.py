"""GEMM rates without the host in the timing, and a blind set of training steps (session 15).

Why: `h200_microbench.jsonl` (the shared grid, `A[M,K] @ B[K,N]`) and session 15's model-shape
GEMMs (`h200_s15/probe_set1.jsonl`, `x @ w.t()` as nn.Linear runs them) disagree by about 10%
on mid-size shapes, and both timed one call between CUDA events, so a call shorter than the
host's launch time measured the host. This script times each GEMM as a CUDA graph of 20 calls
(the GPU never waits for the host), both layouts, cold and after a minute of sustained load,
with the SM clock read through NVML beside each row; then the vocabulary-projection GEMMs at
aligned and unaligned vocabulary sizes; then a third set of training steps of the decoder
(`measure_h200_ops.py`'s `LM`) that nothing was fitted on.

Rows (JSON lines under $OUT): `gemm_graph.jsonl` (kind=gemm: m, k, n, layout "nn" A@B or
"nt" x@w.t() or "tn" g.t()@x, phase "cold"/"hot", s per call, tflops, sm_mhz), and
`train_set3.jsonl` (as train_set1). Run: `python benchmarks/measure_h200_gemm.py [--smoke]`.
"""
# ruff: noqa: E501

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from harness import h200_kit as ops  # same LM, same timers

SMOKE = ops.SMOKE
DEV = ops.DEV
OUT = ops.OUT
T0 = time.time()

try:
    import pynvml  # nvidia-ml-py
    pynvml.nvmlInit()
    _H = pynvml.nvmlDeviceGetHandleByIndex(0)

    def sm_mhz() -> int:
        return int(pynvml.nvmlDeviceGetClockInfo(_H, pynvml.NVML_CLOCK_SM))
except Exception:  # noqa: BLE001 - no NVML (CPU smoke test)
    def sm_mhz() -> int:
        return 0


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def graph_time(fn: Any, calls: int = 20, reps: int = 5) -> float:
    """Seconds per call of `fn` replayed as a CUDA graph of `calls` calls (median of reps)."""
    if DEV.type != "cuda":
        return ops.timeit(fn, reps=3, warm=1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / calls)
    del g
    ts.sort()
    return ts[len(ts) // 2]


GRID = [(m, k, n) for m in (1024, 4096, 16384) for k in (1024, 2048, 4096, 8192, 16384)
        for n in (1024, 4096, 16384)]
#: model shapes (t, k, n) of session 15's set: tp shards of hidden 2048..8192
MODEL = [(t, k, n) for t in (1024, 8192) for (k, n) in (
    (2048, 3072), (2048, 2048), (2048, 16384), (8192, 2048), (2048, 768), (512, 2048),
    (4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 1536), (1024, 4096),
    (4096, 7168), (3584, 4096), (5120, 7168), (5120, 27648), (13824, 5120), (5120, 1792),
    (8192, 10240), (8192, 57344), (28672, 8192), (8192, 1280), (1024, 8192), (7168, 8192))]
VOCAB = (32000, 32768, 50257, 50304, 128256, 151936, 152064)


def rows_for(phase: str, shapes: list[tuple[int, int, int]], layouts: tuple[str, ...],
             f: Any) -> None:
    dtype = torch.bfloat16 if DEV.type == "cuda" else torch.float32
    for m, k, n in shapes:
        if SMOKE:
            m, k, n = max(m // 256, 8), max(k // 256, 8), max(n // 256, 8)
        for lay in layouts:
            if lay == "nn":
                a = torch.randn(m, k, device=DEV, dtype=dtype)
                b = torch.randn(k, n, device=DEV, dtype=dtype)

                def fn(a: torch.Tensor = a, b: torch.Tensor = b) -> Any:
                    return a @ b
            elif lay == "nt":
                a = torch.randn(m, k, device=DEV, dtype=dtype)
                b = torch.randn(n, k, device=DEV, dtype=dtype)

                def fn(a: torch.Tensor = a, b: torch.Tensor = b) -> Any:
                    return a @ b.t()
            else:  # "tn": the weight gradient g.t() @ x, reduction over the m tokens
                a = torch.randn(k, m, device=DEV, dtype=dtype)
                b = torch.randn(k, n, device=DEV, dtype=dtype)

                def fn(a: torch.Tensor = a, b: torch.Tensor = b) -> Any:
                    return a.t() @ b
            s = graph_time(fn)
            f.write(json.dumps({"kind": "gemm", "phase": phase, "layout": lay, "m": m, "k": k,
                                "n": n, "s": s, "tflops": 2.0 * m * k * n / s / 1e12,
                                "sm_mhz": sm_mhz()}) + "\n")
            del a, b
    f.flush()


def heat(seconds: float) -> None:
    """Sustained load: back-to-back 8192^3 bf16 GEMMs for `seconds`."""
    if DEV.type != "cuda":
        return
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()
    log(f"heated, SM clock {sm_mhz()} MHz")


#: the blind set: (model cfg, seq, mbs, recompute, micro-batches)
SET3 = (
    (dict(L=10, h=2560, nh=20, nkv=4, ffn=6912, V=50304), 2048, 4, False, 1),
    (dict(L=10, h=2560, nh=20, nkv=4, ffn=6912, V=50304), 4096, 2, True, 2),
    (dict(L=6, h=4096, nh=32, nkv=32, ffn=11008, V=32000), 4096, 2, False, 1),
    (dict(L=6, h=4096, nh=32, nkv=32, ffn=11008, V=32000), 2048, 8, True, 1),
    (dict(L=3, h=6144, nh=48, nkv=8, ffn=16384, V=100352), 4096, 1, False, 1),
    (dict(L=3, h=6144, nh=48, nkv=8, ffn=16384, V=100352), 8192, 1, True, 2),
    (dict(L=20, h=1536, nh=12, nkv=4, ffn=4096, V=32000), 2048, 4, False, 1),
    (dict(L=20, h=1536, nh=12, nkv=4, ffn=4096, V=32000), 1024, 4, False, 4),
    (dict(L=8, h=3584, nh=28, nkv=4, ffn=18944, V=152064), 4096, 1, False, 1),
    (dict(L=8, h=3584, nh=28, nkv=4, ffn=18944, V=152064), 8192, 2, True, 1),
    (dict(L=2, h=12288, nh=96, nkv=8, ffn=28672, V=32000), 2048, 2, False, 1),
    (dict(L=2, h=12288, nh=96, nkv=8, ffn=28672, V=32000), 4096, 2, True, 1),
    (dict(L=12, h=2048, nh=16, nkv=8, ffn=8192, V=256000), 2048, 2, False, 1),
    (dict(L=32, h=1024, nh=8, nkv=8, ffn=2816, V=32000), 4096, 2, False, 1),
    (dict(L=32, h=1024, nh=8, nkv=8, ffn=2816, V=32000), 2048, 1, False, 8),
)


def train_set3(end: float) -> None:
    import gc
    f = open(os.path.join(OUT, "train_set3.jsonl"), "a")  # noqa: SIM115
    for i, (cfg0, seq, mbs, rc, nmb) in enumerate(SET3):
        if time.time() - T0 > end:
            log("set3 budget reached")
            break
        cfg = dict(cfg0)
        if SMOKE:
            cfg, seq = dict(L=2, h=64, nh=4, nkv=2, ffn=128, V=256), 32
        rec: dict[str, Any] = dict(model=f"set3-{i}", **cfg, seq=seq, mbs=mbs, recompute=rc,
                                   num_microbatches=nmb)
        try:
            gc.collect()
            if DEV.type == "cuda":
                torch.cuda.empty_cache()
            torch.manual_seed(0)
            with torch.device(DEV):
                m = ops.LM(**cfg)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=DEV.type == "cuda")
            m.rc = rc
            nparam = sum(p.numel() for p in m.parameters())
            ids = [torch.randint(0, cfg["V"], (mbs, seq), device=DEV) for _ in range(nmb)]

            def step(m: Any = m, opt: Any = opt, ids: list[torch.Tensor] = ids) -> None:
                for x in ids:
                    with torch.autocast(DEV.type, dtype=torch.bfloat16):
                        loss = m(x, x) / len(ids)
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=False)

            step()
            ops.sync()
            static = torch.cuda.memory_allocated() if DEV.type == "cuda" else 0
            if DEV.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t = ops.timeit(step, reps=3, warm=1)
            peak = torch.cuda.max_memory_allocated() if DEV.type == "cuda" else 0
            reserved = torch.cuda.max_memory_reserved() if DEV.type == "cuda" else 0
            toks = nmb * mbs * seq
            rec.update(params=nparam, static_bytes=static, peak_bytes=peak,
                       reserved_bytes=reserved, step_s=t, tokens_per_s=toks / t,
                       model_tflops=(6 * nparam + 6 * cfg["L"] * seq * cfg["h"]) * toks / t / 1e12,
                       ok=True, sm_mhz=sm_mhz())
            log(f"set3-{i} {cfg} s={seq} b={mbs} rc={rc} m={nmb} {t * 1e3:.1f} ms "
                f"peak {peak / 2**30:.1f} GiB")
            del m, opt
        except torch.OutOfMemoryError:
            rec.update(ok=False, error="OOM")
            log(f"set3-{i} OOM")
        f.write(json.dumps(rec) + "\n")
        f.flush()
    f.close()


def main() -> None:
    log(f"SM clock at start {sm_mhz()} MHz")
    with open(os.path.join(OUT, "gemm_graph.jsonl"), "a") as f:
        rows_for("cold", GRID, ("nn",), f)
        log(f"grid cold done, SM {sm_mhz()} MHz")
        rows_for("cold", MODEL, ("nt", "nn", "tn"), f)
        log(f"model shapes cold done, SM {sm_mhz()} MHz")
        rows_for("cold", [(t, h, v) for t in (4096,) for h in (2048, 4096) for v in VOCAB],
                 ("nt", "tn"), f)
        log("vocab done")
        heat(5 if SMOKE else 45)
        rows_for("hot", GRID, ("nn",), f)
        rows_for("hot", MODEL[len(MODEL) // 2:], ("nt",), f)
        log(f"hot done, SM {sm_mhz()} MHz")
    train_set3(1e9 if SMOKE else 330)
    log("done")


if __name__ == "__main__":
    main()
