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
    python benchmarks/mutation.py --sample 500 --seed 1 search   # a random sample (below)
    python benchmarks/mutation.py --sample 500 --seed 1 --report search   # its score again
    mutmut show autoparallel_cp.cost.comm.x_p2p__mutmut_17   # one mutant's diff

The whole set (11,911 mutants: 3,891 in cost/, 8,020 in search/) takes a day on 2 cores.
`--sample N --seed S` checks a seeded, stratified random sample instead: the mutants are
generated, N of those in the named modules are drawn without replacement, allocated to the
modules in proportion to their mutant counts (largest remainders, at least one per module), and
only those are run; the report gives per module and overall the checked, killed and surviving
mutants, the score, and a 95% Wilson interval for the score of the whole population. Proportional
allocation makes the pooled sample self-weighting, and the interval ignores the finite-population
correction (so it is slightly wide). A module name also selects its submodules ("search", "cost").
With `--chunk K` the sample runs K at a time in its shuffled order: mutmut runs each call's
mutants fastest first, so a run cut short in one call would have checked a biased subset.
`--limit M` keeps only the first M of that order (itself a random sample); a later call with a
larger M continues where the last one stopped, skipping mutants already checked.
`PYTHONPATH` is removed for the mutmut run: mutmut imports the mutated copy under `mutants/`.
"""

from __future__ import annotations

import argparse
import math
import os
import random
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


def run(modules: list[str], names: list[str] | None = None) -> None:
    """`mutmut run` on the mutants of `modules` (e.g. 'cost.comm'), or on `names`, one worker."""
    names = names or [f"autoparallel_cp.{m}.*" for m in modules]
    subprocess.run(["mutmut", "run", "--max-children", "1", *names], cwd=ROOT, env=_env(),
                   check=False)


#: mutmut 3's own generation steps (the start of `mutmut run`), without the test runs.
_GENERATE = """
from mutmut.__main__ import create_mutants
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
import os
os.makedirs("mutants", exist_ok=True)
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(1)
"""


def generate() -> None:
    """Write (or refresh) the mutants under `mutants/` without running any test."""
    done = subprocess.run([sys.executable, "-c", _GENERATE], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit("mutant generation failed (mutmut internals changed? this uses mutmut 3.8):\n"
                 + done.stderr[-2000:])


def _module(name: str) -> str:
    """'autoparallel_cp.search.tables.x_plan_cost__mutmut_3' -> 'search.tables'."""
    return ".".join(name.split(".")[1:3])


def _selected(mod: str, modules: list[str]) -> bool:
    return any(mod == m or mod.startswith(m + ".") for m in modules)


def sample(modules: list[str], n: int, seed: int) -> list[str]:
    """`n` mutant names of `modules`, stratified by module in proportion to its mutant count.

    The population is every generated mutant of the modules (sorted by name, so the draw
    depends only on the source, `n` and `seed`); each module gets its proportional share of `n`
    (largest remainders, at least one), drawn uniformly without replacement.
    """
    pop: dict[str, list[str]] = defaultdict(list)
    for name in results():
        if _selected(_module(name), modules):
            pop[_module(name)].append(name)
    total = sum(len(v) for v in pop.values())
    if not total:
        sys.exit(f"no mutants in {modules}")
    n = min(n, total)
    quota = {m: n * len(v) / total for m, v in pop.items()}
    alloc = {m: max(1, math.floor(q)) for m, q in quota.items()}
    for m in sorted(quota, key=lambda m: (alloc[m] - quota[m], m)):
        if sum(alloc.values()) >= n:
            break
        alloc[m] += 1
    rng = random.Random(seed)
    picked = []
    for m in sorted(pop):
        picked += rng.sample(sorted(pop[m]), min(alloc[m], len(pop[m])))
    rng.shuffle(picked)  # run order: any prefix of whole chunks is itself a random sample
    return picked


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion k/n (Wilson 1927)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


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


def report(modules: list[str] | None, only: list[str] | None = None) -> int:
    """Print the score per module (checked mutants only, or those of `only`) with 95% Wilson
    intervals, and the survivors (with their status when not plain "survived"); returns the
    number of survivors. "no tests" (no selected test reaches the mutant) counts as surviving."""
    res = results()
    population = Counter(_module(name) for name in res)
    per: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for name in only if only is not None else res:
        status = res.get(name, "not checked")
        mod = _module(name)
        if modules and not _selected(mod, modules):
            continue
        if status == "not checked":
            continue
        per[mod][status] += 1
        if status not in KILLED:
            survivors[mod].append(name + ("" if status == "survived" else f" ({status})"))
    tot_k = tot = pop = 0
    print("| module | mutants | checked | killed | survived | score | 95% interval |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for mod in sorted(per):
        c = per[mod]
        n = sum(c.values())
        k = sum(v for s, v in c.items() if s in KILLED)
        tot_k, tot, pop = tot_k + k, tot + n, pop + population[mod]
        lo, hi = wilson(k, n)
        print(f"| {mod} | {population[mod]} | {n} | {k} | {n - k} | {100 * k / n:.1f}% | "
              f"{100 * lo:.1f}-{100 * hi:.1f}% |")
    if tot:
        lo, hi = wilson(tot_k, tot)
        print(f"| **all** | {pop} | {tot} | {tot_k} | {tot - tot_k} | {100 * tot_k / tot:.1f}% | "
              f"{100 * lo:.1f}-{100 * hi:.1f}% |")
    for mod in sorted(survivors):
        print(f"\n{mod}: " + ", ".join(s.split(".")[-1] for s in sorted(survivors[mod])))
    return sum(len(v) for v in survivors.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="e.g. cost.comm search.tables (default: "
                    + " ".join(DEFAULT) + ")")
    ap.add_argument("--report", action="store_true", help="only print the last run's score")
    ap.add_argument("--planted", action="store_true", help="run issue 16's planted bugs")
    ap.add_argument("--sample", type=int, metavar="N",
                    help="check only N mutants drawn at random, stratified by module")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --sample draw (default 0)")
    ap.add_argument("--chunk", type=int, default=0, metavar="K",
                    help="run the sample K mutants at a time, in its random order, so a run "
                    "stopped early has checked a random subset (mutmut orders each run fastest "
                    "first; each chunk repeats mutmut's clean test run)")
    ap.add_argument("--limit", type=int, default=0, metavar="M",
                    help="only the first M mutants of the sample's random order (a smaller "
                    "random sample; a later call with a larger M continues, skipping the "
                    "mutants already checked)")
    a = ap.parse_args()
    if a.planted:
        sys.exit(1 if planted() else 0)
    mods = a.modules or list(DEFAULT)
    if a.sample is None:
        if not a.report:
            run(mods)
        report(mods)
        return
    if a.sample < 1:
        ap.error("--sample needs N >= 1")
    if not a.report:
        generate()
    names = sample(mods, a.sample, a.seed)
    print(f"sample: {len(names)} mutants of {' '.join(mods)}, seed {a.seed}"
          + (f", the first {a.limit} of its random order" if a.limit else ""))
    names = names[:a.limit] if a.limit else names
    if not a.report:
        done = results()
        todo = [n for n in names if done.get(n, "not checked") == "not checked"]
        for i in range(0, len(todo), a.chunk or len(todo)):
            run(mods, todo[i:i + (a.chunk or len(todo))])
    report(mods, names)


if __name__ == "__main__":
    main()
