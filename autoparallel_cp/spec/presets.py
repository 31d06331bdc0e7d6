"""Locate the preset folders (`models/`, `clusters/`) for both editable and regular installs.

A regular `pip install .` ships them as package data under
`autoparallel_cp/preset_files/{models,clusters}` (see `[tool.setuptools.package-dir]` in
pyproject.toml; not `presets/`, which this module's name would shadow); an editable install or a
source checkout reads the repository's top-level folders.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
_REPO_ROOT = _PACKAGE.parent


def preset_dir(kind: str) -> Path:
    """Return the folder holding presets of `kind` ("models" or "clusters")."""
    if kind not in ("models", "clusters"):
        raise ValueError(f"unknown preset kind {kind!r}")
    local = _REPO_ROOT / kind
    packaged = _PACKAGE / "preset_files" / kind
    for folder in (local, packaged):
        if folder.is_dir() and any(folder.glob("*.yaml")):
            return folder
    return local


def preset_names(kind: str) -> list[str]:
    """Sorted names (file stems) of the presets of `kind`."""
    return sorted(p.stem for p in preset_dir(kind).glob("*.yaml"))


def preset_path(kind: str, name: str) -> Path | None:
    """Path of the preset `name` of `kind`, or None when there is no such preset."""
    p = preset_dir(kind) / f"{name}.yaml"
    return p if p.is_file() else None
