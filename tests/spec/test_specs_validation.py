"""Bad spec files fail with an InputError naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.presets import preset_path


def _preset(kind: str, name: str) -> dict[str, Any]:
    p = preset_path(kind, name)
    assert p is not None
    data = yaml.safe_load(p.read_text())
    assert isinstance(data, dict)
    return data


def _write(tmp_path: Path, data: Any, name: str = "x.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


MODEL_CASES = [
    ({"num_attention_heads": 30}, "num_attention_heads", "must divide hidden_size"),
    ({"num_kv_heads": 5}, "num_kv_heads", "must divide num_attention_heads"),
    ({"hidden_size": 0}, "hidden_size", "greater than 0"),
    ({"num_layers": -4}, "num_layers", "greater than 0"),
    ({"vocab_size": 0}, "vocab_size", "greater than 0"),
    ({"num_kv_head": 8}, "num_kv_head", "did you mean 'num_kv_heads'"),
    ({"mlp": "relu"}, "mlp", "swiglu"),
    ({"moe": {"num_experts": 8, "top_k": 9, "expert_ffn_hidden_size": 14336}},
     "moe.top_k", "must not exceed num_experts"),
    ({"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 0}},
     "moe.expert_ffn_hidden_size", "greater than 0"),
    ({"moe": {"num_experts": 8, "top_k": 2, "expert_ffn": 1}}, "moe.expert_ffn", "did you mean"),
    ({"moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 8,
              "first_k_dense_layers": 40}}, "moe.first_k_dense_layers", "exceeds num_layers"),
]


@pytest.mark.parametrize("change,field,text", MODEL_CASES, ids=[c[1] for c in MODEL_CASES])
def test_bad_model_file(tmp_path: Path, change: dict[str, Any], field: str, text: str) -> None:
    p = _write(tmp_path, {**_preset("models", "llama3-8b"), **change})
    with pytest.raises(InputError) as ei:
        load_model(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: field '{field}': "), msg
    assert text in msg and "\n" not in msg
    assert ei.value.field == field and ei.value.source == str(p)


def test_bad_cluster_file(tmp_path: Path) -> None:
    data = _preset("clusters", "dgx-h100")
    data["node_groups"][0]["gpu"]["memory_gb"] = 80
    p = _write(tmp_path, data, "c.yaml")
    with pytest.raises(InputError, match=r"c.yaml: field 'node_groups.0.gpu.memory_gb': unknown"):
        load_cluster(p)
    data = _preset("clusters", "dgx-h100")
    data["node_groups"][0]["inter_node"]["bandwidth_gbps"] = -1
    with pytest.raises(InputError, match=r"'node_groups.0.inter_node.bandwidth_gbps'"):
        load_cluster(_write(tmp_path, data, "c2.yaml"))
    data = _preset("clusters", "mixed-h100-a100")
    data["node_groups"][1]["name"] = data["node_groups"][0]["name"]
    with pytest.raises(InputError, match=r"field 'node_groups': .*unique"):
        load_cluster(_write(tmp_path, data, "c3.yaml"))


def test_syntax_errors_and_shapes(tmp_path: Path) -> None:
    p = _write(tmp_path, "name: x\nnum_layers: [1, 2\n", "broken.yaml")
    with pytest.raises(InputError, match=r"broken.yaml: YAML syntax error at line"):
        load_model(p)
    p = _write(tmp_path, "{\"name\": \"x\",}", "broken.json")
    with pytest.raises(InputError, match=r"broken.json: JSON syntax error"):
        load_model(p)
    p = _write(tmp_path, "- 1\n- 2\n", "list.yaml")
    with pytest.raises(InputError, match=r"list.yaml: expected a mapping"):
        load_cluster(p)
    with pytest.raises(InputError, match="is a directory without a config.json"):
        load_model(tmp_path)


def test_name_defaults_to_file_stem(tmp_path: Path) -> None:
    data = _preset("models", "llama3-8b")
    del data["name"]
    assert load_model(_write(tmp_path, data, "my-model.yaml")).name == "my-model"
