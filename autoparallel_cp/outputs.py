"""Output files: the CSV columns and JSON documents of INTERFACE.md, written atomically.

Files are written atomically: the text goes to a temporary file in the target's folder, which
then replaces the target (`os.replace`); on any error the temporary file is removed and the
target is left as it was.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoparallel_cp.errors import UserError

GIB = 1024**3

PLAN_FIELDS: tuple[str, ...] = (
    "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches", "recompute",
)
TIME_FIELDS: tuple[str, ...] = (
    "compute_s", "bubble_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s",
    "optimizer_s",
)

MEMORY_FIELDS: tuple[str, ...] = (
    "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes",
)

CSV_COLUMNS: tuple[str, ...] = (
    ("rank",) + PLAN_FIELDS + ("recompute_layers", "stage_layers", "fits", "peak_bytes",
                                "peak_gib", "capacity_gib", "step_s")
    + TIME_FIELDS + ("tokens_per_s", "tokens_per_s_per_gpu", "mfu")
    # nominal 80 % prediction intervals (cost/uncertainty.py)
    + ("step_s_lo", "step_s_hi", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi",
       "peak_bytes_lo", "peak_bytes_hi", "fixed_s")
)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` atomically; `-` writes to stdout.

    Raises UserError (exit 2) naming the file when it cannot be written; the target is then
    untouched and no temporary file is left behind.
    """
    if str(path) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    tmp_name: str | None = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_name, target)
        tmp_name = None
    except OSError as exc:
        raise UserError(f"{path}: cannot write file: {exc.strerror or exc}") from exc
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)


def plans_csv(plans: Sequence[Mapping[str, Any]]) -> str:
    """CSV text, one row per PLAN dict (best first), columns CSV_COLUMNS."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    w.writeheader()
    for rank, p in enumerate(plans, start=1):
        w.writerow(csv_row(p, rank))
    return buf.getvalue()


def csv_row(p: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The CSV row of one PLAN dict."""
    plan = p.get("plan", {})
    mem = p.get("memory", {})
    t = p.get("time", {})
    thr = p.get("throughput", {})
    row: dict[str, Any] = {"rank": rank}
    for f in PLAN_FIELDS:
        row[f] = plan.get(f)
    row["recompute_layers"] = plan.get("recompute_layers")
    sl = plan.get("stage_layers")
    row["stage_layers"] = ":".join(map(str, sl)) if sl else ""
    row["fits"] = p.get("fits")
    peak = mem.get("peak_bytes")
    cap = mem.get("capacity_bytes")
    row["peak_bytes"] = peak
    row["peak_gib"] = round(peak / GIB, 3) if peak is not None else None
    row["capacity_gib"] = round(cap / GIB, 3) if cap is not None else None
    row["step_s"] = t.get("step_s")
    for f in TIME_FIELDS:
        row[f] = t.get(f)
    row["tokens_per_s"] = thr.get("tokens_per_s")
    row["tokens_per_s_per_gpu"] = thr.get("tokens_per_s_per_gpu")
    row["mfu"] = thr.get("mfu")
    for name, d, key in (("step_s", t, "step_s_interval"),
                         ("tokens_per_s_per_gpu", thr, "tokens_per_s_per_gpu_interval"),
                         ("peak_bytes", mem, "peak_bytes_interval")):
        iv = d.get(key)
        row[f"{name}_lo"], row[f"{name}_hi"] = (iv[0], iv[1]) if iv else (None, None)
    row["fixed_s"] = t.get("fixed_s")  # calibrated fixed time per step
    return row


def result_json(
    status: str, solve_time_s: float, space_size: Any, plans: Sequence[Mapping[str, Any]]
) -> str:
    """The solve/enumerate JSON document of INTERFACE.md (exactly its four keys)."""
    doc = {"status": status, "solve_time_s": solve_time_s, "space_size": space_size,
           "plans": list(plans)}
    return json.dumps(doc, indent=2, default=_json_default) + "\n"


def plan_json(plan: Mapping[str, Any]) -> str:
    """One PLAN as JSON text (the `evaluate --json` document)."""
    return json.dumps(plan, indent=2, default=_json_default) + "\n"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
