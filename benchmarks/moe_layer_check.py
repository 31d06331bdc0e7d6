"""The cost model's MoE block against NVIDIA's per-layer H100 measurements (no fitting).

Data: `benchmarks/data/megatron_moe_layer_h100.jsonl`, the forward and backward times of one
isolated Megatron-Core MoE layer (router, dispatch, grouped-GEMM experts, shared expert,
combine; no attention) that Megatron-LM's MoE performance regression test records on H100
(tests/functional_tests/test_cases/common/moe_perf/ @d98e8a64: baseline.json holds the
times, test_cases.py the shapes). Each case: 8 GPUs of one node, tp 1, ep 8, one micro-batch of
4096 tokens per GPU, bf16 or fp8 (blockwise), routing forced to balance, router and permute
fusion on, CUDA-event timing of the forward and of the backward (mean of 20 iterations after 5
warm-up ones; a long GEMM is issued before each iteration so that the router's kernel launches
are not timed).

The model's MoE block is `layer_factors(moe=True)` less the same layer's attention part,
obtained as `layer_factors(moe=False)` of the same model with a one-wide dense MLP minus that
MLP's GEMMs (its elementwise work is 4096 x a few bytes, negligible). What this measures: the
GPU time of the MoE block when the host is not the bottleneck. It does not see host (launch)
time in a full step, which the benchmark deliberately hides.

Run: `python benchmarks/moe_layer_check.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoparallel_cp.api import load_cluster, load_model, make_job
from autoparallel_cp.cost.common import options_for
from autoparallel_cp.cost.efficiency import gemm_time
from autoparallel_cp.cost.flops import mlp_gemms
from autoparallel_cp.cost.layer_factors import layer_factors
from autoparallel_cp.spec import Job, ModelSpec

DATA = Path(__file__).resolve().parent / "data" / "megatron_moe_layer_h100.jsonl"


@dataclass(frozen=True)
class Check:
    case: str
    dispatcher: str
    precision: str
    measured_ms: float  # forward + backward
    model_ms: float

    @property
    def error(self) -> float:
        return self.model_ms / self.measured_ms - 1.0


def load_cases(path: Path = DATA) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _proxy_model(row: dict[str, Any], ffn: int) -> ModelSpec:
    """A two-layer model with the case's MoE block (8 heads as the test's config; attention is
    subtracted again) and a dense MLP of width `ffn` for its dense twin."""
    base = load_model("mixtral-8x7b")
    shared = int(row["shared_expert_ffn_hidden_size"])
    spec = base.model_dump()
    spec.update(
        name="moe-perf-proxy", num_layers=2, hidden_size=row["hidden_size"],
        num_attention_heads=8, num_kv_heads=8, ffn_hidden_size=ffn,
        moe=dict(num_experts=row["num_experts"], top_k=row["top_k"],
                 expert_ffn_hidden_size=row["expert_ffn_hidden_size"],
                 num_shared_experts=1 if shared else 0,
                 shared_expert_ffn_hidden_size=shared or None),
    )
    return ModelSpec.model_validate(spec)


def _job(model: ModelSpec, row: dict[str, Any]) -> Job:
    recipe = "megatron-fp8" if row["precision"] == "fp8" else "megatron-bf16"
    return make_job(model, load_cluster("dgx-h100"), gpus=8,
                    seq_len=int(row["seq_len"]),
                    global_batch=8, recipe=recipe)


def model_moe_block_s(row: dict[str, Any]) -> float:
    """Forward + backward seconds of the case's MoE block in the cost model (see module doc)."""
    tokens = float(row["seq_len"]) * float(row["micro_batch"])
    ep = int(row["ep"])
    moe_job = _job(_proxy_model(row, int(row["expert_ffn_hidden_size"])), row)
    opts = options_for(moe_job, None).model_copy(
        update={"ep_dispatcher": row["dispatcher"], "ep_overlap": False})
    full = layer_factors(moe_job, 0, 1, 1, ep, 0, row["micro_batch"], "none", moe=True,
                         options=opts)
    twin_model = _proxy_model(row, 1)
    twin = _job(twin_model, row)
    dense = layer_factors(twin, 0, 1, 1, 1, 0, row["micro_batch"], "none", moe=False,
                          options=opts)
    gpu = twin.cluster.node_groups[0].gpu
    dtype = twin.recipe.compute_dtype
    mlp = 0.0
    for gm in mlp_gemms(twin_model, tokens, 1.0, 1):
        for m, k, n in ((gm.m, gm.k, gm.n), (gm.m, gm.n, gm.k), (gm.k, gm.m, gm.n)):
            mlp += float(np.sum(gm.count * gemm_time(gpu, m, k, n, dtype)))
    return float(full.time_s) - (float(dense.time_s) - mlp)


def run_checks(path: Path = DATA) -> list[Check]:
    out = []
    for row in load_cases(path):
        measured = float(row["forward_ms"]) + float(row["backward_ms"])
        disp = str(row["dispatcher"]) + (f"/{row['flex_backend']}" if row["flex_backend"] else "")
        out.append(Check(str(row["case"]), disp, str(row["precision"]), measured,
                         model_moe_block_s(row) * 1e3))
    return out


def main() -> None:
    checks = run_checks()
    print(f"{'case':32s} {'dispatcher':15s} {'prec':5s} {'measured ms':>11s} "
          f"{'model ms':>9s} {'error':>7s}")
    for c in checks:
        print(f"{c.case:32s} {c.dispatcher:15s} {c.precision:5s} {c.measured_ms:11.2f} "
              f"{c.model_ms:9.2f} {c.error:+7.1%}")
    errs = np.array([c.error for c in checks])
    print(f"signed mean {errs.mean():+.1%}, MAPE {np.abs(errs).mean():.1%} over {len(errs)} "
          "cases (model vs NVIDIA's H100 MoE-layer measurement)")


if __name__ == "__main__":
    main()
