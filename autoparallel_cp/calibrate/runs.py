"""Reading measured runs (RUNS.csv) for `ap-solve calibrate`, one clear error per bad row.

Training rows (INTERFACE.md): `model`, `cluster`, `gpus`, `seq_len`, `global_batch`, `recipe`,
`plan` (a `--plan` string), and `step_s` or `tokens_per_s_per_gpu`; optional `peak_gib`
(torch.cuda.max_memory_allocated, GiB) and, for MoE runs, `moe_load_imbalance` (the run's
most-loaded EP rank's routed tokens over the mean, as `--moe-load-imbalance` takes it; 1 when
empty). Missing model / cluster / recipe come from the command
line; a file name there is looked up relative to the working folder, then to the CSV's. A
`kind` column, when present, tells training rows (`train`, the default) from the microbenchmark
rows of `ap-solve measure` (`gemm`, `all_gather`, `reduce_scatter`,
`all_reduce`; calibrate/micro.py documents their columns).
"""

from __future__ import annotations

import csv
import difflib
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from autoparallel_cp.calibrate.micro import MICRO_KINDS, MicroRow, check_micro
from autoparallel_cp.errors import InputError, UserError
from autoparallel_cp.spec import GIB, Job
from autoparallel_cp.spec.base import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_SEQ_LEN
from autoparallel_cp.spec.loaders import load_cluster, load_model, load_recipe
from autoparallel_cp.spec.plan import Plan, PlanError, parse_plan, plan_violations

#: Most data rows of one RUNS.csv: `calibrate` fits 10^4 rows in under a minute on 2 cores
#: (benchmarks/calibrate_scale.py); 10^5 keeps it to minutes (docs/user-guide.md says so).
MAX_ROWS = 100_000
#: Largest RUNS.csv read: 10^5 rows of a few hundred bytes each, with room to spare.
MAX_FILE_BYTES = 64 << 20
#: Longest field: a file path (PATH_MAX is 4096 on Linux) or a plan string is far shorter.
MAX_FIELD_CHARS = 4096
#: Plausible measured step: 100 us (a tiny decoder on one GPU) to ~11.6 days (the model's own
#: step bound, spec/base.py MAX_STEP_ESTIMATE_S); a measured peak: 1 MiB (spec/base.py
#: MIN_MEMORY_GIB) to the GPU's memory.
STEP_S_RANGE = (1e-4, 1e6)
MIN_PEAK_GIB = 2.0**-10
#: Columns RUNS.csv may hold (training rows, the microbenchmark rows of calibrate/micro.py, and
#: what `ap-solve measure` writes); others are kept for the user (notes) unless they look like
#: a misspelt known one.
KNOWN_COLUMNS = ("kind", "model", "cluster", "gpus", "seq_len", "global_batch", "recipe",
                 "plan", "step_s", "tokens_per_s_per_gpu", "peak_gib", "moe_load_imbalance",
                 "gpu", "m", "k", "n", "dtype", "gpus_per_node", "size_bytes", "time_s",
                 "device")


@dataclass(frozen=True)
class Run:
    """One measured training run: the job, the plan, what was measured."""

    row: int  # 1-based data row (the header is row 0)
    job: Job
    plan: Plan
    step_s: float
    peak_bytes: float | None
    options: Any = None  # cost.factors.CostOptions override (benchmark rows), else the recipe's

    @property
    def label(self) -> str:
        return f"row {self.row}"


def _err(path: str, row: int, field: str, msg: str) -> InputError:
    return InputError(msg, source=f"{path} row {row}", field=field)


