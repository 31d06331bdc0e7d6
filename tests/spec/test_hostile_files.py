"""Hostile and careless spec files (issue 11, items 4-7, 10): each is refused with an InputError
(a UserError: exit 2) that names the file, in bounded time and memory; nothing else escapes."""

from __future__ import annotations

import json
import os
import random
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoparallel_cp.errors import InputError, UserError
from autoparallel_cp.spec.loaders import (
    MAX_FILE_BYTES,
    load_cluster,
    load_model,
    load_recipe,
)
from autoparallel_cp.spec.presets import preset_path


def _preset(kind: str, name: str) -> dict[str, Any]:
    p = preset_path(kind, name)
    assert p is not None
    data = yaml.safe_load(p.read_text())
    assert isinstance(data, dict)
    return data


def _billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def _many_aliases(n: int = 5000) -> str:
    return "x: &x 1\nl: [" + ",".join(["*x"] * n) + "]\n"


def _deep_yaml_block(n: int = 3000) -> str:
    return "".join("  " * i + "a:\n" for i in range(n)) + "  " * n + "b: 1\n"


#: (name, file suffix, content); content is text, bytes, or a callable making the path itself.
CORPUS: list[tuple[str, str, Any]] = [
    ("random-bytes", ".yaml", random.Random(11).randbytes(4096)),
    ("random-bytes-json", ".json", random.Random(12).randbytes(4096)),
    ("latin1", ".yaml", "name: caf\xe9\n".encode("latin-1")),
    ("nul-bytes", ".yaml", b"\x00" * 64),
    ("empty", ".yaml", ""),
    ("blank", ".json", "  \n\n"),
    ("deep-json", ".json", "[" * 100_000 + "]" * 100_000),
    ("deep-json-obj", ".json", '{"a":' * 50_000 + "1" + "}" * 50_000),
    ("deep-yaml-flow", ".yaml", "[" * 50_000 + "]" * 50_000),
    ("deep-yaml-block", ".yaml", _deep_yaml_block()),
    ("alias-bomb", ".yaml", _billion_laughs()),
    ("many-aliases", ".yaml", _many_aliases()),
    ("too-big", ".yaml", "# " + "x" * (MAX_FILE_BYTES + 10) + "\n"),
    ("top-level-list", ".yaml", "- 1\n- 2\n"),
    ("top-level-scalar", ".json", "42"),
    ("top-level-string", ".yaml", "hello\n"),
    ("int-keys", ".yaml", "1: 2\n3: 4\n"),
    ("python-tag", ".yaml", "!!python/object/apply:os.system ['true']\n"),
    ("unclosed", ".json", '{"name": "x", '),
    ("json-nan", ".json", '{"name": NaN}'),
    ("timestamp", ".yaml", "name: 2001-01-01\n"),
    ("bad-timestamp", ".yaml", "name: 2001-13-45 25:61:61\n"),
]


def _make(tmp_path: Path, name: str, suffix: str, content: Any) -> Path:
    p = tmp_path / f"{name}{suffix}"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


LOADERS: list[tuple[str, Callable[[Any], Any]]] = [
    ("model", load_model), ("cluster", load_cluster), ("recipe", load_recipe),
]


def _refused(load: Callable[[Any], Any], arg: Any, name_in_msg: str | None) -> InputError:
    t0 = time.perf_counter()
    with pytest.raises(InputError) as ei:
        load(arg)
    assert time.perf_counter() - t0 < 10.0
    msg = str(ei.value)
    assert "\n" not in msg and "Traceback" not in msg
    if name_in_msg is not None:
        assert name_in_msg in msg, msg
    return ei.value


@pytest.mark.parametrize("name,suffix,content", CORPUS, ids=[c[0] for c in CORPUS])
@pytest.mark.parametrize("kind,load", LOADERS, ids=[k for k, _ in LOADERS])
def test_hostile_file_is_an_input_error_naming_the_file(
        tmp_path: Path, kind: str, load: Callable[[Any], Any], name: str, suffix: str,
        content: Any) -> None:
    p = _make(tmp_path, name, suffix, content)
    _refused(load, p if kind != "recipe" else str(p), str(p))


def test_alias_bomb_stays_small_in_memory(tmp_path: Path) -> None:
    p = _make(tmp_path, "bomb", ".yaml", _billion_laughs(12))  # 9^12 strings when expanded
    tracemalloc.start()
    try:
        err = _refused(load_model, p, str(p))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
    assert "values" in str(err) or "aliases" in str(err)


