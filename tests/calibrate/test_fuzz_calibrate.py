"""Fuzzing of calibrate's inputs (issue 32): hypothesis over RUNS.csv cells (training and
microbenchmark rows) and calibration-file documents. Only `UserError`s may escape `load_runs` /
`load_calibration`, each naming the file; whatever is accepted is finite and in range."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoparallel_cp.calibrate.files import load_calibration
from autoparallel_cp.calibrate.runs import load_runs
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec.calibration import BOUNDS, MAX_LOG_INTERVAL

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

NUMBERS = st.one_of(
    st.sampled_from(["", "0", "-1", "1e-300", "1e300", "nan", "inf", "-inf", "0.5", "8", "64",
                     "4096", "1e12", "abc", "1_000", " 7 ", "0x10", "9" * 400]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**20, 10**20).map(str))
TEXT = st.one_of(st.sampled_from(["llama3-8b", "dgx-h100", "megatron-bf16", "nosuch", "",
                                  "a" * 300, "../../etc/passwd", "x\0y", "tp=8", "tp=8,mbs=1",
                                  "dp=1,tp=8,pp=1,mbs=1,recompute=full,recompute_layers=99"]),
                 st.text(max_size=40))
TRAIN = ("model", "cluster", "gpus", "seq_len", "global_batch", "recipe", "plan", "step_s",
         "peak_gib")
MICRO = ("kind", "cluster", "gpu", "m", "k", "n", "dtype", "gpus", "gpus_per_node",
         "size_bytes", "time_s")


def _cell(v: str) -> str:
    return '"' + v.replace('"', '""') + '"'


def _write(text: str | bytes) -> Path:
    d = Path(tempfile.mkdtemp(prefix="fuzz-cal-"))
    p = d / "in.csv"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8", errors="surrogatepass")
    return p


def _load(p: Path) -> None:
    try:
        runs, micro = load_runs(p)
    except UserError as exc:
        msg = str(exc)
        assert str(p) in msg and "\n" not in msg, msg
        return
    for r in runs:
        assert math.isfinite(r.step_s) and r.step_s > 0
        assert r.peak_bytes is None or math.isfinite(r.peak_bytes)
    for m in micro:
        assert math.isfinite(float(m.fields["time_s"]))


@FUZZ
@given(st.fixed_dictionaries({k: NUMBERS if k in ("gpus", "seq_len", "global_batch", "step_s",
                                                   "peak_gib") else TEXT for k in TRAIN}))
@example({"model": "llama3-8b", "cluster": "dgx-h100", "gpus": "8", "seq_len": "4096",
          "global_batch": "64", "recipe": "megatron-bf16", "plan": "tp=8,mbs=1",
          "step_s": "6.1", "peak_gib": "1e300"})
def test_training_rows(row: dict[str, str]) -> None:
    _load(_write(",".join(TRAIN) + "\n" + ",".join(_cell(row[k]) for k in TRAIN) + "\n"))


@FUZZ
@given(st.sampled_from(["gemm", "all_gather", "reduce_scatter", "all_reduce", "bogus"]),
       st.fixed_dictionaries({k: NUMBERS for k in MICRO[3:]}),
       st.sampled_from(["H100-SXM5-80GB", "A100-SXM4-80GB", ""]))
def test_microbenchmark_rows(kind: str, nums: dict[str, str], gpu: str) -> None:
    row = {"kind": kind, "cluster": "dgx-h100", "gpu": gpu} | nums
    _load(_write(",".join(MICRO) + "\n" + ",".join(_cell(row[k]) for k in MICRO) + "\n"))


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes(raw: bytes) -> None:
    _load(_write(b"\xef\xbb\xbf" + ",".join(TRAIN).encode() + b"\r\n" + raw))


VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**30, 10**30),
                   st.booleans(), st.none(), st.text(max_size=10),
                   st.lists(st.floats(allow_nan=True), max_size=3))
KEYS = st.sampled_from(["compute", "net_intra", "net_inter", "per_microbatch_s", "per_step_s",
                        "memory_reserve_gib", "net_intr", "bogus"])


@FUZZ
@given(st.dictionaries(KEYS, VALUES, max_size=4),
       st.dictionaries(st.sampled_from(["time", "memory", "tim"]),
                       st.lists(VALUES, max_size=3), max_size=2),
       st.dictionaries(st.sampled_from(["net_intra", "compute:H100-SXM5-80GB", "x"]), VALUES,
                       max_size=2),
       st.sampled_from([1, 2, "1", None, True]))
def test_calibration_documents(knobs: dict[str, Any], intervals: dict[str, Any],
                               std: dict[str, Any], version: Any) -> None:
    doc = {"format": "ap-solve-calibration", "version": version, "knobs": knobs,
           "intervals": intervals, "uncertainty": std}
    d = Path(tempfile.mkdtemp(prefix="fuzz-cal-"))
    p = d / "c.yaml"
    p.write_text(yaml.safe_dump(doc), encoding="utf-8")
    try:
        cal = load_calibration(p)
    except UserError as exc:
        assert str(p) in str(exc) and "\n" not in str(exc), str(exc)
        return
    for k in ("net_intra", "net_inter", "per_microbatch_s", "per_step_s",
              "memory_reserve_gib"):
        lo, hi = BOUNDS[k]
        assert lo <= getattr(cal, k) <= hi
    for iv in (cal.time_interval, cal.memory_interval):
        assert iv is None or -MAX_LOG_INTERVAL <= iv.lo <= 0 <= iv.hi <= MAX_LOG_INTERVAL
    assert all(math.isfinite(v) for v in cal.std.values())
