"""evaluate, explain and whatif mark a plan above the --mem-headroom margin as solve does
(search/capacity.py, issue 28.5): evaluated against the GPU's whole memory, `fits` against
it, `memory.near_capacity` above (1 - h) x capacity, `memory.oom_risk` from the memory
interval; a plan over the whole memory does not fit and is not "near" it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoparallel_cp import api, whatif
from autoparallel_cp.cli import main
from autoparallel_cp.cost.uncertainty import default_mem_headroom

JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len", "8192",
       "--global-batch", "512"]
#: 77.7 of 79.1 GiB: between the default margin (84.8 % of memory) and the capacity
NEAR = "tp=4,pp=2,vpp=4,cp=2,sp=1,zero=1,mbs=1,recompute=none"
OVER = "tp=2,pp=2,cp=1,sp=1,zero=0,mbs=1,recompute=none"


def _evaluate(tmp_path: Path, plan: str, *extra: str) -> dict:
    out = tmp_path / "p.json"
    r = CliRunner().invoke(main, ["evaluate", *JOB, "--plan", plan, "--json", str(out),
                                  *extra])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def test_evaluate_marks_a_near_capacity_plan_like_solve(tmp_path: Path) -> None:
    d = _evaluate(tmp_path, NEAR)
    mem = d["memory"]
    assert d["fits"] is True
    assert mem["near_capacity"] is True
    assert mem["mem_headroom"] == pytest.approx(default_mem_headroom())
    assert mem["required_bytes"] > (1 - default_mem_headroom()) * mem["capacity_bytes"]
    job = api.make_job("llama3-70b", "dgx-h100", gpus=512, seq_len=8192, global_batch=512)
    ev = api.evaluate(job, NEAR)
    assert mem["oom_risk"] == pytest.approx(ev.memory.oom_risk, rel=1e-12)
    assert 0.5 < mem["oom_risk"] < 1.0
    # the same figures as the plan's row in solve's JSON: solve pins it to one key
    out = tmp_path / "s.json"
    r = CliRunner().invoke(main, ["solve", *JOB, "--fix", NEAR + ",dp_replicate=1",
                                  "--top-k", "1", "--json", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    s = json.loads(out.read_text())["plans"][0]
    assert s["memory"]["near_capacity"] is True
    assert s["memory"]["oom_risk"] == pytest.approx(mem["oom_risk"], rel=1e-12)
    assert s["time"]["step_s"] == pytest.approx(d["time"]["step_s"], rel=1e-12)


def test_evaluate_margin_zero_and_a_plan_over_capacity(tmp_path: Path) -> None:
    d = _evaluate(tmp_path, NEAR, "--mem-headroom", "0")
    assert d["fits"] is True and d["memory"]["near_capacity"] is False
    over = _evaluate(tmp_path, OVER)
    assert over["fits"] is False and over["memory"]["near_capacity"] is False
    r = CliRunner().invoke(main, ["evaluate", *JOB, "--plan", NEAR])
    assert "near capacity" in r.output and "risk of running out of memory" in r.output


def test_whatif_keeps_the_near_capacity_plan_with_its_risk() -> None:
    """The pinned key's only plans are above the margin: the headroom cut made the point
    infeasible; the near-capacity rule returns the plan, marked."""
    (pt,) = whatif.build_points(model="llama3-70b", clusters=["dgx-h100"], gpus=[512],
                                seq_lens=[8192], global_batches=[512])
    job = pt.job.model_copy(update={"mem_headroom": default_mem_headroom()})
    rows = whatif.run_sweep([type(pt)(pt.coords, job)], fix=NEAR + ",dp_replicate=1",
                            time_limit=30, jobs=1)
    (row,) = rows
    assert row["status"] == "optimal"
    assert row["near_capacity"] is True and 0.5 < row["oom_risk"] < 1.0
    assert row["peak_gib"] is not None
    assert "!" in str(whatif.rows_table(rows).columns[9]._cells[0])
