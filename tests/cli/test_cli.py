"""`ap-solve` through click's CliRunner: every exit code of INTERFACE.md, files written."""

from __future__ import annotations

import csv
import inspect
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main

TINY_MODEL = """\
name: tiny-test
num_layers: 8
hidden_size: 1024
ffn_hidden_size: 4096
num_attention_heads: 16
num_kv_heads: 4
vocab_size: 32000
"""

# a small job: 8 H100s, a 1B-class model, short sequences
SMALL = ["--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "32"]
# a narrowed space (no pipeline / context parallelism) so CP-SAT proves optimality in < 1 s
NARROW = "pp=1,cp=1,vpp=1"
FAST = ["--time-limit", "10", "--workers", "2", "--quiet"]


Solved = tuple[Any, str, str, Path, Path]


def _runner() -> CliRunner:
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg,unused-ignore]
    return CliRunner()


def run(*args: str) -> tuple[Any, str, str]:
    result = _runner().invoke(main, list(args), catch_exceptions=False)
    return result, result.stdout, result.stderr


def assert_user_error(args: list[str], *needles: str) -> str:
    result, _, err = run(*args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    line = [x for x in err.splitlines() if x.strip()]
    assert len(line) == 1, err  # one clear line
    for n in needles:
        assert n in err, (n, err)
    return err


# --------------------------------------------------------------------------------------------
# exit 2: bad input, one line naming the file / field
# --------------------------------------------------------------------------------------------


def test_unknown_model_preset() -> None:
    assert_user_error(["solve", "--model", "llama3-70", "--cluster", "dgx-h100", "--gpus", "8"],
                      "unknown model preset", "llama3-70b")


def test_missing_model_file() -> None:
    assert_user_error(["solve", "--model", "./no/such/model.yaml", "--cluster", "dgx-h100"],
                      "no/such/model.yaml")


def test_bad_model_field_names_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_MODEL.replace("num_kv_heads: 4", "num_kv_heads: 3"))
    assert_user_error(["evaluate", "--model", str(bad), "--cluster", "dgx-h100", "--gpus", "8",
                       "--plan", "tp=1"], "bad.yaml", "num_kv_heads")


def test_typo_in_cluster_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("name: c\nnode_group:\n  - name: x\n")
    assert_user_error(["solve", "--model", "gpt3-1.3b", "--cluster", str(bad)], "c.yaml",
                      "node_group")


def test_yaml_syntax_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\n")
    assert_user_error(["solve", "--model", str(bad), "--cluster", "dgx-h100"], "broken.yaml")


def test_gpus_not_whole_nodes() -> None:
    assert_user_error(["solve", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "12"],
                      "--gpus", "whole number")


def test_gpus_and_nodes_together() -> None:
    assert_user_error(["solve", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8",
                       "--nodes", "1"], "--gpus", "--nodes")


def test_bad_fix_field() -> None:
    assert_user_error(["solve", *SMALL, "--fix", "tpp=2"], "tpp")


def test_bad_plan_value() -> None:
    assert_user_error(["evaluate", *SMALL, "--plan", "tp=eight"], "'tp'", "integer")


def test_illegal_plan_lists_broken_rules() -> None:
    assert_user_error(["evaluate", *SMALL, "--plan", "tp=3"], "heads % tp")


def test_unwritable_output_is_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "models.json"
    assert_user_error(["models", "--json", str(target)], "models.json")
    assert not target.parent.exists()


def test_click_usage_errors_exit_2() -> None:
    result, _, _ = run("solve", "--model", "gpt3-1.3b")  # missing --cluster
    assert result.exit_code == 2
    result, _, _ = run("solve", *SMALL, "--recipe", "fp4-dreams")
    assert result.exit_code == 2


# --------------------------------------------------------------------------------------------
# catalog commands
# --------------------------------------------------------------------------------------------


def test_models_and_clusters_list_presets() -> None:
    result, out, _ = run("models")
    assert result.exit_code == 0
    assert "llama3-70b" in out and "mixtral-8x7b" in out
    result, out, _ = run("clusters")
    assert result.exit_code == 0
    assert "dgx-h100" in out and "mixed-h100-a100" in out
    result, out, _ = run("clusters", "--json", "-")
    names = {r["name"] for r in json.loads(out)}
    assert {"dgx-h100", "dgx-a100"} <= names


def test_help_and_version() -> None:
    result, out, _ = run("--help")
    assert result.exit_code == 0
    for cmd in ("solve", "enumerate", "evaluate", "explain", "whatif", "models", "clusters"):
        assert cmd in out
    result, out, _ = run("--version")
    assert result.exit_code == 0 and "ap-solve" in out