def test_aliases_in_moderation_still_load(tmp_path: Path) -> None:
    """A cluster file that reuses its GPU and link blocks with YAML anchors stays valid."""
    text = """
name: two-groups
node_groups:
  - name: a
    gpu: &gpu {name: H100, memory_gib: 80, bf16_tflops: 989, hbm_gbps: 3350}
    gpus_per_node: 8
    num_nodes: 2
    intra_node: &nvl {bandwidth_gbps: 450, latency_us: 3}
    inter_node: &ib {bandwidth_gbps: 50, latency_us: 8}
  - name: b
    gpu: *gpu
    gpus_per_node: 8
    num_nodes: 1
    intra_node: *nvl
    inter_node: *ib
"""
    c = load_cluster(_make(tmp_path, "anchors", ".yaml", text))
    assert c.num_gpus == 24


@pytest.mark.parametrize("kind,load", LOADERS, ids=[k for k, _ in LOADERS])
def test_special_paths(tmp_path: Path, kind: str, load: Callable[[Any], Any]) -> None:
    d = tmp_path / "folder.yaml"
    d.mkdir()
    _refused(load, str(d), str(d))
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    _refused(load, str(fifo), str(fifo))  # must not block on open()
    if Path("/dev/zero").exists():
        _refused(load, "/dev/zero", "/dev/zero")  # endless: must not be read
    _refused(load, str(tmp_path / "missing.yaml"), "missing.yaml")
    _refused(load, "nul\x00byte.yaml", None)
    _refused(load, "x" * 5000 + ".yaml", None)
    _refused(load, "y" * 5000, None)


def test_unreadable_file(tmp_path: Path) -> None:
    p = _make(tmp_path, "secret", ".yaml", "name: x\n")
    p.chmod(0)
    try:
        if os.access(p, os.R_OK):
            pytest.skip("running as root: every file is readable")
        _refused(load_model, p, str(p))
    finally:
        p.chmod(0o644)


# ------------------------------------------------------------------ field values


MODEL_VALUES = [
    ("num_layers", True, "boolean"),
    ("num_layers", False, "boolean"),
    ("hidden_size", 1e12, "<= 262144"),
    ("hidden_size", 10**30, "<= 262144"),
    ("hidden_size", 0, "greater than 0"),
    ("hidden_size", -4096, "greater than 0"),
    ("hidden_size", 4096.5, "fractional"),
    ("hidden_size", "4096x", "integer"),
    ("hidden_size", [4096], "integer"),
    ("vocab_size", 2**40, "<= 4194304"),
    ("num_attention_heads", {"a": 1}, "integer"),
    ("max_position_embeddings", 2**62, "<= 1073741824"),
    ("name", 5, "string"),
    ("tie_embeddings", "maybe", "boolean"),
]


@pytest.mark.parametrize("field,value,text", MODEL_VALUES,
                         ids=[f"{f}={v!r:.20}" for f, v, _ in MODEL_VALUES])
def test_model_field_values(tmp_path: Path, field: str, value: Any, text: str) -> None:
    data = {**_preset("models", "llama3-8b"), field: value}
    p = _make(tmp_path, "m", ".json", json.dumps(data))
    err = _refused(load_model, p, str(p))
    assert err.field == field and text in str(err), str(err)


def test_model_too_many_parameters(tmp_path: Path) -> None:
    data = {**_preset("models", "llama3-8b"), "hidden_size": 2**18, "num_attention_heads": 64,
            "num_kv_heads": 8, "ffn_hidden_size": 2**20, "num_layers": 4096}
    p = _make(tmp_path, "huge", ".yaml", yaml.safe_dump(data))
    _refused(load_model, p, "parameters")


def _group(**change: Any) -> dict[str, Any]:
    data = _preset("clusters", "dgx-h100")
    g = dict(data["node_groups"][0])
    for k, v in change.items():
        part, _, sub = k.partition(".")
        if sub:
            g[part] = {**g[part], sub: v}
        else:
            g[part] = v
    return {**data, "node_groups": [g]}


