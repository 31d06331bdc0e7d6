"""The evidence table of cost/evidence.py: the best published MFU per model class and GPU
generation, from the cited corpus.

    python benchmarks/evidence_table.py [--check | --claims]

Every run of `benchmarks/data/published_runs_*.csv` with a plan and a measured tokens/s/GPU
(crossval.cases: the development and held-out rows, each read with its source's recipe) gives
a measured MFU in the model's own definition (cost/flops.py model FLOPs per token x measured
tokens/s/GPU / the data-sheet peak of the run's compute dtype, as `evaluate` reports a plan's).
Per class (cost/evidence.py `class_key`: dense / MoE, size bucket, GPU generation, compute
dtype) the run with the highest measured MFU is kept, with its plan evaluated by the cost model
(predicted MFU, each time term's share of the step: what a plan's claim is compared against).
Writes autoparallel_cp/cost/evidence.json; `--check` exits 1 when the packaged file differs;
`--claims` prints, for well-known jobs, the fastest plan's MFU against its class's evidence
(benchmarks/RESULTS.md, "Claims against evidence").
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


#: well-known jobs (issue 29): the solver's best plan against the evidence of its class
JOBS: tuple[tuple[str, str, str, int, int, int, str], ...] = (
    ("Llama 3 405B, 16,384 H100", "llama3-405b", "dgx-h100", 16384, 8192, 2048, "megatron-bf16"),
    ("GPT-3 175B, 1,536 A100", "gpt3-175b", "dgx-a100", 1536, 2048, 1536, "megatron-bf16"),
    ("GPT 1T, 3,072 A100", "sc21-gpt-1t", "dgx-a100", 3072, 2048, 3072, "megatron-bf16"),
    ("Nemotron-4 340B, 6,144 H100", "nemotron-4-340b", "dgx-h100", 6144, 4096, 768,
     "megatron-bf16"),
    ("DeepSeek-V3, 2,048 H800", "deepseek-v3", "dgx-h800", 2048, 4096, 15360, "megatron-bf16"),
    ("Mixtral 8x7B, 64 H100", "mixtral-8x7b", "dgx-h100", 64, 4096, 256, "megatron-bf16"),
    ("torchtitan Llama 3 8B, 64 H100", "llama3-8b", "dgx-h100", 64, 8192, 64,
     "torchtitan-fsdp"),
    ("torchtitan Llama 3 70B, 256 H100", "llama3-70b", "dgx-h100", 256, 8192, 256,
     "torchtitan-fsdp"),
)


def claims() -> str:
    """A markdown table: each well-known job's fastest plan (solve, default space, up to the
    GPU memory), its MFU, the best published MFU of its class and the mechanisms named."""
    from autoparallel_cp import api
    from autoparallel_cp.cost.evidence import evidence_text

    rows = ["| job | fastest plan | MFU | best published (class) | claim | carried by |",
            "|---|---|---|---|---|---|"]
    for label, model, cluster, gpus, seq, batch, recipe in JOBS:
        job = api.make_job(model, cluster, gpus=gpus, seq_len=seq, global_batch=batch,
                           recipe=recipe)
        ev = api.solve(job, top_k=1, time_limit=30).plans[0]
        e = ev.evidence or {}
        mfu = ev.throughput.mfu
        best = e.get("best_published_mfu")
        mech = evidence_text(e, mfu).split("carried by ", 1)[-1] if e.get(
            "beyond_evidence") else "-"
        if best is None:
            pub, claim = "none in the corpus", "-"
        else:
            pub = (f"{best:.1%} ({e['run']}, {e['source']}; model "
                   f"{e['model_mfu_on_published_run']:.1%})")
            claim = f"{e['claim_vs_published']:+.0%}" + (
                " beyond" if e.get("beyond_evidence") else "")
        rows.append(f"| {label} | {ev.plan.short()} | {mfu:.1%} | {pub} | {claim} | {mech} |")
    return "\n".join(rows)


def main() -> int:
    if "--claims" in sys.argv:
        print(claims())
        return 0
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
