"""Held-out published runs (`data/published_runs_heldout.csv`): rows to (job, plan, options).

The 280 rows of 19 sources (`data/heldout_sources.md`) were collected after the cost model was
developed on `published_runs_train.csv`; no constant or mechanism was chosen while looking at
them. Each row becomes a job and a plan by rules per framework family, written once here and
cited; anything a source does not state is flagged in `assumed`, and rows that cannot be written
as a plan are skipped with the reason (the plan-space gaps of issue 15: MLA variants). Uneven
interleaved splits take the layout of the source's Megatron-Bridge recipe (`_bridge_layout`);
expert parallelism folded over tensor ranks is expressed with the plan's `etp` (MoE parallel
folding) where a Megatron-Bridge recipe sets it.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping

from autoparallel_cp.cost.factors import CostOptions, recipe_options
from autoparallel_cp.spec import ClusterSpec, Job
from autoparallel_cp.spec.plan import Plan, plan_violations
from harness import heldout_automodel as automodel
from harness import heldout_deepseek as deepseek
from harness import heldout_offload as offload
from harness import heldout_zb as zb
from harness.heldout_bridge import (
    CLAMPED_GLU_BIAS_MODELS,
    _bridge_cuda_graphs,
    _bridge_expert_tp,
    _bridge_layout,
    _bridge_moe_comm,
    _bridge_recompute_modules,
)
from harness.heldout_common import (
    CARD_SETTING_SOURCES,
    DATA,
    HeldOutRow,
    _card_settings,
    _family,
    _int,
    _model_name,
)
from harness.heldout_megatron import _mcore_before_013, _megatron_lm_defaults, _plain_mcore_minor
from harness.heldout_models import (
    IB_200_PER_GPU,
    OPA_4X100,
    _model,
    _node_group,
    _recompute,
    _zero,
)
from harness.heldout_recipes import _recipe
from harness.heldout_stated import (
    _stated_grad_accum,
    _stated_plan,
    _stated_settings,
    _stated_shape,
    _stated_stage_layers,
)
from harness.tuned import flag, knob


def heldout_rows(knobs: Mapping[str, float] | None = None) -> list[HeldOutRow]:
    """Every held-out row; the ones that cannot be evaluated carry `skip`. `knobs` overrides
    the tuned constants (validate.TUNED) for the rows that use them."""
    with open(DATA / "published_runs_heldout.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out: list[HeldOutRow] = []
    for i, r in enumerate(rows):
        assumed: list[str] = []
        src = r["source_id"]
        name = r["model"]
        measured = float(r["measured_tokens_per_s_per_gpu"] or 0) or None
        mem = float(r["measured_memory_gib"] or 0) or None

        def skip(why: str, fam: str = "", _i: int = i, _n: str = name, _s: str = src,
                 _m: float | None = measured) -> None:
            out.append(HeldOutRow(_i, _n, _s, fam, None, None, CostOptions(), _m, None,
                                  skip=why))

        family = _family(r) or deepseek.family(r)
        if family is None:
            skip(f"framework {r['framework']!r} ({r['framework_version'][:40]}) has no recipe")
            continue
        if measured is None:
            skip("no tokens/s/GPU measured", family)
            continue
        gpus = _int(r["num_gpus"])
        tp, pp = _int(r["tp"]), _int(r["pp"])
        seq, gb = _int(r["seq_len"]), _int(r["global_batch"])
        if gpus is None or tp is None or pp is None or seq is None or gb is None:
            skip("plan, sequence or batch not stated", family)
            continue
        cp = _int(r["cp"]) or 1
        vpp = _int(r["vpp"]) or 1
        ep = _int(r["ep"]) or 1
        dp = _int(r["dp"])
        am = automodel.settings(r)
        if am and automodel.pipeline_ga_gap(am, pp):
            skip("not expressible: " + automodel.pipeline_ga_gap(am, pp), family)
            continue
        stated_plan = _stated_plan(r)
        if stated_plan is not None:
            cells, why = stated_plan
            if cells.get("cp", cp) != cp:
                cp, dp = cells["cp"], None
            vpp = cells.get("vpp", vpp)
            ep = cells.get("ep", ep)
            assumed.append(why)
        if dp is None:
            if gpus % (tp * pp * cp):
                skip("gpus not a multiple of tp*pp*cp", family)
                continue
            dp = gpus // (tp * pp * cp)
        if dp * tp * pp * cp != gpus:
            skip(f"tp*pp*cp*dp = {dp * tp * pp * cp} != {gpus} GPUs", family)
            continue
        mbs = _int(r["micro_batch"])
        if stated_plan is not None and "mbs" in stated_plan[0]:
            mbs = stated_plan[0]["mbs"]
        if mbs is None:
            mbs = 1
            assumed.append("mbs=1")
        if gb % (dp * mbs):
            skip(f"global batch {gb} not a multiple of dp*mbs = {dp * mbs}", family)
            continue
        ga = _stated_grad_accum(r["notes"])
        if stated_plan is not None and "mbs" in stated_plan[0]:
            ga = None  # the launch files set the micro-batch: the table's GA cell follows it
        if ga is not None and ga != gb // (dp * mbs):
            # the source's own cells disagree (a table row whose GA cell does not match its
            # batch, micro-batch and parallel cells): which of them is wrong is not known, so
            # the run's plan cannot be written down
            skip(f"the source's GA cell ({ga}) contradicts gbs/(mbs*dp) = {gb // (dp * mbs)}",
                 family)
            continue
        model = _model(r, assumed)
        if model is None:
            skip("model shape not stated", family)
            continue
        shape = _stated_shape(r)
        if shape is not None:
            model = model.model_copy(update=shape[0])
            assumed.append(shape[1])
        if am and model.mtp_layers:
            # AutoModel's DeepseekV3ForCausalLM (components/models/deepseek_v3/model.py
            # @364f600be) builds no multi-token-prediction module
            model = model.model_copy(update={"mtp_layers": 0})
            assumed.append("no MTP module (AutoModel's DeepSeek-V3 model has none)")
        ng = _node_group(r["gpu"], gpus)
        if ng is None:
            skip(f"GPU {r['gpu']!r} not modelled", family)
            continue
        group, _ = ng
        if "4 opa links per node" in r["extra_config"].lower():
            group = group.model_copy(update={"inter_node": OPA_4X100})
            assumed.append("inter-node 4 x 100 Gb/s Omni-Path per node (the source's hardware)")
        if "h800" in r["gpu"].lower() and "ib 200gb/s" in r["extra_config"].lower():
            group = group.model_copy(update={"inter_node": IB_200_PER_GPU})
            assumed.append("inter-node InfiniBand 200 Gb/s per GPU (the source's H800 hosts)")
        precision = r["precision"].strip()
        if not precision:
            precision = "bf16"
            assumed.append("bf16 (precision not stated)")
        moe_comm = _bridge_moe_comm(r, tp, pp, vpp, ep, mbs) \
            if family == "megatron-core" else None
        if moe_comm is not None and not _int(r["moe_experts"]):
            # a dense card row: only the recipe's TP overlap applies
            moe_comm = ("alltoall", False, moe_comm[2])
        got = deepseek.recipe(assumed) if family == deepseek.FAMILY else _recipe(
            family, precision, r, tp, assumed, None if moe_comm is None else moe_comm[2])
        if got is None:
            skip("no recipe", family)
            continue
        recipe, sp_rule, tags = got
        if "megatron_tp_overlap" in tags:
            name_k = tags[0]
            recipe = recipe.with_behaviour(tp_comm_overlap=knob(knobs, name_k))
            assumed.append(flag(name_k, knobs))
        if "h100_96_peak" in tags:
            peak = knob(knobs, "h100_96_peak")
            group = group.model_copy(update={"gpu": group.gpu.model_copy(update={
                "bf16_tflops": peak, "fp8_tflops": 2 * peak})})
            assumed.append(flag("h100_96_peak", knobs))
        if recipe.compute_dtype == "fp8" and group.gpu.fp8_tflops is None:
            skip("fp8 on a GPU without fp8", family)
            continue
        recompute = _recompute(r["recompute"])
        schedule = None
        if family == deepseek.FAMILY:
            recompute, schedule = deepseek.STATED["recompute"], deepseek.STATED["schedule"]
        zb_schedule = zb.schedule(r)
        if zb_schedule is not None:
            schedule = zb_schedule[0]
            assumed.append(zb_schedule[1])
        stated_rc = _stated_settings(r).get("recompute") if family == "megatron-core" else None
        if recompute is None and stated_rc is not None:
            recompute = str(stated_rc)
            assumed.append(f"{recompute} recompute (the source's YAML)")
        modules = _bridge_recompute_modules(r) if family == "megatron-core" else None
        if recompute in (None, "selective") and modules is not None:
            # the Megatron-Bridge performance recipe of this model and GPU states them
            recompute = "selective"
            recipe = recipe.with_behaviour(recompute_modules=modules)
            assumed.append("selective recompute of " + "/".join(modules) + (
                " (the card's recipe)" if src in CARD_SETTING_SOURCES
                else " (Megatron-Bridge perf recipe @067f987)"))
        if family == "megatron-core" and _model_name(r).startswith(CLAMPED_GLU_BIAS_MODELS):
            recipe = recipe.with_behaviour(moe_glu_clamp_bias=True)
            assumed.append("eager clamp/cat before the fused quick-GEGLU and fp32 per-expert fc2 "
                           "bias (Megatron-Core core_v0.15.0-0.18.0 TEGroupedMLP, GPT-OSS "
                           "clamp 7.0 + expert biases per Megatron-Bridge gpt_oss_bridge.py)")
        if _card_settings(r).get("dp_overlap") == "0":
            # the card's recipe sets ddp.overlap_grad_reduce=False
            recipe = recipe.with_behaviour(dp_overlap=False)
            assumed.append("DP reduction not overlapped (the card's recipe)")
        lm_defaults = _megatron_lm_defaults(r)
        if recompute is None and family == "maxtext":
            # MaxText's configs/base.yml default `remat_policy: 'full'`
            recompute = "full"
            assumed.append("full remat (MaxText default remat_policy)")
        elif recompute is None and lm_defaults:
            # the memory flags of MEGATRON_LM_DEFAULTS (sp follows from the "tp>1" rule)
            recompute = "selective"
        elif recompute is None:
            recompute = "none"
            assumed.append("no recompute (not stated)")
        zero = automodel.zero_stage(am, pp, assumed) if am else _zero(r["zero_stage"])
        if zero is None and lm_defaults:
            zero = 1 if lm_defaults["distributed_optimizer"] else 0
        elif zero is None:
            zero = 1 if family in ("megatron-core", "megatron-deepspeed") else 0
            assumed.append(f"zero={zero} (distributed optimizer)" if zero else "zero=0")
        sp = 1 if (r["sp"].strip().lower() == "yes" or (sp_rule == "tp>1" and tp > 1)) else 0
        if sp and r["sp"].strip().lower() != "yes":
            assumed.append("sp with tp")
        L = model.num_layers
        stage_layers: tuple[int, ...] | None = None
        stated_stages = _stated_stage_layers(r)
        chunk_layers: tuple[int, ...] | None = None
        zb_chunks = zb.chunk_layers(r, L, pp, vpp)
        if zb_chunks is not None:
            chunk_layers = zb_chunks
            assumed.append("chunks " + ":".join(map(str, zb_chunks))
                           + " (the ZB fork's layer padding, heldout_zb)")
        elif am and vpp > 1:
            chunk_layers = automodel.chunk_layers(am, L, pp, vpp)
            if chunk_layers is None:
                skip(f"{L} layers: the YAML's layers_per_stage does not give pp {pp} x vpp "
                     f"{vpp} virtual stages", family)
                continue
            assumed.append("virtual stages " + ":".join(map(str, chunk_layers))
                           + " (AutoModel autopipeline split of layers_per_stage)")
        elif L % (pp * vpp) and vpp > 1:
            if family != "megatron-core":
                skip(f"{L} layers on pp {pp} x vpp {vpp}: no recipe layout for {family}",
                     family)
                continue
            chunk_layers, why = _bridge_layout(name, L, pp, vpp)
            assumed.append(why)
        elif stated_stages is not None and vpp == 1:
            stated_sl, why_sl = stated_stages
            if len(stated_sl) != pp or sum(stated_sl) != L:
                skip(f"stated stage layers {stated_sl} do not give {L} layers on pp {pp}",
                     family)
                continue
            stage_layers = stated_sl
            assumed.append("stage layers " + "/".join(map(str, stated_sl)) + f" ({why_sl})")
        elif L % (pp * vpp):
            # first and last stages hold the remainder less (Megatron-DeepSpeed
            # 'type:transformer|embedding', Llama 3's one fewer layer on the edge stages)
            base = -(-L // pp)
            edge = (L - base * (pp - 2)) // 2 if pp > 2 else L // 2
            stage_layers = tuple([edge] + [base] * (pp - 2) + [L - edge - base * (pp - 2)])
            assumed.append(f"stage layers {stage_layers[0]}/{base}/{stage_layers[-1]}")
        etp = _bridge_expert_tp(r) if family == "megatron-core" else None
        where = ("the card's recipe" if src in CARD_SETTING_SOURCES
                 else "Megatron-Bridge recipe @067f987")
        if etp is not None:
            assumed.append(f"etp={etp} ({where})")
        if moe_comm is not None and _int(r["moe_experts"]):
            dispatcher, overlap, _ = moe_comm
            recipe = recipe.with_behaviour(ep_dispatcher=dispatcher, ep_overlap=overlap)
            assumed.append(f"{dispatcher} MoE dispatcher" + (", EP overlap" if overlap else "")
                           + f" ({where})")
        graphs = _bridge_cuda_graphs(r, mbs) if _int(r["moe_experts"]) else ()
        if graphs:
            recipe = recipe.with_behaviour(cuda_graph_scopes=graphs)
            assumed.append("TE CUDA graphs of " + "/".join(graphs) + f" ({where})")
        if family == "megatron-core" and _int(r["moe_experts"]) and _mcore_before_013(r):
            recipe = recipe.with_behaviour(moe_prob_scaling="combine")
            assumed.append("router probabilities applied at the combine (Megatron-Core "
                           "before 0.13)")
        if moe_comm is None and _int(r["moe_experts"]) and _plain_mcore_minor(r) == 6:
            # a plain Megatron-LM launch that names no dispatcher runs the default
            recipe = recipe.with_behaviour(ep_dispatcher="allgather")
            assumed.append("allgather MoE dispatcher (Megatron core_v0.6.0 default, "
                           "arguments.py l. 1592-1594; the launch sets none)")
        opt_off, act_off, off_behaviour, off_notes = offload.offload(r)
        if off_behaviour:
            recipe = recipe.with_behaviour(**off_behaviour)
        assumed += off_notes
        cl = ClusterSpec(name=group.name, node_groups=[group])
        try:
            job = Job(model=model, cluster=cl, recipe=recipe, seq_len=seq, global_batch=gb)
            plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs,
                        num_microbatches=gb // (dp * mbs), recompute=recompute,
                        stage_layers=stage_layers, chunk_layers=chunk_layers, etp=etp,
                        schedule=schedule, optimizer_offload=opt_off,
                        activation_offload=act_off)
        except ValueError as exc:
            skip(f"not expressible: {str(exc).splitlines()[0][:80]}", family)
            continue
        bad = plan_violations(job, plan)
        if bad:
            skip("plan breaks: " + "; ".join(bad), family)
            continue
        out.append(HeldOutRow(i, name, src, family, job, plan, recipe_options(recipe),
                              measured, mem, assumed, knobs=tags))
    return out
