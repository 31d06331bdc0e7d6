"""The evidence table of cost/evidence.py: the best published MFU per model class and GPU
generation, from the cited corpus.

    python benchmarks/evidence_table.py [--check]

Every run of `benchmarks/data/published_runs_*.csv` with a plan and a measured tokens/s/GPU
(crossval.cases: the development and held-out rows, each read with its source's recipe) gives
a measured MFU in the model's own definition (cost/flops.py model FLOPs per token x measured
tokens/s/GPU / the data-sheet peak of the run's compute dtype, as `evaluate` reports a plan's).
Per class (cost/evidence.py `class_key`: dense / MoE, size bucket, GPU generation, compute
dtype) the run with the highest measured MFU is kept, with its plan evaluated by the cost model
(predicted MFU, each time term's share of the step: what a plan's claim is compared against).
Writes autoparallel_cp/cost/evidence.json; `--check` exits 1 when the packaged file differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import crossval  # noqa: E402

from autoparallel_cp.cost.efficiency import peak_flops  # noqa: E402
from autoparallel_cp.cost.evaluate import evaluate  # noqa: E402
from autoparallel_cp.cost.evidence import TABLE_FILE, class_key, time_shares  # noqa: E402
from autoparallel_cp.cost.flops import model_flops_per_token  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "autoparallel_cp" / "cost" / TABLE_FILE
#: significant digits kept (the table is compared as text)
DIGITS = 4


def _r(x: float) -> float:
    return float(f"{x:.{DIGITS}g}")


def measured_mfu(c: crossval.Case) -> float:
    """Measured MFU of one run (the peak of its slowest GPU type, as evaluate's sum)."""
    job = c.job
    peak = sum(g.num_gpus * peak_flops(g.gpu, job.recipe.compute_dtype)
               for g in job.cluster.node_groups)
    return model_flops_per_token(job.model, job.seq_len) * c.measured * job.num_gpus / peak


def build() -> dict[str, Any]:
    """The table: class key -> the best run (measured MFU, its plan, the model's view of it)."""
    best: dict[str, tuple[float, crossval.Case]] = {}
    for c in crossval.cases():
        key = class_key(c.job)
        mfu = measured_mfu(c)
        if key not in best or (mfu, c.key) > (best[key][0], best[key][1].key):
            best[key] = (mfu, c)
    classes: dict[str, Any] = {}
    for key in sorted(best):
        mfu, c = best[key]
        ev = evaluate(c.job, c.plan, c.options)
        shares = time_shares(ev.time.model_dump())
        classes[key] = {
            "mfu": _r(mfu), "run": c.name, "source": c.source, "gpus": c.gpus,
            "seq_len": c.job.seq_len, "plan": c.plan.short(),
            "predicted_mfu": _r(ev.throughput.mfu),
            "shares": {k: _r(v) for k, v in shares.items()},
        }
    return {"generated_by": "benchmarks/evidence_table.py",
            "corpus": "benchmarks/data/published_runs_train.csv, published_runs_heldout.csv",
            "classes": classes}


def text() -> str:
    return json.dumps(build(), indent=1, sort_keys=True) + "\n"


def main() -> int:
    new = text()
    if "--check" in sys.argv:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == new
        print("evidence table up to date" if same else f"{OUT} differs: regenerate it")
        return 0 if same else 1
    OUT.write_text(new, encoding="utf-8")
    print(f"wrote {OUT} ({len(json.loads(new)['classes'])} classes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
