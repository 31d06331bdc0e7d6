"""Mutation testing of the cost model and the search (issue 16): a standing benchmark, not CI.

Runs mutmut (`pip install -e .[mutation]`; configuration in pyproject.toml `[tool.mutmut]`) over
`autoparallel_cp/cost/*` and `autoparallel_cp/search/*`, one worker, each mutant against only the
tests that cover the mutated function (mutmut's per-test coverage), and prints the score per
module with the surviving mutants. Results and the explanations of the survivors are recorded in
benchmarks/RESULTS.md ("Mutation testing").

    python benchmarks/mutation.py                       # the cost-model modules (about 1 h)
    python benchmarks/mutation.py cost.comm cost.sync   # some modules
    python benchmarks/mutation.py --report              # score of the last run only
    python benchmarks/mutation.py --planted             # issue 16's planted bugs (~3 min)
    mutmut show autoparallel_cp.cost.comm.x_p2p__mutmut_17   # one mutant's diff

The whole set (about 11,500 mutants, 4,400 of them in cost/) takes several hours on 2 cores.
`PYTHONPATH` is removed for the mutmut run: mutmut imports the mutated copy under `mutants/`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The cost-model modules the issue names first, then the rest of cost/.
DEFAULT = ("cost.comm", "cost.sync", "cost.steptime", "cost.memory", "cost.model_state",
           "cost.layer_factors")
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


#: Issue 16's planted bugs: each must fail at least one test of `PLANTED_TESTS`.
PLANTED = {
    "NVLink bandwidth halved": ("autoparallel_cp/cost/comm.py",
                                "node.intra_node.bandwidth_gbps * 1e9",
                                "node.intra_node.bandwidth_gbps * 0.5e9"),
    "network bandwidth halved": ("autoparallel_cp/cost/comm.py",
                                 "node.inter_node.bandwidth_gbps * 1e9",
                                 "node.inter_node.bandwidth_gbps * 0.5e9"),
    "NVLINK_EFFICIENCY halved": ("autoparallel_cp/cost/comm.py", "NVLINK_EFFICIENCY = 0.80",
                                 "NVLINK_EFFICIENCY = 0.40"),
    "NETWORK_EFFICIENCY halved": ("autoparallel_cp/cost/comm.py", "NETWORK_EFFICIENCY = 0.85",
                                  "NETWORK_EFFICIENCY = 0.425"),
    "HBM bandwidth halved": ("autoparallel_cp/cost/efficiency.py",
                             "gpu.hbm_gbps * 1e9 * HBM_EFFICIENCY",
                             "gpu.hbm_gbps * 0.5e9 * HBM_EFFICIENCY"),
    "HBM_EFFICIENCY halved": ("autoparallel_cp/cost/efficiency.py", "HBM_EFFICIENCY = 0.87",
                              "HBM_EFFICIENCY = 0.435"),
    "bubble off-by-one (steptime)": ("autoparallel_cp/cost/steptime.py",
                                     "bubble = (total - tmax) / plan.vpp",
                                     "bubble = total / plan.vpp"),
    "bubble off-by-one (tables)": ("autoparallel_cp/search/tables.py",
                                   "(sum(times) - tmax) / plan.vpp", "sum(times) / plan.vpp"),
    "bubble off-by-one (enumerate)": ("autoparallel_cp/search/enumerate.py",
                                      "(tsum - tmax) / d.vpp", "tsum / d.vpp"),
}
PLANTED_TESTS = ("tests/cost", "tests/spec", "tests/search/test_one_cost.py")


def planted() -> int:
    """Plant each bug in a copy of the tracked tree and list the tests that fail."""
    escaped = 0
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            (Path(tmp) / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, Path(tmp) / f)
        env = dict(os.environ, PYTHONPATH=tmp)
        for name, (path, old, new) in PLANTED.items():
            src = (Path(tmp) / path).read_text()
            assert src.count(old) == 1, (name, "pattern not found once: update PLANTED")
            (Path(tmp) / path).write_text(src.replace(old, new))
            try:
                out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p",
                                      "no:cacheprovider", *PLANTED_TESTS], cwd=tmp, env=env,
                                     capture_output=True, text=True, check=False).stdout
            finally:
                (Path(tmp) / path).write_text(src)
            failed = sorted(set(re.findall(r"^FAILED (\S+?)(?:\[| - |$)", out, re.M)))
            escaped += not failed
            print(f"{name}: {len(failed)} failing tests" + "".join(f"\n  {t}" for t in failed))
    return escaped


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def run(modules: list[str]) -> None:
    """`mutmut run` on the mutants of `modules` (e.g. 'cost.comm'), one worker."""
    names = [f"autoparallel_cp.{m}.*" for m in modules]
    subprocess.run(["mutmut", "run", "--max-children", "1", *names], cwd=ROOT, env=_env(),
                   check=False)


def results() -> dict[str, str]:
    """mutant name -> status of every mutant mutmut has generated."""
    out = subprocess.run(["mutmut", "results", "--all", "true"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        m = re.match(r"\s*(autoparallel_cp\.\S+): (.+)$", line)
        if m:
            res[m.group(1)] = m.group(2).strip()
    return res


def report(modules: list[str] | None) -> int:
    """Print the score per module (checked mutants only) and the survivors; returns survivors."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for name, status in results().items():
        mod = ".".join(name.split(".")[1:3])
        if modules and mod not in modules:
            continue
        if status == "not checked":
            continue
        per[mod][status] += 1
        if status not in KILLED:
            survivors[mod].append(name)
    tot_k = tot = 0
    print("| module | mutants | killed | survived | score |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mod in sorted(per):
        c = per[mod]
        n = sum(c.values())
        k = sum(v for s, v in c.items() if s in KILLED)
        tot_k, tot = tot_k + k, tot + n
        print(f"| {mod} | {n} | {k} | {n - k} | {100 * k / n:.1f}% |")
    if tot:
        print(f"| **all** | {tot} | {tot_k} | {tot - tot_k} | {100 * tot_k / tot:.1f}% |")
    for mod in sorted(survivors):
        print(f"\n{mod}: " + ", ".join(s.split(".")[-1] for s in sorted(survivors[mod])))
    return sum(len(v) for v in survivors.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="e.g. cost.comm search.tables (default: "
                    + " ".join(DEFAULT) + ")")
    ap.add_argument("--report", action="store_true", help="only print the last run's score")
    ap.add_argument("--planted", action="store_true", help="run issue 16's planted bugs")
    a = ap.parse_args()
    if a.planted:
        sys.exit(1 if planted() else 0)
    mods = a.modules or list(DEFAULT)
    if not a.report:
        run(mods)
    report(mods)


if __name__ == "__main__":
    main()