# --------------------------------------------------------------------------------------------
# with the cost model and the solver
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> Solved:
    """One small solve with CSV + JSON outputs, shared by the checks below."""
    d = tmp_path_factory.mktemp("solve")
    csv_path, json_path = d / "plans.csv", d / "plans.json"
    result, out, err = run("solve", *SMALL, *FAST, "--fix", NARROW, "--top-k", "3", "--csv",
                           str(csv_path), "--json", str(json_path))
    return result, out, err, csv_path, json_path


def test_solve_success_table_and_files(solved: Solved) -> None:
    result, out, err, csv_path, json_path = solved
    assert result.exit_code == 0, result.output
    assert "tok/s/GPU" in out and "recommended" in out
    doc = json.loads(json_path.read_text())
    assert set(doc) == {"status", "solve_time_s", "space_size", "plans", "space"}
    assert doc["status"] == "optimal"
    assert 1 <= len(doc["plans"]) <= 3
    p = doc["plans"][0]
    for key in ("plan", "fits", "memory", "time", "throughput"):
        assert key in p
    assert p["fits"] is True
    steps = [q["time"]["step_s"] for q in doc["plans"]]
    assert steps == sorted(steps)
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert len(rows) == len(doc["plans"])
    assert rows[0]["rank"] == "1"
    assert float(rows[0]["step_s"]) == pytest.approx(steps[0])
    assert sorted(os.listdir(csv_path.parent)) == ["plans.csv", "plans.json"]  # no temp files


def test_solve_json_to_stdout_is_pure_json() -> None:
    result, out, _ = run("solve", *SMALL, *FAST, "--fix", NARROW, "--top-k", "1", "--json", "-")
    assert result.exit_code == 0
    doc = json.loads(out)
    assert len(doc["plans"]) == 1


def test_solve_with_fix_and_emit() -> None:
    result, out, _ = run("solve", *SMALL, *FAST, "--top-k", "2", "--fix", NARROW + ",tp=2",
                         "--emit", "megatron")
    assert result.exit_code == 0, result.output
    assert "--tensor-model-parallel-size 2" in out


def test_infeasible_is_exit_1_with_explanation() -> None:
    result, out, err = run("solve", "--model", "llama3-405b", "--cluster", "dgx-a100-40g",
                           "--gpus", "8", "--seq-len", "4096", "--global-batch", "8", *FAST)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "no feasible plan" in err
    assert len(err.strip().splitlines()) >= 2  # an explanation follows


def test_evaluate_json_is_one_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    result, out, _ = run("evaluate", *SMALL, "--plan", "tp=2,pp=2,mbs=1,zero=1", "--json",
                         str(path), "--quiet")
    assert result.exit_code == 0, result.output
    doc = json.loads(path.read_text())
    assert doc["plan"]["tp"] == 2 and doc["plan"]["dp"] == 2
    assert set(doc["memory"]) >= {"params_bytes", "grads_bytes", "optimizer_bytes",
                                  "activations_bytes", "other_bytes", "peak_bytes",
                                  "capacity_bytes"}
    assert set(doc["time"]) >= {"step_s", "compute_s", "bubble_s", "tp_comm_s", "cp_comm_s",
                                "ep_comm_s", "pp_comm_s", "dp_comm_s", "optimizer_s"}
    assert set(doc["throughput"]) >= {"tokens_per_s", "tokens_per_s_per_gpu", "mfu"}
    assert "Step time" in out


def test_evaluate_plan_that_does_not_fit_is_exit_0() -> None:
    result, out, _ = run("evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus",
                         "8", "--seq-len", "4096", "--global-batch", "8", "--plan",
                         "tp=1,zero=0,mbs=1", "--json", "-", "--quiet")
    assert result.exit_code == 0
    assert json.loads(out)["fits"] is False


def test_explain_reports_limits_and_changes(tmp_path: Path) -> None:
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY_MODEL)
    result, out, _ = run("explain", "--model", str(model), "--cluster", "dgx-h100", "--gpus",
                         "16", "--seq-len", "2048", "--global-batch", "64", "--plan",
                         "tp=1,pp=8,mbs=1,zero=0")
    assert result.exit_code == 0, result.output
    assert "What limits it" in out
    assert "Change that would help most" in out or "locally optimal" in out


