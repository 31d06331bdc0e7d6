"""`--trace FILE.json`: the predicted step as a Chrome trace (Trace Event Format) from
`evaluate`, `explain` and `solve`; its complete events add up to the plan's breakdown."""

from __future__ import annotations

import inspect
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp import api
from autoparallel_cp.cli import main
from autoparallel_cp.trace import check_events, chrome_trace, stage_ranks

# the README's job (llama3-70b on 512 H100s) and its recommended plan
README_JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len",
              "8192", "--global-batch", "512"]
README_PLAN = "dp=16,tp=2,pp=4,vpp=4,cp=4,sp=1,zero=2,mbs=1"
SMALL = ["--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "32"]
BREAKDOWN = {"compute": "compute_s", "bubble": "bubble_s", "tp": "tp_comm_s",
             "cp": "cp_comm_s", "ep": "ep_comm_s", "pp": "pp_comm_s", "dp": "dp_comm_s",
             "optimizer": "optimizer_s", "fixed": "fixed_s"}


def run(*args: str) -> Any:
    kw = ({"mix_stderr": False}
          if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters else {})
    return CliRunner(**kw).invoke(main, list(args), catch_exceptions=False)


def check_trace(trace: dict[str, Any], plan: dict[str, Any]) -> None:
    """Well formed; the span is the step; the critical events' sums are the breakdown."""
    assert trace["displayTimeUnit"] == "ms"
    assert check_events(trace) == []
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for e in complete:
        assert {"ph", "ts", "dur", "pid", "tid", "name", "cat", "args"} <= set(e)
    span = (max(e["ts"] + e["dur"] for e in complete) - min(e["ts"] for e in complete)) / 1e6
    t = plan["time"]
    assert span == pytest.approx(t["step_s"], rel=1e-6)
    sums: dict[str, float] = defaultdict(float)
    for e in complete:
        if e["args"].get("critical"):
            sums[e["cat"]] += e["dur"] / 1e6
    for cat, field in BREAKDOWN.items():
        # microsecond rounding of each event (3 decimals) bounds the error
        assert sums[cat] == pytest.approx(t[field], abs=1e-8 * len(complete) + 1e-9), cat
    pp = plan["plan"]["pp"]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == list(range(1, pp + 1))
    threads = {e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "TP comm", "CP comm", "EP comm", "PP send", "PP recv", "DP reduce",
            "DP gather", "optimizer", "bubble / idle"} <= threads


def test_readme_job_trace_from_evaluate(tmp_path: Path) -> None:
    path = tmp_path / "step.json"
    out = tmp_path / "plan.json"
    r = run("evaluate", *README_JOB, "-p", README_PLAN, "--trace", str(path), "--json",
            str(out), "-q")
    assert r.exit_code == 0, r.output
    trace = json.loads(path.read_text())
    plan = json.loads(out.read_text())
    check_trace(trace, plan)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    # pp outermost: 512 GPUs over 4 stages, 128 consecutive ranks each
    assert names[1].startswith("stage 0 (ranks 0-127)")
    assert names[4].startswith("stage 3 (ranks 384-511)")
    # every micro-batch's forward and backward of every chunk on every stage
    fwd = {(e["pid"], e["args"]["microbatch"], e["args"]["chunk"], e["args"]["pass"])
           for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "compute"}
    assert len(fwd) == 4 * 32 * 4 * 2


def test_explain_and_solve_write_traces(tmp_path: Path) -> None:
    a, b, js = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "plans.json"
    r = run("explain", *SMALL, "-p", "tp=2,pp=2,mbs=1,zero=1", "--trace", str(a), "-q")
    assert r.exit_code == 0, r.output
    assert check_events(json.loads(a.read_text())) == []
    r = run("solve", *SMALL, "--fix", "cp=1", "--top-k", "3", "--time-limit", "10", "--trace",
            str(b), "--trace-rank", "2", "--json", str(js), "-q")
    assert r.exit_code == 0, r.output
    plans = json.loads(js.read_text())["plans"]
    trace = json.loads(b.read_text())
    check_trace(trace, plans[1])
    assert trace["otherData"]["step_s"] == pytest.approx(plans[1]["time"]["step_s"])


def test_trace_rank_past_the_table_is_a_user_error(tmp_path: Path) -> None:
    r = run("solve", *SMALL, "--fix", "pp=1,cp=1,vpp=1", "--top-k", "2", "--time-limit", "10",
            "--trace", str(tmp_path / "t.json"), "--trace-rank", "9", "-q")
    assert r.exit_code == 2
    assert "--trace-rank 9: only" in r.stderr
    assert not (tmp_path / "t.json").exists()


def test_trace_path_follows_the_output_rule(tmp_path: Path) -> None:
    same = tmp_path / "x.json"
    r = run("evaluate", *SMALL, "-p", "tp=2,mbs=1", "--trace", str(same), "--json", str(same))
    assert r.exit_code == 2 and "the same file" in r.stderr
    r = run("evaluate", *SMALL, "-p", "tp=2,mbs=1", "--trace", str(tmp_path / "no" / "t.json"))
    assert r.exit_code == 2 and "does not exist" in r.stderr
    assert "Traceback" not in r.output


def test_check_events_finds_broken_events() -> None:
    assert check_events({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "pid": 1,
                                          "tid": 1}]}) == ["event 0: 'dur' missing or not "
                                                           "(<class 'int'>, <class 'float'>)"]
    assert check_events({"traceEvents": [{"ph": "X", "name": "a", "ts": -1.0, "dur": 1,
                                          "pid": 1, "tid": True}]}) != []
    assert check_events({"traceEvents": {}}) == ["traceEvents is not a list"]


