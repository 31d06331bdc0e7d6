"""`--model hf:PATH` end to end for the newer Hugging Face families (Qwen3-MoE, GPT-OSS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoparallel_cp.spec.loaders import load_model
from autoparallel_cp.spec.params import count_params
from tests.cli.test_cli import FAST, assert_user_error, run

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "hf_configs"
JOB = ["--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "gpt-oss-20b"])
def test_evaluate_and_solve(name: str) -> None:
    model = ["--model", f"hf:{CONFIGS / name}.json"]
    res, out, _ = run("evaluate", *model, *JOB, "--plan", "tp=1,pp=2,ep=8,mbs=1,zero=1",
                      "--json", "-", "--quiet")
    assert res.exit_code == 0, res.output
    doc = json.loads(out)
    assert doc["plan"]["ep"] == 8 and doc["time"]["ep_comm_s"] > 0
    # the parameters a GPU holds are at least its share of the routed experts (ep = 8, pp = 2)
    pc = count_params(load_model(CONFIGS / f"{name}.json"))
    assert doc["memory"]["params_bytes"] >= 2 * pc.expert_total / 8 / 2
    res, out, _ = run("solve", *model, *JOB, *FAST, "--fix", "pp=1,cp=1,vpp=1", "--top-k", "1",
                      "--json", "-")
    assert res.exit_code == 0, res.output
    plans = json.loads(out)["plans"]
    assert len(plans) == 1 and plans[0]["fits"]


def test_gpt_oss_emits_its_attention() -> None:
    res, out, _ = run("solve", "--model", f"hf:{CONFIGS / 'gpt-oss-20b.json'}", *JOB, *FAST,
                      "--fix", "pp=1,cp=1,vpp=1,tp=1", "--top-k", "1", "--emit", "megatron")
    assert res.exit_code == 0, res.output
    for flag in ("--softmax-type learnable", "--window-size 127,0", "--kv-channels 64",
                 "--num-experts 32", "--quick-geglu"):
        assert flag in out, flag
    assert "--disable-bias-linear" not in out  # biases on every linear, the router's too
    # GPT-OSS's gate is x * sigmoid(1.702 x) (modeling_gpt_oss.py), Megatron's --quick-geglu,
    # not SiLU; the clamp and offset it cannot set on the command line are said in a note
    assert "--swiglu" not in out and "clamp" in out


def test_gelu_gated_mlp_is_refused_by_megatron(tmp_path: Path) -> None:
    """Megatron-LM d98e8a64's activations are --swiglu, --quick-geglu, --squared-relu and
    GELU (arguments.py:2444-2453): a GELU-gated MLP (Gemma's GeGLU) has no flag, so the emit
    refuses the model instead of writing --swiglu."""
    own = tmp_path / "geglu.yaml"
    own.write_text("name: g\nnum_layers: 2\nhidden_size: 256\nffn_hidden_size: 512\n"
                   "num_attention_heads: 4\nvocab_size: 1024\nmlp: geglu\n")
    swiglu = tmp_path / "swiglu.yaml"
    swiglu.write_text(own.read_text().replace("geglu", "swiglu"))
    # a gated unit: three matrices whatever the gate's function
    assert count_params(load_model(own)).total == count_params(load_model(swiglu)).total
    job = ["--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "1024", "--global-batch", "8"]
    assert_user_error(["evaluate", "--model", str(own), *job, "--plan", "tp=1,dp=8",
                       "--emit", "megatron"], "megatron cannot run this plan", "model")


def test_unsupported_and_multimodal_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["FalconForCausalLM"], "hidden_size": 8}))
    assert_user_error(["evaluate", "--model", f"hf:{bad}", *JOB, "--plan", "tp=8"],
                      "unsupported architecture", "GptOssForCausalLM", "Qwen3MoeForCausalLM",
                      "Gemma3ForCausalLM")
    bad.write_text(json.dumps({"architectures": ["Gemma3ForConditionalGeneration"]}))
    assert_user_error(["evaluate", "--model", f"hf:{bad}", *JOB, "--plan", "tp=8"],
                      "text_config")
    own = tmp_path / "own.yaml"
    own.write_text("name: x\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\n"
                   "num_attention_heads: 4\nvocab_size: 100\n")
    assert_user_error(["evaluate", "--model", f"hf:{own}", *JOB, "--plan", "tp=8"],
                      "not a Hugging Face config")
