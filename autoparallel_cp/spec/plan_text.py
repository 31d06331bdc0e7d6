"""The text forms `--plan` and `--fix` read besides `key=value`: items split outside brackets,
integer lists as `4:4:4`, `[4, 4, 4]` or `(4, 4, 4)`, and JSON as the outputs write a plan
(spec/plan.py `parse_assignments` types and checks the fields)."""

from __future__ import annotations

import json
from typing import Any


def split_items(text: str) -> list[str]:
    """`text` split at the commas outside brackets: `stage_layers=[4, 4],tp=2` is two items."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch in "[(") - (ch in "])")
        if ch == "," and depth <= 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def int_list(value: str) -> tuple[int, ...]:
    """`4:4:4` (or `/` between), `[4, 4, 4]` or `(4, 4, 4)` as integers; ValueError else."""
    inner = value.strip()
    if inner[:1] + inner[-1:] in ("[]", "()"):
        inner = inner[1:-1].replace(",", ":")
    return tuple(int(x) for x in inner.replace("/", ":").split(":") if x.strip())


def _unique(items: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in items:
        if k in seen:
            raise ValueError(f"field {k!r} is given twice")
        seen[k] = v
    return seen


def json_object(text: str) -> dict[str, Any]:
    """The plan fields of JSON as the outputs write it: a PLAN object `{"dp": 8, ...}`, a
    "plans" entry `{"plan": {...}, ...}`, or an object's members without braces (`"dp": 8,
    "tp": 2`). ValueError naming the problem (a key given twice, not an object, bad JSON)."""
    body = text.strip()
    if not body.startswith("{"):
        body = "{" + body + "}"
    try:
        obj = json.loads(body, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if isinstance(obj, dict) and isinstance(obj.get("plan"), dict):
        obj = obj["plan"]  # one entry of the JSON output's "plans"
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object of plan fields")
    return obj