def test_stage_ranks_follow_the_pipeline_outermost_order() -> None:
    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=16, seq_len=2048, global_batch=32)
    ev = api.evaluate(job, "tp=2,pp=4,mbs=1")
    assert [stage_ranks(job, ev.plan, j) for j in range(4)] == [(0, 3), (4, 7), (8, 11),
                                                                 (12, 15)]
    trace = chrome_trace(job, ev.plan, ev.to_json())
    check_trace(trace, ev.to_json())


def test_trace_to_stdout_moves_the_report_to_stderr() -> None:
    r = run("evaluate", *SMALL, "-p", "tp=2,pp=2,mbs=1", "--trace", "-")
    assert r.exit_code == 0, r.output
    trace = json.loads(r.stdout)  # nothing but the trace on stdout
    assert check_events(trace) == []
    assert "Plan breakdown" in r.stderr


def test_flow_arrows_join_passes_across_stages() -> None:
    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=16, seq_len=2048, global_batch=32)
    ev = api.evaluate(job, "tp=1,pp=4,vpp=2,mbs=1")
    trace = chrome_trace(job, ev.plan, ev.to_json())
    events = trace["traceEvents"]
    flows = [e for e in events if e["ph"] in ("s", "f")]
    m = ev.plan.num_microbatches
    # every pass but stage 0's first chunk's forward and the last stage's last chunk's backward
    # receives from another stage: 2·(pp·vpp - 1)·m arrows
    assert len(flows) == 2 * 2 * (4 * 2 - 1) * m
    compute = [e for e in events if e["ph"] == "X" and e["cat"] == "compute"]
    by_id: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in flows:
        by_id[f["id"]].append(f)
        # bound to its enclosing slice: inside a compute slice of its stage and row
        assert any(c["pid"] == f["pid"] and c["tid"] == f["tid"]
                   and c["ts"] <= f["ts"] <= c["ts"] + c["dur"] for c in compute)
    for pair in by_id.values():
        start, end = sorted(pair, key=lambda e: e["ph"] != "s")
        assert start["ph"] == "s" and end["ph"] == "f" and end["bp"] == "e"
        assert start["pid"] != end["pid"] and start["ts"] < end["ts"]


def test_the_python_calls_the_user_guide_names() -> None:
    from autoparallel_cp import evaluate, make_job
    from autoparallel_cp.cost.timeline import timeline

    job = make_job("llama3-8b", "dgx-h100", gpus=64, seq_len=8192, global_batch=256)
    ev = evaluate(job, "tp=4,pp=2,mbs=1,sp=1,zero=1")
    tl = timeline(job, ev.plan)
    assert sum(tl.kind_sums().values()) == pytest.approx(ev.time.step_s, rel=1e-9)
    assert check_events(chrome_trace(job, ev.plan)) == []


@pytest.mark.parametrize(("plan", "split"), [("tp=1,pp=4,vpp=2,mbs=1,schedule=zbv", True),
                                             ("tp=1,pp=4,vpp=2,mbs=1,schedule=dualpipev", True),
                                             ("tp=1,pp=4,mbs=1,schedule=zb-h1", True),
                                             ("tp=1,pp=4,mbs=1,schedule=dualpipe", True),
                                             ("tp=1,pp=4,vpp=2,mbs=1", False)])
def test_every_schedule_traces_its_own_passes(plan: str, split: bool) -> None:
    """W passes and F&B pairs are drawn as such, named as torch's profiler names them where
    torch runs the schedule, and every arrow goes forward in time."""
    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=16, seq_len=2048, global_batch=32)
    ev = api.evaluate(job, plan)
    trace = chrome_trace(job, ev.plan, ev.to_json())
    assert check_events(trace) == []
    events = trace["traceEvents"]
    passes = {e["args"]["pass"] for e in events if e["ph"] == "X" and "pass" in e["args"]}
    assert ("W" in passes) == split
    ranges = [e["args"]["profiler_range"] for e in events
              if e["ph"] == "X" and "profiler_range" in e["args"]]
    sched = ev.plan.pipeline_schedule
    kinds = {re.fullmatch(r"PP:(\d+)([FIWB])(\d+)", r).group(2)  # type: ignore[union-attr]
             for r in ranges}
    if sched in ("zbv", "dualpipev"):
        assert {"F", "I", "W"} <= kinds
        stages = {int(re.fullmatch(r"PP:(\d+)\D.*", r).group(1))  # type: ignore[union-attr]
                  for r in ranges}
        assert stages == set(range(8))  # the V's 2·pp stages
    elif sched == "interleaved":
        assert kinds == {"F", "B"}
    else:
        assert ranges == []
    if sched in ("dualpipe", "dualpipev"):
        assert any("F&B overlapped pair" in e["name"] for e in events if e["ph"] == "X")
    flows = [e for e in events if e["ph"] in ("s", "f")]
    by_id: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for f in flows:
        by_id[f["id"]].append(f)
    assert by_id
    for pair in by_id.values():
        start, end = sorted(pair, key=lambda e: e["ph"] != "s")
        assert start["ts"] < end["ts"]
