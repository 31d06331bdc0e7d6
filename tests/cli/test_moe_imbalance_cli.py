"""`--moe-load-imbalance RHO` through the CLI: it moves a MoE job's numbers, 1 is the default,
bad values are one-line exit-2 errors, and `whatif` echoes it per point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import assert_user_error, run

TINY_MOE = """\
name: tiny-moe
num_layers: 4
hidden_size: 1024
ffn_hidden_size: 2816
num_attention_heads: 8
num_kv_heads: 4
vocab_size: 32000
moe:
  num_experts: 8
  top_k: 2
  expert_ffn_hidden_size: 1408
"""
PLAN = "dp=8,ep=4,mbs=1,recompute=none,zero=1"


@pytest.fixture()
def tiny(tmp_path: Path) -> list[str]:
    path = tmp_path / "tiny-moe.yaml"
    path.write_text(TINY_MOE)
    return ["--model", str(path), "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "4096",
            "--global-batch", "16"]


def _step(args: list[str]) -> float:
    result, out, err = run("evaluate", *args, "--plan", PLAN, "--json", "-")
    assert result.exit_code == 0, err
    return float(json.loads(out)["time"]["step_s"])


def test_evaluate_default_is_1_and_rho_slows_the_step(tiny: list[str]) -> None:
    base = _step(tiny)
    assert _step([*tiny, "--moe-load-imbalance", "1"]) == base
    assert _step([*tiny, "--moe-load-imbalance", "1.5"]) > base


@pytest.mark.parametrize("value", ["0.5", "nan", "inf", "-1", "9"])
def test_bad_rho_is_a_one_line_exit_2(tiny: list[str], value: str) -> None:
    assert_user_error(["evaluate", *tiny, "--plan", PLAN, "--moe-load-imbalance", value],
                      "--moe-load-imbalance")


def test_dense_model_with_rho_is_refused() -> None:
    for cmd in (["evaluate", "--plan", "dp=8"], ["solve", "--quiet"]):
        assert_user_error([cmd[0], "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus",
                           "8", *cmd[1:], "--moe-load-imbalance", "1.2"], "dense model")


def test_solve_json_keeps_its_four_keys(tiny: list[str]) -> None:
    result, out, err = run("solve", *tiny, "--fix", "pp=1,cp=1,vpp=1", "--top-k", "1",
                           "--time-limit", "10", "--workers", "1", "--quiet",
                           "--moe-load-imbalance", "1.5", "--json", "-")
    assert result.exit_code == 0, err
    assert set(json.loads(out)) == {"status", "solve_time_s", "space_size", "plans", "space"}


def test_whatif_echoes_rho(tiny: list[str]) -> None:
    result, out, err = run("whatif", *tiny, "--fix", "pp=1,cp=1,vpp=1", "--time-limit", "10",
                           "--jobs", "1", "--quiet", "--moe-load-imbalance", "1.25",
                           "--json", "-")
    assert result.exit_code == 0, err
    points = json.loads(out)["points"]
    assert [p["moe_load_imbalance"] for p in points] == [1.25]
