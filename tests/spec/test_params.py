"""Parameter counts against published totals (HF model cards / safetensors metadata, papers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.spec.loaders import load_model
from autoparallel_cp.spec.params import count_params, layer_params, stage_params

# Published exact totals: HF safetensors parameter counts of the official checkpoints, the
# Llama 3 paper (405B), BLOOM model card; DeepSeek-V3 671B main model excluding MTP.
PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_620_634_112,
    "qwen2.5-72b": 72_706_203_648,
    "deepseek-v3": 671_026_419_200,
    "bloom-176b": 176_247_271_424,
}

# Rounded totals (billions) stated by papers.
ROUNDED = {
    "gpt3-175b": (175.0, 0.5),  # "175.0B" in GPT-3 Table 2.1 (Brown et al. 2020); see below
    "gpt3-13b": (13.0, 0.2),
    "gpt3-6.7b": (6.7, 0.1),
    "gpt3-2.7b": (2.7, 0.1),
    "gpt3-1.3b": (1.3, 0.05),
    "nemotron-4-340b": (340.0, 1.5),
    "sc21-gpt-1.7b": (1.7, 0.05),  # Narayanan et al. Table 1
    "sc21-gpt-145b": (145.6, 0.05),
    "sc21-gpt-530b": (529.6, 0.05),
    "sc21-gpt-1t": (1008.0, 0.05),
}


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED.items()))
def test_published_totals(name: str, expected: int) -> None:
    assert count_params(load_model(name)).total == expected


@pytest.mark.parametrize("name,approx", sorted(ROUNDED.items()))
def test_rounded_totals(name: str, approx: tuple[float, float]) -> None:
    b, tol = approx
    assert abs(count_params(load_model(name)).total / 1e9 - b) <= tol


def test_gpt3_175b_by_hand() -> None:
    """GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, GPT-2 vocabulary of
    50257, context 2048; GPT-2 architecture: learned positions, biases, pre-LN, tied head).

    Per layer: attention QKV + output 4·h² weights + 4h biases, MLP (4h) 8·h² + 5h biases, two
    LayerNorms 4h; then token embedding V·h, positions 2048·h and the final LayerNorm 2h. The
    table's "175.0B" is this 174.6B rounded to the family's name."""
    h, L, V = 12288, 96, 50257
    per_layer = 12 * h * h + 13 * h
    expect = L * per_layer + V * h + 2048 * h + 2 * h
    assert expect == 174_604_259_328
    assert count_params(load_model("gpt3-175b")).total == expect


def test_moe_active_and_mtp() -> None:
    ds = count_params(load_model("deepseek-v3"))
    assert ds.num_moe_layers == 58 and ds.num_dense_layers == 3
    assert 37.0e9 <= ds.active_per_token <= 37.6e9  # "37B activated" (DeepSeek-V3 report)
    # the HF checkpoint (685B) stores the MTP module with embedding and head copies
    assert round((ds.total + ds.mtp_as_stored) / 1e9) in (684, 685)
    assert ds.total_with_mtp == ds.total + ds.mtp and ds.mtp < ds.mtp_as_stored
    mx = count_params(load_model("mixtral-8x7b"))
    assert round(mx.active_per_token / 1e8) == 129  # 12.9B active (Mixtral paper)
    assert mx.dense_total + mx.expert_total == mx.total
    dense = count_params(load_model("llama3-8b"))
    assert dense.expert_total == 0 and dense.active_per_token == dense.total
    assert dense.mtp == 0 and dense.total_with_mtp == dense.total


def test_parts_add_up() -> None:
    for name in ("llama2-7b", "gpt3-175b", "deepseek-v3", "bloom-176b"):
        m = load_model(name)
        pc = count_params(m)
        layers = sum(sum(layer_params(m, i)) for i in range(m.num_layers))
        assert layers == pc.layers_total
        assert pc.expert_total == sum(layer_params(m, i)[1] for i in range(m.num_layers))


def test_tied_embeddings_have_no_head() -> None:
    pc = count_params(load_model("gpt3-175b"))
    assert pc.lm_head == 0 and pc.position_embedding == 2048 * 12288


def test_stage_params_tied_copy_and_layout() -> None:
    m = load_model("gpt3-175b")
    pc = count_params(m)
    one = stage_params(m, [96])
    assert len(one) == 1 and one[0].total == pc.total and one[0].embedding_copy == 0
    st4 = stage_params(m, [24, 24, 24, 24])
    assert st4[-1].embedding_copy == pc.embedding  # Megatron's tied copy on the last stage
    assert sum(s.unique for s in st4) == pc.total
    assert st4[1].total == st4[2].total == 24 * sum(layer_params(m, 0))
    ds = load_model("deepseek-v3")
    dpc = count_params(ds)
    stages = stage_params(ds, [16, 15, 15, 15])
    assert stages[0].expert == 13 * dpc.routed_experts_per_moe_layer  # 3 dense layers first
    assert stages[-1].mtp == dpc.mtp and stages[-1].embedding_copy == dpc.embedding
    assert sum(s.unique for s in stages) == dpc.total_with_mtp
    no_mtp = stage_params(ds, [16, 15, 15, 15], include_mtp=False)
    assert sum(s.unique for s in no_mtp) == dpc.total
    with pytest.raises(ValueError):
        stage_params(ds, [10, 10])


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_stage_params_sum_to_total(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["llama2-7b", "gpt3-1.3b", "deepseek-v3", "mixtral-8x7b"]))
    m = load_model(name)
    cuts = sorted(data.draw(st.lists(st.integers(0, m.num_layers), max_size=7)))
    bounds = [0, *cuts, m.num_layers]
    layers = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    pc = count_params(m)
    stages = stage_params(m, layers)
    assert sum(s.unique for s in stages) == pc.total_with_mtp
    mtp_experts = m.mtp_layers * pc.routed_experts_per_moe_layer
    assert sum(s.expert for s in stages) == pc.expert_total + mtp_experts
    assert [s.num_layers for s in stages] == layers