def test_evaluate_with_the_torchtitan_recipe() -> None:
    """`--recipe torchtitan-fsdp` carries its framework behaviour: `selective` is op-level SAC
    (it replays matmuls, so it costs more time than Megatron-style selective recompute)."""
    args = ("evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--seq-len", "8192", "--global-batch", "16", "--plan",
            "zero=3,mbs=1,recompute=selective", "--json", "-", "--quiet")
    result, out, _ = run(*args, "--recipe", "torchtitan-fsdp")
    assert result.exit_code == 0, result.output
    tt = json.loads(out)
    assert tt["fits"]  # at mbs 2 the root unit's gathered embedding and head tip it over
    from autoparallel_cp.cost.evaluate import evaluate
    from autoparallel_cp.spec import RECIPES, Job
    from autoparallel_cp.spec.loaders import load_cluster, load_model
    from autoparallel_cp.spec.plan import Plan

    recipe = RECIPES["torchtitan-fsdp"]
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100").take_gpus(8),
              recipe=recipe, seq_len=8192, global_batch=16)
    plan = Plan(dp=8, zero=3, mbs=1, num_microbatches=2, recompute="selective")
    assert tt["time"]["step_s"] == pytest.approx(evaluate(job, plan).time.step_s)
    megatron_style = job.model_copy(update={"recipe": recipe.model_copy(update={
        "behaviour": recipe.behaviour.model_copy(update={"selective_policy": "attention"})})})
    assert evaluate(megatron_style, plan).time.compute_s < tt["time"]["compute_s"]


def test_recipe_file_overrides_a_base_preset(tmp_path: Path) -> None:
    """--recipe FILE: `base` preset plus overrides; behaviour is merged field by field."""
    from autoparallel_cp.spec import RECIPES
    from autoparallel_cp.spec.loaders import load_recipe

    f = tmp_path / "mcore.yaml"
    f.write_text("base: megatron-bf16\nbehaviour: {dropout: true, tp_comm_overlap: 0.8}\n"
                 "grad_reduce_bytes: 2\n")
    r = load_recipe(str(f))
    assert r.name == "mcore"
    assert r.behaviour.dropout and r.behaviour.tp_comm_overlap == 0.8
    assert r.behaviour.attention_kernel == RECIPES["megatron-bf16"].behaviour.attention_kernel
    assert r.grad_reduce_bytes == 2 and r.weight_bytes == 2
    args = ("evaluate", *SMALL, "--plan", "tp=2,mbs=1,zero=1", "--json", "-", "--quiet")
    result, out, _ = run(*args, "--recipe", str(f))
    assert result.exit_code == 0, result.output
    custom = json.loads(out)
    result, out, _ = run(*args)
    default = json.loads(out)
    assert custom["time"]["tp_comm_s"] < default["time"]["tp_comm_s"]  # 80% hidden


def test_bad_recipe_inputs_are_clear_errors(tmp_path: Path) -> None:
    assert_user_error(["evaluate", *SMALL, "--plan", "tp=1", "--recipe", "megatron-bf61"],
                      "unknown recipe", "megatron-bf16")
    f = tmp_path / "bad.yaml"
    f.write_text("base: megatron-bf16\nbehaviour: {selective_policy: everything}\n")
    assert_user_error(["evaluate", *SMALL, "--plan", "tp=1", "--recipe", str(f)],
                      "selective_policy")
    g = tmp_path / "bad2.yaml"
    g.write_text("base: nemo\n")
    assert_user_error(["evaluate", *SMALL, "--plan", "tp=1", "--recipe", str(g)],
                      "unknown base recipe")


def test_pp_not_dividing_layers_evaluates_and_fix_matches(tmp_path: Path) -> None:
    """gpt3-1.3b has 24 layers: pp=8 with vpp=2 is 16 chunks, which do not divide 24. evaluate
    takes Megatron's split (26 slots: chunks 2,2,...,1 less the embedding and the loss), and
    `solve --fix` of that split (stage_layers written out) returns evaluate's step time."""
    model = tmp_path / "m.yaml"
    model.write_text(TINY_MODEL.replace("num_layers: 8", "num_layers: 24"))
    job = ["--model", str(model), "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
           "--global-batch", "32"]
    plan = "tp=1,pp=8,vpp=2,zero=1,mbs=1"
    result, out, _ = run("evaluate", *job, "--plan", plan, "--json", "-", "--quiet")
    assert result.exit_code == 0, result.output
    ev = json.loads(out)
    # 26 slots over 16 chunks: chunks 0..9 hold 2, 10..15 hold 1; less E on chunk 0 and L on
    # chunk 15: 1,2,2,2,2,2,2,2 | 2,2,1,1,1,1,1,0; stage j sums chunks j and j + 8:
    # 1+2, 2+2, 2+1, 2+1, 2+1, 2+1, 2+1, 2+0 (each stage's chunks then split by stage_chunks)
    split = "3:4:3:3:3:3:3:2"
    result, out, _ = run("solve", *job, *FAST, "--top-k", "1", "--fix",
                         plan + f",stage_layers={split}", "--json", "-")
    assert result.exit_code == 0, result.output
    [best] = json.loads(out)["plans"]
    assert best["time"]["step_s"] == pytest.approx(ev["time"]["step_s"], rel=1e-9)
    assert best["memory"]["peak_bytes"] == pytest.approx(ev["memory"]["peak_bytes"], rel=1e-9)
