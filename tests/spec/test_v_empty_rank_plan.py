"""The plan rule of a V's empty rank 0 (spec/plan.py `empty_first_ok`, `split_violations`):
under zbv / dualpipev rank 0 (embedding and head) may hold no layer, by chunk_layers or by
stage_layers; every other rank, and every rank of the other schedules, keeps >= 1 layer, and
what stays refused names the rule (exit 2 on the command line)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main
from autoparallel_cp.spec.plan import EMPTY_RULE, Plan, parse_plan, split_violations


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_a_v_rank_0_may_be_empty(sched: str) -> None:
    for plan in (Plan(pp=4, vpp=2, schedule=sched, chunk_layers=(0, 1, 1, 1, 0, 1, 1, 1)),
                 Plan(pp=4, vpp=2, schedule=sched, stage_layers=(0, 2, 2, 2))):
        assert split_violations(6, plan) == []
        assert plan.layers_per_stage(6) == (0, 2, 2, 2)
        assert plan.chunks_per_stage(6)[0] == (0, 0)
    assert parse_plan(f"pp=4,vpp=2,schedule={sched},stage_layers=0:2:2:2").stage_layers == (
        0, 2, 2, 2)


@pytest.mark.parametrize("fields", [
    {"schedule": "zbv", "chunk_layers": (1, 0, 1, 1, 1, 0, 1, 1)},  # rank 1 empty
    {"schedule": "zbv", "stage_layers": (2, 0, 2, 2)},
    {"schedule": "interleaved", "chunk_layers": (0, 2, 2, 2, 0, 0, 0, 0)},
    {"schedule": None, "stage_layers": (0, 2, 2, 2)},
])
def test_every_other_empty_stage_is_refused_with_the_rule(fields: dict) -> None:
    plan = Plan(pp=4, vpp=2, **fields)
    bad = split_violations(6, plan)
    assert bad and EMPTY_RULE in bad[0]
    assert "without layers" in bad[0]


def test_one_chunk_schedules_keep_every_stage() -> None:
    assert split_violations(6, Plan(pp=2, stage_layers=(0, 6), schedule="zb-h1"))
    r = CliRunner().invoke(main, [
        "evaluate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "-p",
        "tp=2,pp=4,vpp=2,chunk_layers=0:8:8:8:0:4:4:0"])
    assert r.exit_code == 2 and "without layers" in r.output and "Traceback" not in r.output
    ok = CliRunner().invoke(main, [
        "evaluate", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "--global-batch",
        "64", "-p", "tp=2,pp=4,vpp=2,schedule=zbv,chunk_layers=0:5:5:6:0:5:5:6"])
    assert ok.exit_code == 0, ok.output