def _num(path: str, row: int, rec: Mapping[str, str], field: str, *, integer: bool = False,
         required: bool = True, hi: float | None = None, lo: float | None = None
         ) -> float | None:
    raw = (rec.get(field) or "").strip()
    if not raw:
        if required:
            raise _err(path, row, field, "missing value")
        return None
    try:
        v = float(raw)
    except ValueError:
        raise _err(path, row, field, f"not a number: {raw!r}") from None
    if not math.isfinite(v):
        raise _err(path, row, field, f"not a finite number: {raw!r}")
    if v <= 0:
        what = "time" if field == "step_s" else "value"
        raise _err(path, row, field, f"must be positive, got {raw} (a negative or zero {what})")
    if integer and v != int(v):
        raise _err(path, row, field, f"must be a whole number, got {raw}")
    if hi is not None and v > hi:
        raise _err(path, row, field, f"{raw} is more than {hi:g}")
    if lo is not None and v < lo:
        raise _err(path, row, field, f"{raw} is less than {lo:g}")
    return v


def _text(path: str, row: int, rec: Mapping[str, str], field: str,
          default: str | None) -> str:
    v = (rec.get(field) or "").strip() or default
    if not v:
        raise _err(path, row, field, f"missing value (no column and no --{field} option)")
    return v


def _read_text(path: str | Path) -> str:
    """The file's text: at most MAX_FILE_BYTES, UTF-8 with or without a byte-order mark (what a
    spreadsheet's "CSV UTF-8" writes)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise UserError(f"{path}: more than {MAX_FILE_BYTES >> 20} MiB (at most {MAX_ROWS:,} "
                        "rows are read)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not a UTF-8 text file (byte {exc.start})") from None


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's data rows as dicts (UserError naming the file and row when it cannot be read):
    a byte-order mark and CRLF line ends are accepted, fields are bounded."""
    text = _read_text(path)
    # fields are bounded below, naming the column; the csv module's own limit (128 KiB) would
    # only say "field larger than field limit"
    csv.field_size_limit(max(csv.field_size_limit(), MAX_FILE_BYTES))
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[dict[str, str]] = []
    try:
        header = [h.strip() for h in next(reader, [])]
        if not any(header):
            raise UserError(f"{path}: empty file (a CSV with a header row is expected)")
        _check_header(str(path), header)
        for i, cells in enumerate(reader, 1):
            if not any(c.strip() for c in cells):
                continue  # a blank line (spreadsheets add them at the end)
            if len(rows) >= MAX_ROWS:
                raise UserError(f"{path}: more than {MAX_ROWS:,} data rows (the limit of one "
                                "calibration; see the user guide)")
            if len(cells) > len(header):
                raise _err(str(path), i, header[-1], f"{len(cells)} fields, the header has "
                           f"{len(header)} (an unquoted comma in a plan?)")
            for h, c in zip(header, cells, strict=False):
                if len(c) > MAX_FIELD_CHARS:
                    raise _err(str(path), i, h, f"{len(c)} characters, more than "
                               f"{MAX_FIELD_CHARS}")
            rows.append(dict(zip(header, cells, strict=False)))
    except csv.Error as exc:
        raise InputError(f"not readable as CSV ({exc})",
                         source=f"{path} line {reader.line_num}") from None
    if not rows:
        raise UserError(f"{path}: no data rows")
    return rows


