"""Fuzzing of the input layer (issue 11): hypothesis over model / cluster / recipe spec dicts,
Hugging Face configs, plan and --fix strings and job arguments. Only `UserError`s
(`InputError`, `PlanError`) may escape, and whatever is accepted lies within the bounds."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoparallel_cp import api
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import ClusterSpec, Job, ModelSpec, TrainingRecipe
from autoparallel_cp.spec.base import MAX_GPUS, MAX_PARAMS, MAX_STEP_ESTIMATE_S
from autoparallel_cp.spec.hf_import import model_from_hf_config
from autoparallel_cp.spec.plan import PLAN_FIELDS, Plan, parse_assignments, parse_plan
from autoparallel_cp.spec.presets import preset_path
from autoparallel_cp.spec.validation import validate_cluster, validate_model, validate_spec

#: test_fuzz_reached_the_accepting_paths reads what the fuzzers before it collected: the module
#: runs in one process, in order (the `serial` mark in pyproject.toml)
pytestmark = pytest.mark.serial

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


def _preset(kind: str, name: str) -> dict[str, Any]:
    p = preset_path(kind, name)
    assert p is not None
    data = yaml.safe_load(p.read_text())
    assert isinstance(data, dict)
    return data


#: values a careless or hostile file may hold in any field
HOSTILE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**18, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e-30, 1e300, 0.5]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _mutate(base: dict[str, Any], keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys), HOSTILE, min_size=1, max_size=3).map(
        lambda ch: {**base, **ch})


MODEL_BASES = [_preset("models", n) for n in ("llama3-8b", "mixtral-8x7b", "deepseek-v3")]


def _check_model(m: ModelSpec) -> None:
    assert m.num_layers >= 1 and m.hidden_size >= 1
    total, _ = m.param_scale()
    assert math.isfinite(total) and total <= MAX_PARAMS


@FUZZ
@given(st.sampled_from(MODEL_BASES).flatmap(lambda b: _mutate(b, [*b.keys(), "head_dim",
                                                                "num_kv_heads", "qk_norm"])))
def test_model_dicts(data: dict[str, Any]) -> None:
    try:
        m = validate_model(data, "fuzz.yaml")
    except UserError as exc:
        assert str(exc).startswith("fuzz.yaml: ") and "\n" not in str(exc)
        return
    _check_model(m)


@FUZZ
@given(st.sampled_from([b for b in MODEL_BASES if "moe" in b]).flatmap(
    lambda b: _mutate(b["moe"], [*b["moe"].keys(), "moe_layer_freq"]).map(
        lambda moe: {**b, "moe": moe})))
def test_moe_dicts(data: dict[str, Any]) -> None:
    try:
        m = validate_model(data, "fuzz.yaml")
    except UserError:
        return
    _check_model(m)
    assert m.moe is not None and m.moe.top_k <= m.moe.num_experts


CLUSTER = _preset("clusters", "dgx-h100")
GROUP = CLUSTER["node_groups"][0]


@FUZZ
@given(st.one_of(
    _mutate(GROUP, list(GROUP)).map(lambda g: {**CLUSTER, "node_groups": [g]}),
    _mutate(GROUP["gpu"], [*GROUP["gpu"], "fp8_tflops", "fp32_tflops"]).map(
        lambda gpu: {**CLUSTER, "node_groups": [{**GROUP, "gpu": gpu}]}),
    _mutate(GROUP["inter_node"], ["bandwidth_gbps", "latency_us"]).map(
        lambda lk: {**CLUSTER, "node_groups": [{**GROUP, "inter_node": lk}]}),
    _mutate(CLUSTER, list(CLUSTER)),
))
def test_cluster_dicts(data: dict[str, Any]) -> None:
    try:
        c = validate_cluster(data, "fuzz.yaml")
    except UserError:
        return
    assert 1 <= c.num_gpus <= MAX_GPUS
    for g in c.node_groups:
        for x in (g.gpu.memory_gib, g.gpu.bf16_tflops, g.gpu.hbm_gbps,
                  g.inter_node.bandwidth_gbps, g.inter_node.latency_us):
            assert math.isfinite(x)


RECIPE = api.resolve_recipe("megatron-bf16").model_dump()


@FUZZ
@given(st.one_of(_mutate(RECIPE, list(RECIPE)),
                 _mutate(RECIPE["behaviour"], list(RECIPE["behaviour"])).map(
                     lambda b: {**RECIPE, "behaviour": b})))
def test_recipe_dicts(data: dict[str, Any]) -> None:
    try:
        r = validate_spec(TrainingRecipe, data, "fuzz.yaml")
    except UserError:
        return
    assert 1 <= r.state_bytes_per_param <= 4 * 64


HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 14336,
            "vocab_size": 128256, "num_key_value_heads": 8, "hidden_act": "silu",
            "tie_word_embeddings": False, "model_type": "llama", "head_dim": 128}
HF_DEEPSEEK = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
               "num_attention_heads": 128, "num_hidden_layers": 61,
               "intermediate_size": 18432, "vocab_size": 129280, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
               "moe_intermediate_size": 2048, "n_shared_experts": 1,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "topk_method": "noaux_tc",
               "num_nextn_predict_layers": 1}


HF_NEWER = [json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "data"
                        / "hf_configs" / f"{n}.json").read_text())
            for n in ("gpt-oss-20b", "Qwen3-30B-A3B", "Qwen1.5-MoE-A2.7B", "gemma-3-1b-pt")]


@FUZZ
@given(st.sampled_from([HF_LLAMA, HF_DEEPSEEK, *HF_NEWER]).flatmap(
    lambda b: _mutate(b, [*b, "attention_bias", "mlp_bias", "_name_or_path",
                          "mlp_only_layers", "decoder_sparse_step", "use_sliding_window"])))
def test_hf_configs(cfg: dict[str, Any]) -> None:
    try:
        _check_model(model_from_hf_config(cfg, "config.json"))
    except UserError as exc:
        assert "config.json" in str(exc)


PLAN_TEXT = st.lists(
    st.tuples(st.sampled_from([*PLAN_FIELDS, "tq", "", " tp "]),
              st.one_of(st.integers(-5, 2**70).map(str),
                        st.sampled_from(["", "0", "-0", "1e3", "nan", "inf", "full", "8:8",
                                         "1:0:31", "4/4", "true", "0x10", "٣", " 8 "]),
                        st.text(string.printable, max_size=6))),
    max_size=6,
).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv))


@FUZZ
@given(PLAN_TEXT | st.text(max_size=30))
def test_plan_text(text: str) -> None:
    try:
        fields = parse_assignments(text)
    except UserError:
        return
    Plan(**fields)  # every parsed value is a legal Plan field
    for k in ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs", "num_microbatches"):
        assert fields.get(k, 1) >= 1


@pytest.fixture(scope="module")
def job() -> Job:
    return api.make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)


@FUZZ
@given(text=PLAN_TEXT)
@example(text="tp=8,pp=2,mbs=1,recompute=selective")
def test_plans_against_a_job(job: Job, text: str) -> None:
    try:
        plan = parse_plan(text, job)
        ev = api.evaluate(job, plan)
    except UserError:
        return
    assert ev.to_json()["plan"]["tp"] == plan.tp
    EVALUATED.append(text)


@FUZZ
@given(st.dictionaries(st.sampled_from([*PLAN_FIELDS, "bogus"]), HOSTILE, max_size=4))
def test_fix_mappings(fix: dict[str, Any]) -> None:
    try:
        pins = api.parse_fix(fix)
    except UserError:
        return
    assert set(pins) <= set(PLAN_FIELDS)
    Plan(**pins)


EVALUATED: list[str] = []
JOBS: list[Job] = []


@FUZZ
@given(seq_len=HOSTILE, global_batch=HOSTILE, gpus=st.one_of(st.none(), HOSTILE),
       recipe=st.sampled_from(["megatron-bf16", "megatron-fp8", "nope", 3]))
@example(seq_len=4096, global_batch=64, gpus=16, recipe="megatron-fp8")
def test_job_arguments(seq_len: Any, global_batch: Any, gpus: Any, recipe: Any) -> None:
    model = _MODEL
    cluster = _CLUSTERS[0]
    try:
        j = api.make_job(model, cluster, gpus=gpus, seq_len=seq_len, global_batch=global_batch,
                         recipe=recipe)
    except UserError:
        return
    assert j.step_time_scale_s() <= MAX_STEP_ESTIMATE_S
    JOBS.append(j)


def test_fuzz_reached_the_accepting_paths() -> None:
    """The fuzzers above also exercised inputs that pass (not only refusals)."""
    assert EVALUATED and JOBS


_MODEL = api.load_model("llama3-8b")
_CLUSTERS: list[ClusterSpec] = [api.load_cluster("dgx-h100")]