CLUSTER_VALUES: list[tuple[dict[str, Any], str, str]] = [
    ({"gpu.memory_gib": float("inf")}, "node_groups.0.gpu.memory_gib", "finite"),
    ({"gpu.memory_gib": float("nan")}, "node_groups.0.gpu.memory_gib", "finite"),
    ({"gpu.memory_gib": float("-inf")}, "node_groups.0.gpu.memory_gib", "finite"),
    ({"gpu.memory_gib": True}, "node_groups.0.gpu.memory_gib", "boolean"),
    ({"gpu.bf16_tflops": 1e-30}, "node_groups.0.gpu.bf16_tflops", "0.01"),
    ({"gpu.bf16_tflops": 1e30}, "node_groups.0.gpu.bf16_tflops", "<= 1e+06"),
    ({"gpu.hbm_gbps": 0}, "node_groups.0.gpu.hbm_gbps", "0.1"),
    ({"inter_node.latency_us": 1e300}, "node_groups.0.inter_node.latency_us", "<= 1e+06"),
    ({"inter_node.latency_us": -1}, "node_groups.0.inter_node.latency_us", "greater than"),
    ({"intra_node.bandwidth_gbps": 1e-9}, "node_groups.0.intra_node.bandwidth_gbps", "0.01"),
    ({"num_nodes": 10**18}, "node_groups.0.num_nodes", "<= 4194304"),
    ({"num_nodes": 1e18}, "node_groups.0.num_nodes", "<= 4194304"),
    ({"num_nodes": False}, "node_groups.0.num_nodes", "boolean"),
    ({"gpus_per_node": 2**20}, "node_groups.0.gpus_per_node", "<= 4096"),
    ({"price_per_gpu_hour": 1e9}, "node_groups.0.price_per_gpu_hour", "<= 10000"),
    ({"price_per_gpu_hour": 0}, "node_groups.0.price_per_gpu_hour", "greater than 0"),
]


@pytest.mark.parametrize("change,field,text", CLUSTER_VALUES,
                         ids=[f"{next(iter(c))}={next(iter(c.values()))!r:.12}"
                              for c, _, _ in CLUSTER_VALUES])
def test_cluster_field_values(tmp_path: Path, change: dict[str, Any], field: str,
                              text: str) -> None:
    # YAML spells infinity and NaN .inf / .nan; safe_dump writes them so
    p = _make(tmp_path, "c", ".yaml", yaml.safe_dump(_group(**change)))
    err = _refused(load_cluster, p, str(p))
    assert err.field == field and text in str(err), str(err)


def test_cluster_with_too_many_gpus_is_refused_fast(tmp_path: Path) -> None:
    data = _preset("clusters", "dgx-h100")
    g = data["node_groups"][0]
    groups = [{**g, "name": f"g{i}", "num_nodes": 2**19} for i in range(4)]
    p = _make(tmp_path, "big", ".yaml", yaml.safe_dump({**data, "node_groups": groups}))
    err = _refused(load_cluster, p, "GPUs")
    assert err.field == "node_groups"


def test_hf_config_wrong_types(tmp_path: Path) -> None:
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_hidden_layers": 32, "intermediate_size": 14336,
            "vocab_size": 128256, "num_key_value_heads": 8}
    assert load_model(_make(tmp_path, "ok", ".json", json.dumps(base))).num_layers == 32
    for field, value in [("architectures", 5), ("architectures", [5]),
                         ("architectures", {"a": 1}), ("hidden_size", True),
                         ("hidden_act", 7), ("tie_word_embeddings", "false"),
                         ("num_hidden_layers", 1e30), ("_name_or_path", 12)]:
        p = _make(tmp_path, f"hf-{field}", ".json", json.dumps({**base, field: value}))
        if field == "_name_or_path":
            assert load_model(p).num_layers == 32  # a non-string name is ignored
            continue
        err = _refused(load_model, p, str(p))
        assert err.field in (field, "num_layers"), (field, str(err))


def test_recipe_file_base_of_wrong_type(tmp_path: Path) -> None:
    p = _make(tmp_path, "r", ".yaml", "base: [megatron-bf16]\n")
    err = _refused(load_recipe, str(p), str(p))
    assert err.field == "base"
    p = _make(tmp_path, "r2", ".yaml", "base: megatron-bf16\nweight_bytes: 1e9\n")
    _refused(load_recipe, str(p), "weight_bytes")
    p = _make(tmp_path, "r3", ".yaml", "base: megatron-bf16\nbehaviour: {tp_comm_overlap: .nan}\n")
    _refused(load_recipe, str(p), "tp_comm_overlap")


def test_every_loader_error_is_a_user_error() -> None:
    assert issubclass(InputError, UserError)
