"""Plans round-trip: `--plan` and `--fix` accept what the JSON output and `Plan.short()` write
(issue #32: a plan copied from the JSON, `"stage_layers": [4, 4, ...]`, was refused)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.api import evaluate, make_job
from autoparallel_cp.cli import main
from autoparallel_cp.spec.plan import (
    RECOMPUTE_MODES,
    Plan,
    PlanError,
    parse_assignments,
    parse_plan,
)

small = st.integers(1, 64)
layers = st.lists(st.integers(1, 40), min_size=1, max_size=8).map(tuple)


@st.composite
def plans(draw: Any) -> Plan:
    return Plan(
        dp=draw(small), tp=draw(small), pp=draw(small), vpp=draw(st.integers(1, 8)),
        cp=draw(small), ep=draw(small), sp=draw(st.integers(0, 1)), zero=draw(st.integers(0, 3)),
        mbs=draw(small), num_microbatches=draw(st.integers(1, 512)),
        recompute=draw(st.sampled_from(RECOMPUTE_MODES)),
        recompute_layers=draw(st.none() | st.integers(0, 40)),
        stage_layers=draw(st.none() | layers),
        chunk_layers=draw(st.none() | st.lists(st.integers(0, 40), min_size=1,
                                              max_size=8).map(tuple)),
        stage_groups=draw(st.none() | st.lists(st.integers(0, 3), min_size=1,
                                              max_size=8).map(tuple)),
        etp=draw(st.none() | small))


def _json_plan(plan: Plan) -> dict[str, Any]:
    """The INTERFACE.md PLAN object: every field set, lists for the splits."""
    return {k: list(v) if isinstance(v, tuple) else v
            for k, v in plan.model_dump().items() if v is not None}


@settings(max_examples=200, deadline=None)
@given(plans())
def test_json_of_a_plan_parses_back(plan: Plan) -> None:
    doc = _json_plan(plan)
    assert parse_plan(json.dumps(doc)) == plan
    assert parse_plan(json.dumps({"plan": doc, "fits": True})) == plan  # a "plans" entry
    assert parse_plan(json.dumps(doc)[1:-1]) == plan  # its members, copied without braces
    # key=value text with JSON lists, as copied field by field
    text = ",".join(f"{k}={json.dumps(v) if isinstance(v, list) else v}"
                    for k, v in doc.items())
    assert parse_plan(text) == plan


@settings(max_examples=200, deadline=None)
@given(plans())
def test_short_text_parses_back(plan: Plan) -> None:
    """`short()` leaves out the micro-batch count, which `parse_plan` derives from the job."""
    job = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096,
                   global_batch=plan.dp * plan.mbs * plan.num_microbatches)
    assert parse_plan(plan.short(), job) == plan
    assert parse_plan(plan.short()) == plan.model_copy(update={"num_microbatches": 1})


def test_evaluate_output_is_accepted_by_plan(tmp_path: Any) -> None:
    job_args = ["-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
                "--global-batch", "64"]
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    plan = parse_plan("tp=2,pp=4,zero=1,mbs=1,stage_layers=7:9:9:7", job)
    doc = evaluate(job, plan).to_json()
    assert parse_plan(json.dumps(doc["plan"])) == plan
    for text in (json.dumps(doc["plan"]), '"stage_layers": [7, 9, 9, 7], "tp": 2, "pp": 4, '
                 '"zero": 1', "tp=2,pp=4,zero=1,stage_layers=[7, 9, 9, 7]"):
        res = CliRunner().invoke(main, ["evaluate", *job_args, "--plan", text, "-q"])
        assert res.exit_code == 0, (text, res.output)


@pytest.mark.parametrize("text,match", [
    ('{"dp": 1, "dp": 2}', "given twice"),
    ('{"dp": 8.0}', "expected an integer"),
    ('{"tp": 2', "JSON plan object"),
    ('"x": 1', "unknown plan field 'x'"),
    ("[1, 2]", "expected KEY=VALUE"),
    ("stage_layers=[4, a]", "integers separated"),
    ('{"dp": ' + "[" * 100000, "JSON plan object"),
])
def test_bad_plan_text_is_one_plan_error(text: str, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        parse_assignments(text)
