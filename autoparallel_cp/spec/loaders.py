"""Load model and cluster specs: preset names, YAML/JSON files, Hugging Face configs.

Every failure is an `InputError` with one line that names the file and the field, e.g.
``models/x.yaml: field 'num_kv_heads': num_kv_heads (3) must divide num_attention_heads (32)``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import RECIPES, ClusterSpec, ModelSpec, TrainingRecipe
from autoparallel_cp.spec.hf_import import is_hf_config, model_from_hf_config
from autoparallel_cp.spec.params import count_params
from autoparallel_cp.spec.presets import preset_names, preset_path
from autoparallel_cp.spec.validation import (
    validate_cluster,
    validate_model,
    validate_spec,
)


def _read(path: Path, source: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", source=source) from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                source=source,
            ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"YAML syntax error{where}: {problem}", source=source) from None


def _resolve(kind: str, name_or_path: str | Path) -> tuple[Path, str, bool]:
    """(file, name for messages, is_preset) for a preset name or a path."""
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        cfg = p / "config.json"
        if kind == "models" and cfg.is_file():
            return cfg, str(cfg), False
        raise InputError(
            "is a directory" + (" without a config.json" if kind == "models" else ""),
            source=str(p),
        )
    if p.is_file():
        return p, str(p), False
    text = str(name_or_path)
    preset = preset_path(kind, text)
    if preset is not None:
        return preset, f"{kind}/{preset.name}", True
    looks_like_path = any(s in text for s in ("/", "\\")) or Path(text).suffix.lower() in (
        ".yaml", ".yml", ".json",
    )
    names = preset_names(kind)
    what = "model" if kind == "models" else "cluster"
    if looks_like_path:
        raise InputError(f"no such file (and not a {what} preset)", source=text)
    close = difflib.get_close_matches(text, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InputError(
        f"unknown {what} preset {text!r}{hint}; available: {', '.join(names)}; "
        "or give a path to a YAML/JSON file"
    )


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A model from a preset name, a YAML/JSON spec, or a Hugging Face config.json / folder."""
    path, source, is_preset = _resolve("models", name_or_path)
    data = _read(path, source)
    if isinstance(data, Mapping) and is_hf_config(data):
        name = None
        if not data.get("_name_or_path"):  # name it after its folder (hub snapshot layout)
            name = path.parent.name if path.name == "config.json" else path.stem
        return model_from_hf_config(data, source, name=name or None)
    if isinstance(data, Mapping) and "name" not in data:
        data = {"name": path.parent.name if path.name == "config.json" else path.stem, **data}
    return validate_model(data, source)


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A cluster from a preset name or a YAML/JSON spec."""
    path, source, _ = _resolve("clusters", name_or_path)
    data = _read(path, source)
    if isinstance(data, Mapping) and "name" not in data:
        data = {"name": path.stem, **data}
    return validate_cluster(data, source)


def load_recipe(name_or_path: str | Path) -> TrainingRecipe:
    """A training recipe from a preset name (`RECIPES`) or a YAML/JSON file.

    A file either spells out every `TrainingRecipe` field, or names a preset in `base` and
    overrides some fields; `behaviour` is merged field by field, e.g.

        base: megatron-bf16
        name: megatron-bf16-dropout
        behaviour: {dropout: true, tp_comm_overlap: 0.8}
    """
    text = str(name_or_path)
    if text in RECIPES:
        return RECIPES[text]
    p = Path(text).expanduser()
    if not p.is_file():
        close = difflib.get_close_matches(text, list(RECIPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(f"unknown recipe {text!r}{hint}; available: {', '.join(RECIPES)}; "
                         "or give a path to a YAML/JSON file", field="--recipe")
    source = str(p)
    data = _read(p, source)
    if not isinstance(data, Mapping):
        raise InputError("expected a mapping of fields at the top level, got "
                         f"{type(data).__name__}", source=source)
    data = dict(data)
    named = "name" in data
    base = data.pop("base", None)
    if base is not None:
        if base not in RECIPES:
            raise InputError(f"unknown base recipe {base!r}; available: {', '.join(RECIPES)}",
                             source=source, field="base")
        merged = RECIPES[base].model_dump()
        behaviour = data.pop("behaviour", None)
        if behaviour is not None:
            if not isinstance(behaviour, Mapping):
                raise InputError("expected a mapping of behaviour fields", source=source,
                                 field="behaviour")
            merged["behaviour"] = {**merged["behaviour"], **behaviour}
        data = {**merged, **data}
    if not named:
        data["name"] = p.stem
    return validate_spec(TrainingRecipe, data, source)


# --------------------------------------------------------------------------------------------
# Catalogs for `ap-solve models` / `ap-solve clusters`
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _model_row(name: str) -> dict[str, Any]:
    m = load_model(name)
    pc = count_params(m)
    moe = m.moe
    return {
        "name": name,
        "params_b": round(pc.total / 1e9, 2),
        "active_b": round(pc.active_per_token / 1e9, 2),
        "layers": m.num_layers,
        "hidden": m.hidden_size,
        "ffn": m.ffn_hidden_size,
        "heads": m.num_attention_heads,
        "kv_heads": m.kv_heads if m.mla is None else None,
        "attention": "MLA" if m.mla is not None else (
            "MHA" if m.kv_heads == m.num_attention_heads else "GQA"),
        "vocab": m.vocab_size,
        "experts": moe.num_experts if moe else None,
        "top_k": moe.top_k if moe else None,
        "shared_experts": moe.num_shared_experts if moe else None,
        "mtp_layers": m.mtp_layers,
        "source": m.source,
    }


def model_catalog() -> list[dict[str, Any]]:
    """One row per model preset: name, params_b (excl. MTP), active_b, layers, hidden, ffn,
    heads, kv_heads, attention (MHA/GQA/MLA), vocab, experts, top_k, shared_experts,
    mtp_layers, source."""
    return [dict(_model_row(n)) for n in preset_names("models")]


def _joined(values: list[Any]) -> Any:
    """One value when all groups agree, else the values joined with ' / ' (file order)."""
    uniq = list(dict.fromkeys(values))
    return uniq[0] if len(uniq) == 1 else " / ".join(str(v) for v in values)


def cluster_catalog() -> list[dict[str, Any]]:
    """One row per cluster preset: name, groups, gpu, gpus, nodes, gpus_per_node, memory_gib,
    bf16_tflops, fp8_tflops, hbm_gbps, intra_node_gbps, inter_node_gbps (per GPU, per
    direction). For a heterogeneous cluster, per-group values are joined with ' / '."""
    rows = []
    for name in preset_names("clusters"):
        c = load_cluster(name)
        gs = c.node_groups
        rows.append({
            "name": name,
            "groups": len(gs),
            "gpu": _joined([g.gpu.name for g in gs]),
            "gpus": c.num_gpus,
            "nodes": sum(g.num_nodes for g in gs),
            "gpus_per_node": _joined([g.gpus_per_node for g in gs]),
            "memory_gib": _joined([g.gpu.memory_gib for g in gs]),
            "bf16_tflops": _joined([g.gpu.bf16_tflops for g in gs]),
            "fp8_tflops": _joined([g.gpu.fp8_tflops for g in gs]),
            "hbm_gbps": _joined([g.gpu.hbm_gbps for g in gs]),
            "intra_node_gbps": _joined([g.intra_node.bandwidth_gbps for g in gs]),
            "inter_node_gbps": _joined([g.inter_node.bandwidth_gbps for g in gs]),
            "source": c.source,
        })
    return rows
