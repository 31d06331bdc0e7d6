"""Near-capacity plans (issue 28.5): returned with their OOM risk, not dropped; the
recommendation stays within the --mem-headroom margin."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from autoparallel_cp import api
from autoparallel_cp.cli import main
from autoparallel_cp.cost.uncertainty import (
    MEMORY_LOG_ERROR,
    default_mem_headroom,
    near_capacity,
    oom_risk,
)
from autoparallel_cp.search.capacity import annotate, risk_text, safe_ranked

JOB405 = ["--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "16384",
          "--seq-len", "8192", "--global-batch", "2048"]


def _job() -> object:
    return api.make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=64)


def test_oom_risk_is_ten_percent_at_the_default_margin_and_monotone() -> None:
    job = _job()
    cap = 80e9
    edge = cap * math.exp(-MEMORY_LOG_ERROR[1])  # the 90th-percentile under-prediction
    assert abs(oom_risk(job, edge, cap) - 0.10) < 1e-9
    # the default headroom is that edge, rounded to 0.1 %
    assert abs(oom_risk(job, cap * (1 - default_mem_headroom()), cap) - 0.10) < 1e-3
    risks = [oom_risk(job, f * cap, cap) for f in (0.5, 0.8, 0.9, 0.95, 1.0, 1.1)]
    assert risks == sorted(risks) and risks[0] < 1e-6 and risks[-1] > 0.9
    # the median error is an under-prediction (q10 + q90 > 0): a plan at capacity likelier fails
    assert oom_risk(job, cap, cap) > 0.5
    assert oom_risk(job, 0.0, cap) == 0.0


def test_annotate_and_safe_ranked() -> None:
    dicts = [{"memory": {"required_bytes": 90.0, "capacity_bytes": 100.0, "oom_risk": 0.3}},
             {"memory": {"required_bytes": 80.0, "capacity_bytes": 100.0, "oom_risk": 0.01}}]
    annotate(dicts, 0.15)
    assert [d["memory"]["near_capacity"] for d in dicts] == [True, False]
    assert risk_text(dicts[0]) == "!30%" and risk_text(dicts[1]) == ""
    assert near_capacity(85.0, 100.0, 0.15) is False  # the edge itself is within the margin
    assert safe_ranked([("a", 1.0), ("b", 2.0)], dicts) == [("b", 2.0)]  # type: ignore[list-item]


def test_llama3_405b_production_layout_appears_with_its_risk() -> None:
    """Meta's layout (tp 8, pp 16, cp 1 on 16K H100, Llama 3 paper Table 4) at 76.9 / 79.1
    GiB with vpp 2 was left out by the 15.2 % default headroom; it is now returned, marked."""
    fix = "tp=8,pp=16,cp=1,vpp=2,zero=1,mbs=1"
    r = CliRunner().invoke(main, ["solve", *JOB405, "--fix", fix, "--top-k", "2",
                                  "--time-limit", "20", "--json", "-", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    near = [p for p in doc["plans"] if p["memory"]["near_capacity"]]
    assert near, "the near-capacity plans must be returned"
    for p in near:
        mem = p["memory"]
        assert p["fits"] is True  # it fits the GPU's memory, as published runs do
        assert mem["required_bytes"] > mem["capacity_bytes"] * (1 - default_mem_headroom())
        assert 0.1 < mem["oom_risk"] < 1.0
    # the same search with the headroom as a capacity cut (the old answer) drops them
    job = api.make_job("llama3-405b", "dgx-h100", gpus=16384, seq_len=8192,
                       global_batch=2048).calibrated(None, default_mem_headroom())
    old = api.solve(job, fix=fix, top_k=2, time_limit=20)
    keys = {json.dumps(p["plan"], sort_keys=True) for p in near}
    assert not keys & {json.dumps(e.to_json()["plan"], sort_keys=True) for e in old.plans}


def test_terminal_marks_risk_and_recommends_within_the_margin() -> None:
    r = CliRunner().invoke(main, ["solve", *JOB405, "--fix", "tp=8,pp=16,cp=1,zero=1,mbs=1",
                                  "--top-k", "2", "--time-limit", "20"])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.stdout.split())  # sentences may wrap on the terminal's width
    assert "!" in flat and "risk of running out of memory" in flat
    assert "#1 is near capacity" in flat
    rec = next(line for line in r.stdout.splitlines() if line.startswith("recommended:"))
    gib = float(rec.split("mem ")[1].split(" GiB")[0])
    assert gib <= 79.1 * (1 - default_mem_headroom())


def test_csv_carries_the_risk_and_the_evidence_mark() -> None:
    import csv
    import io

    from autoparallel_cp.outputs import plans_csv

    d = {"plan": {"dp": 1}, "memory": {"oom_risk": 0.25, "near_capacity": True},
         "time": {}, "throughput": {}, "evidence": {"beyond_evidence": False}}
    row = next(csv.DictReader(io.StringIO(plans_csv([d]))))
    assert (row["oom_risk"], row["near_capacity"], row["beyond_evidence"]) == \
        ("0.25", "True", "False")
