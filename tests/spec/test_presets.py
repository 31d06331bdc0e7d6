"""Every preset loads and validates; the catalogs list them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.loaders import cluster_catalog, load_cluster, load_model, model_catalog
from autoparallel_cp.spec.presets import preset_names

REQUIRED_MODELS = {
    "gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b", "llama2-7b", "llama2-13b", "llama2-70b",
    "llama3-8b", "llama3-70b", "llama3-405b", "mistral-7b", "mixtral-8x7b", "mixtral-8x22b",
    "qwen2.5-72b", "deepseek-v3", "bloom-176b", "nemotron-4-340b",
}
REQUIRED_CLUSTERS = {
    "dgx-a100", "dgx-a100-40g", "dgx-h100", "dgx-h800", "dgx-h200", "dgx-b200", "mixed-h100-a100",
}


def test_required_presets_exist() -> None:
    assert set(preset_names("models")) >= REQUIRED_MODELS
    assert set(preset_names("clusters")) >= REQUIRED_CLUSTERS


@pytest.mark.parametrize("name", preset_names("models"))
def test_model_preset_loads(name: str) -> None:
    m = load_model(name)
    assert m.name == name
    assert m.source, "every preset cites its source"


@pytest.mark.parametrize("name", preset_names("clusters"))
def test_cluster_preset_loads(name: str) -> None:
    c = load_cluster(name)
    assert c.name == name and c.source
    for g in c.node_groups:
        assert g.gpu.source and g.intra_node.source and g.inter_node.source
        assert g.intra_node.bandwidth_gbps > g.inter_node.bandwidth_gbps
    assert c.num_gpus >= 1024


def test_cluster_facts() -> None:
    h100 = load_cluster("dgx-h100").node_groups[0]
    assert (h100.gpu.bf16_tflops, h100.gpu.fp8_tflops, h100.gpu.hbm_gbps) == (989, 1979, 3350)
    assert (h100.intra_node.bandwidth_gbps, h100.inter_node.bandwidth_gbps) == (450, 50)
    a100 = load_cluster("dgx-a100").node_groups[0]
    assert (a100.gpu.bf16_tflops, a100.gpu.fp8_tflops, a100.inter_node.bandwidth_gbps) == (
        312, None, 25)
    assert load_cluster("dgx-h800").node_groups[0].intra_node.bandwidth_gbps == 200
    b200 = load_cluster("dgx-b200").node_groups[0]
    assert (b200.gpu.bf16_tflops, b200.intra_node.bandwidth_gbps) == (2250, 900)
    mixed = load_cluster("mixed-h100-a100")
    assert mixed.heterogeneous and [g.inter_node.bandwidth_gbps for g in mixed.node_groups] == [
        50, 25]
    assert load_cluster("dgx-h100").take_gpus(64).num_gpus == 64


def test_model_facts() -> None:
    ds = load_model("deepseek-v3")
    assert ds.moe is not None and ds.mla is not None
    assert (ds.moe.num_experts, ds.moe.top_k, ds.moe.num_shared_experts) == (256, 8, 1)
    assert (ds.moe.first_k_dense_layers, ds.vocab_size, ds.mtp_layers) == (3, 129280, 1)
    bloom = load_model("bloom-176b")
    assert bloom.position_embedding == "alibi" and bloom.embedding_norm and bloom.tie_embeddings
    nemo = load_model("nemotron-4-340b")
    assert (nemo.mlp, nemo.kv_heads, nemo.vocab_size, nemo.tie_embeddings) == (
        "gelu", 8, 256000, False)
    assert load_model("qwen2.5-72b").qkv_bias


def test_catalogs_list_every_preset() -> None:
    rows = model_catalog()
    assert [r["name"] for r in rows] == preset_names("models")
    ds = next(r for r in rows if r["name"] == "deepseek-v3")
    assert ds["params_b"] == 671.03 and ds["experts"] == 256 and ds["top_k"] == 8
    l8 = next(r for r in rows if r["name"] == "llama3-8b")
    assert (l8["layers"], l8["hidden"], l8["heads"], l8["kv_heads"], l8["vocab"]) == (
        32, 4096, 32, 8, 128256)
    crow = cluster_catalog()
    assert [r["name"] for r in crow] == preset_names("clusters")
    h = next(r for r in crow if r["name"] == "dgx-h100")
    assert (h["gpu"], h["memory_gib"], h["bf16_tflops"], h["inter_node_gbps"]) == (
        "H100-SXM5-80GB", 79.11, 989.0, 50.0)
    mixed = next(r for r in crow if r["name"] == "mixed-h100-a100")
    assert mixed["groups"] == 2 and mixed["gpus"] == 1024


def test_unknown_preset_lists_available() -> None:
    with pytest.raises(InputError) as ei:
        load_model("llama3-8c")
    assert "did you mean 'llama3-8b'" in str(ei.value) and "mixtral-8x7b" in str(ei.value)
    with pytest.raises(InputError) as ei:
        load_cluster("dgx-h1000")
    assert "dgx-h100" in str(ei.value)
    with pytest.raises(InputError, match="no such file"):
        load_cluster("nowhere/cluster.yaml")


def test_presets_found_from_outside_the_checkout(tmp_path: Path) -> None:
    """The installed package finds its presets from any working directory (a regular install
    ships them as package data; a name clash once hid them behind `presets.py`)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c",
         "from autoparallel_cp.spec.presets import preset_names as p; "
         "print(len(p('models')), len(p('clusters')))"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    n_models, n_clusters = (int(x) for x in out.stdout.split())
    assert n_models == len(preset_names("models")) > 0
    assert n_clusters == len(preset_names("clusters")) > 0
