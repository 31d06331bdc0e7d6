"""The public Python API (issue 11, item 8): every exported name resolves and keeps working on
repeated calls; wrong arguments raise the documented `UserError` types naming the argument."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import autoparallel_cp as ap
from autoparallel_cp import api
from autoparallel_cp.errors import InputError, UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import PlanError


@pytest.fixture(scope="module")
def job() -> Job:
    return ap.make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=32)


def test_every_exported_name_resolves() -> None:
    for name in ap.__all__:
        assert getattr(ap, name) is not None, name
    assert callable(ap.evaluate) and callable(ap.solve) and callable(ap.enumerate_plans)


def test_evaluate_solve_enumerate_twice(job: Job) -> None:
    a = ap.evaluate(job, "tp=8")
    b = ap.evaluate(job, "tp=8")  # used to fail: a submodule shadowed the function
    assert a.to_json() == b.to_json()
    assert ap.evaluate(job, {"tp": 8, "mbs": 1}).to_json() == a.to_json()
    c = ap.evaluate(job, {"tp": "8", "stage_layers": "32"}).to_json()  # strings as in text
    assert c["plan"]["stage_layers"] in ([32], (32,)) and c["memory"] == a.to_json()["memory"]
    r1 = ap.solve(job, top_k=2, time_limit=20, fix="tp=8")
    r2 = ap.solve(job, top_k=2, time_limit=20, fix="tp=8")
    assert r1.plans and [p.plan for p in r1.plans] == [p.plan for p in r2.plans]
    e1 = ap.enumerate_plans(job, top_k=2, fix="tp=8,pp=1,cp=1")
    e2 = ap.enumerate_plans(job, top_k=2, fix={"tp": 8, "pp": 1, "cp": 1})
    assert e1.plans and [p.plan for p in e1.plans] == [p.plan for p in e2.plans]


def test_error_types_are_user_errors() -> None:
    assert issubclass(ap.PlanError, ap.UserError) and issubclass(ap.InputError, ap.UserError)
    assert issubclass(PlanError, ValueError)  # still a ValueError for older callers


#: the API as an untyped caller sees it (these calls are wrong on purpose)
AP: Any = ap
API: Any = api

CALLS: list[tuple[str, Callable[[Job], Any], str]] = [
    ("make_job model int", lambda j: AP.make_job(5, "dgx-h100"), "model"),
    ("make_job model None", lambda j: AP.make_job(None, "dgx-h100"), "model"),
    ("make_job cluster list", lambda j: AP.make_job("llama3-8b", ["dgx-h100"]), "cluster"),
    ("make_job gpus str", lambda j: AP.make_job("llama3-8b", "dgx-h100", gpus="8"), "--gpus"),
    ("make_job gpus bool", lambda j: AP.make_job("llama3-8b", "dgx-h100", gpus=True), "--gpus"),
    ("make_job gpus float", lambda j: AP.make_job("llama3-8b", "dgx-h100", gpus=8.0), "--gpus"),
    ("make_job nodes 0", lambda j: AP.make_job("llama3-8b", "dgx-h100", nodes=0), "--nodes"),
    ("make_job seq str", lambda j: AP.make_job("llama3-8b", "dgx-h100", seq_len="4096"),
     "--seq-len"),
    ("make_job seq nan", lambda j: AP.make_job("llama3-8b", "dgx-h100", seq_len=math.nan),
     "--seq-len"),
    ("make_job batch 1e15", lambda j: AP.make_job("llama3-8b", "dgx-h100",
                                                   global_batch=10**15), "--global-batch"),
    ("make_job batch neg", lambda j: AP.make_job("llama3-8b", "dgx-h100", global_batch=-1),
     "--global-batch"),
    ("make_job recipe int", lambda j: AP.make_job("llama3-8b", "dgx-h100", recipe=3),
     "--recipe"),
    ("make_job recipe unknown", lambda j: AP.make_job("llama3-8b", "dgx-h100", recipe="bf17"),
     "--recipe"),
    ("make_job huge step", lambda j: AP.make_job("llama3-405b", "dgx-h100", gpus=8,
                                                  seq_len=2**20, global_batch=2**16),
     "optimizer step"),
    ("fp8 on A100", lambda j: AP.make_job("llama3-8b", "dgx-a100", recipe="megatron-fp8"),
     "A100"),
    ("load_model int", lambda j: AP.load_model(42), "model"),
    ("load_model bytes", lambda j: AP.load_model(b"llama3-8b"), "model"),
    ("load_cluster dict", lambda j: AP.load_cluster({"name": "x"}), "cluster"),
    ("evaluate job str", lambda j: AP.evaluate("llama3-8b", "tp=8"), "job"),
    ("evaluate plan int", lambda j: AP.evaluate(j, 8), "plan"),
    ("evaluate plan list", lambda j: AP.evaluate(j, ["tp=8"]), "plan"),
    ("evaluate tp=0", lambda j: AP.evaluate(j, "tp=0"), "tp"),
    ("evaluate mbs=0", lambda j: AP.evaluate(j, "tp=8,mbs=0"), "mbs"),
    ("evaluate vpp=0", lambda j: AP.evaluate(j, "vpp=0"), "vpp"),
    ("evaluate cp=-2", lambda j: AP.evaluate(j, "cp=-2"), "cp"),
    ("evaluate duplicate", lambda j: AP.evaluate(j, "tp=8,tp=4"), "twice"),
    ("evaluate dict tp None-key", lambda j: AP.evaluate(j, {None: 8}), "field"),
    ("evaluate dict tp str", lambda j: AP.evaluate(j, {"tp": "8x"}), "tp"),
    ("evaluate dict tp commas", lambda j: AP.evaluate(j, {"tp": "8,pp=2"}), "tp"),
    ("evaluate dict tp bool", lambda j: AP.evaluate(j, {"tp": True}), "tp"),
    ("evaluate dict stage_layers", lambda j: AP.evaluate(j, {"stage_layers": 8}),
     "stage_layers"),
    ("Plan tp=0", lambda j: AP.Plan(tp=0), "tp"),
    ("Plan unknown field", lambda j: AP.Plan(tq=2), "tq"),
    ("Plan recompute", lambda j: AP.Plan(recompute="some"), "recompute"),
    ("evaluate broken rule", lambda j: AP.evaluate(j, "tp=3"), "heads % tp"),
    ("solve job None", lambda j: AP.solve(None), "job"),
    ("solve time_limit -1", lambda j: AP.solve(j, time_limit=-1), "--time-limit"),
    ("solve time_limit 0", lambda j: AP.solve(j, time_limit=0), "--time-limit"),
    ("solve time_limit nan", lambda j: AP.solve(j, time_limit=math.nan), "--time-limit"),
    ("solve time_limit inf", lambda j: AP.solve(j, time_limit=math.inf), "--time-limit"),
    ("solve time_limit 1e300", lambda j: AP.solve(j, time_limit=1e300), "--time-limit"),
    ("solve time_limit str", lambda j: AP.solve(j, time_limit="10"), "--time-limit"),
    ("solve time_limit bool", lambda j: AP.solve(j, time_limit=True), "--time-limit"),
    ("solve top_k 0", lambda j: AP.solve(j, top_k=0), "--top-k"),
    ("solve top_k float", lambda j: AP.solve(j, top_k=2.5), "--top-k"),
    ("solve top_k huge", lambda j: AP.solve(j, top_k=10**9), "--top-k"),
    ("solve workers 0", lambda j: AP.solve(j, workers=0), "--workers"),
    ("solve objective", lambda j: AP.solve(j, objective="speed"), "--objective"),
    ("solve objective list", lambda j: AP.solve(j, objective=[]), "--objective"),
    ("solve fix int", lambda j: AP.solve(j, fix=8), "--fix"),
    ("solve fix tp=0", lambda j: AP.solve(j, fix="tp=0"), "tp"),
    ("solve fix pp=0", lambda j: AP.solve(j, fix={"pp": 0}), "pp"),
    ("solve fix dup", lambda j: AP.solve(j, fix="tp=8,tp=4"), "twice"),
    ("solve fix unknown", lambda j: AP.solve(j, fix="tq=8"), "tq"),
    ("solve progress", lambda j: AP.solve(j, progress=5), "progress"),
    ("solve seed str", lambda j: AP.solve(j, seed="x"), "seed"),
    ("enumerate job", lambda j: AP.enumerate_plans(3), "job"),
    ("enumerate top_k", lambda j: AP.enumerate_plans(j, top_k=-3), "--top-k"),
    ("enumerate fix vpp=0", lambda j: AP.enumerate_plans(j, fix="vpp=0"), "vpp"),
    ("bandwidth nan", lambda j: API.with_inter_node_bandwidth(j.cluster, math.nan),
     "--inter-node-gbps"),
    ("bandwidth huge", lambda j: API.with_inter_node_bandwidth(j.cluster, 1e30),
     "bandwidth_gbps"),
    ("select_gpus str", lambda j: API.select_gpus(j.cluster, gpus="8"), "--gpus"),
    ("select_gpus too many", lambda j: API.select_gpus(j.cluster, gpus=10**18), "--gpus"),
]


@pytest.mark.parametrize("name,call,text", CALLS, ids=[c[0] for c in CALLS])
def test_wrong_calls_raise_user_errors(job: Job, name: str, call: Callable[[Job], Any],
                                       text: str) -> None:
    with pytest.raises(UserError) as ei:
        call(job)
    msg = str(ei.value)
    assert text in msg and "\n" not in msg, msg


def test_fp8_needs_fp8_gpus_on_every_group() -> None:
    with pytest.raises(InputError) as ei:
        ap.make_job("llama3-8b", "mixed-h100-a100", recipe="megatron-fp8")
    assert "megatron-fp8" in str(ei.value) and "fp8_tflops" in str(ei.value)
    j = ap.make_job("llama3-8b", "dgx-h100", gpus=8, recipe="megatron-fp8")
    assert j.recipe.compute_dtype == "fp8"


def test_repro_bounds_name_the_bound(tmp_path: Path) -> None:
    with pytest.raises(InputError) as ei:
        ap.make_job("llama3-8b", "dgx-h100", gpus=64, global_batch=1_000_000_000_000_000)
    assert "--global-batch" in str(ei.value) and "16777216" in str(ei.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: c\nnode_groups:\n- name: g\n  gpus_per_node: 8\n  num_nodes: 1.0e+18\n"
                   "  gpu: {name: X, memory_gib: 80, bf16_tflops: 1000, hbm_gbps: 3000}\n"
                   "  intra_node: {bandwidth_gbps: 450}\n  inter_node: {bandwidth_gbps: 50}\n")
    with pytest.raises(InputError) as ei:
        ap.load_cluster(cfg)
    assert "num_nodes" in str(ei.value)


def test_a_bounded_corner_job_still_solves() -> None:
    """A job near the step-time bound (long sequences, a large batch) plans without integer
    overflow in the solver."""
    j = ap.make_job("llama3-8b", "dgx-h100", gpus=64, seq_len=2**17, global_batch=2**14)
    assert j.step_time_scale_s() < 1e6
    r = ap.solve(j, top_k=1, time_limit=20, fix="tp=8,pp=1")
    assert r.plans


def test_activation_scale_bound() -> None:
    """A job within every other bound (a wide model, the fastest cluster allowed, the largest
    step) is refused when a step's activations pass 2^70 bytes (the solver's KiB integers)."""
    from autoparallel_cp.spec import ClusterSpec, ModelSpec

    model = ModelSpec(name="wide", num_layers=4096, hidden_size=2**17, ffn_hidden_size=1,
                      num_attention_heads=128, vocab_size=2)
    link = {"bandwidth_gbps": 1e5, "latency_us": 0.0}
    cluster = ClusterSpec.model_validate({"name": "fast", "node_groups": [{
        "name": "g", "gpus_per_node": 8, "num_nodes": 2**19, "intra_node": link,
        "inter_node": link, "gpu": {"name": "W", "memory_gib": 2.0**16, "bf16_tflops": 1e6,
                                    "hbm_gbps": 1e8}}]})
    with pytest.raises(InputError) as ei:
        ap.make_job(model, cluster, seq_len=4096, global_batch=2**24)
    assert "2^70" in str(ei.value)
    assert ap.make_job(model, cluster, seq_len=4096, global_batch=2**12).num_gpus == 2**22
