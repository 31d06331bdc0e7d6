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
from autoparallel_cp.spec.loaders import load_cluster, load_model, load_recipe
from autoparallel_cp.spec.plan import Plan, PlanError, parse_plan, plan_violations


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
         required: bool = True) -> float | None:
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
    return v


def _text(path: str, row: int, rec: Mapping[str, str], field: str,
          default: str | None) -> str:
    v = (rec.get(field) or "").strip() or default
    if not v:
        raise _err(path, row, field, f"missing value (no column and no --{field} option)")
    return v


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's data rows as dicts (UserError when the file cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise UserError(f"{path}: empty file (a CSV with a header row is expected)")
    rows = [{(k or "").strip(): (v or "") for k, v in r.items()} for r in reader]
    if not rows:
        raise UserError(f"{path}: no data rows")
    return rows


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
        if not Path(name).is_file() and (here / name).is_file():
            name = str(here / name)  # a file named relative to the CSV (ap-solve measure)
        if key not in cache:
            loader = {"model": load_model, "cluster": load_cluster, "recipe": load_recipe}[kind]
            try:
                cache[key] = loader(name)
            except (UserError, ValidationError, ValueError, OSError) as exc:
                msg = " ".join(str(exc).split())
                raise _err(p, row, kind, f"unknown or invalid {kind} {name!r} ({msg})") from None
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
        gpus = int(_num(p, i, rec, "gpus", integer=True) or 0)
        seq = int(_num(p, i, rec, "seq_len", integer=True) or 0)
        gb = int(_num(p, i, rec, "global_batch", integer=True) or 0)
        try:
            sub = c.take_gpus(gpus)  # type: ignore[attr-defined]
        except ValueError as exc:
            raise _err(p, i, "gpus", str(exc)) from None
        job = Job(model=m, cluster=sub, recipe=r, seq_len=seq, global_batch=gb)
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
        step = _num(p, i, rec, "step_s", required=False)
        tps = _num(p, i, rec, "tokens_per_s_per_gpu", required=False)
        if step is None and tps is None:
            raise _err(p, i, "step_s", "give step_s or tokens_per_s_per_gpu")
        if step is None:
            step = job.tokens_per_step / (float(tps or 1.0) * job.num_gpus)
        peak = _num(p, i, rec, "peak_gib", required=False)
        runs.append(Run(i, job, plan, float(step), None if peak is None else peak * GIB))
    return runs, micro