def _check_header(path: str, header: list[str]) -> None:
    """UserError on a duplicated column, or one that looks like a misspelt known column."""
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise InputError(f"column {h!r} appears twice", source=f"{path} header", field=h)
        seen.add(h)
        if h and h not in KNOWN_COLUMNS:
            close = difflib.get_close_matches(h, KNOWN_COLUMNS, n=1, cutoff=0.8)
            if close and close[0] not in header:
                raise InputError(f"unknown column {h[:80]!r} (did you mean {close[0]!r}?)",
                                 source=f"{path} header", field=h[:80])


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def load_runs(path: str | Path, *, model: str | None = None, cluster: str | None = None,
              recipe: str | None = None) -> tuple[list[Run], list[MicroRow]]:
    """Training runs and microbenchmark rows of RUNS.csv (InputError naming row and field)."""
    p = str(path)
    runs: list[Run] = []
    micro: list[MicroRow] = []
    cache: dict[tuple[str, str], object] = {}

    here = Path(path).parent

    def cached(kind: str, name: str, row: int) -> object:
        key = (kind, name)
        if not _is_file(Path(name)) and _is_file(here / name):
            name = str(here / name)  # a file named relative to the CSV (ap-solve measure)
        if key not in cache:
            loader = {"model": load_model, "cluster": load_cluster, "recipe": load_recipe}[kind]
            try:
                cache[key] = loader(name)
            except (UserError, ValidationError, ValueError, OSError) as exc:
                msg = " ".join(str(exc).split())
                raise _err(p, row, kind, f"unknown or invalid {kind} {name[:80]!r} "
                           f"({msg[:300]})") from None
        return cache[key]

    for i, rec in enumerate(read_rows(path), 1):
        kind = (rec.get("kind") or "train").strip() or "train"
        if kind in MICRO_KINDS:
            mr = MicroRow(i, kind, rec)
            try:
                check_micro(mr)
            except InputError as exc:
                raise _err(p, i, exc.field or "kind", str(exc).split(": ", 2)[-1]) from None
            micro.append(mr)
            continue
        if kind != "train":
            raise _err(p, i, "kind", f"unknown row kind {kind!r} (train, "
                       + ", ".join(MICRO_KINDS) + ")")
        m = cached("model", _text(p, i, rec, "model", model), i)
        c = cached("cluster", _text(p, i, rec, "cluster", cluster), i)
        r = cached("recipe", _text(p, i, rec, "recipe", recipe or "megatron-bf16"), i)
        gpus = int(_num(p, i, rec, "gpus", integer=True, hi=MAX_GPUS) or 0)
        seq = int(_num(p, i, rec, "seq_len", integer=True, hi=MAX_SEQ_LEN) or 0)
        gb = int(_num(p, i, rec, "global_batch", integer=True, hi=MAX_GLOBAL_BATCH) or 0)
        try:
            sub = c.take_gpus(gpus)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise _err(p, i, "gpus", str(exc)) from None
        try:
            job = Job(model=m, cluster=sub, recipe=r, seq_len=seq, global_batch=gb)
        except (ValidationError, ValueError) as exc:
            msg = " ".join(str(exc).split())
            raise _err(p, i, "global_batch", f"not a valid job ({msg[:300]})") from None
        rho = _num(p, i, rec, "moe_load_imbalance", required=False)
        if rho is not None:
            try:
                job = job.with_moe_load_imbalance(rho)
            except ValueError as exc:
                raise _err(p, i, "moe_load_imbalance", str(exc)) from None
        plan_text = _text(p, i, rec, "plan", None)
        try:
            plan = parse_plan(plan_text, job)
        except PlanError as exc:
            raise _err(p, i, "plan", str(exc)) from None
        need = plan.dp * plan.tp * plan.pp * plan.cp
        if plan.tp * plan.pp * plan.cp > gpus or need > gpus:
            raise _err(p, i, "plan", f"needs {max(need, plan.tp * plan.pp * plan.cp)} GPUs "
                       f"(dp*tp*pp*cp), the row has {gpus}")
        bad = plan_violations(job, plan)
        if bad:
            raise _err(p, i, "plan", "plan not legal: " + "; ".join(bad))
        lo_s, hi_s = STEP_S_RANGE
        step = _num(p, i, rec, "step_s", required=False, lo=lo_s, hi=hi_s)
        tps = _num(p, i, rec, "tokens_per_s_per_gpu", required=False)
        if step is None and tps is None:
            raise _err(p, i, "step_s", "give step_s or tokens_per_s_per_gpu")
        if step is None:
            step = job.tokens_per_step / (float(tps or 1.0) * job.num_gpus)
            if not lo_s <= step <= hi_s:
                raise _err(p, i, "tokens_per_s_per_gpu", f"gives a step of {step:.3g} s, "
                           f"outside [{lo_s:g}, {hi_s:g}] s")
        cap = max(g.gpu.memory_gib for g in job.cluster.node_groups)
        peak = _num(p, i, rec, "peak_gib", required=False, lo=MIN_PEAK_GIB, hi=cap)
        runs.append(Run(i, job, plan, float(step), None if peak is None else peak * GIB))
    return runs, micro
