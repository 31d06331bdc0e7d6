"""Validate the cost model against published training runs and H200 measurements.

    python benchmarks/validate.py [--markdown] [--cv] [--sensitivity] [--write-snapshot]

`--cv` adds the leave-one-source-out table over all published sources (crossval.py), the
headline number; `--write-snapshot` records every row's signed error for the two-sided
regression guard (tests/cost/test_validation_data.py).

Reads only files under benchmarks/data/ (copied from the calibration set; see its README).
For every usable row prints predicted vs measured tokens/s/GPU (and memory where measured),
the error of each row and the MAPE; rows that cannot be evaluated are listed with the reason.
Defaults used for fields a source leaves empty are the documented defaults of that source,
and every such row is flagged in the `assumed` column.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tuned import flag, knob

from autoparallel_cp.cost.evaluate import Evaluation, evaluate
from autoparallel_cp.cost.factors import ALLOCATOR_FRAGMENTATION, CostOptions, recipe_options
from autoparallel_cp.spec import (
    GIB,
    RECIPES,
    ClusterSpec,
    GPUSpec,
    Job,
    LinkSpec,
    ModelSpec,
    NodeGroup,
    TrainingRecipe,
)
from autoparallel_cp.spec.plan import Plan, plan_violations

DATA = Path(__file__).resolve().parent / "data"

# --------------------------------------------------------------------------------------------
# Hardware as stated by the sources (published_runs_train.csv README)
# --------------------------------------------------------------------------------------------

A100_80 = GPUSpec(name="A100-SXM4-80GB", memory_gib=79.15, bf16_tflops=312.0, hbm_gbps=2039.0,
                  source="A100 datasheet: 312 TFLOP/s bf16 dense, 2039 GB/s HBM2e")
H100_SXM = GPUSpec(name="H100-SXM5-80GB", memory_gib=79.1, bf16_tflops=989.0, fp8_tflops=1979.0,
                   hbm_gbps=3350.0, source="H100 SXM datasheet")
#: torchtitan's H100: 96 GB HBM2e at a 500 W cap (Grand Teton). Peak between the 700 W SXM (989)
#: and the 400 W NVL part (835, per the source's note): assumed 835 (power-capped clocks).
#: HBM2e bandwidth 2410 GB/s: the HBM2e H100 (94 GiB usable) measured by Ujeniya et al. 2026,
#: "power-capping NVIDIA H100 and H200" (arXiv 2604.11391), same 5-stack HBM2e part.
H100_96_500W = GPUSpec(name="H100-96GB-HBM2e-500W", memory_gib=95.0, bf16_tflops=835.0,
                       fp8_tflops=1670.0, hbm_gbps=2410.0,
                       source="assumed: 500 W cap ~ H100 NVL clocks; HBM2e 2.41 TB/s")
NVLINK3 = LinkSpec(bandwidth_gbps=300.0, latency_us=3.0, source="NVLink3 300 GB/s/dir")
NVLINK4 = LinkSpec(bandwidth_gbps=450.0, latency_us=3.0, source="NVLink4 450 GB/s/dir")
HDR_IB = LinkSpec(bandwidth_gbps=25.0, latency_us=8.0, source="8 x 200 Gb/s HDR per DGX A100")
NDR_IB = LinkSpec(bandwidth_gbps=50.0, latency_us=8.0, source="400 Gb/s per GPU")


def cluster(gpu: GPUSpec, intra: LinkSpec, inter: LinkSpec, gpus: int) -> ClusterSpec:
    nodes = max(gpus // 8, 1)
    per = 8 if gpus >= 8 else gpus
    return ClusterSpec(name=gpu.name, node_groups=[NodeGroup(
        name="n", gpu=gpu, gpus_per_node=per, num_nodes=nodes, intra_node=intra,
        inter_node=inter)])


#: Megatron-LM 2021/2022 (SC21, Korthikanti): fp16/bf16 mixed precision, fused softmax (no flash
#: attention), no distributed optimizer. fp16 mixed precision: Megatron of 2021 all-reduced the
#: fp16 gradients (fp32 accumulation/all-reduce was forced only for bf16), so 2 B on the wire.
#: Megatron-LM of 2021-22 scattered each stage's output over the tp ranks before sending it
#: (`--scatter-gather-tensors-in-pipeline`, default on from 72e4230bb5, 2021-02-16, until
#: 3c92fa93b5, 2023-03-23; megatron/p2p_communication.py l. 148-190 at 3c92fa93b5^). Its
#: interleaved schedule waited for every send and receive: the p2p overlap option came with
#: f9283c5a8a (2023-05-31) and became the default with 4eeff55d1f (2023-10-23), so
#: `overlap_p2p_comm` stays off here (the megatron-bf16 recipe has Megatron-LM main's on).
MEGATRON_2021 = TrainingRecipe(name="megatron-2021", framework="megatron", flash_attention=False,
                               grad_reduce_bytes=2).with_behaviour(pp_scatter_gather=True,
                                                                   overlap_p2p_comm=False)
#: `assumed` note of the interleaved MEGATRON_2021 rows (SC21, Korthikanti et al.)
P2P_2021 = ("pipeline p2p not overlapped (Megatron-LM of 2021-22: no overlap option before "
            "f9283c5a8a, 2023-05-31)")
#: torchtitan FSDP2: fp32 sharded params, bf16 compute (param_dtype), fp32 reduce, no autocast
#: copies (FSDP mixed precision casts on all-gather).
#: The `torchtitan-fsdp` preset (FSDP2 fp32 sharded params, bf16 compute, fp32 reduce; foreach
#: AdamW, clipping at max_norm 1.0); each row sets the behaviour its notes state.
TORCHTITAN = RECIPES["torchtitan-fsdp"]
TORCHTITAN_FP8 = TORCHTITAN.model_copy(update={"name": "torchtitan-fsdp-fp8",
                                               "compute_dtype": "fp8"})

#: torchtitan 2024-12 (torch nightly 1963fc8) calls SDPA, which then dispatched to
#: FlashAttention-2 on H100 (cuDNN attention opt-in since pytorch/pytorch#138522; #142132 shows
#: nightly 2.6.0.dev20241204 SDPA at 329 vs cuDNN 631 TFLOP/s on H100, "expected").
TORCHTITAN_ATTENTION = "fa2"


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


H200 = GPUSpec(name="H200", memory_gib=139.8, bf16_tflops=989.0, fp8_tflops=1979.0,
               hbm_gbps=4800.0, source="H200 SXM datasheet; 139.8 GiB per torch")


#: measure_h200.py: fp32 params under autocast, fused AdamW, no gradient clipping.
H200_RECIPE = RECIPES["pytorch-amp"].model_copy(update={"grad_clip": False})


def h200_rows() -> list[tuple[dict[str, float], Job, Plan]]:
    cl = ClusterSpec(name="h200x1", node_groups=[NodeGroup(
        name="h200", gpu=H200, gpus_per_node=1, num_nodes=1, intra_node=NVLINK4,
        inter_node=NDR_IB)])
    out = []
    with open(DATA / "h200_pytorch_amp_train.jsonl") as fh:
        lines = fh.readlines()
    for line in lines:
        r = json.loads(line)
        if not r.get("ok"):
            continue
        model = ModelSpec(name=r["model"], num_layers=r["L"], hidden_size=r["h"],
                          ffn_hidden_size=r["ffn"], num_attention_heads=r["nh"],
                          num_kv_heads=r["nkv"], vocab_size=r["V"])
        job = Job(model=model, cluster=cl, recipe=H200_RECIPE, seq_len=r["seq"],
                  global_batch=r["mbs"])
        plan = Plan(mbs=r["mbs"], num_microbatches=1,
                    recompute="full" if r["recompute"] else "none")
        out.append((r, job, plan))
    return out


def predicted_reserved_bytes(ev: Evaluation) -> float:
    """The caching allocator's predicted max reserved memory: the allocated peak plus the free
    space fragmentation leaves in the segments of the transient allocations
    (`model_state.fragmentation_bytes`); what torch.cuda.max_memory_reserved measures."""
    return ev.memory.peak_bytes + ev.memory.fragmentation_bytes


def main(markdown: bool = False) -> int:
    sep = " | " if markdown else "  "
    print("## Published runs (tokens/s/GPU)\n")
    hdr = ["#", "model", "src", "plan", "pred", "meas", "err%", "mem pred/meas GiB", "fits",
           "assumed"]
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    errs: dict[str, list[float]] = {}
    mem_errs: list[float] = []
    skipped = []
    not_fit = []
    for row in published_rows():
        if row.job is None or row.plan is None:
            skipped.append(row)
            continue
        ev = evaluate(row.job, row.plan, row.options)
        pred = ev.throughput.tokens_per_s_per_gpu
        err = (pred / row.measured_tps - 1) * 100 if row.measured_tps else float("nan")
        if row.measured_tps:
            errs.setdefault(row.source, []).append(abs(err))
        mem_txt = f"{ev.memory.peak_bytes / GIB:.1f}"
        if row.measured_mem_gib:
            reserved = predicted_reserved_bytes(ev) / GIB
            mem_txt = f"{reserved:.1f}/{row.measured_mem_gib:.1f}"
            mem_errs.append(abs(reserved / row.measured_mem_gib - 1) * 100)
        if not ev.fits:
            not_fit.append(row.idx)
        p = row.plan
        plan_txt = (f"tp{p.tp} pp{p.pp} v{p.vpp} cp{p.cp} dp{p.dp} z{p.zero} sp{p.sp} "
                    f"b{p.mbs} m{p.num_microbatches} {p.recompute}")
        cells = [str(row.idx), row.name[:28], row.source, plan_txt, f"{pred:.0f}",
                 f"{row.measured_tps:.0f}" if row.measured_tps else "-", f"{err:+.1f}",
                 mem_txt, "yes" if ev.fits else "NO", row.assumed]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    allerr = [e for v in errs.values() for e in v]
    print()
    for k, v in errs.items():
        print(f"MAPE {k}: {sum(v) / len(v):.1f}% over {len(v)} rows (max {max(v):.1f}%)")
    print(f"MAPE all published rows: {sum(allerr) / len(allerr):.1f}% over {len(allerr)} rows")
    if mem_errs:
        print(f"torchtitan memory (pred peak + {ALLOCATOR_FRAGMENTATION:.3f} x transient vs max "
              "reserved):"
              f" MAPE {sum(mem_errs) / len(mem_errs):.1f}% over {len(mem_errs)} rows")
    print(f"published runs predicted not to fit: {not_fit or 'none'}")
    print("\nSkipped rows:")
    for row in skipped:
        print(f"  #{row.idx} {row.name}: {row.skip}")

    print("\n## H200 pytorch-amp (single GPU)\n")
    hdr2 = ["model", "seq", "mbs", "recompute", "peak pred GiB", "peak meas GiB", "err%",
            "step pred ms", "step meas ms", "err%"]
    if markdown:
        print("| " + " | ".join(hdr2) + " |")
        print("|" + "---|" * len(hdr2))
    me, te = [], []
    for r, job, plan in h200_rows():
        ev = evaluate(job, plan)
        pm = ev.memory.peak_bytes
        ts = ev.time.step_s
        e1 = (pm / r["peak_bytes"] - 1) * 100
        e2 = (ts / r["step_s"] - 1) * 100
        me.append(abs(e1))
        te.append(abs(e2))
        cells = [str(r["model"]), str(r["seq"]), str(r["mbs"]), str(r["recompute"]),
                 f"{pm / GIB:.2f}", f"{r['peak_bytes'] / GIB:.2f}", f"{e1:+.1f}",
                 f"{ts * 1e3:.1f}", f"{r['step_s'] * 1e3:.1f}", f"{e2:+.1f}"]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    print(f"\nH200 peak memory MAPE {sum(me) / len(me):.1f}% (max {max(me):.1f}%), "
          f"step time MAPE {sum(te) / len(te):.1f}% (max {max(te):.1f}%) over {len(me)} rows")
    return 0


def heldout_section(markdown: bool) -> None:
    """Held-out runs (never looked at while the model was built), at the TUNED values."""
    from heldout import heldout_rows

    sep = " | " if markdown else "  "
    print("\n## Held-out published runs (tokens/s/GPU)\n")
    hdr = ["#", "source", "model", "GPUs", "plan", "pred", "meas", "err%", "fits", "assumed"]
    if markdown:
        print("| " + " | ".join(hdr) + " |")
        print("|" + "---|" * len(hdr))
    skipped = []
    for row in heldout_rows():
        if row.job is None or row.plan is None or not row.measured_tps:
            skipped.append(row)
            continue
        ev = evaluate(row.job, row.plan, row.options)
        pred = ev.throughput.tokens_per_s_per_gpu
        err = (pred / row.measured_tps - 1) * 100
        p = row.plan
        plan_txt = (f"tp{p.tp} pp{p.pp} v{p.vpp} cp{p.cp} ep{p.ep} dp{p.dp} z{p.zero} sp{p.sp} "
                    f"b{p.mbs} m{p.num_microbatches} {p.recompute}")
        cells = [str(row.idx), row.source, row.name[:24], str(row.job.num_gpus), plan_txt,
                 f"{pred:.0f}", f"{row.measured_tps:.0f}", f"{err:+.1f}",
                 "yes" if ev.fits else "NO", "; ".join(row.assumed)]
        print(("| " if markdown else "") + sep.join(cells) + (" |" if markdown else ""))
    print("\nSkipped held-out rows:")
    for row in skipped:
        print(f"  #{row.idx} {row.source} {row.name}: {row.skip}")


def error_tables(cv: bool, markdown: bool) -> None:
    """Per-source error (in-sample, and leave-one-source-out with `cv`) and ranking."""
    import crossval as X

    base = X.cases()
    insample = {c.key: X.predict(c) for c in base}
    preds_cv: dict[tuple[str, int], float] = {}
    fitted: dict[str, dict[str, float]] = {}
    if cv:
        _, table = X.grid_predictions()
        preds_cv, fitted = X.loso(base, table)
    print("\n## Error per source (tokens/s/GPU, percent)\n")
    hdr = ["source", "split", "rows", "MAPE", "signed", "worst", "slope/2x GPUs"]
    if cv:
        hdr += ["CV MAPE", "CV signed", "CV worst"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    ins = {s.source: s for s in X.source_stats(base, insample)}
    cvs = {s.source: s for s in X.source_stats(base, preds_cv)} if cv else {}
    for src, st in ins.items():
        cells = [src, st.split, str(st.n), X.fmt(st.mape, False), X.fmt(st.signed),
                 X.fmt(st.worst), X.fmt(st.slope_log2_gpus)]
        if cv:
            c = cvs[src]
            cells += [X.fmt(c.mape, False), X.fmt(c.signed), X.fmt(c.worst)]
        print("| " + " | ".join(cells) + " |")
    print()
    for label, group in (("all", base), ("development", [c for c in base if c.split == "dev"]),
                         ("held-out", [c for c in base if c.split == "heldout"])):
        m, sgn = X.mape(group, insample)
        line = f"{label}: {len(group)} rows, in-sample MAPE {m:.1f}%, signed {sgn:+.1f}%"
        if cv:
            m2, s2 = X.mape(group, preds_cv)
            line += f"; leave-one-source-out MAPE {m2:.1f}%, signed {s2:+.1f}%"
        print(line)
    a, t = X.ranking_agreement(base, insample)
    line = f"ranking agreement (same model shape, measured > 10% apart): {a}/{t}"
    if cv:
        a2, t2 = X.ranking_agreement(base, preds_cv)
        line += f" in-sample, {a2}/{t2} leave-one-source-out"
    print(line)
    if cv:
        print("\nTuned constants re-fitted per held-out source:")
        for src, vals in fitted.items():
            print(f"  {src}: " + ", ".join(f"{k}={v:g}" for k, v in vals.items()))


#: Other plausible values of each tuned constant (sources' ranges: the NVL part's 835 and the
#: SXM part's 989 TFLOP/s; no overlap to full overlap).
SENSITIVITY: dict[str, tuple[float, ...]] = {
    "h100_96_peak": (835.0, 912.0, 989.0),
    "megatron_tp_overlap": (0.0, 0.5, 0.8, 1.0),
}


def sensitivity() -> None:
    """How the headline moves when each unstated choice takes its other plausible values."""
    import crossval as X

    print("\n## Sensitivity of the headline to the tuned constants\n")
    print("| constant | value | dev MAPE | dev signed | held-out MAPE | held-out signed |")
    print("|---|---|---|---|---|---|")
    for name, values in SENSITIVITY.items():
        for v in values:
            cs = X.cases({name: v})
            preds = {c.key: X.predict(c) for c in cs}
            dev = [c for c in cs if c.split == "dev"]
            held = [c for c in cs if c.split == "heldout"]
            (m1, s1), (m2, s2) = X.mape(dev, preds), X.mape(held, preds)
            print(f"| {name} | {v:g} | {m1:.1f} | {s1:+.1f} | {m2:.1f} | {s2:+.1f} |")


def write_snapshot(path: Path) -> None:
    """Every evaluable row's signed error (percent) at the TUNED values, for the guard."""
    import crossval as X

    rows = {f"{c.split}:{c.key[1]}": round((X.predict(c) / c.measured - 1) * 100, 2)
            for c in X.cases()}
    path.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({len(rows)} rows)")


if __name__ == "__main__":
    if "--write-snapshot" in sys.argv:
        write_snapshot(DATA / "validation_snapshot.json")
        sys.exit(0)
    md = "--markdown" in sys.argv
    rc = main(md)
    heldout_section(md)
    error_tables("--cv" in sys.argv, md)
    if "--sensitivity" in sys.argv:
        sensitivity()
    sys.exit(rc)
