"""The calibration file (`ap-solve calibrate --out CALIB.yaml`, read by `--calibration`).

Format (docs/user-guide.md, "Calibrating to your cluster"), YAML:

    format: ap-solve-calibration
    version: 1
    knobs:                      # spec/calibration.py; omitted knobs are the identity
      compute: {H100-SXM5-80GB: 0.93}   # kernel speed factor per GPU type
      net_intra: 0.88           # NVLink bandwidth factor
      net_inter: 1.0            # network bandwidth factor
      per_microbatch_s: 0.004   # fixed seconds per micro-batch (whole model)
      per_step_s: 0.12          # fixed seconds per optimizer step
      memory_reserve_gib: 0.6   # allocated GiB per GPU the model does not count
    intervals:                  # ln(measured / predicted), nominal 80 %; absent: model tables
      time: [-0.05, 0.05]
      memory: [-0.02, 0.02]
    uncertainty:                # one sd of each fitted knob (sensitivity ranges)
      compute:H100-SXM5-80GB: 0.02
    report: {...}               # what `calibrate` printed: knobs with uncertainty, residuals
                                # before / after, rows, outliers, notes (informative only)
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoparallel_cp.calibrate.fit import FitResult
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.calibration import (
    BOUNDS,
    FORMAT_VERSION,
    MAX_LOG_INTERVAL,
    Calibration,
    Interval,
)

FORMAT = "ap-solve-calibration"
_KNOBS = ("compute", "net_intra", "net_inter", "per_microbatch_s", "per_step_s",
          "memory_reserve_gib")
_TOP = ("format", "version", "created", "knobs", "intervals", "uncertainty", "report")
#: Most per-row lines kept in the file's report (the largest residuals first): the file stays
#: under the spec loaders' 1 MiB and 10^5-value bounds however many rows were fitted.
MAX_REPORT_ROWS = 1000


def to_document(result: FitResult, sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """The YAML document of a fit."""
    cal = result.calibration
    knobs = {k: getattr(cal, k) for k in _KNOBS}
    knobs["compute"] = dict(cal.compute)
    intervals: dict[str, list[float]] = {}
    if cal.time_interval is not None:
        intervals["time"] = [cal.time_interval.lo, cal.time_interval.hi]
    if cal.memory_interval is not None:
        intervals["memory"] = [cal.memory_interval.lo, cal.memory_interval.hi]
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "knobs": knobs,
        "intervals": intervals,
        "uncertainty": dict(cal.std),
        "report": {
            "inputs": sources or {},
            "knobs": [{"name": k.name, "value": k.value, "std": k.std,
                       "identified": k.identified, "note": k.note,
                       "moved": k.std is not None, "determined": k.determined,
                       "prior_sigma": k.prior_sigma} for k in result.knobs],
            "moved": [k.name for k in result.knobs if k.std is not None],
            "model_sigma_time": result.model_sigma,
            "residuals_before": result.before,
            "residuals_after": result.after,
            "outlier_rows": list(result.outliers),
            "notes": list(result.notes),
            "rows": _report_rows(result.rows),
            "rows_left_out": max(0, len(result.rows) - MAX_REPORT_ROWS),
        },
    }


def _report_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most MAX_REPORT_ROWS rows, those with the largest step-time residual after the fit,
    in file order."""
    if len(rows) <= MAX_REPORT_ROWS:
        return rows

    def err(r: dict[str, Any]) -> float:
        return abs(math.log(float(r["after_step_s"]) / float(r["measured_step_s"])))

    keep = sorted(range(len(rows)), key=lambda i: -err(rows[i]))[:MAX_REPORT_ROWS]
    return [rows[i] for i in sorted(keep)]


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file: the guards of the spec loaders (size, alias, depth and value
    bounds, spec/loaders.py), every key known (a misspelt one named with a did-you-mean),
    numbers finite and in range; InputError naming the file and the field."""
    src = str(path)
    doc = read_document(Path(path), src)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"not a calibration file (expected 'format: {FORMAT}')", source=src,
                         field="format")
    _known_keys(doc, _TOP, src, "")
    if doc.get("version") != FORMAT_VERSION or isinstance(doc.get("version"), bool):
        raise InputError(f"unsupported version {str(doc.get('version'))[:40]!r} (this ap-solve "
                         f"reads version {FORMAT_VERSION})", source=src, field="version")
    knobs = _mapping(doc, "knobs", src)
    _known_keys(knobs, _KNOBS, src, "knobs.")
    data: dict[str, Any] = {}
    for k, v in knobs.items():
        if v is None:
            continue
        if k == "compute":
            if not isinstance(v, dict):
                raise InputError("must map GPU type names to speed factors", source=src,
                                 field="knobs.compute")
            data[k] = {str(g): _in_range(x, "compute", src, f"knobs.compute.{str(g)[:80]}")
                       for g, x in v.items()}
        else:
            data[k] = _in_range(v, k, src, f"knobs.{k}")
    iv = _mapping(doc, "intervals", src)
    _known_keys(iv, ("time", "memory"), src, "intervals.")
    for key, name in (("time", "time_interval"), ("memory", "memory_interval")):
        if iv.get(key) is not None:
            v = iv[key]
            f = f"intervals.{key}"
            if not (isinstance(v, list) and len(v) == 2):
                raise InputError("must be [lo, hi]", source=src, field=f)
            lo, hi = _number(v[0], src, f), _number(v[1], src, f)
            if not -MAX_LOG_INTERVAL <= lo <= 0.0 <= hi <= MAX_LOG_INTERVAL:
                raise InputError(f"must be [lo <= 0, hi >= 0] within +-{MAX_LOG_INTERVAL:.3g} "
                                 f"(ln measured/predicted: a factor of 10), got [{lo:g}, "
                                 f"{hi:g}]", source=src, field=f)
            data[name] = Interval(lo=lo, hi=hi)
    std = _mapping(doc, "uncertainty", src)
    names = [*(k for k in _KNOBS if k != "compute"),
             *(f"compute:{g}" for g in data.get("compute", {}))]
    _known_keys(std, names, src, "uncertainty.")
    data["std"] = {}
    for k, v in std.items():
        lo, hi = BOUNDS[str(k).split(":", 1)[0]]
        data["std"][str(k)] = _in_range(v, None, src, f"uncertainty.{k}", (0.0, hi - lo))
    try:
        return Calibration(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        where = "uncertainty" if "uncertainty" in msg else f"knobs.{loc}" if loc else "knobs"
        raise InputError(msg, source=src, field=where) from None


def read_document(path: Path, source: str) -> Any:
    """The parsed YAML of `path` under the spec loaders' guards (spec/loaders.py `_read`)."""
    from autoparallel_cp.spec.loaders import _read

    return _read(path, source)


