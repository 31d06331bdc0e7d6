"""Run the frameworks' own validators over what `ap-solve ... --emit X` prints (issue 13).

A fixed matrix of jobs (evaluate with a plan, solve, solve --fix, --emit-rank, every recipe;
Llama 3, Mixtral, DeepSeek-V3; pipeline, interleaved, CP, EP, ZeRO-3, FP8, partial recompute;
sliding-window attention: Mistral 7B v0.1, the two windowed test models of
benchmarks/data/models and GPT-OSS 20B's config.json, at cp = 1 and cp > 1) is
emitted in each format through the real CLI (`--emit X --emit-out FILE`). Each emit is checked by
the framework itself, in a subprocess per framework:

- megatron: Megatron-LM main d98e8a64: the MEGATRON_ARGS bash array and the `export` lines are
  read back through bash, then `parse_args()`, `validate_args()` and
  `core_transformer_config_from_args()` (the TransformerConfig checks) run; Megatron's derived
  data-parallel size, virtual stages and recompute count must equal the plan's, and on an
  interleaved plan its `overlap_p2p_comm` / `batch_p2p_comm` the recipe's p2p overlap. For a
  windowed model, every layer's window as Megatron builds it (`is_layer_window_attention` over
  the parsed `--window-size` / `--window-attn-skip-freq`) must be the plan's, and with cp > 1
  every layer's `cp_comm_type` must be the exchange the cost model charges (all_gather on
  windowed layers, p2p on the others) and pass Transformer Engine v2.9's rules
  (context_parallel.py:3803-3809: a sliding window runs only with a2a or all_gather; 3825-3827:
  attention sinks only with a2a; TE itself is not installed).
  `--params` also builds the whole model on the meta device from the emitted flags (tp = pp = ep =
  1) and compares Megatron's parameter count with the plan's (Llama 3 8B, GPT-3 13B, Mixtral
  8x7B, DeepSeek-V3, and the windowed Mistral 7B, test models and GPT-OSS 20B, whose built
  layers' softmax windows must be the plan's).
- torchtitan: torchtitan 0.3.0 (PyPI): the emitted module is loaded by torchtitan's ConfigManager
  (`--module <file> --config autoparallel_plan`), `Trainer.Config.__post_init__` runs, then
  `ParallelDims` (its `_validate`), `_get_pipeline_metadata` and
  `_generate_llm_fqn_per_model_part` (the stage split, whose layer counts must equal the plan's);
  the model the config builds (meta device, once per model) must have the plan's parameter count
  (MTP included, expert-bias buffers counted as the plan counts them);
  the batch rule of trainer.py:415-437 is applied as written there (it sits inside
  `Trainer.__init__`).
- torchtitan-toml: torchtitan v0.2.2 source: ConfigManager reads the TOML (`--job.config_file`),
  then `ParallelDims._validate`, the converter registry, the stage-count rule of
  distributed/pipeline_parallel.py:72-105 and `generate_llm_fqn_per_model_part`.
- deepspeed: DeepSpeed 0.19.8: `DeepSpeedConfig(json, mpu)` with the data-parallel size the
  emitted topology/mpu gives (`PipeDataParallelTopology` / `PipeModelDataParallelTopology`
  `.get_dim("data")`; every rank when tp = pp = 1), the pipeline engine's ZeRO assertion
  (runtime/pipe/engine.py:76-77) for pp > 1, and AutoEP's `validate_autoep_config` for ep > 1.

Each format gets the job in the precision recipe it runs (megatron-* for Megatron, torchtitan-fsdp,
or a float8 variant of it, for torchtitan; the job's own for DeepSpeed); the last job keeps its
recipe everywhere to show the refusal. A case passes when the framework accepts the emitted
settings, or when `--emit` refused the plan
(exit 2, naming the plan field, the framework source and the closest plan it runs): the refused
plans are counted apart. A DeepSpeed solve case (JSON has no comment line) is matched to its plan
in the `--json` output by its batch, ZeRO and tp fields.

Setup (CPU only, ~2.5 GB; Python 3.11):
    python3.11 -m venv /work/venv-fw
    /work/venv-fw/bin/pip install torch==2.13.0        # the CPU wheel on local disk
    DS_BUILD_OPS=0 /work/venv-fw/bin/pip install --no-build-isolation \\
        deepspeed==0.19.8 torchtitan==0.3.0 triton torchao
    /work/venv-fw/bin/pip install -e .                 # this project
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/fw-src/Megatron-LM
    git -C /tmp/fw-src/Megatron-LM checkout d98e8a64ddf34856e74b24714e3bedb2f5a39553
    git clone https://github.com/pytorch/torchtitan /tmp/tt
    mkdir -p /tmp/fw-src/torchtitan-v0.2.2
    git -C /tmp/tt archive v0.2.2 torchtitan | tar -x -C /tmp/fw-src/torchtitan-v0.2.2
Run:
    /work/venv-fw/bin/python benchmarks/frameworks_check.py --params \\
        --megatron-lm /tmp/fw-src/Megatron-LM --torchtitan-v022 /tmp/fw-src/torchtitan-v0.2.2
(`--only TEXT` runs the jobs whose label contains TEXT, e.g. `--only swa`, without --params.)

Megatron main needs Python 3.12 only for `typing.override` (a no-op decorator): the worker aliases
it from typing_extensions. No GPU is used: Megatron's `get_device_arch_version` is set to 9 (H100,
the matrix's cluster), and Transformer Engine's fused RoPE, which TransformerConfig requires to
exist when `apply_rope_fusion` is on (its default), is stood in for by a placeholder;
torchtitan's float8 converter sees compute capability 9.0 (H100) instead of asking CUDA. The
meta-device model build gives core attention (no parameters) the MLA keyword arguments its local
(non-Transformer-Engine) class lacks, builds the MoE layers with the allgather token dispatcher
(no parameters either; the alltoall one opens a CUDA stream in its constructor), and skips the MTP
block, whose local spec needs Transformer Engine types (the plan counts MTP apart as well).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FORMATS = ("megatron", "torchtitan", "torchtitan-toml", "deepspeed")
EXT = {"megatron": "sh", "torchtitan": "py", "torchtitan-toml": "toml", "deepspeed": "json"}

# model files of the windowed test models (not presets: see their `source`)
SWA_ALT = str(Path(__file__).parent / "data" / "models" / "swa-alt-8b.yaml")
SWA_TAIL = str(Path(__file__).parent / "data" / "models" / "swa-tail-8b.yaml")
GPT_OSS_20B = str(Path(__file__).parent / "data" / "hf_configs" / "gpt-oss-20b.json")

# (label, model, gpus, seq_len, global_batch, recipe, command, plan-or-fix, extra CLI args)
JOBS: list[tuple[str, str, int, int, int, str, str, str, list[str]]] = [
    ("interleaved+cp", "llama3-8b", 32, 8192, 64, "megatron-bf16", "evaluate",
     "tp=4,pp=2,vpp=2,cp=2,sp=1,zero=1,mbs=1,recompute=selective", []),
    ("zero3+fp8+uneven", "llama3-8b", 16, 4096, 32, "megatron-fp8", "evaluate",
     "tp=4,pp=4,zero=3,mbs=1,stage_layers=7:9:9:7", []),
    ("ddp+tp", "llama3-8b", 32, 8192, 64, "megatron-bf16", "evaluate", "tp=8,zero=0,mbs=1", []),
    ("zero2+pipeline", "llama3-8b", 32, 8192, 64, "megatron-bf16", "evaluate",
     "pp=4,zero=2,mbs=1", []),
    ("partial-recompute-3", "llama3-8b", 64, 4096, 128, "megatron-bf16", "evaluate",
     "tp=2,pp=4,vpp=2,zero=1,mbs=1,recompute=full,recompute_layers=3", []),
    ("partial-recompute-4", "llama3-8b", 64, 4096, 128, "megatron-bf16", "evaluate",
     "tp=2,pp=4,vpp=2,zero=1,mbs=1,recompute=full,recompute_layers=4", []),
    ("70b-pipeline", "llama3-70b", 64, 4096, 128, "megatron-bf16", "evaluate",
     "tp=8,pp=4,sp=1,zero=1,mbs=1,recompute=full", []),
    ("70b-5-per-chunk", "llama3-70b", 128, 4096, 256, "megatron-bf16", "evaluate",
     "tp=8,pp=4,vpp=4,sp=1,zero=3,mbs=1", []),
    ("70b-solve", "llama3-70b", 64, 4096, 128, "megatron-bf16", "solve", "", []),
    ("70b-solve-fix-pp4", "llama3-70b", 64, 4096, 128, "megatron-bf16", "solve", "pp=4", []),
    ("8b-solve-torchtitan-fsdp", "llama3-8b", 8, 4096, 64, "torchtitan-fsdp", "solve", "", []),
    ("8b-solve-emit-rank-2", "llama3-8b", 32, 8192, 64, "megatron-bf16", "solve", "",
     ["--emit-rank", "2"]),
    ("8b-solve-pytorch-amp", "llama3-8b", 16, 4096, 64, "pytorch-amp", "solve", "", []),
    ("8b-solve-fp8", "llama3-8b", 16, 4096, 64, "megatron-fp8", "solve", "", []),
    ("mixtral-ep", "mixtral-8x7b", 64, 4096, 256, "megatron-bf16", "evaluate",
     "tp=2,pp=4,ep=8,sp=1,zero=1,mbs=1", []),
    ("mixtral-solve", "mixtral-8x7b", 64, 4096, 256, "megatron-bf16", "solve", "", []),
    ("dsv3-ep", "deepseek-v3", 1024, 4096, 1024, "megatron-bf16", "evaluate",
     "tp=2,pp=8,ep=64,sp=1,zero=1,mbs=1,recompute=full,stage_layers=7:8:8:8:8:8:8:6", []),
    ("dsv3-ep64-zero3", "deepseek-v3", 1024, 4096, 2048, "megatron-bf16", "evaluate",
     "pp=16,ep=64,zero=3,mbs=1,recompute=full,stage_layers=3" + ":4" * 14 + ":2", []),
    ("dsv3-solve-fix-ep64", "deepseek-v3", 1024, 4096, 1024, "megatron-bf16", "solve",
     "ep=64", []),
    ("405b-uneven", "llama3-405b", 512, 4096, 512, "megatron-bf16", "evaluate",
     "tp=8,pp=8,sp=1,zero=1,mbs=1,recompute=full,stage_layers=15:16:16:16:16:16:16:15", []),
    # Megatron-Core's splits (issue 15 item 4): embedding and loss as layer slots, a layout,
    # micro-batch groups when pp does not divide m
    ("405b-pp8-vpp8-slots", "llama3-405b", 1024, 8192, 512, "megatron-bf16", "evaluate",
     "tp=8,pp=8,vpp=8,cp=2,sp=1,zero=1,mbs=1", []),
    ("dsv3-pp8-vpp4-layout", "deepseek-v3", 1024, 4096, 8192, "megatron-bf16", "evaluate",
     "tp=2,pp=8,vpp=4,ep=64,sp=1,zero=1,mbs=1", []),
    ("interleaved-m12-pp8", "llama3-8b", 64, 4096, 12, "megatron-bf16", "evaluate",
     "tp=8,pp=8,vpp=2,zero=1,mbs=1", []),
    ("cp4+zero3", "llama3-8b", 32, 16384, 64, "megatron-bf16", "evaluate",
     "tp=2,cp=4,sp=1,zero=3,mbs=1", []),
    # issue 31: schedules (torchtitan's torch schedule classes; refused by Megatron and
    # DeepSpeed with the closest plan) and host offload (Megatron's optimizer and TE CPU
    # offloading flags, DeepSpeed's offload_optimizer)
    ("sched-zbv", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=4,vpp=2,zero=2,mbs=1,schedule=zbv", []),
    ("sched-dualpipev", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=4,vpp=2,zero=2,mbs=1,schedule=dualpipev", []),
    ("sched-gpipe", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=4,zero=2,mbs=1,schedule=gpipe", []),
    ("offload-opt-act", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=8,zero=1,mbs=1,optimizer_offload=0.5,activation_offload=4", []),
    ("offload-opt-all", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=1,zero=1,mbs=1,optimizer_offload=1", []),
    ("dp+zero1", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate", "zero=1,mbs=2", []),
    ("gpt3-learned-pos", "gpt3-13b", 16, 2048, 64, "megatron-bf16", "evaluate",
     "tp=4,pp=2,sp=1,zero=1,mbs=1", []),
    ("bloom-alibi", "bloom-176b", 64, 2048, 64, "megatron-bf16", "evaluate",
     "tp=8,pp=2,sp=1,zero=1,mbs=1", []),
    ("gpt3-seq-over-table", "gpt3-13b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "tp=4,pp=2,sp=1,zero=1,mbs=1", []),
    # sliding-window attention: every layer (Mistral 7B v0.1), GPT-OSS's alternating pattern
    # (--window-attn-skip-freq N) and a period that leaves a tail (its list expression); cp = 1
    # and cp > 1 (per-layer --cp-comm-type)
    ("mistral-swa", "mistral-7b", 16, 8192, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=2,sp=1,zero=1,mbs=1", []),
    ("mistral-swa-cp2", "mistral-7b", 32, 16384, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=2,cp=2,sp=1,zero=1,mbs=1,recompute=selective", []),
    ("mistral-swa-solve", "mistral-7b", 16, 8192, 64, "megatron-bf16", "solve", "", []),
    ("mistral-swa-solve-fix-cp4", "mistral-7b", 32, 32768, 32, "megatron-bf16", "solve",
     "cp=4", []),
    ("swa-alt-interleaved", SWA_ALT, 16, 8192, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=2,vpp=2,sp=1,zero=1,mbs=1", []),
    ("swa-alt-cp2", SWA_ALT, 32, 16384, 64, "megatron-bf16", "evaluate",
     "tp=4,pp=2,cp=2,sp=1,zero=1,mbs=1", []),
    ("swa-alt-solve", SWA_ALT, 16, 8192, 64, "megatron-bf16", "solve", "", []),
    ("swa-alt-solve-fix-cp2", SWA_ALT, 32, 32768, 64, "megatron-bf16", "solve", "cp=2", []),
    ("swa-tail-cp2-uneven", SWA_TAIL, 32, 16384, 64, "megatron-bf16", "evaluate",
     "tp=2,pp=4,cp=2,sp=1,zero=1,mbs=1,stage_layers=7:9:9:7", []),
    ("swa-tail-solve", SWA_TAIL, 16, 8192, 64, "megatron-bf16", "solve", "", []),
    # GPT-OSS 20B from its config.json: windows with attention sinks (--softmax-type learnable)
    ("gpt-oss-20b-ep8", GPT_OSS_20B, 16, 8192, 64, "megatron-bf16", "evaluate",
     "ep=8,zero=1,mbs=1", []),
    ("gpt-oss-20b-cp2", GPT_OSS_20B, 32, 16384, 64, "megatron-bf16", "evaluate",
     "cp=2,ep=8,zero=1,mbs=1", []),
    ("gpt-oss-20b-solve", GPT_OSS_20B, 16, 8192, 64, "megatron-bf16", "solve", "", []),
    ("recipe-as-given", "llama3-8b", 32, 8192, 64, "megatron-bf16", "evaluate",
     "tp=2,sp=1,zero=3,mbs=1", ["strict"]),
]

PARAM_JOBS = [("llama3-8b", 32, "tp=8,zero=1,mbs=1"), ("gpt3-13b", 16, "tp=4,zero=1,mbs=1"),
              ("mixtral-8x7b", 64, "tp=2,pp=4,ep=8,sp=1,zero=1,mbs=1"),
              ("deepseek-v3", 1024, "tp=8,pp=8,ep=32,sp=1,zero=1,mbs=1"),
              ("mistral-7b", 16, "tp=2,pp=2,cp=2,sp=1,zero=1,mbs=1"),
              (SWA_ALT, 16, "tp=2,pp=2,cp=2,sp=1,zero=1,mbs=1"),
              (SWA_TAIL, 16, "tp=2,pp=2,cp=2,sp=1,zero=1,mbs=1"),
              (GPT_OSS_20B, 16, "ep=8,zero=1,mbs=1")]


def emit_all(out: Path, only: str | None = None) -> list[dict[str, Any]]:
    """Run the CLI for every job and format; return the cases (emit file or refusal)."""
    import yaml
    from click.testing import CliRunner

    from autoparallel_cp.api import make_job
    from autoparallel_cp.cli import main
    from autoparallel_cp.spec import RECIPES
    from autoparallel_cp.spec.params import count_params
    from autoparallel_cp.spec.plan import parse_plan

    runner = CliRunner()
    tt_fp8 = out / "torchtitan-fsdp-fp8.yaml"  # torchtitan-fsdp with float8 GEMMs
    tt_fp8.write_text(yaml.safe_dump(RECIPES["torchtitan-fsdp"].model_copy(
        update={"name": "torchtitan-fsdp-fp8", "compute_dtype": "fp8"}).model_dump()))
    cases = []
    for label, model, gpus, seq, gbs, job_recipe, cmd, text, extra_args in JOBS:
        if only is not None and only not in label:
            continue
        strict = "strict" in extra_args  # keep the job's recipe even where fmt refuses it
        extra = [a for a in extra_args if a != "strict"]
        for fmt in FORMATS:
            recipe = job_recipe if strict else native_recipe(job_recipe, fmt, str(tt_fp8))
            job = make_job(model, "dgx-h100", gpus=gpus, seq_len=seq, global_batch=gbs,
                           recipe=recipe)
            path = out / f"{label}.{fmt}.{EXT[fmt]}"
            plan_json = out / f"{label}.{fmt}.plan.json"
            argv = [cmd, "-m", model, "-c", "dgx-h100", "--gpus", str(gpus), "--seq-len",
                    str(seq), "--global-batch", str(gbs), "--recipe", recipe, "--emit", fmt,
                    "--emit-out", str(path), "--json", str(plan_json), "-q"]
            if cmd == "evaluate":
                argv += ["--plan", text]
            else:
                argv += ["--time-limit", "20", "--workers", "1"] + (["--fix", text] if text
                                                                    else []) + extra
            res = runner.invoke(main, argv)
            case: dict[str, Any] = {"label": label, "fmt": fmt, "model": model, "gpus": gpus,
                                    "exit": res.exit_code, "recipe": Path(recipe).stem}
            plan_text = text
            if plan_json.exists() and cmd == "evaluate":
                plan_text = text
            if res.exit_code == 0 and path.exists():
                case["file"] = str(path)
                first = path.read_text().splitlines()[1] if fmt != "deepspeed" else ""
                if "# plan: " in first:
                    plan_text = first.split("# plan: ", 1)[1].split("  (")[0]
            else:
                case["message"] = (res.output.strip().splitlines() or [""])[-1]
            if cmd == "solve" and "file" not in case:
                plan_text = ""
            if fmt == "deepspeed" and cmd == "solve" and "file" in case:
                plan_text = _deepspeed_plan(plan_json, path)
            case["plan"] = plan_text
            if plan_text:
                p = parse_plan(plan_text, job)
                case["plan_fields"] = p.model_dump()
                case["stage_layers"] = list(p.layers_per_stage(job.model.num_layers))
                case["layout"] = list(p.layout(job.model.num_layers))
                case["num_layers"] = job.model.num_layers
                case["global_batch"] = gbs
                case["planned_params"] = count_params(job.model).total_with_mtp
                case["windows"] = planned_windows(job.model)
                case["p2p_overlap"] = job.recipe.behaviour.overlap_p2p_comm
            cases.append(case)
    return cases


def planned_windows(m: Any) -> list[list[int] | None] | None:
    """Every layer's attention window as the plan has it, Megatron's `window_size` (w, 0) or
    None for full causal attention; None for a model without windows."""
    if m.sliding_window_left is None:
        return None
    return [[m.sliding_window_left, 0] if m.is_window_layer(i) else None
            for i in range(m.num_layers)]


def native_recipe(recipe: str, fmt: str, tt_fp8: str) -> str:
    """The job's recipe in the precision layout `fmt` runs (spec/frameworks.py, "recipe" rows):
    Megatron bf16 weights + fp32 master, torchtitan fp32 FSDP2 weights; DeepSpeed runs both."""
    fp8 = recipe == "megatron-fp8"
    if fmt == "megatron" and recipe not in ("megatron-bf16", "megatron-fp8"):
        return "megatron-bf16"
    if fmt.startswith("torchtitan") and recipe in ("megatron-bf16", "megatron-fp8"):
        return tt_fp8 if fp8 else "torchtitan-fsdp"
    return recipe


def _deepspeed_plan(plan_json: Path, emitted: Path) -> str:
    """The plan a DeepSpeed solve emitted (JSON has no comment line): match the batch fields."""
    doc = json.loads(plan_json.read_text())
    cfg = json.loads(emitted.read_text())
    for d in doc.get("plans", []):
        p = d["plan"]
        if (p["mbs"] == cfg["train_micro_batch_size_per_gpu"]
                and p["num_microbatches"] == cfg["gradient_accumulation_steps"]
                and p["zero"] == cfg["zero_optimization"]["stage"]
                and p["tp"] == cfg.get("tensor_parallel", {}).get("autotp_size", 1)):
            keys = ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "recompute")
            s = ",".join(f"{k}={p[k]}" for k in keys)
            if p.get("recompute_layers") is not None:
                s += f",recompute_layers={p['recompute_layers']}"
            if p.get("stage_layers"):
                s += ",stage_layers=" + ":".join(map(str, p["stage_layers"]))
            return s
    return ""


# ----------------------------------------------------------------- workers (one per framework)

def _megatron_setup(src: str) -> Any:
    import typing

    import typing_extensions
    typing.override = typing_extensions.override  # type: ignore[attr-defined]
    sys.path.insert(0, src)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.training import arguments as a
    a.get_device_arch_version = lambda: 9  # H100 (dgx-h100), no GPU here
    if rope_utils.fused_apply_rotary_pos_emb is None:  # Transformer Engine stand-in (see top)
        rope_utils.fused_apply_rotary_pos_emb = lambda *x, **k: None
    return a


def _bash_array(path: str) -> tuple[list[str], dict[str, str]]:
    """MEGATRON_ARGS and the exports, read back through bash exactly as a user's shell would."""
    script = (f"set -e; source {path}; for a in \"${{MEGATRON_ARGS[@]}}\"; do printf '%s\\0' "
              "\"$a\"; done; printf 'ENV\\0%s\\0' \"${CUDA_DEVICE_MAX_CONNECTIONS-}\"")
    raw = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    items = raw.stdout.split("\0")[:-1]
    i = items.index("ENV")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": items[i + 1]} if items[i + 1] else {}
    return items[:i], env


