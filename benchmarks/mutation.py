"""Mutation testing of the cost model and the search (issue 16): a standing benchmark, not CI.

Runs mutmut (`pip install -e .[mutation]`; configuration in pyproject.toml `[tool.mutmut]`) over
`autoparallel_cp/cost/*` and `autoparallel_cp/search/*`, one worker, each mutant against only the
tests that cover the mutated function (mutmut's per-test coverage), and prints the score per
module with the surviving mutants. Results and the explanations of the survivors are recorded in
benchmarks/RESULTS.md ("Mutation testing").

    python benchmarks/mutation.py                       # the cost-model modules (about 1 h)
    python benchmarks/mutation.py cost.comm cost.sync   # some modules
    python benchmarks/mutation.py --report              # score of the last run only
    mutmut show autoparallel_cp.cost.comm.x_p2p__mutmut_17   # one mutant's diff

The whole set (about 11,500 mutants, 4,400 of them in cost/) takes several hours on 2 cores.
`PYTHONPATH` is removed for the mutmut run: mutmut imports the mutated copy under `mutants/`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The cost-model modules the issue names first, then the rest of cost/.
DEFAULT = ("cost.comm", "cost.sync", "cost.steptime", "cost.memory", "cost.model_state",
           "cost.layer_factors")
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


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
    a = ap.parse_args()
    mods = a.modules or list(DEFAULT)
    if not a.report:
        run(mods)
    report(mods)


if __name__ == "__main__":
    main()
