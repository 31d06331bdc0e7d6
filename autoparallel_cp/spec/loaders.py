"""Load model and cluster specs: preset names, YAML/JSON files, Hugging Face configs.

Every failure is an `InputError` with one line that names the file and the field, e.g.
``models/x.yaml: field 'num_kv_heads': num_kv_heads (3) must divide num_attention_heads (32)``.
"""

from __future__ import annotations

import difflib
import json
import stat
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

#: Largest spec file read: our specs are a few KB and Hugging Face config.json files well under
#: 100 KB (id2label tables included), so 1 MiB is 10x the largest real one.
MAX_FILE_BYTES = 1 << 20
#: Most YAML aliases (`*name`) in one file: a cluster file reuses a GPU or link block a few
#: times; thousands only appear in "billion laughs" bombs.
MAX_ALIASES = 1000
#: Most values (mapping entries and list items, aliases expanded) and deepest nesting of a
#: parsed file: real specs hold a few hundred values, nested at most 4 deep.
MAX_VALUES = 100_000
MAX_DEPTH = 64


class _Loader(yaml.SafeLoader):
    """PyYAML's SafeLoader that refuses more than MAX_ALIASES aliases (alias bombs)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (an alias bomb?)")
        return super().compose_node(parent, index)


def _check_shape(data: Any, source: str) -> None:
    """InputError when the parsed data is nested deeper than MAX_DEPTH or holds more than
    MAX_VALUES values once aliases are expanded (iterative: no recursion on hostile input)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    count = 0
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"nested more than {MAX_DEPTH} levels deep", source=source)
        if isinstance(value, Mapping):
            children: list[Any] = [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            children = list(value)
        else:
            continue
        count += len(children)
        if count > MAX_VALUES:
            raise InputError(f"holds more than {MAX_VALUES} values (aliases expanded)",
                             source=source)
        stack.extend((c, depth + 1) for c in children)


def _read(path: Path, source: str) -> Any:
    """The parsed YAML/JSON of a regular file of at most MAX_FILE_BYTES; every failure (no
    such file, a directory or FIFO, not UTF-8, bad syntax, too deep or too large, an alias
    bomb) is an InputError naming the file."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise InputError(f"is {kind}", source=source)
        if st.st_size > MAX_FILE_BYTES:
            raise InputError(f"is {st.st_size} bytes, more than {MAX_FILE_BYTES} "
                             "(spec files are a few KB)", source=source)
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise InputError(f"cannot read file: {why}", source=source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"is more than {MAX_FILE_BYTES} bytes", source=source)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"is not UTF-8 text (byte {exc.start}): expected YAML or JSON",
                         source=source) from None
    if not text.strip():
        raise InputError("is empty: expected a mapping of fields", source=source)
    try:
        data = _parse(path, text, source)
    except RecursionError:
        raise InputError(f"nested too deeply (more than {MAX_DEPTH} levels)",
                         source=source) from None
    except MemoryError:
        raise InputError("too large to parse", source=source) from None
    _check_shape(data, source)
    return data


def _parse(path: Path, text: str, source: str) -> Any:
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                source=source,
            ) from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"YAML syntax error{where}: {problem}", source=source) from None
    except (ValueError, TypeError, OverflowError) as exc:
        # PyYAML's constructors raise these on some values (e.g. a timestamp out of range)
        raise InputError(f"YAML value error: {exc}", source=source) from None


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except (OSError, ValueError):
        return False


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except (OSError, ValueError):
        return False


def _resolve(kind: str, name_or_path: str | Path) -> tuple[Path, str, bool]:
    """(file, name for messages, is_preset) for a preset name or a path."""
    p = Path(name_or_path).expanduser()
    if _is_dir(p):
        cfg = p / "config.json"
        if kind == "models" and _exists(cfg):
            return cfg, str(cfg), False
        raise InputError(
            "is a directory" + (" without a config.json" if kind == "models" else ""),
            source=str(p),
        )
    if _exists(p):
        return p, str(p), False  # _read refuses what is not a regular file
    text = str(name_or_path)
    preset = preset_path(kind, text) if _is_name(text) else None
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
        f"unknown {what} preset {text[:200]!r}{hint}; available: {', '.join(names)}; "
        "or give a path to a YAML/JSON file"
    )


def _is_name(text: str) -> bool:
    """Whether `text` can name a preset file (no NUL byte, not absurdly long)."""
    return 0 < len(text) <= 255 and "\0" not in text


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A model from a preset name, a YAML/JSON spec, or a Hugging Face config.json / folder.

    `hf:PATH` insists on a Hugging Face config (a file or a folder holding config.json).
    """
    hf_only = isinstance(name_or_path, str) and name_or_path.startswith("hf:")
    if hf_only:
        assert isinstance(name_or_path, str)
        name_or_path = name_or_path[3:]
        if not name_or_path:
            raise InputError("hf: needs a path to a config.json or a folder holding one",
                             source="hf:")
    path, source, is_preset = _resolve("models", name_or_path)
    data = _read(path, source)
    if hf_only and not (isinstance(data, Mapping) and is_hf_config(data)):
        raise InputError("not a Hugging Face config (no 'architectures' or 'model_type')",
                         source=source)
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
    if not _exists(p):
        close = difflib.get_close_matches(text, list(RECIPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(f"unknown recipe {text[:200]!r}{hint}; available: {', '.join(RECIPES)}; "
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
        if not isinstance(base, str) or base not in RECIPES:
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
