"""Development rows to jobs and plans: `data/published_runs_train.csv` (the four sources the
cost model was built on) and the H200 measurements (`data/h200_pytorch_amp_train.jsonl`).
Defaults for fields a source leaves empty are that source's documented defaults, flagged in
`assumed`; rows that cannot be evaluated carry the reason."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autoparallel_cp.cost.evaluate import Evaluation
from autoparallel_cp.cost.factors import CostOptions, recipe_options
from autoparallel_cp.spec import RECIPES, ClusterSpec, Job, ModelSpec, NodeGroup
from autoparallel_cp.spec.plan import Plan, plan_violations
from harness.corpus import (
    A100_80,
    H100_96_500W,
    H100_SXM,
    H200,
    H200_RECIPE,
    HDR_IB,
    MEGATRON_2021,
    NDR_IB,
    NVLINK3,
    NVLINK4,
    P2P_2021,
    TORCHTITAN,
    TORCHTITAN_ATTENTION,
    TORCHTITAN_FP8,
    cluster,
)
from harness.tuned import flag, knob

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass
class Row:
    idx: int
    name: str
    source: str
    job: Job | None
    plan: Plan | None
    options: CostOptions
    measured_tps: float | None
    measured_mem_gib: float | None
    assumed: str
    skip: str = ""
    knobs: tuple[str, ...] = ()  # the TUNED constants this row's prediction depends on


def _i(x: str, default: int | None = None) -> int | None:
    x = (x or "").strip()
    if not x:
        return default
    try:
        return int(float(x))
    except ValueError:
        return default


def _r2_flops_per_token(L: int, h: int, s: int, V: int, ffn: int, g_over_a: float) -> float:
    """Megatron-Core r0.8 `num_floating_point_operations` per token (as quoted in the csv)."""
    return 12.0 * L * h * h * ((1 + g_over_a + s / h) + ffn / h + V / (2.0 * L * h))


def _megatron_gpt(name: str, L: int, h: int, ffn: int, a: int, vocab: int) -> ModelSpec:
    """The GPT shape of the Megatron 2021/2022 papers: learned positions, LayerNorm, GELU,
    biases everywhere, tied embeddings."""
    return ModelSpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
                     num_attention_heads=a, vocab_size=vocab, mlp="gelu", norm="layernorm",
                     position_embedding="learned", tie_embeddings=True, qkv_bias=True,
                     attn_out_bias=True, mlp_bias=True)


def _sc21_flops_per_token(L: int, h: int, s: int, V: int) -> float:
    """Narayanan Eq. 3 per token: 96·l·h²·(1 + s/6h + V/16lh) (includes the recompute pass)."""
    return 96.0 * L * h * h * (1 + s / (6.0 * h) + V / (16.0 * L * h))


def published_rows(knobs: Mapping[str, float] | None = None) -> list[Row]:
    with open(DATA / "published_runs_train.csv") as fh:
        rows = list(csv.DictReader(fh))
    out: list[Row] = []
    for i, r in enumerate(rows):
        src = r["source"]
        name = r["model"]
        L, h, a = _i(r["layers"]), _i(r["hidden"]), _i(r["heads"])
        assumed: list[str] = []
        gpus = _i(r["num_gpus"])
        tp, pp = _i(r["tp"]), _i(r["pp"])
        if tp is None or pp is None or L is None or h is None or a is None or gpus is None:
            out.append(Row(i, name, src[:20], None, None, CostOptions(), None, None, "",
                           skip="parallel plan (tp/pp) not stated by the source"))
            continue
        ffn = _i(r["ffn_hidden"]) or 4 * h
        kv = _i(r["kv_heads"]) or a
        vocab = _i(r["vocab"])
        if vocab is None:
            vocab = 51200
            assumed.append("vocab=51200 (source's cross-check value)")
        seq = _i(r["seq_len"])
        vpp = _i(r["vpp"], 1) or 1
        cp = _i(r["cp"], 1) or 1
        dp = _i(r["dp"]) or gpus // (tp * pp * cp)
        mbs = _i(r["micro_batch"])
        gb = _i(r["global_batch"])
        rec_txt = r["recompute"].lower()
        recompute = "full" if rec_txt.startswith("full") else (
            "selective" if rec_txt.startswith("selective") else "none")
        sp = 1 if r["sp"].strip().lower() == "yes" else 0
        measured = float(r["measured_tokens_per_s_per_gpu"] or 0) or None
        mem = float(r["measured_memory_gib"] or 0) or None
        opts = CostOptions()
        stage_layers: tuple[int, ...] | None = None
        fsdp_pp = False
        tags: tuple[str, ...] = ()
        if src.startswith("Narayanan"):
            kind = "sc21"
            gpu, intra, inter = A100_80, NVLINK3, HDR_IB
            recipe = MEGATRON_2021
            model = _megatron_gpt(name, L, h, ffn, a, vocab)
            opts = recipe.behaviour.model_copy(update={"dropout": True, "dp_overlap": False})
            assert seq is not None
            measured = float(r["measured_tflops_per_gpu"]) * 1e12 / _sc21_flops_per_token(
                L, h, seq, vocab)
            assumed.append("tok/s derived from TFLOP/s via Eq. 3")
            if vpp > 1:
                assumed.append(P2P_2021)
        elif src.startswith("Korthikanti"):
            kind = "korthikanti"
            gpu, intra, inter = A100_80, NVLINK3, HDR_IB
            recipe = MEGATRON_2021
            model = _megatron_gpt(name, L, h, ffn, a, vocab)
            opts = recipe.behaviour.model_copy(update={"dropout": True, "dp_overlap": False})
            if vpp > 1:
                assumed.append(P2P_2021)
        elif src.startswith("NVIDIA/Megatron-LM"):
            kind = "mcore"
            gpu, intra, inter = H100_SXM, NVLINK4, NDR_IB
            recipe = RECIPES["megatron-bf16"]
            model = ModelSpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
                              num_attention_heads=a, num_kv_heads=kv, vocab_size=vocab,
                              mlp="gelu", norm="layernorm", tie_embeddings=False)
            if mbs is None:
                mbs = 1
                assumed.append("mbs=1")
            if recompute == "none" and not rec_txt:
                assumed.append("no recompute")
            sp = 1 if tp > 1 else 0
            assumed.append("sp, dist-opt, TP/DP overlap from README flags")
            # dropout not stated: Megatron's defaults (arguments.py --attention-dropout /
            # --hidden-dropout 0.1; the GPT-3 example script does not override them)
            assumed.append("dropout 0.1 (Megatron default)")
            opts = recipe.behaviour.model_copy(update={
                "tp_comm_overlap": knob(knobs, "megatron_tp_overlap"), "dp_overlap": True,
                "dropout": True})
            tags = ("megatron_tp_overlap",)
            assumed.append(flag("megatron_tp_overlap", knobs))
            assert seq is not None
            measured = float(r["measured_tflops_per_gpu"]) * 1e12 / _r2_flops_per_token(
                L, h, seq, vocab, ffn, kv / a)
            assumed.append("tok/s derived from TFLOP/s via the r0.8 formula")
        elif src.startswith("pytorch/torchtitan"):
            kind = "torchtitan"
            peak = knob(knobs, "h100_96_peak")
            gpu, intra, inter = H100_96_500W.model_copy(update={
                "bf16_tflops": peak, "fp8_tflops": 2 * peak}), NVLINK4, NDR_IB
            tags = ("h100_96_peak",)
            assumed.append(flag("h100_96_peak", knobs))
            notes = r["notes"]
            # the run's configuration is the notes' first sentence(s) before "Local batch
            # size"; the boilerplate after it mentions Float8 for every row
            config = notes.split("Local batch size")[0]
            fp8 = "Float8" in config
            compiled = "compile" in config
            recipe = TORCHTITAN_FP8 if fp8 else TORCHTITAN
            model = ModelSpec(name=name, num_layers=L, hidden_size=h, ffn_hidden_size=ffn,
                              num_attention_heads=a, num_kv_heads=kv, vocab_size=vocab,
                              mlp="swiglu", norm="rmsnorm", max_position_embeddings=131072)
            if seq is None:
                seq = 8192
                assumed.append("seq=8192 (torchtitan llama3 config default)")
            local = _i(notes.split("Local batch size")[1].split(".")[0]) if (
                "Local batch size" in notes) else None
            if pp > 1 and local is not None:
                # torchtitan 2024-12: --experimental.pipeline_parallel_microbatches defaults to
                # the pipeline degree (the local batch is split into pp micro-batches)
                mbs = local // pp
                assumed.append(f"{pp} PP micro-batches of {mbs} (torchtitan 2024-12 default: "
                               "microbatches = pp degree)")
                # FSDP under PP: torch.distributed.pipelining keeps the FSDP parameters
                # unsharded and skips gradient sync until the last micro-batch
                # (set_reshard_after_backward / set_requires_gradient_sync(False)), and
                # torchtitan does not reshard after forward with PP: bf16 params and fp32
                # gradients are unsharded for the whole step, the fp32 params and Adam
                # states stay sharded, one all-gather and one reduce-scatter per step. That is
                # ZeRO-1 with a bf16 working copy and an fp32 master.
                recipe = recipe.model_copy(update={"weight_bytes": 2,
                                                   "master_weight_bytes": 4})
                fsdp_pp = True
                assumed.append("FSDP under PP = ZeRO-1 (params/grads unsharded during the "
                               "step)")
            else:
                mbs = local
            if gb is None and local is not None:
                gb = local * dp
            if "Interleaved" in notes:
                vpp = 2
                assumed.append("vpp=2 (stages per rank not stated)")
            if L % (pp * vpp) and vpp == 1:
                # torchtitan at the cited commit (`generate_split_points`) counts the
                # embedding and the output as one layer each: L + 2 slots over pp stages,
                # so the first and last stage hold one layer less (126 on 8: 15, 16x6, 15)
                per = (L + 2) // pp
                stage_layers = (per - 1, *([per] * (pp - 2)), L - (per - 1) - per * (pp - 2))
                assumed.append("torchtitan default split " + "/".join(
                    str(x) for x in sorted(set(stage_layers))))
            elif L % (pp * vpp):
                # interleaved: the per-stage counts must be multiples of vpp here, which
                # torchtitan's embedding-as-a-layer split is not; nearest expressible split
                base = (L // pp + vpp - 1) // vpp * vpp
                layers = [base] * (pp - 1)
                layers.append(L - sum(layers))
                stage_layers = tuple(layers)
                assumed.append(f"split {base}x{pp - 1}+{layers[-1]} (torchtitan's is not a "
                               "multiple of vpp)")
            async_tp = "AsyncTP" in config
            if async_tp:
                # Inductor micro-pipeline TP, costed by what it fuses (cost/async_tp.py)
                assumed.append("async TP: Inductor micro-pipeline TP (cost/async_tp.py)")
            sp = 1 if tp > 1 else 0
            behaviour = recipe.behaviour.model_copy(update={
                "tp_comm_overlap": 1.0 if async_tp else 0.0,
                "tp_comm_overlap_bwd": None, "fused": compiled,
                "attention_kernel": TORCHTITAN_ATTENTION})
            recipe = recipe.model_copy(update={"behaviour": behaviour})
            opts = recipe_options(recipe)
        else:
            out.append(Row(i, name, src[:20], None, None, CostOptions(), None, None, "",
                           skip="unknown source"))
            continue
        if seq is None or mbs is None or gb is None:
            out.append(Row(i, name, kind, None, None, opts, measured, mem, "",
                           skip="seq_len / micro batch / global batch not stated"))
            continue
        zero_txt = r["zero_stage"].strip()
        zero = 3 if zero_txt == "FSDP" else (1 if kind == "mcore" else 0)
        if fsdp_pp:
            zero = 1
        cl = cluster(gpu, intra, inter, gpus)
        job = Job(model=model, cluster=cl, recipe=recipe, seq_len=seq, global_batch=gb)
        plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, sp=sp, zero=zero, mbs=mbs,
                    num_microbatches=gb // (dp * mbs), recompute=recompute,
                    stage_layers=stage_layers)
        bad = plan_violations(job, plan)
        if bad:
            out.append(Row(i, name, kind, None, None, opts, measured, mem, "",
                           skip="plan breaks: " + "; ".join(bad)))
            continue
        out.append(Row(i, name, kind, job, plan, opts, measured, mem, "; ".join(assumed),
                       knobs=tags))
    return out


#: session 15's held-out H200 training steps (data/README.md: h200_s15/), never used to fit
H200_HELDOUT_FILES = ("h200_s15/train_set1.jsonl", "h200_s15/train_set2.jsonl",
                      "h200_s15/train_set3.jsonl")


def h200_rows(files: tuple[str, ...] = ("h200_pytorch_amp_train.jsonl",)
              ) -> list[tuple[dict[str, float], Job, Plan]]:
    """(measured row, job, plan) of the single-H200 PyTorch-AMP training steps in `files`
    (default: the development file; `H200_HELDOUT_FILES`: session 15's held-out rows, whose
    steps accumulate gradients over `num_microbatches` micro-batches)."""
    cl = ClusterSpec(name="h200x1", node_groups=[NodeGroup(
        name="h200", gpu=H200, gpus_per_node=1, num_nodes=1, intra_node=NVLINK4,
        inter_node=NDR_IB)])
    out = []
    lines = []
    for name in files:
        with open(DATA / name) as fh:
            lines += fh.readlines()
    for line in lines:
        r = json.loads(line)
        if not r.get("ok"):
            continue
        model = ModelSpec(name=r["model"], num_layers=r["L"], hidden_size=r["h"],
                          ffn_hidden_size=r["ffn"], num_attention_heads=r["nh"],
                          num_kv_heads=r["nkv"], vocab_size=r["V"])
        m = int(r.get("num_microbatches", 1))
        job = Job(model=model, cluster=cl, recipe=H200_RECIPE, seq_len=r["seq"],
                  global_batch=r["mbs"] * m)
        plan = Plan(mbs=r["mbs"], num_microbatches=m,
                    recompute="full" if r["recompute"] else "none")
        out.append((r, job, plan))
    return out


def predicted_reserved_bytes(ev: Evaluation) -> float:
    """The caching allocator's predicted max reserved memory: the allocated peak plus the free
    space fragmentation leaves in the segments of the transient allocations
    (`model_state.fragmentation_bytes`); what torch.cuda.max_memory_reserved measures."""
    return ev.memory.peak_bytes + ev.memory.fragmentation_bytes