def _mapping(doc: dict[str, Any], key: str, src: str) -> dict[str, Any]:
    v = doc.get(key) or {}
    if not isinstance(v, dict):
        raise InputError("must be a mapping", source=src, field=key)
    return v


def _number(v: Any, src: str, field: str) -> float:
    """A finite number; a YAML 1.2 float that YAML 1.1 reads as text (`1e-3`) is accepted."""
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"must be a number, got {str(v)[:40]!r}", source=src, field=field)
    x = float(v)
    if not math.isfinite(x):
        raise InputError(f"must be a finite number, got {v}", source=src, field=field)
    return x


def _in_range(v: Any, kind: str | None, src: str, field: str,
              bounds: tuple[float, float] | None = None) -> float:
    x = _number(v, src, field)
    lo, hi = bounds or BOUNDS[kind or ""]
    if not lo <= x <= hi:
        raise InputError(f"{x:g} outside its range [{lo:g}, {hi:g}]", source=src, field=field)
    return x


def _known_keys(d: dict[str, Any], known: Sequence[str], src: str, where: str) -> None:
    """InputError naming the first key of `d` not in `known` (with the closest known one)."""
    for k in d:
        name = str(k)
        if name in known:
            continue
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InputError(f"unknown key {name[:80]!r} ({hint}known: {', '.join(known)})",
                         source=src, field=f"{where}{name[:80]}")