def _megatron_chunks(cfg: Any, pp: int, vpp: int) -> list[int]:
    """Decoder layers Megatron builds in every model chunk (layout order: chunk v of rank j at
    v*pp + j): its parsed --pipeline-model-parallel-layout, else transformer_block.py
    `get_num_layers_to_build` per (rank, virtual stage)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    lay = cfg.pipeline_model_parallel_layout
    if lay is not None:
        return [lay.layout[j][v].count(LayerType.decoder) for v in range(vpp)
                for j in range(pp)]
    if pp == 1:
        return [cfg.num_layers]
    return [get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=j)
            for v in range(vpp) for j in range(pp)]


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """What Megatron derived that differs from the plan (per-layer lists: the first layer)."""
    out = []
    for k, w in want.items():
        g = got.get(k)
        if g == w:
            continue
        if k in ("windows", "cp_comm") and isinstance(g, list) and len(g) == len(w):
            i = next(i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b)
            out.append(f"{k}: layer {i + 1} (1-based) derived {g[i]} != plan {w[i]}")
        else:
            out.append(f"{k}: derived {g} != plan {w}")
    return "; ".join(out)


def _megatron_attention(cfg: Any, cp: int) -> dict[str, Any]:
    """Each layer's window as Megatron builds it (transformer/utils.py:531-547
    `is_layer_window_attention`, 1-based layer numbers, read by both attention cores:
    dot_product_attention.py:93-98, extensions/transformer_engine.py:2163-2171) and, with
    cp > 1, each layer's context-parallel exchange (transformer_layer.py:378-385: the list's
    entry layer_number - 1, or the one string) and the layers Transformer Engine would refuse
    (v2.9 context_parallel.py, TE is not installed here: its rules are applied as written):
    3803-3809, a sliding window (window_size other than (-1, 0) / (-1, -1)) runs only with
    cp_comm_type "a2a" or "all_gather"; 3825-3827, a softmax_type other than "vanilla" (the
    attention sinks of --softmax-type learnable, handed over at
    extensions/transformer_engine.py:2184-2189) only with "a2a"; 3854-3888 knows only p2p,
    a2a+p2p, all_gather and a2a."""
    from megatron.core.transformer.utils import is_layer_window_attention

    n = cfg.num_layers
    win = [list(cfg.window_size) if is_layer_window_attention(
        cfg.window_size, cfg.window_attn_skip_freq, i + 1) else None for i in range(n)]
    out: dict[str, Any] = {"windows": win}
    if cp > 1:
        kinds = cfg.cp_comm_type if isinstance(cfg.cp_comm_type, list) else \
            [cfg.cp_comm_type] * n
        out["cp_comm"] = kinds
        out["te_refuses"] = [
            i + 1 for i, (w, k) in enumerate(zip(win, kinds, strict=True))
            if k not in ("p2p", "a2a+p2p", "all_gather", "a2a")
            or (w is not None and tuple(w) not in ((-1, 0), (-1, -1))
                and k not in ("a2a", "all_gather"))
            or (cfg.softmax_type != "vanilla" and k != "a2a")]
    return out


def worker_megatron(cases: list[dict[str, Any]], src: str) -> None:
    a = _megatron_setup(src)
    for c in cases:
        pid = os.fork()
        if pid == 0:  # a fresh process state per case
            try:
                args_list, env = _bash_array(c["file"])
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
                os.environ.update(env, WORLD_SIZE=str(c["gpus"]))
                sys.argv = ["pretrain_gpt.py", *args_list, "--tokenizer-type", "NullTokenizer"]
                args = a.parse_args()
                a.validate_args(args, {})
                cfg = a.core_transformer_config_from_args(args)
                p = c["plan_fields"]
                got = {"dp": args.data_parallel_size,
                       "vpp": args.virtual_pipeline_model_parallel_size or 1,
                       "chunks": _megatron_chunks(cfg, p["pp"], p["vpp"])}
                want = {"dp": p["dp"], "vpp": p["vpp"], "chunks": c["layout"]}
                if p["pp"] > 1 and p["vpp"] > 1:
                    # the interleaved p2p overlap Megatron runs (model_parallel_config
                    # overlap_p2p_comm / batch_p2p_comm from the arguments) is the one the
                    # recipe costs; on pp 2 Megatron always overlaps (the emit's note)
                    got["overlap_p2p_comm"] = (cfg.overlap_p2p_comm, cfg.batch_p2p_comm)
                    on = bool(c["p2p_overlap"]) or p["pp"] == 2
                    want["overlap_p2p_comm"] = (on, not on)
                if p["recompute"] == "full" and p["recompute_layers"] is not None and \
                        p["recompute_layers"] < max(c["stage_layers"]):
                    got["recompute_layers"] = args.recompute_num_layers * got["vpp"]
                    want["recompute_layers"] = p["recompute_layers"]
                got.update(_megatron_attention(cfg, p["cp"]))
                want["windows"] = c["windows"] or [None] * c["num_layers"]
                if p["cp"] > 1:
                    # the exchange the cost model charges: the all-gather on windowed
                    # layers, the p2p ring on the others (cost/cp_ring.py)
                    want["cp_comm"] = ["all_gather" if w else "p2p" for w in want["windows"]]
                    want["te_refuses"] = []
                ok = got == want
                print(json.dumps({"id": c["id"], "ok": ok, "why": _differences(got, want)}),
                      flush=True)
            except BaseException as exc:  # noqa: BLE001 - report every rejection
                print(json.dumps({"id": c["id"], "ok": False,
                                  "why": f"{type(exc).__name__}: {str(exc)[:300]}"}),
                      flush=True)
            os._exit(0)
        os.waitpid(pid, 0)


def worker_megatron_params(jobs: list[dict[str, Any]], src: str) -> None:
    a = _megatron_setup(src)
    import torch
    for j in jobs:
        pid = os.fork()
        if pid == 0:
            try:
                args_list, _ = _bash_array(j["file"])
                os.environ.update(WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29591")
                sys.argv = ["pretrain_gpt.py", *args_list, "--tokenizer-type", "NullTokenizer",
                            "--use-cpu-initialization", "--transformer-impl", "local",
                            "--no-rope-fusion", "--no-bias-swiglu-fusion",
                            "--no-bias-dropout-fusion", "--no-masked-softmax-fusion",
                            "--no-gradient-accumulation-fusion"]
                args = a.parse_args()
                for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "expert_model_parallel_size", "context_parallel_size"):
                    setattr(args, k, 1)  # the whole model on one rank, same architecture
                args.sequence_parallel = False
                args.pipeline_model_parallel_layout = None
                args.decoder_first_pipeline_num_layers = None
                args.decoder_last_pipeline_num_layers = None
                args.num_layers_per_virtual_pipeline_stage = None
                args.use_megatron_fsdp = False
                # the token dispatcher holds no parameter; alltoall's constructor makes a CUDA
                # stream (moe/token_dispatcher.py:471-472), which a CPU has not (the dispatcher
                # flag itself is checked by the per-case worker)
                if args.moe_token_dispatcher_type == "alltoall":
                    args.moe_token_dispatcher_type = "allgather"
                args.global_batch_size = args.micro_batch_size
                a.validate_args(args, {})
                from megatron.core.tokenizers.utils.build_tokenizer import (
                    vocab_size_with_padding,
                )
                args.padded_vocab_size = vocab_size_with_padding(args.vocab_size, args)
                cfg = a.core_transformer_config_from_args(args)
                cfg.perform_initialization = False
                cfg.persist_layer_norm = False
                mtp_layers, cfg.mtp_num_layers = cfg.mtp_num_layers, None
                torch.distributed.init_process_group("gloo", world_size=1, rank=0)
                from megatron.core import parallel_state
                parallel_state.initialize_model_parallel()
                from megatron.core.models.gpt import GPTModel
                from megatron.core.models.gpt.gpt_layer_specs import (
                    get_gpt_decoder_block_spec,
                )
                from megatron.core.transformer.dot_product_attention import (
                    DotProductAttention,
                )
                def _dpa(self: Any, *x: Any, k_channels: Any = None, v_channels: Any = None,
                         _init: Any = DotProductAttention.__init__, **kw: Any) -> None:
                    _init(self, *x, **kw)
                DotProductAttention.__init__ = _dpa  # type: ignore[method-assign]
                torch.cuda.current_device = lambda: "meta"  # type: ignore[assignment,return-value]
                spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
                with torch.device("meta"):
                    m = GPTModel(config=cfg, transformer_layer_spec=spec,
                                 vocab_size=args.padded_vocab_size,
                                 max_sequence_length=args.max_position_embeddings,
                                 position_embedding_type=args.position_embedding_type,
                                 share_embeddings_and_output_weights=(
                                     not args.untie_embeddings_and_output_weights))
                n = sum(p.numel() for p in m.parameters())
                bias = sum(b.numel() for k, b in m.named_buffers() if k.endswith("expert_bias"))
                # the window each built layer's softmax masks with (local core attention:
                # dot_product_attention.py:93-108 hands it to FusedScaleMaskSoftmax)
                wins = [list(w) if (w := layer.self_attention.core_attention
                                    .scale_mask_softmax.window_size) is not None else None
                        for layer in m.decoder.layers]
                print(json.dumps({"model": j["model"], "megatron_params": n,
                                  "expert_bias_buffers": bias, "mtp_layers": mtp_layers or 0,
                                  "padded_vocab": args.padded_vocab_size,
                                  "windows": wins}), flush=True)
            except BaseException as exc:  # noqa: BLE001
                print(json.dumps({"model": j["model"], "error": f"{type(exc).__name__}: {exc}"}),
                      flush=True)
            os._exit(0)
        os.waitpid(pid, 0)


def _check_split(c: dict[str, Any], fqns: list[list[str]]) -> str:
    p = c["plan_fields"]
    chunks = c["layout"] if p["pp"] > 1 else [c["num_layers"]]
    got = [sum(m.startswith("layers.") for m in part) for part in fqns]
    return "" if got == chunks else f"stage split {got} != plan {chunks}"


def _batch_rule(c: dict[str, Any], local: int, gbs: int, mb: int, dp: int, pp: int) -> str:
    """torchtitan trainer.py:415-437 (0.3.0): gbs % (local * dp) == 0 and the microbatches."""
    p = c["plan_fields"]
    if gbs % (local * dp):
        return f"global batch {gbs} not a multiple of local {local} * dp {dp}"
    accum = gbs // (local * dp)
    n_mb = local // mb if pp > 1 else 1
    if accum * n_mb != p["num_microbatches"] or (pp > 1 and mb != p["mbs"]):
        return f"micro-batches {accum}*{n_mb} != plan {p['num_microbatches']}"
    return ""


def worker_torchtitan(cases: list[dict[str, Any]]) -> None:
    import torchtitan.components.quantization.float8 as tt_float8
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )
    tt_float8.has_cuda_capability = lambda major, minor: (major, minor) <= (9, 0)  # H100
    import torch
    built: dict[str, int] = {}
    for c in cases:
        try:
            d = os.path.dirname(c["file"])
            if d not in sys.path:
                sys.path.insert(0, d)
            mod = Path(c["file"]).stem.replace(".", "_").replace("-", "_").replace("+", "_")
            Path(d, mod + ".py").write_text(Path(c["file"]).read_text())
            cfg = ConfigManager().parse_args(["--module", mod, "--config", "autoparallel_plan"])
            cfg.__post_init__()  # Trainer.Config checks on the final values
            par, tr = cfg.parallelism, cfg.training
            dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                dp_shard=par.data_parallel_shard_degree,
                                cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                                pp=par.pipeline_parallel_degree,
                                ep=par.expert_parallel_degree, world_size=c["gpus"])
            why = ""
            dense = dims.dp_shard * dims.cp * dims.tp  # parallel_dims.py:277-279, 338-339
            if (dense // dims.ep) * dims.ep != dense:
                why = f"sparse mesh: dp_shard*cp*tp = {dense} not a multiple of ep = {dims.ep}"
            if c["model"] not in built:  # the model torchtitan builds, on the meta device
                with torch.device("meta"):
                    m = cfg.model_spec.model.build()
                built[c["model"]] = sum(p.numel() for p in m.parameters()) + sum(
                    b.numel() for k, b in m.named_buffers() if "expert_bias" in k)
                del m
            if built[c["model"]] != c["planned_params"]:
                why = (f"torchtitan builds {built[c['model']]:,} parameters (+ expert-bias "
                       f"buffers), the plan {c['planned_params']:,}")
            if dims.pp > 1 and not why:
                if par.module_fqns_per_model_part is None:
                    n, layers, iw, ow = _get_pipeline_metadata(dims, par, cfg.model_spec.model)
                    fqns = _generate_llm_fqn_per_model_part(n, layers, iw, ow)
                else:
                    fqns = par.module_fqns_per_model_part
                    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule),
                                        PipelineScheduleSingle)
                    if len(fqns) % dims.pp or (single and len(fqns) != dims.pp):
                        why = f"{len(fqns)} stages do not fit {par.pipeline_parallel_schedule}"
                why = why or _check_split(c, fqns)
            dp = dims.dp_replicate * dims.dp_shard
            why = why or _batch_rule(c, tr.local_batch_size, tr.global_batch_size,
                                     par.pipeline_parallel_microbatch_size, dp, dims.pp)
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)


def worker_torchtitan_toml(cases: list[dict[str, Any]], src: str) -> None:
    import math
    sys.path.insert(0, src)
    import torchtitan.components.quantization  # noqa: F401 - registers the converters
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.protocols.model_converter import _registry_model_converter_cls
    assert src in (torchtitan.__file__ or ""), torchtitan.__file__
    for c in cases:
        try:
            cfg = ConfigManager().parse_args(["--job.config_file", c["file"]])
            par, tr = cfg.parallelism, cfg.training
            dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                dp_shard=par.data_parallel_shard_degree,
                                cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                                pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                                etp=par.expert_tensor_parallel_degree, world_size=c["gpus"])
            why = ""
            for name in cfg.model.converters:
                if name not in _registry_model_converter_cls:
                    why = f"converter {name!r} is not registered"
            if dims.pp > 1 and not why:
                if par.module_fqns_per_model_part is None:
                    # v0.2.2 distributed/pipeline_parallel.py:72-105
                    iw = par.pipeline_parallel_first_stage_less_layers
                    ow = par.pipeline_parallel_last_stage_less_layers
                    n = math.ceil((c["num_layers"] + iw + ow)
                                  / par.pipeline_parallel_layers_per_stage)
                    per_rank = n // dims.pp
                    single = par.pipeline_parallel_schedule in ("1F1B", "GPipe")
                    if n % dims.pp or (single and per_rank != 1) or (not single
                                                                    and per_rank < 2):
                        why = f"{n} virtual stages for pp={dims.pp}"
                    else:
                        fqns = generate_llm_fqn_per_model_part(n, c["num_layers"], iw, ow)
                        why = _check_split(c, fqns)
                else:
                    why = _check_split(c, par.module_fqns_per_model_part)
            dp = dims.dp_replicate * dims.dp_shard
            why = why or _batch_rule(c, tr.local_batch_size, tr.global_batch_size,
                                     par.pipeline_parallel_microbatch_size, dp, dims.pp)
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)


def worker_deepspeed(cases: list[dict[str, Any]]) -> None:
    import deepspeed.comm as dist
    from deepspeed.module_inject.auto_ep_config import (
        parse_autoep_config,
        validate_autoep_config,
    )
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import (
        PipeDataParallelTopology,
        PipeModelDataParallelTopology,
    )
    from deepspeed.runtime.zero.config import ZeroStageEnum
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29592", RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    dist.init_distributed(dist_backend="gloo")  # DeepSpeedConfig asks deepspeed.comm

    class Mpu:
        def __init__(self, dp: int) -> None:
            self.dp = dp

        def get_data_parallel_world_size(self) -> int:
            return self.dp

    for c in cases:
        try:
            p = c["plan_fields"]
            cfg = json.loads(Path(c["file"]).read_text())
            if p["pp"] > 1:
                dp = PipeDataParallelTopology(num_pp=p["pp"], num_dp=p["dp"]).get_dim("data")
            elif p["tp"] > 1:
                dp = PipeModelDataParallelTopology(num_pp=1, num_mp=p["tp"],
                                                   num_dp=p["dp"]).get_dim("data")
            else:
                dp = c["gpus"]  # no mpu: DeepSpeed counts every rank
            ds = DeepSpeedConfig(cfg, mpu=Mpu(dp))
            why = ""
            if "expert_parallel" in cfg:  # AutoEP's own validation (folding of EP onto ranks)
                validate_autoep_config(parse_autoep_config(cfg["expert_parallel"]),
                                       world_size=c["gpus"], pp_size=p["pp"], tp_size=p["tp"],
                                       sp_size=1, zero_stage=p["zero"])
            if p["pp"] > 1 and not ds.zero_optimization_stage < ZeroStageEnum.gradients:
                why = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)


# ----------------------------------------------------------------------------------- driver

def _run_worker(kind: str, payload: list[dict[str, Any]], opts: argparse.Namespace,
                tmp: Path) -> dict[Any, dict[str, Any]]:
    if not payload:
        return {}
    f = tmp / f"{kind}.json"
    f.write_text(json.dumps(payload))
    cmd = [sys.executable, __file__, "--worker", kind, "--cases", str(f),
           "--megatron-lm", opts.megatron_lm, "--torchtitan-v022", opts.torchtitan_v022]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out: dict[Any, dict[str, Any]] = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            out[d.get("id", d.get("model"))] = d
    if not out:
        print(f"worker {kind} failed:\n{res.stderr[-3000:]}")
    return out


def _versions() -> str:
    from importlib.metadata import version

    import deepspeed
    import torch
    import torchtitan
    return (f"torch {torch.__version__}, deepspeed {deepspeed.__version__}, torchtitan "
            f"{version('torchtitan')} ({os.path.dirname(torchtitan.__file__)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-lm", default="/tmp/fw-src/Megatron-LM")
    ap.add_argument("--torchtitan-v022", default="/tmp/fw-src/torchtitan-v0.2.2")
    ap.add_argument("--params", action="store_true",
                    help="also build the three models with Megatron and count parameters")
    ap.add_argument("--only", default=None,
                    help="run only the jobs whose label contains this text (and no --params)")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--cases", default=None)
    opts = ap.parse_args()
    if opts.worker:
        payload = json.loads(Path(opts.cases).read_text())
        if opts.worker == "megatron":
            worker_megatron(payload, opts.megatron_lm)
        elif opts.worker == "megatron-params":
            worker_megatron_params(payload, opts.megatron_lm)
        elif opts.worker == "torchtitan":
            worker_torchtitan(payload)
        elif opts.worker == "torchtitan-toml":
            worker_torchtitan_toml(payload, opts.torchtitan_v022)
        elif opts.worker == "deepspeed":
            worker_deepspeed(payload)
        return 0

    t0 = time.time()
    mg_commit = subprocess.run(["git", "-C", opts.megatron_lm, "rev-parse", "HEAD"],
                               capture_output=True, text=True).stdout.strip() or "?"
    print(f"versions: Megatron-LM {mg_commit[:8]}; {_versions()}; torchtitan v0.2.2 source "
          f"{opts.torchtitan_v022}")
    with tempfile.TemporaryDirectory(prefix="fwcheck-") as tmpd:
        tmp = Path(tmpd)
        cases = emit_all(tmp, opts.only)
        for i, c in enumerate(cases):
            c["id"] = i
        results: dict[Any, dict[str, Any]] = {}
        for fmt in FORMATS:
            results.update(_run_worker(fmt, [c for c in cases if c["fmt"] == fmt
                                             and "file" in c], opts, tmp))
        counts = {"accepted": 0, "refused": 0, "infeasible": 0, "failed": 0}
        for c in cases:
            where = f"{c['fmt']:16s} {c['label']:26s} [{c['recipe']}]"
            if "file" in c:
                r = results.get(c["id"], {"ok": False, "why": "no result from the worker"})
                status = "accepted" if r["ok"] else "failed"
                print(f"{status.upper():9s} {where} {c['plan'] or ''} {r['why']}")
            elif c["exit"] == 2:
                status = "refused"
                print(f"REFUSED   {where} exit 2: {c.get('message', '')[:220]}")
            elif c["exit"] == 1 and "no plan fits" in c.get("message", ""):
                status = "infeasible"  # the solver proves no plan this framework runs fits
                print(f"NOFIT     {where} exit 1: {c.get('message', '')[:220]}")
            else:
                status = "failed"
                print(f"FAILED    {where} exit {c['exit']}: {c.get('message', '')[:220]}")
            counts[status] += 1
        if opts.params and opts.only is None:
            from autoparallel_cp.api import make_job
            from autoparallel_cp.emit import emit
            from autoparallel_cp.spec.params import count_params
            from autoparallel_cp.spec.plan import parse_plan
            jobs = []
            for model, gpus, text in PARAM_JOBS:
                job = make_job(model, "dgx-h100", gpus=gpus, seq_len=2048, global_batch=gpus)
                f = tmp / f"params-{Path(model).stem}.sh"
                f.write_text(emit(job, parse_plan(text, job), "megatron").text)
                jobs.append({"model": model, "file": str(f),
                             "planned": count_params(job.model).total,
                             "windows": planned_windows(job.model) or
                             [None] * job.model.num_layers})
            got = _run_worker("megatron-params", jobs, opts, tmp)
            for j in jobs:
                r = got.get(j["model"], {})
                if "megatron_params" not in r:
                    print(f"PARAMS    {j['model']}: {r.get('error', 'no result')}")
                    counts["failed"] += 1
                    continue
                built = r["megatron_params"] + r["expert_bias_buffers"]
                same = built == j["planned"] and r["windows"] == j["windows"]
                nwin = sum(w is not None for w in r["windows"])
                as_planned = "as planned" if r["windows"] == j["windows"] else "NOT as planned"
                wins = (f"; windows {as_planned} ({nwin} of {len(r['windows'])} layers)"
                        if nwin or any(j["windows"]) else "")
                print(f"PARAMS    {Path(j['model']).stem:14s} Megatron builds "
                      f"{r['megatron_params']:,} + {r['expert_bias_buffers']:,} expert-bias "
                      f"buffers = {built:,}; planned {j['planned']:,} (MTP layers "
                      f"{r['mtp_layers']}, counted apart){wins} "
                      f"{'SAME' if same else 'DIFFERENT'}")
                if not same:
                    counts["failed"] += 1
    total = len(cases)
    print(f"summary: {total} cases ({total // len(FORMATS)} jobs x {len(FORMATS)} formats): "
          f"{counts['accepted']} accepted by the framework, {counts['refused']} refused by "
          f"--emit (exit 2, closest plan named), {counts['infeasible']} proven without a "
          f"plan the framework runs that fits (exit 1), {counts['failed']} failed; "
          f"{time.time() - t0:.0f} s")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
