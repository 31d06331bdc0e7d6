"""Solver benchmark: case, space size, CP-SAT time, enumerate time (or "refused"), speed-up.

Run: python benchmarks/solver_bench.py [--time-limit S] [--workers W] [--enum-limit N]
Where the enumerator runs, the last column says whether both top-k lists agree (same step
times within CP-SAT's proven per-plan error bound, same keys up to exact ties).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from autoparallel_cp.search.enumerate import SpaceTooLarge
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster, load_model

CASES = [
    ("llama3-8b 16xH100 uniform", "llama3-8b", "dgx-h100", 16, 4096, 64,
     dict(partition="uniform", partial_recompute=False)),
    ("llama3-8b 16xH100 free pp<=4", "llama3-8b", "dgx-h100", 16, 4096, 64,
     dict(max_pp=4, max_vpp=2)),
    ("llama3-8b 16xH100 free pp<=8 whole-stage recompute", "llama3-8b", "dgx-h100", 16, 4096,
     64, dict(max_pp=8, max_vpp=2, partial_recompute=False)),
    ("llama3-8b 32xH100 free pp<=8", "llama3-8b", "dgx-h100", 32, 4096, 128,
     dict(max_pp=8, max_vpp=2)),
    ("llama3-405b 16384xH100", "llama3-405b", "dgx-h100", 16384, 8192, 2048, {}),
    ("deepseek-v3 2048xH800", "deepseek-v3", "dgx-h800", 2048, 4096, 4096, {}),
    ("llama3-70b mixed-h100-a100", "llama3-70b", "mixed-h100-a100", None, 4096, 1024, {}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--only", default="")
    ap.add_argument("--enum-limit", type=float, default=3e6,
                    help="largest space the enumerator is allowed to run")
    a = ap.parse_args()
    print("| case | space size | CP-SAT s (status, keys scored) | enumerate s | speed-up "
          "| same top-k |")
    print("|---|---|---|---|---|---|")
    for name, model, cluster, gpus, seq, batch, kw in CASES:
        if a.only and a.only not in name:
            continue
        c = load_cluster(cluster)
        job = Job(model=load_model(model), cluster=c.take_gpus(gpus) if gpus else c,
                  seq_len=seq, global_batch=batch)
        space = SearchSpace.for_job(job, **kw)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        r = solve(job, space, top_k=a.top_k, time_limit=a.time_limit, workers=a.workers)
        ts = time.perf_counter() - t0
        same = "-"
        try:
            t1 = time.perf_counter()
            e = enumerate_plans(job, space, top_k=a.top_k, limit=int(a.enum_limit))
            te: float | None = time.perf_counter() - t1
            same = "yes" if _agree(r, e) else "NO"
        except SpaceTooLarge:
            te = None
        sp = f"{te / ts:.1f}x" if te else "-"
        print(f"| {name} | {space.size():.3g} | {ts:.2f} ({r.status}, {r.iterations}) | "
              f"{'refused' if te is None else f'{te:.2f}'} | {sp} | {same} |", flush=True)


def _agree(r: Any, e: Any) -> bool:
    """Same top-k step times (within CP-SAT's error bound) and keys (up to exact ties)."""
    ca = [c for c, _ in r.stats["ranked"]]
    ce = [c for c, _ in e.stats["ranked"]]
    tol = r.error_bound_s + 1e-9
    if len(ca) != len(ce) or any(abs(x - y) > tol for x, y in zip(ca, ce, strict=True)):
        return False
    return all(pa.key()[:10] == pe.key()[:10] or abs(x - y) <= tol
               for (x, pa), (y, pe) in zip(r.stats["ranked"], e.stats["ranked"], strict=True))


if __name__ == "__main__":
    main()
