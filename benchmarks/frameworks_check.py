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
  interleaved plan its `overlap_p2p_comm` / `batch_p2p_comm` the recipe's p2p overlap; its
  parsed `num_distributed_optimizer_instances`, optimizer offload fraction and CPU-offloaded
  layer count must be the plan's `dp_replicate`, `optimizer_offload`, `activation_offload`. For a
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
  the replicate x shard degrees ParallelDims holds must be the plan's (`dp_replicate`,
  dp/dp_replicate), and with pp > 1 the class `get_schedule_class` returns for the emitted
  `pipeline_parallel_schedule` must be the plan's schedule (Schedule1F1B, ...ZBVZeroBubble,
  ...DualPipeV, ...);
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
  (runtime/pipe/engine.py:76-77) for pp > 1, AutoEP's `validate_autoep_config` for ep > 1, and
  the parsed `offload_optimizer` (device cpu, `ratio`) must be the plan's `optimizer_offload`.

Each format gets the job in the precision recipe it runs (megatron-* for Megatron, torchtitan-fsdp,
or a float8 variant of it, for torchtitan; the job's own for DeepSpeed); the `space-*` jobs
(`solve --recipe R --emit X`: the search keeps to what X runs) and the last job keep their
recipe everywhere (the last one to show the refusal). A case passes when the framework accepts
the emitted settings, or when `--emit` refused the plan
(exit 2, naming the plan field, the framework source and the closest plan it runs): the refused
plans are counted apart. A DeepSpeed solve case (JSON has no comment line) is matched to its plan
in the `--json` output by its batch, ZeRO and tp fields.

Setup (CPU only, ~2.5 GB; Python 3.11):
    python3.11 -m venv /work/venvs/fw
    /work/venvs/fw/bin/pip install torch==2.13.0        # the CPU wheel on local disk
    DS_BUILD_OPS=0 /work/venvs/fw/bin/pip install --no-build-isolation \\
        deepspeed==0.19.8 torchtitan==0.3.0 triton torchao
    /work/venvs/fw/bin/pip install -e .                 # this project
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/fw-src/Megatron-LM
    git -C /tmp/fw-src/Megatron-LM checkout d98e8a64ddf34856e74b24714e3bedb2f5a39553
    git clone https://github.com/pytorch/torchtitan /tmp/tt
    mkdir -p /tmp/fw-src/torchtitan-v0.2.2
    git -C /tmp/tt archive v0.2.2 torchtitan | tar -x -C /tmp/fw-src/torchtitan-v0.2.2
Run:
    /work/venvs/fw/bin/python benchmarks/frameworks_check.py --params \\
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
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.frameworks_megatron import worker_megatron, worker_megatron_params
from harness.frameworks_torchtitan import (
    worker_deepspeed,
    worker_torchtitan,
    worker_torchtitan_toml,
)

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
    ("sched-zbv-r2", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate",
     "pp=4,vpp=2,zero=3,mbs=1,schedule=zbv,dp_replicate=2", []),
    ("offload-zero3-part", "llama3-8b", 16, 4096, 64, "megatron-bf16", "evaluate",
     "zero=3,mbs=1,optimizer_offload=0.25", []),
    # issue 31.2: the searched optimizer share (70B on one node fits only with it)
    ("70b-solve-offload", "llama3-70b", 8, 4096, 32, "megatron-bf16", "solve", "", []),
    # issues 28/31: hybrid sharding (dp_replicate: torchtitan data_parallel_replicate_degree,
    # Megatron --num-distributed-optimizer-instances, DeepSpeed MiCS mics_shard_size)
    ("hsdp-zero3-r2", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate",
     "zero=3,mbs=1,dp_replicate=2", []),
    ("hsdp-zero3-r4-offload", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate",
     "zero=3,mbs=1,dp_replicate=4,optimizer_offload=1", []),
    ("hsdp-tp2-zero1-r2", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate",
     "tp=2,sp=1,zero=1,mbs=1,dp_replicate=2", []),
    ("hsdp-ddp-r2", "llama3-8b", 32, 4096, 64, "megatron-bf16", "evaluate",
     "tp=8,zero=0,mbs=1,dp_replicate=2", []),
    ("hsdp-solve-fix-r2", "llama3-8b", 32, 4096, 64, "megatron-bf16", "solve",
     "dp_replicate=2", []),
    # framework spaces: `solve --recipe R --emit X` searches only what X runs under R
    # (the recipe kept in every format: the strict ones)
    ("space-torchtitan-fsdp", "llama3-8b", 32, 4096, 64, "torchtitan-fsdp", "solve", "",
     ["strict"]),
    ("space-pytorch-fsdp", "llama3-8b", 32, 4096, 64, "pytorch-fsdp", "solve", "",
     ["strict"]),
    ("space-deepspeed", "llama3-8b", 32, 4096, 64, "deepspeed", "solve", "", ["strict"]),
    ("space-megatron-fp8", "llama3-70b", 64, 4096, 128, "megatron-fp8", "solve", "",
     ["strict"]),
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
                case["schedule"] = p.pipeline_schedule
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
                and p["tp"] == cfg.get("tensor_parallel", {}).get("autotp_size", 1)
                and p.get("dp_replicate", 1) == p["dp"] // cfg["zero_optimization"].get(
                    "mics_shard_size", p["dp"])):
            keys = ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "recompute")
            s = ",".join(f"{k}={p[k]}" for k in keys)
            if p.get("recompute_layers") is not None:
                s += f",recompute_layers={p['recompute_layers']}"
            if p.get("stage_layers"):
                s += ",stage_layers=" + ":".join(map(str, p["stage_layers"]))
            if p.get("optimizer_offload"):  # ZeRO-Offload
                s += f",optimizer_offload={p['optimizer_offload']:g}"
            if p.get("dp_replicate", 1) != 1:  # hybrid sharding (MiCS)
                s += f",dp_replicate={p['dp_replicate']}"
            return s
    return ""


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
            elif c["exit"] == 1 and re.search(r"no plan (that \S+ runs )?fits",
                                               c.get("message", "")):
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
