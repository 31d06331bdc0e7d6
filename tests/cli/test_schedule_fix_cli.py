"""`solve --fix schedule=...` through the CLI: a searched schedule (gpipe) is solved and its
plans and JSON `space` say so; an unsearched one is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import FAST, SMALL, assert_user_error, run

from autoparallel_cp.spec import ModelSpec


def test_fix_gpipe_solves_and_the_json_names_it() -> None:
    result, out, err = run("solve", *SMALL, "--fix", "schedule=gpipe,pp=2,cp=1", "--top-k", "2",
                           *FAST, "--json", "-")
    assert result.exit_code == 0, (result.exit_code, err)
    doc = json.loads(out)
    assert doc["space"]["schedule"] == ["gpipe"]
    assert doc["plans"] and all(p["plan"]["schedule"] == "gpipe" for p in doc["plans"])


def test_fix_zbv_solves_and_the_json_names_it() -> None:
    """ZBV is searched (search/replay_axis.py): its plans are V-shaped (vpp 2) and the JSON
    `space` names the schedule."""
    result, out, err = run("solve", *SMALL, "--fix", "schedule=zbv,cp=1", "--top-k", "2",
                           *FAST, "--json", "-")
    assert result.exit_code == 0, (result.exit_code, err)
    doc = json.loads(out)
    assert doc["space"]["schedule"] == ["zbv"]
    assert doc["plans"] and all(p["plan"]["schedule"] == "zbv" and p["plan"]["vpp"] == 2
                                for p in doc["plans"])


def test_fix_dualpipe_solves_and_the_json_names_it() -> None:
    """DualPipe is searched (search/model_scored.py): one chunk per rank, an even pp."""
    result, out, err = run("solve", *SMALL, "--fix", "schedule=dualpipe,cp=1", "--top-k", "2",
                           *FAST, "--json", "-")
    assert result.exit_code == 0, (result.exit_code, err)
    doc = json.loads(out)
    assert doc["space"]["schedule"] == ["dualpipe"]
    assert doc["plans"] and all(p["plan"]["schedule"] == "dualpipe" and p["plan"]["vpp"] == 1
                                and p["plan"]["pp"] % 2 == 0 for p in doc["plans"])


def test_fix_unsearched_schedule_is_one_line_exit_2() -> None:
    assert_user_error(["solve", *SMALL, "--fix", "schedule=dualpipe,pp=1", *FAST],
                      "pp", "pp=1")
    assert_user_error(["enumerate", *SMALL, "--fix", "activation_offload=999", "--quiet"],
                      "activation_offload", "layer count")
    # Megatron runs CPU activation offloading at pp = 1 only (spec/frameworks.py): under
    # --emit megatron a pinned pp > 1 beside it is exit 2 naming the row
    assert_user_error(["solve", *SMALL, "--emit", "megatron", "--fix",
                       "activation_offload=2,pp=2", *FAST], "activation_offload")
    # the optimizer share is searched (search/offload_axis.py): out of range is exit 2
    assert_user_error(["enumerate", *SMALL, "--fix", "optimizer_offload=1.5", "--quiet"],
                      "optimizer_offload", "at most 1")


def test_the_deepspeed_recipe_refuses_a_schedule_its_pipeline_engine_does_not_run() -> None:
    # --recipe deepspeed costs Megatron-DeepSpeed, whose pipeline is DeepSpeed's 1F1B
    # TrainSchedule (spec/framework_rows_unemitted.py): a pinned GPipe is exit 2 naming it
    assert_user_error(["solve", *SMALL, "--recipe", "deepspeed", "--fix", "schedule=gpipe",
                       *FAST], "schedule", "megatron-deepspeed does not run it", "TrainSchedule")


def test_fix_zb_h1_solves_and_says_which_bubble_it_removes() -> None:
    """A zero-bubble pin is searched (search/schedule_axis.py): its plans carry the schedule,
    the JSON `space` names it, and the report says the bubble against 1F1B's on the same plan
    (report.schedule_line)."""
    result, out, err = run("solve", *SMALL, "--fix", "schedule=zb-h1,pp=2,cp=1", "--top-k", "2",
                           *FAST, "--json", "-")
    assert result.exit_code == 0, (result.exit_code, err)
    doc = json.loads(out)
    assert doc["space"]["schedule"] == ["zb-h1"]
    assert doc["plans"] and all(p["plan"]["schedule"] == "zb-h1" for p in doc["plans"])
    result, out, err = run("solve", *SMALL, "--fix", "schedule=zb-h1,pp=2,cp=1", "--top-k", "2",
                           *FAST)
    assert result.exit_code == 0, (result.exit_code, err)
    line = next(x for x in out.splitlines() if "schedule zb-h1: bubble" in x)
    assert "against 1f1b on the same plan" in line and "shorter" in line


@pytest.mark.parametrize("fix, pp", [("activation_offload=2", None),
                                     ("activation_offload=2,pp=1", 1),
                                     ("activation_offload=2,pp=2", 2)])
def test_fix_activation_offload_solves_a_plan_evaluate_agrees_with(fix: str,
                                                                   pp: int | None) -> None:
    """`solve --fix activation_offload=2` (search/act_offload.py), alone or with pp pinned to
    1 or 2: every plan offloads two layers per stage (pp as pinned), and `evaluate` of the
    plan gives the step time and fit solve reported."""
    from autoparallel_cp.spec.plan import Plan

    result, out, err = run("solve", *SMALL, "--fix", fix, "--top-k", "2", *FAST, "--json", "-")
    assert result.exit_code == 0, (result.exit_code, err)
    doc = json.loads(out)
    assert doc["plans"]
    for p in doc["plans"]:
        assert p["plan"]["activation_offload"] == 2 and p["plan"]["pp"] == (pp or p["plan"]["pp"])
        r2, out2, err2 = run("evaluate", *SMALL, "--plan", Plan(**p["plan"]).short(),
                             "--json", "-")
        assert r2.exit_code == 0, (r2.exit_code, err2)
        ev = json.loads(out2)
        ev = ev["plans"][0] if "plans" in ev else ev
        assert ev["fits"] and ev["time"]["step_s"] == p["time"]["step_s"]


def test_search_also_offload_names_the_activations_it_removes() -> None:
    """Llama 2 13B on 8 A100 40 GB with `--search-also offload`: #1 offloads 20 layers'
    activations, and the line under `fastest:` says which GPU memory that removes and that the
    plan does not fit without it."""
    result, out, err = run("solve", "--model", "llama2-13b", "--cluster", "dgx-a100-40g",
                           "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
                           "--search-also", "offload", "--top-k", "2", "--time-limit", "30",
                           "--workers", "1")
    assert result.exit_code == 0, (result.exit_code, err)
    assert "activation_offload 20: GPU memory" in out
    assert "without it the plan does not fit" in out
    assert "activations of 0, 20, 39 layers on the host" in out


def test_an_interleaved_offload_pin_is_searched() -> None:
    """A pinned activation offload searches every vpp (search/act_offload.py): vpp = 2 at
    pp = 2 beside it gives interleaved plans offloading 2 layers per stage, not exit 2."""
    result, out, _ = run("solve", *SMALL, "--fix", "activation_offload=2,pp=2,vpp=2",
                         "--top-k", "2", *FAST, "--json", "-")
    assert result.exit_code == 0, result.output
    doc = json.loads(out)
    assert doc["plans"] and all(p["plan"]["vpp"] == 2 and p["plan"]["activation_offload"] == 2
                                for p in doc["plans"])


def test_an_empty_first_rank_is_contrasted_with_the_default_split(tmp_path: Path) -> None:
    """#1 is a ZBV plan whose rank 0 holds no layer (6 layers on pp 4 at a 128k vocabulary,
    tests/search/test_empty_rank.py): interleaved 1F1B cannot leave a stage empty, so the line
    compares it with the same plan under the default schedule's own split, and says so (the
    command used to stop with exit 2 on its own answer)."""
    model = tmp_path / "model.json"
    model.write_text(ModelSpec(
        name="mini-128k", num_layers=6, hidden_size=1024, ffn_hidden_size=2816,
        num_attention_heads=8, num_kv_heads=4, vocab_size=128000).model_dump_json())
    result, out, err = run("solve", "--model", str(model), "--cluster", "dgx-a100-40g",
                           "--gpus", "4", "--seq-len", "4096", "--global-batch", "16",
                           "--fix", "schedule=zbv,pp=4", "--top-k", "1",
                           "--time-limit", "10", "--workers", "2", "--json", str(
                               tmp_path / "out.json"))
    assert result.exit_code == 0, (result.exit_code, err)
    plan = json.loads((tmp_path / "out.json").read_text())["plans"][0]["plan"]
    assert plan["schedule"] == "zbv" and plan["stage_layers"][0] == 0
    assert ("against interleaved on the same plan with its default layer split"
            in " ".join(out.split()))
