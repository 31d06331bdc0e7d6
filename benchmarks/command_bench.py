"""What the user waits for: the whole `ap-solve solve` command, in process, phase by phase.

    python benchmarks/command_bench.py [--top-k 10] [--repeat 1] [--only NAME] [--scaling]
                                       [--search-also schedule] [--fix schedule=dualpipe]

Runs the CLI exactly as a user would (click's runner over `autoparallel_cp.cli.main`, default
settings unless stated, deterministic time limits) and splits the wall clock into load (specs
and job), the search's own phases (`SolveResult.stats["phases"]`: the factor tables, master
listing (since session 6 the numpy key table, `search/key_table.py`, and its window slices;
before, the CP-SAT master's minimization and solution enumeration), key bounds, per-key
models), the recommendation phase, and the rest (exact
re-scoring of the k best, report, start-up of the command). `--scaling` adds solve time
against GPU count for one dense and one MoE model, and against top-k.

Timings are wall clock of this machine (2 cores for the project's numbers) and are reported
with the machine's load average; the plans and statuses do not depend on it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner

from autoparallel_cp import api
from autoparallel_cp.cli import main as cli_main
from autoparallel_cp.search import recommend as recommend_mod

CASES: list[tuple[str, list[str]]] = [
    ("llama3-405b 16,384 H100", ["-m", "llama3-405b", "-c", "dgx-h100", "--gpus", "16384",
                                 "--seq-len", "8192", "--global-batch", "2048"]),
    ("deepseek-v3 2,048 H800", ["-m", "deepseek-v3", "-c", "dgx-h800", "--gpus", "2048",
                                "--seq-len", "4096", "--global-batch", "15360"]),
    ("llama3-70b mixed-h100-a100", ["-m", "llama3-70b", "-c", "mixed-h100-a100",
                                    "--seq-len", "4096", "--global-batch", "1024"]),
    ("gpt3-175b 1,536 A100", ["-m", "gpt3-175b", "-c", "dgx-a100", "--gpus", "1536",
                              "--seq-len", "2048", "--global-batch", "1536"]),
    ("README: llama3-70b 512 H100", ["-m", "llama3-70b", "-c", "dgx-h100", "--gpus", "512",
                                     "--seq-len", "8192", "--global-batch", "512"]),
]


class Probe:
    """Wraps the API's solve and the recommendation to time them inside one CLI run."""

    def __init__(self) -> None:
        self.solve_s = 0.0
        self.recommend_s = 0.0
        self.load_s = 0.0
        self.result: Any = None

    def __enter__(self) -> Probe:
        self._solve = api.solve
        self._rec = recommend_mod.recommend
        self._job = api.make_job

        def timed(fn: Callable[..., Any], slot: str) -> Callable[..., Any]:
            def run(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    out = fn(*a, **k)
                finally:
                    setattr(self, slot, getattr(self, slot) + time.perf_counter() - t0)
                if slot == "solve_s":
                    self.result = out
                return out
            return run

        api.solve = timed(self._solve, "solve_s")  # type: ignore[assignment]
        recommend_mod.recommend = timed(self._rec, "recommend_s")  # type: ignore[assignment]
        api.make_job = timed(self._job, "load_s")  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        api.solve = self._solve  # type: ignore[assignment]
        recommend_mod.recommend = self._rec  # type: ignore[assignment]
        api.make_job = self._job  # type: ignore[assignment]


def run(args: list[str]) -> tuple[float, Probe, int]:
    """(wall seconds, the probe, exit code) of one `ap-solve solve ARGS` in this process."""
    with Probe() as p:
        t0 = time.perf_counter()
        res = CliRunner().invoke(cli_main, ["solve", *args, "--quiet"])
        wall = time.perf_counter() - t0
    return wall, p, res.exit_code


def phases_row(name: str, wall: float, p: Probe, code: int) -> str:
    r = p.result
    ph = dict(getattr(r, "stats", {}).get("phases", {})) if r is not None else {}
    status = getattr(r, "status", "?")
    keyed = ph.get("enumerate_keys_s", 0.0)
    parts = [p.load_s, ph.get("build_s", 0.0), ph.get("master_s", 0.0) + keyed,
             ph.get("key_bound_s", 0.0), ph.get("partition_s", 0.0)]
    rest_solve = p.solve_s - sum(parts[1:])
    other = wall - p.load_s - p.solve_s - p.recommend_s
    cells = [name, f"{wall:.2f}", status, *(f"{x:.2f}" for x in parts),
             f"{rest_solve:.2f}", f"{p.recommend_s:.2f}", f"{other:.2f}", str(code)]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| job | whole command s | status | load | tables + master build | master listing "
          "| key bounds | per-key models | exact re-scoring + rest of solve | recommendation "
          "| report + rest | exit |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def _big_cluster() -> str:
    """A YAML file of the dgx-h100 preset with 8,192 nodes (65,536 GPUs; the preset has 2,048)."""
    import tempfile

    import yaml

    from autoparallel_cp.spec.loaders import load_cluster

    c = load_cluster("dgx-h100")
    grp = c.node_groups[0].model_copy(update={"num_nodes": 8192})
    data = c.model_copy(update={"name": "dgx-h100-65536", "node_groups": [grp]}).model_dump()
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="dgx-h100-65536-")
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default="")
    ap.add_argument("--scaling", action="store_true")
    ap.add_argument("--search-also", default="",
                    help="passed to every job (e.g. schedule: issue 31's opt-in schedule axis)")
    ap.add_argument("--fix", default="",
                    help="passed to every job (e.g. schedule=dualpipe: its free splits)")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (cpus: {os.cpu_count()})\n")
    print(HEADER)
    for name, args in CASES:
        if a.only and a.only not in name:
            continue
        k = ["--top-k", str(a.top_k)] if "README" not in name else []
        if a.search_also:
            k += ["--search-also", a.search_also]
        if a.fix:
            k += ["--fix", a.fix]
        best = None
        for _ in range(a.repeat):
            got = run([*args, *k])
            if best is None or got[0] < best[0]:
                best = got
        assert best is not None
        print(phases_row(name, *best), flush=True)
    if not a.scaling:
        return
    print("\n### Solve time against GPU count (top-k 10)\n")
    print("| model | GPUs | whole command s | status |\n|---|---|---|---|")
    big = _big_cluster()
    for model, cluster, seq, batch in (("llama3-8b", big, 8192, 4096),
                                       ("mixtral-8x7b", big, 4096, 4096)):
        for gpus in (8, 64, 512, 4096, 16384, 65536):
            wall, p, code = run(["-m", model, "-c", cluster, "--gpus", str(gpus), "--seq-len",
                                 str(seq), "--global-batch", str(batch), "--top-k", "10"])
            print(f"| {model} | {gpus} | {wall:.2f} | "
                  f"{getattr(p.result, 'status', 'exit ' + str(code))} |", flush=True)
    print("\n### Solve time against top-k (llama3-70b, 512 H100)\n")
    print("| top-k | whole command s | status |\n|---|---|---|")
    for k in (1, 10, 100):
        wall, p, code = run(["-m", "llama3-70b", "-c", "dgx-h100", "--gpus", "512",
                             "--seq-len", "8192", "--global-batch", "512", "--top-k", str(k)])
        print(f"| {k} | {wall:.2f} | {getattr(p.result, 'status', 'exit ' + str(code))} |",
              flush=True)


if __name__ == "__main__":
    main()
