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

import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from autoparallel_cp.calibrate.fit import FitResult
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.calibration import FORMAT_VERSION, Calibration, Interval

FORMAT = "ap-solve-calibration"
_KNOBS = ("compute", "net_intra", "net_inter", "per_microbatch_s", "per_step_s",
          "memory_reserve_gib")


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
                       "identified": k.identified, "note": k.note} for k in result.knobs],
            "residuals_before": result.before,
            "residuals_after": result.after,
            "outlier_rows": list(result.outliers),
            "notes": list(result.notes),
            "rows": result.rows,
        },
    }


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration file (InputError naming the file and field)."""
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=src,
                         field="--calibration") from None
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", source=src, field="--calibration") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"not valid YAML ({' '.join(str(exc).split())})", source=src) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"not a calibration file (expected 'format: {FORMAT}')", source=src,
                         field="format")
    if doc.get("version") != FORMAT_VERSION:
        raise InputError(f"unsupported version {doc.get('version')!r} (this ap-solve reads "
                         f"version {FORMAT_VERSION})", source=src, field="version")
    knobs = doc.get("knobs") or {}
    if not isinstance(knobs, dict):
        raise InputError("must be a mapping", source=src, field="knobs")
    unknown = sorted(set(knobs) - set(_KNOBS))
    if unknown:
        raise InputError(f"unknown knob(s) {unknown} (known: {', '.join(_KNOBS)})", source=src,
                         field="knobs")
    data: dict[str, Any] = {k: v for k, v in knobs.items() if v is not None}
    iv = doc.get("intervals") or {}
    if not isinstance(iv, dict):
        raise InputError("must be a mapping", source=src, field="intervals")
    for key, name in (("time", "time_interval"), ("memory", "memory_interval")):
        if key in iv and iv[key] is not None:
            v = iv[key]
            if not (isinstance(v, list) and len(v) == 2):
                raise InputError("must be [lo, hi]", source=src, field=f"intervals.{key}")
            try:
                data[name] = Interval(lo=float(v[0]), hi=float(v[1]))
            except (ValidationError, TypeError, ValueError):
                raise InputError("must be [lo <= 0, hi >= 0] (ln measured/predicted)",
                                 source=src, field=f"intervals.{key}") from None
    std = doc.get("uncertainty") or {}
    if not isinstance(std, dict) or not all(
            isinstance(v, (int, float)) and v >= 0 for v in std.values()):
        raise InputError("must map knob names to non-negative numbers", source=src,
                         field="uncertainty")
    data["std"] = {str(k): float(v) for k, v in std.items()}
    try:
        return Calibration(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        raise InputError(msg, source=src, field=f"knobs.{loc}" if loc else "knobs") from None
