"""The validation harness's import graph (issue 30, "Finish the layout").

`benchmarks/harness/` is a package whose modules import only from lower layers (`HARNESS`
below, the order its `__init__` docstring gives); the scripts in `benchmarks/` are entry points
on top: they import the harness and the tool, never each other, and nothing in the harness
imports a script. No import cycle anywhere in `benchmarks/`, and no module over 600 lines
(strictly: the harness is new code, so no "Kept whole" exemption).
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

#: Rank of each harness module: imports go to a strictly lower rank only.
HARNESS: dict[str, int] = {
    "harness": 0,
    "harness.tuned": 0,
    "harness.corpus": 0,
    "harness.heldout_automodel": 0,
    "harness.heldout_deepseek": 0,
    "harness.heldout_zb": 0,
    "harness.h200_kit": 0,
    "harness.ablation": 0,
    "harness.frameworks_megatron": 0,
    "harness.frameworks_torchtitan": 0,
    "harness.heldout_common": 1,
    "harness.train_rows": 1,
    "harness.heldout_bridge": 2,
    "harness.heldout_stated": 2,
    "harness.heldout_megatron": 2,
    "harness.heldout_offload": 2,
    "harness.heldout_models": 3,
    "harness.heldout_recipes": 4,
    "harness.heldout": 5,
    "harness.crossval": 6,
}

MAX_LINES = 600


def _modules() -> dict[str, Path]:
    """Every Python module under benchmarks/, by the name the scripts import it as."""
    out = {}
    for path in sorted(BENCH.rglob("*.py")):
        parts = list(path.relative_to(BENCH).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, known: set[str]) -> set[str]:
    """Modules of `known` that the file imports anywhere (top level or inside functions). A
    `from pkg import name` counts as importing `pkg.name` where that is a module, else `pkg`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            hit = subs & known
            found |= hit or ({node.module} & known)
    return found


MODULES = _modules()
GRAPH = {name: _imports(path, set(MODULES)) - {name} for name, path in MODULES.items()}


def _is_script(module: str) -> bool:
    return "." not in module and module != "harness"


def test_every_harness_module_has_a_layer() -> None:
    missing = sorted(m for m in GRAPH if not _is_script(m) and m not in HARNESS)
    assert missing == [], f"harness modules outside the layer map (add them to HARNESS): {missing}"
    assert "harness" in GRAPH and "harness.heldout" in GRAPH


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if not _is_script(m)))
def test_harness_imports_go_down_only(module: str) -> None:
    bad = [t for t in sorted(GRAPH[module]) if _is_script(t) or HARNESS[t] >= HARNESS[module]]
    assert bad == [], f"{module} (layer {HARNESS[module]}) imports {bad}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _is_script(m)))
def test_scripts_import_no_other_script(module: str) -> None:
    assert sorted(t for t in GRAPH[module] if _is_script(t)) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """An import cycle of `graph` as a sorted list of its modules (none: []), found by the
    standard library's topological sort (graphlib.CycleError names one cycle)."""
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        return [sorted(set(err.args[1]))]
    return []


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_600_lines(module: str) -> None:
    n = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(BENCH)}: {n} lines"


def test_the_checker_sees_planted_imports_and_cycles(tmp_path: Path) -> None:
    """The reader finds function-level, `from pkg import module` and plain imports, and the
    cycle finder reports a circle (else the tests above would pass vacuously)."""
    f = tmp_path / "x.py"
    f.write_text("import validate\n\ndef g():\n    from harness import crossval as X\n"
                 "    from harness.heldout import heldout_rows\n")
    known = {"validate", "harness", "harness.crossval", "harness.heldout"}
    assert _imports(f, known) == {"validate", "harness.crossval", "harness.heldout"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
