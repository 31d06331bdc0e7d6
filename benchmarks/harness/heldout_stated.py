"""Held-out rows: what each source states about its runs beyond the CSV's columns (settings,
userbuffers SM margins, plans, layer shapes, gradient accumulation), per source id, cited."""

from __future__ import annotations

import re

from harness.heldout_common import _card_settings, _for_model, _model_name

#: Settings the sources' published configuration files state, per source and model prefix
#: (`_model_name`; "" matches every model of the source):
#: - `bf16_grads`: gradient buffers and their reduction in bf16 (the value names the setting).
#:   NeMo 1.x YAMLs: `optim.grad_sync_dtype: bf16` (unset means the optimizer's fp32: Apex
#:   DistributedFusedAdam's `grad_sync_dtype` defaults to its `dtype`, which NeMo sets to fp32).
#:   Megatron-Bridge benchmark recipes: `grad_reduce_in_fp32 = False` (perf_recipes/_common.py
#:   `_benchmark_common` / `_perf_precision` @067f987), so Megatron's DDP grad buffer takes the
#:   param dtype.
#: - `fp8_params`: fp8 weight storage in FP8 runs (`model.fp8_params: true`; dgxc-bench-25.02's
#:   llama3.1/configure.sh and nemotron/configure.sh pass `+model.fp8_params=$FP8_ENABLED`,
#:   grok1/configure.sh `model.fp8_params=${FP8_ENABLED^}`: true in the FP8 runs only).
#: - `recompute`: `activations_checkpoint_granularity` (null unless listed).
#: - `dropout`: `hidden_dropout` / `attention_dropout` 0.1 (the GPT-3 YAMLs of both sources;
#:   their Llama, Nemotron and Grok YAMLs set 0.0).
#: - `optimizer`: `optim.name: distributed_fused_adam` (Apex DistributedFusedAdam; the Grok-1 and
#:   Nemotron-4 15B YAMLs use Megatron-Core's `mcore_distributed_optim` instead) with the state
#:   dtype `optim.dtype` (fp32 when unset). NeMo (nemo/collections/nlp/models/language_modeling/
#:   megatron_base_model.py `setup_optimization` @v2.0.0) keeps no master copy when the state
#:   dtype is the bf16 model dtype (store_params False), only the 16 trailing bits of the fp32
#:   master when the state is fp32 (store_param_remainders; Apex: "store bits required to
#:   reconstruct FP32 params"), and a full fp32 copy with fp8 params (store_params True): master
#:   0 / 2 / 4 B per parameter, Adam's two moments 2 x the state dtype.
#: - `overlap_p2p` / `no_overlap_p2p`: Megatron-Core's interleaved-schedule p2p overlap on /
#:   off (behaviour `overlap_p2p_comm`), as the YAML's `overlap_p2p_comm` / `batch_p2p_comm` or
#:   the recipe's CommOverlapConfig sets it. Every interleaved Megatron-Core row's setting is
#:   stated here or by its Megatron-LM commit (MEGATRON_LM_DEFAULTS), not taken from the
#:   recipes' Megatron-LM main default (`_p2p_overlap`).
#: Kept for the record, not applied: the launcher 24.07 YAMLs of GPT-3 175B (gpt3/175b.yaml
#: l. 149, 175b_fp8.yaml l. 149) and Nemotron-4 340B (nemotron/nemotron_340b.yaml l. 156) set
#: `ub_tp_comm_overlap: False`, while the nemo-perf-24.07 rows assume TP overlap on (as every
#: NeMo row with tp > 1). Those YAMLs (and examples/training/gpt/h100/175b_fp8_16node.sh) run
#: plans the table does not (vpp 12 against the table's 6; pp 12 x vpp 8 against pp 8 x vpp
#: 12), so they are not the table's launch files for these two models, and the table's GPT-3
#: 175B FP8 at 128 GPUs (716 tokens/s/GPU) matches dgxc-bench-25.02's NeMo 24.12 run of the
#: same plan with userbuffers on (256 x 2048 / 5.626 s / 128 = 728). Applied, the three rows
#: went +6.9 / -6.3 / -0.7% to -3.3 / -15.0 / -13.6% (in-sample nemo-perf 5.8 / +3.5 -> 7.3 /
#: +0.8%).
#: Files: dgxc-bench-25.02: NVIDIA/dgxc-benchmarking @8f5cbb3799 (tag v25.02)
#: llama3.1/llama3.1_{8b,70b,405b}.yaml, nemo_megatron/gpt3_175b_hydra.yaml,
#: nemotron/nemotron4-{15b,340b}-synth.yaml, grok1/grok1_314b.yaml; nemo-perf-24.07:
#: NVIDIA/NeMo-Framework-Launcher tag 24.07, launcher_scripts/conf/training/{gpt3,llama,
#: nemotron}/*.yaml (only Nemotron 340B sets grad_sync_dtype and selective recompute).
_FLAGPERF_DROPOUT = ("FlagPerf @1b5a030398 training/benchmarks/%s sets no dropout flag: "
                     "Megatron core_v0.6.0 arguments.py default 0.1")


_YAML_GRADS = "optim.grad_sync_dtype in the source's YAML"


_YAML_DROPOUT = "hidden/attention dropout 0.1 in the source's YAML"


_YAML_P2P = "overlap_p2p_comm true, batch_p2p_comm false in the source's %s"


STATED_SETTINGS: dict[str, dict[str, dict[str, object]]] = {
    "zero-bubble-iclr24": {
        "": {"bf16_grads": "fp16 gradient buffers: --fp16 without "
                           "--accumulate-allreduce-grads-in-fp32, which the ZB fork's "
                           "arguments.py @6574e0ea ll. 224-236 forces only for bf16"},
    },
    "dgxc-bench-25.02": {
        "llama 3.1": {"bf16_grads": _YAML_GRADS, "optimizer": "fp32", "fp8_params": True,
                      "overlap_p2p": _YAML_P2P % "llama3.1_{70b,405b}.yaml"},
        "gpt-3 175b": {"bf16_grads": _YAML_GRADS, "fp8_params": True, "dropout": _YAML_DROPOUT,
                       "optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "gpt3_175b_hydra.yaml l. 91-92"},
        "nemotron-4 340b": {"bf16_grads": _YAML_GRADS, "recompute": "selective",
                            "optimizer": "bf16", "fp8_params": True,
                            "overlap_p2p": _YAML_P2P % "nemotron/configure.sh l. 86-88 "
                                                       "overrides"},
        "nemotron-4 15b": {"fp8_params": True},
        "grok-1": {"bf16_grads": _YAML_GRADS, "fp8_params": True,
                   "overlap_p2p": _YAML_P2P % "grok1_314b.yaml l. 97-98"},
    },
    "nemo-perf-24.07": {
        "nemotron-340b": {"bf16_grads": _YAML_GRADS, "recompute": "selective",
                          "optimizer": "bf16",
                          "no_overlap_p2p": "overlap_p2p_comm false, batch_p2p_comm true in "
                                            "the source's nemotron/nemotron_340b.yaml l. "
                                            "135-136 (24.07)"},
        "gpt3": {"dropout": _YAML_DROPOUT, "optimizer": "fp32",
                 "overlap_p2p": _YAML_P2P % "gpt3/175b.yaml l. 108-109 (24.07)"},
        "llama2-13b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama2_13b.yaml l. 137 (24.07)"},
        "llama2-70b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama2_70b.yaml l. 140 (24.07)"},
        "llama3-70b": {"optimizer": "fp32",
                       "overlap_p2p": _YAML_P2P % "llama/llama3_70b.yaml l. 138 (24.07)"},
        "nemotron-22b": {"optimizer": "fp32",
                         "overlap_p2p": _YAML_P2P % "nemotron/nemotron_22b.yaml l. 138 (24.07)"},
        "": {"optimizer": "fp32"},
    },
    # Every Megatron-Bridge perf config runs with a CommOverlapConfig (scripts/performance/
    # configs/{llama31,qwen3,deepseek}/*_llm_pretrain.py set or update `cfg.comm_overlap` at
    # v0.2.0 717c62de40 and v0.4.1; the DeepSeek-V3 recipe creates one when unset), and its
    # `_get_model_comm_overlap_cfgs` sets overlap_p2p_comm true / batch_p2p_comm false at
    # pp > 1 with vpp > 1 (src/megatron/bridge/training/comm_overlap.py l. 451-457, the same
    # at v0.1.0rc4, v0.2.0 and v0.4.1): the interleaved rows' p2p overlap is stated.
    # The mbridge-cards DeepSeek-V3 card's recipe (perf_recipes/deepseek/h100/deepseek_v3.py
    # on recipes/deepseek/h100/deepseek_v3.py l. 228 `cfg.comm_overlap = CommOverlapConfig(
    # tp_comm_overlap=False)` at the card's bridge_commit 79308d0d9) runs the same setup
    # (training/config.py l. 2027-2029, comm_overlap.py l. 453-457 @79308d0d9): at vpp 4 its
    # p2p overlap is on.
    "mbridge-cards": {"deepseekv3": {"overlap_p2p": "overlap_p2p_comm true, batch_p2p_comm "
                                                    "false by Megatron-Bridge's CommOverlapConfig "
                                                    "at vpp > 1 (training/comm_overlap.py l. "
                                                    "453-457 @79308d0d9)"}},
    "mbridge-perf": {"": {"bf16_grads": "Megatron-Bridge benchmark default",
                          "overlap_p2p": "overlap_p2p_comm true, batch_p2p_comm false by "
                                         "Megatron-Bridge's CommOverlapConfig at vpp > 1 "
                                         "(training/comm_overlap.py l. 451-457)"}},
    # bigscience train/tr11-176B-ml/tr11-176B-ml.slurm @9e64ede sets no dropout flag, so the
    # fork's defaults hold (bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py
    # @8387ae17: --attention-dropout / --hidden-dropout 0.1), and that fork has no sequence
    # parallelism (no such argument)
    # The prequel's throughput tables (train/tr11-176B-ml/chronicles-prequel.md @9e64ede) ran
    # fp16 until its "Rebalancing layers" section ("from now on the testing is happening with
    # BF16 optimizer ... compared to fp16 which grad accumulates in fp16"): DeepSpeed's fp16
    # path keeps the gradients in the fp16 `.grad` that autograd adds into and reduces them
    # in fp16 (engine.py `communication_data_type`)
    "bloom-tr11": {"bloom prequel": {"dropout": "the fork's default 0.1 (tr11's launch sets none)",
                                     "no_sp": "the bigscience Megatron-DeepSpeed fork has none",
                                     "half_grad_accum": "fp16 runs of the prequel: gradients "
                                                        "accumulated and reduced in fp16"},
                   "bloom": {"dropout": "tr11 slurm sets none: the fork's default 0.1",
                             "no_sp": "the bigscience Megatron-DeepSpeed fork has none"}},
    # FlagOpen/FlagPerf @1b5a030398 training/nvidia/llama2_7b-megatron-deepspeed/config/
    # ds_config.json: bf16, ZeRO stage 1, "data_types": {"grad_accum_dtype": "bf16"}; DeepSpeed
    # then runs its ZeRO optimizer, not BF16_Optimizer (engine.py @v0.11.1
    # `_do_optimizer_sanity_check` l. 1135-1177: BF16_Optimizer only with fp32 accumulation).
    # The Megatron-Core rows (core_v0.6.0, cac60ce4) launch with the flags of FlagPerf's
    # training/benchmarks/<model>/megatron/*.sh, which set no --attention-dropout /
    # --hidden-dropout, so Megatron's defaults hold (megatron/training/arguments.py @core_v0.6.0
    # l. 854-857: 0.1 each). FlagScale's llama2_70B megatron_main.sh sets both to 0.0.
    # Unfused elementwise ops (behaviour `unfused_ops`, cost/unfused_ops.py):
    # - Llama 2 70B: FlagPerf's llama2_70B/megatron/megatron_main.sh passes --swiglu and
    #   --use-rotary-position-embeddings and neither --use-mcore-models nor --transformer-impl,
    #   so FlagScale @26cd664 builds its legacy layer (arguments.py l. 614 default 'local'):
    #   megatron/model/transformer.py l. 138-145 `F.silu(x[0]) * x[1]`, l. 868-869
    #   Megatron-Core's unfused `apply_rotary_pos_emb`; the RMSNorm is Apex's
    #   MixedFusedRMSNorm (megatron/model/__init__.py) and bias-dropout-add jit-fused.
    # - Llama 2 7B: megatron-deepspeed_main.sh passes --swiglu and
    #   --use-rotary-position-embeddings before its '#' line; microsoft/Megatron-DeepSpeed
    #   @6d4c535e megatron/model/transformer.py l. 130-134 (swiglu, its fc1 bias added before
    #   it: skip_bias_add=True, l. 117, 163-165) and l. 777-778 (megatron/model/
    #   rotary_pos_embedding.py); the LayerNorm is Apex's MixedFusedLayerNorm.
    #   Megatron-DeepSpeed's attention also splits the fused QKV output with slices and
    #   selects (l. 641-644: a zeros-filled gradient of the whole output per part in backward)
    #   and copies the strided v before FlashAttention-2 (l. 799-800); FlagPerf's image pins
    #   11f2d934 (training/nvidia/docker_image/megatron-deepspeed/megatron-deepspeed_install.sh),
    #   two commits before 6d4c535e with the same megatron/model/.
    # - Llama 2 70B, grouped-query: the legacy layer expands K and V to all 64 heads with
    #   `repeat_interleave` (l. 855-864) before the RoPE (behaviour `gqa_repeat_kv`; the RoPE
    #   then runs on 64 K heads, cost/unfused_ops.py).
    # - Mixtral: mixtral_8x7B/megatron/megatron_main.sh passes --no-rope-fusion: Megatron-LM
    #   core_v0.6.0 (cac60ce4) attention.py l. 289-292 then runs rotary_pos_embedding.py
    #   `apply_rotary_pos_emb_bshd` (l. 173-196); the TE layer keeps the rest fused.
    "flagperf": {
        "llama2 7b": {"bf16_grad_accum": "ds_config.json: ZeRO-1 with grad_accum_dtype bf16, "
                                         "no BF16_Optimizer",
                      "unfused_ops": (("rope-legacy", "swiglu", "qkv-slice"),
                                      "megatron-deepspeed_main.sh @1b5a030398 --swiglu "
                                      "--use-rotary-position-embeddings --use-flash-attn-v2: "
                                      "Megatron-DeepSpeed @6d4c535e megatron/model/"
                                      "transformer.py l. 130-134, 641-644, 777-778, 799-800")},
        "llama2 70b": {"unfused_ops": (("rope", "swiglu"),
                                       "llama2_70B/megatron/megatron_main.sh @1b5a030398: "
                                       "FlagScale @26cd664 legacy layer, "
                                       "megatron/model/transformer.py l. 138-145, 868-869"),
                       "repeat_kv": "FlagScale @26cd664 legacy layer: repeat_interleave "
                                    "before RoPE, megatron/model/transformer.py l. 855-864"},
        "llama3": {"dropout": _FLAGPERF_DROPOUT % "llama3_{8B,70B}/megatron/pretrain_llama3.sh"},
        "mixtral": {"dropout": _FLAGPERF_DROPOUT % "mixtral_8x7B/megatron/megatron_main.sh",
                    "unfused_ops": (("rope",),
                                    "mixtral_8x7B/megatron/megatron_main.sh @1b5a030398 "
                                    "--no-rope-fusion: Megatron-LM cac60ce4 "
                                    "rotary_pos_embedding.py l. 173-196")},
    },
}


#: Plan cells a source's launch files set where its tables' headers say otherwise (source id ->
#: (model prefix, precision or "" for both) -> ({"cp"/"vpp": value}, citation)); dp follows as
#: gpus / (tp*pp*cp). dgxc-bench-25.02 (@8f5cbb3799, tag v25.02) changed them in this release,
#: the commit that re-measured those tables, and left the table headers at their v25.01.1
#: (e6afea3) text, so the launch files are taken as the runs:
#: - nemotron/configure.sh l. 71-77: the 340B runs `CP=1`, `CP=2` when `DTYPE = bf16`, passed as
#:   `model.context_parallel_size=$CP` (absent at v25.01.1); the BF16 table went 4.77 -> 4.61 s
#:   at 128 GPUs, its header "(TP=8, PP=8, MBS=1, GA=16, VP=12)" (GA 16 is cp 1's) unchanged.
#: Kept for the record, not applied: nemo_megatron/gpt3_175b_hydra.yaml l. 57 sets
#: `virtual_pipeline_model_parallel_size: 6` (12 at v25.01.1; configure.sh overrides no parallel
#: size) and both GPT-3 tables were re-measured (128 GPUs BF16 8.91 -> 8.309 s, FP8 5.92 ->
#: 5.626 s) under headers still "VP=12". With vpp 6 the model sends half the interleaved p2p
#: messages, rows 62-65 went +15.8/+16.6/+6.8/+10.9 -> +18.7/+19.5/+10.8/+15.0 and LOSO all
#: 14.5 -> 14.6% (ranking 870 -> 868/896). With the p2p overlap costed (behaviour
#: `overlap_p2p_comm`, cost/sync.py; the YAML sets `overlap_p2p_comm: true`, `batch_p2p_comm:
#: false` l. 91-92) vpp 6 and 12 cost nearly the same (+21.6/+22.3/+14.6/+18.8 against
#: +21.4/+22.2/+14.0/+18.2), but the overlap itself is not applied to any row: set on every
#: interleaved row whose files state it (dgxc-bench-25.02's Llama 3.1 70B/405B, GPT-3, Nemotron-4
#: 340B, Grok-1; NeMo launcher 24.07's gpt3/175b, llama2_13b/70b, llama3_70b, nemotron_22b
#: YAMLs), with this vpp 6, it moved dgxc-bench-25.02 from 11.4 / +6.5 to 12.8 / +8.5 in-sample
#: (CV 8.3 / +2.0 -> 8.7 / +2.7), nemo-perf-24.07 from 11.0 / +10.6 to 13.0 / +12.9 (CV 9.2 /
#: +5.5 -> 10.0 / +7.6), mcore's CV (the refitted TP-overlap constant) 10.6 -> 12.6, and LOSO
#: all 14.1 / +8.0 -> 14.4 / +8.2% (held-out 16.2 -> 16.4%, ranking 870/896 unchanged): these
#: rows are already optimistic, the hidden transfers only add to it.
#: SMs the source's userbuffers configuration reserves from the forward GEMMs whose output it
#: reduce-scatters in `pipeline` mode (source id -> model prefix -> ((proj_fprop, fc2_fprop)
#: `num_sm` with `set_sm_margin: 1`, citation); behaviour `ub_rs_sm_margin`,
#: cost/efficiency.py `sm_reserve_stretch`). Both precisions run the same YAML; the
#: dgxc-bench-25.02 models not listed run `ub_tp_comm_overlap` with Transformer Engine's
#: default configuration (no SM margin: Nemotron-4 15B, and 340B via configure.sh) or without
#: userbuffers (Grok-1, Llama 3.1 8B at tp 1).
#: Kept for the record, not applied: the only launch setting that differs between a BF16 run
#: and its FP8 twin besides fp8 / fp8_hybrid / fp8_params (and 340B's cp, STATED_PLAN) is
#: `NVTE_UB_SPLIT_AG`, which nemo_megatron/ and nemotron/configure.sh take from
#: NeMo-Framework-Launcher's conditional_cfgs.py `get_ag_overlap` (0 on sm90 in BF16: "Disable
#: AG overlap with P2P ring-exchange at H100 BF16 training"); Transformer Engine stopped reading
#: that variable in v1.4 (bdf1afeef, "Use arguments instead of env vars for TP comm overlap"),
#: before NeMo 24.12's TE, so the BF16 runs keep the YAMLs' ring-exchange all-gathers. The
#: 405B FP8 runs also set `fp8_buf` on proj_fprop / fc2_fprop (fp8 reduce-scatter buffers).
UB_RS_SM_MARGIN: dict[str, dict[str, tuple[tuple[int, int], str]]] = {
    "dgxc-bench-25.02": {
        "llama 3.1 70b": ((24, 16), "llama3.1/llama3.1_70b.yaml @8f5cbb3799 "
                                    "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                    "num_sm 16, pipeline, set_sm_margin 1"),
        "llama 3.1 405b": ((24, 8), "llama3.1/llama3.1_405b.yaml @8f5cbb3799 "
                                    "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                    "num_sm 8, pipeline, set_sm_margin 1"),
        "gpt-3 175b": ((24, 20), "nemo_megatron/gpt3_175b_hydra.yaml @8f5cbb3799 "
                                 "ub_tp_comm_overlap_cfg: proj_fprop num_sm 24, fc2_fprop "
                                 "num_sm 20, pipeline, set_sm_margin 1"),
    },
    # the NeMo-Framework-Launcher 24.07 training YAMLs that set `ub_tp_comm_overlap: true` and
    # name a tp_overlap file (launcher_scripts/conf/training/tp_overlap/*.yaml @24.07)
    "nemo-perf-24.07": {
        "llama2-70b": ((24, 16), "llama/llama2_70b.yaml -> tp_overlap/ub_cfg_h100_h8192_tp4_"
                                 "mbs1_seqlen4096.yaml (24.07): proj_fprop / fc2_fprop num_sm "
                                 "24 / 16, pipeline, set_sm_margin 1"),
        "llama3-70b": ((24, 16), "llama/llama3_70b.yaml -> tp_overlap/ub_cfg_h100_h8192_tp4_"
                                 "mbs1_seqlen8192.yaml (24.07): proj_fprop / fc2_fprop num_sm "
                                 "24 / 16, pipeline, set_sm_margin 1"),
        "gpt3-20b": ((16, 24), "gpt3/20b.yaml -> tp_overlap/ub_cfg_h100_h6144_tp2_mbs2_"
                               "seqlen2048.yaml (24.07): proj_fprop / fc2_fprop num_sm 16 / 24, "
                               "pipeline, set_sm_margin 1"),
    },
}


STATED_PLAN: dict[str, dict[tuple[str, str], tuple[dict[str, int], str]]] = {
    "dgxc-bench-25.02": {
        ("nemotron-4 340b", "bf16"): ({"cp": 2}, "cp=2 in BF16 (nemotron/configure.sh "
                                                 "@8f5cbb3799)"),
        ("gpt-3 175b", ""): ({"vpp": 6}, "vpp=6 (nemo_megatron/gpt3_175b_hydra.yaml l. 57 "
                                         "@8f5cbb3799)"),
    },
}


#: Plan cells of mbridge-perf rows where the performance-summary table disagrees with the
#: Megatron-Bridge performance config of the row's own container, keyed by (model prefix, GPU
#: prefix, container in `framework_version`) -> ({"ep"/"vpp"/"mbs": value}, citation); the config is
#: taken as the run (NVIDIA-NeMo/Megatron-Bridge, read at the mirror; NeMo 25.11 ships
#: Megatron-Bridge v0.2.0 = 717c62de40, docs/releases/software-versions.md @067f987df):
#: - GPT-OSS 120B, 64 B200, BF16, GBS 512 (25.11 table: EP 8): v0.2.0 scripts/performance/
#:   configs/gpt_oss/workload_base_configs.py `GPT_OSS_120B_B200_BF16_BASE_CONFIG` sets
#:   `expert_model_parallel_size=64`, `micro_batch_size=4` (since 34641780a, 2025-11-20, "fix
#:   GPT-OSS perf scripts"), and the GBS-512 B200 config keeps EP 64 in v0.3.0/v0.3.1/v0.4.x
#:   (`..._B200_BF16_V1`); EP 8 (with HybridEP) is only the GBS-1280 `_V2` of v0.4.0. The
#:   archive's tables follow the configs elsewhere: 26.02 (v0.3.0, V2 = V1 + GBS 1280, EP 64)
#:   states EP 64 at 8,047 tokens/s/GPU, 26.02.01 EP 8 at 13,722; this row's 8,213 is the EP-64
#:   figure. Its GA cell (2) holds for either EP (dp = 64).
#: - Qwen3 30B-A3B, 16 H100, FP8-CS (25.11 table: VP 24): every version of v0.2.0's
#:   scripts/performance/configs/qwen3/workload_base_configs.py
#:   `QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG` (fbf96a3dc .. 717c62de40) sets
#:   `pipeline_model_parallel_size=2`, `virtual_pipeline_model_parallel_size=12` (24 is the
#:   layers per pipeline stage, 48 / 2). Its micro-batch stays the table's 2 (GA 32 agrees):
#:   the config had `micro_batch_size=2` until 8aed9a229 (2025-11-21), which dropped it to 1 and
#:   added `moe_a2a_overlap` together, so the table's cells are the earlier config's, without
#:   the EP overlap (87aa39ce7: pp 2, vpp 12, mbs 2, no dispatcher backend, no CUDA graphs;
#:   qwen3_llm_pretrain.py: recompute off, `moe_router_fusion`; Qwen3MoEModelProvider:
#:   alltoall, `moe_permute_fusion`, grouped GEMM, no `moe_router_padding_for_fp8`).
#:   Kept for the record (predicted +114%, nothing costed): the same archive file times this
#:   plan's pipeline layout at about 33 ms per layer and micro-batch whatever the micro-batch:
#:   25.11 mbs 2 (5,275 tokens/s/GPU: 24.8 s / (32 x 24)) and 26.02 (Megatron-Bridge v0.3.0
#:   `QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1`: pp 2, vpp 12, ep 8, DeepEP, EP overlap)
#:   mbs 1 GBS 1024 (5,113: 51.3 s / (64 x 24)); the 25.09 table's token-drop run of the same
#:   plan (16 H100, mbs 2, PP 2, EP 8) made 10,494 (16.3 ms). The next patch release's table
#:   (26.02.01) prints the same cells (pp 2, vpp 12, ep 8, mbs 1, GBS 1024) at 9,058, but its
#:   Megatron-Bridge v0.3.1 `QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1` runs pp 1, ep 16,
#:   HybridEP, no EP overlap (the cells look carried over), as 26.04 (v0.4.0) states at 8,901
#:   (9.7 ms at mbs 1). The model predicts about the token-drop figure here
#:   (11,289) and on the 8 B200 mbs-1 row (16,604 against 25.09's token-drop 18,066 and 25.11's
#:   dropless 9,299). A cost fixed per layer and micro-batch that only the
#:   dropless pp-2 layout pays is no mechanism read in the sources: the interleaved schedule
#:   (get_schedule_table, group = pp) with a per-chunk P2P latency of 0.7-3 ms adds 0.06-0.16 s
#:   to this row's step (simulated; sync.py's overlap already hides the steady state), and
#:   TE v2.9's current-scaling `split_quantize` (cast.cpp: per-expert allocation, amax,
#:   scale and cast launches) adds host ops to a layer that stays GPU-bound in moe_host.py.
#: - GPT-OSS 120B, 64 H100, BF16, GBS 512 (25.11 table: MBS 4, EP 8, GA 2, the B200 row's cells
#:   with PP 4; GA 2 contradicts gbs / (mbs * dp) = 8): v0.2.0's
#:   `GPT_OSS_120B_H100_BF16_BASE_CONFIG` sets `pipeline_model_parallel_size=4` on the base's
#:   `expert_model_parallel_size=8`, `micro_batch_size=1` (GA 512 / 16 = 32); the same in
#:   v0.4.x `_H100_BF16_V1`, whose GBS-1280 `_V2` the 26.04.01 table states as MBS 1.
#: Kept for the record (the per-step costs of these MoE rows, read in Megatron-Core 0d8e0714 =
#: v0.2.0's 3rdparty/Megatron-LM and d7288711 = v0.4.1's; nothing added): the same-plan pair
#: rows 32 / 44 (GPT-OSS H100 pp4 ep8 mbs1, 32 and 80 micro-batches, 25.11 / 26.04.01) gives
#: 0.172 s per micro-batch + 0.32 s per step measured against the model's 0.143 + 0.46, so
#: the gap is per micro-batch; 38 / 47 are no pair (EP 64 alltoall vs EP 8 HybridEP). Expert
#: gradients sit in their own DDP buffers (`expert_parallel_buffers`,
#: distributed/distributed_data_parallel.py:316-321) reduced over the expert-DP group, in
#: buckets of max(40M, 1M x dp) parameters (:58-60), overlapped like the dense ones; with
#: `overlap_param_gather` the distributed optimizer skips its synchronous all-gather
#: (optimizer/distrib_optimizer.py:2593-2599) and the forward pre-hooks gather one bucket
#: group ahead in the next step's first forward (param_and_grad_buffer.py:283-301), a window
#: cost/steptime.py does not split out (charging all-gather and reduce-scatter against the last
#: backward: 0.709 s exposed on row 47 against 0.46 s with the split; the split over
#: every overlapped Megatron row moved in-sample all 12.1 / +6.2% to 12.2 / +6.5%, not
#: applied). The perf runs turn off `check_for_nan_in_grad` and `check_for_nan_in_loss`
#: (scripts/performance/utils/helpers.py v0.2.0 `set_common_perf_overrides`; overrides.py
#: v0.4.1), leave `num_distributed_optimizer_instances` at 1; the grad-norm all-reduce, the
#: per-step loss / MoE-metric reductions (`log_interval = 1`) and the calculate_per_token_loss
#: token-count all-reduce are a few elements each.
BRIDGE_STATED_PLAN: dict[tuple[str, str, str], tuple[dict[str, int], str]] = {
    ("gpt oss", "b200", "NeMo 25.11"): (
        {"ep": 64}, "ep=64 (Megatron-Bridge v0.2.0 scripts/performance/configs/gpt_oss/"
                    "workload_base_configs.py GPT_OSS_120B_B200_BF16_BASE_CONFIG)"),
    ("gpt oss", "h100", "NeMo 25.11"): (
        {"mbs": 1}, "mbs=1 (Megatron-Bridge v0.2.0 scripts/performance/configs/gpt_oss/"
                    "workload_base_configs.py BASE_GPT_OSS_120B_CONFIG, H100 BF16)"),
    ("qwen3 30b", "h100", "NeMo 25.11"): (
        {"vpp": 12}, "vpp=12 (Megatron-Bridge v0.2.0 scripts/performance/configs/qwen3/"
                     "workload_base_configs.py QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG)"),
}


def _stated_plan(r: dict[str, str]) -> tuple[dict[str, int], str] | None:
    """(plan cells, citation) a row's source's launch files set for its model and precision
    (for mbridge-perf rows: its container's performance config, BRIDGE_STATED_PLAN)."""
    if r["source_id"] == "mbridge-perf":
        model, gpu = _model_name(r), r["gpu"].lower()
        return next((v for (m, g, c), v in BRIDGE_STATED_PLAN.items()
                     if model.startswith(m) and g in gpu and c in r["framework_version"]),
                    None)
    table = STATED_PLAN.get(r["source_id"], {})
    prec = r["precision"].strip().lower()
    return next((v for (m, p), v in table.items()
                 if _model_name(r).startswith(m) and p in ("", prec)), None)


#: Layer-shape flags a source's launch command leaves at its framework's defaults, where the
#: row's public model config says otherwise (source id -> model prefix -> (ModelSpec updates,
#: citation)):
#: - FlagPerf Llama 3 on Megatron-Core core_v0.6.0 (cac60ce4): pretrain_llama3.sh @1b5a030398
#:   passes neither --position-embedding-type rope / --use-rotary-position-embeddings, nor
#:   --untie-embeddings-and-output-weights, nor --disable-bias-linear, so arguments.py @core_v0.6.0
#:   defaults hold: learned absolute position embeddings (l. 709), the output layer sharing the
#:   word embedding (l. 754, store_true), biases on every linear layer (l. 1033, store_false
#:   `add_bias_linear`). RMSNorm and SwiGLU are passed.
#: - FlagPerf Llama 2 7B on Megatron-DeepSpeed: megatron-deepspeed_main.sh @1b5a030398 builds the
#:   command in one double-quoted string with backslash continuations and runs `eval $cmd`; the
#:   line `#--recompute-activations \` puts a `#` word inside it, so eval reads everything after
#:   it as a comment: `--normalization rmsnorm`, `--disable-bias-linear`,
#:   `--num-key-value-heads` and the ds_args (whose `--zero-stage=$ZERO_STAGE` is empty and
#:   would not parse) never reach pretrain_gpt.py. Megatron-DeepSpeed's defaults
#:   (microsoft/Megatron-DeepSpeed megatron/arguments.py @6d4c535e, the last commit before the
#:   case was added on 2024-02-06): `--normalization` layernorm (l. 635), biases on (l. 907);
#:   the kv heads default to the 32 heads, as stated.
_BIASES = {"qkv_bias": True, "attn_out_bias": True, "mlp_bias": True}


#: - OLMo-core's OLMo-1124 models (the olmo-core rows): `TransformerConfig.olmo_{1B,7B,13B}`
#:   (nn/transformer/config.py @a7de3f651c) are `llama_like` (SwiGLU FFN, RMSNorm, RoPE, no
#:   biases) with `qk_norm=True` and the reordered-norm block (OLMo 2: each sublayer's output
#:   normed before the residual add, in place of the input pre-norm: the same two norms per
#:   layer, costed at the pre-norm positions). OLMo-core's q / k norms are RMSNorms over the
#:   whole q and k projections (`qk_norm.build(size=d_model)`, nn/attention.py), the model's
#:   `qk_norm` per head: the same elementwise traffic, 2·(h − head_dim) fewer norm weights
#:   per layer (under 0.03% of the parameters).
STATED_SHAPE: dict[str, dict[str, tuple[dict[str, object], str]]] = {
    "olmo-core": {
        "olmo-1124": ({"mlp": "swiglu", "norm": "rmsnorm", "qk_norm": True},
                      "SwiGLU, RMSNorm, QK-norm (OLMo-core TransformerConfig.olmo_* "
                      "@a7de3f651c; whole-projection q/k norms costed per head)"),
    },
    "flagperf": {
        "llama3": ({"position_embedding": "learned", "tie_embeddings": True, **_BIASES},
                   "learned absolute positions, tied output layer, linear biases "
                   "(pretrain_llama3.sh leaves Megatron core_v0.6.0 defaults)"),
        "baichuan2": ({"position_embedding": "alibi", "mlp": "swiglu", "norm": "rmsnorm",
                       "tie_embeddings": False},
                      "ALiBi positions, SwiGLU MLP, RMSNorm, untied output head "
                      "(Baichuan2-13B-Base config.json and modeling_baichuan.py: no rotary "
                      "embedding in the 13B model, a separate NormHead lm_head)"),
        "llama2 7b": ({"norm": "layernorm", **_BIASES},
                      "LayerNorm and linear biases (megatron-deepspeed_main.sh: the "
                      "'#--recompute-activations' line comments out the flags after it under "
                      "eval; Megatron-DeepSpeed defaults)"),
    },
}


def _stated_shape(r: dict[str, str]) -> tuple[dict[str, object], str] | None:
    """The STATED_SHAPE updates and citation of this row's source and model, or None."""
    return _for_model(STATED_SHAPE.get(r["source_id"], {}), r)


def _stated_settings(r: dict[str, str]) -> dict[str, object]:
    """The STATED_SETTINGS of this row's source and model ({} when none are listed)."""
    listed = _for_model(STATED_SETTINGS.get(r["source_id"], {}), r) or {}
    if _card_settings(r).get("grads") == "bf16":
        return {**listed, "bf16_grads": "the card's recipe: grad_reduce_in_fp32=False"}
    return listed


def _stated_grad_accum(notes: str) -> int | None:
    """The gradient-accumulation cell a row's notes record from its source table ("source GA
    column says N" / "Source GA N"), None where the source states none."""
    m = re.search(r"[Ss]ource GA (?:column says )?(\d+)", notes)
    return int(m.group(1)) if m else None


#: Pipeline stage sizes a source states where they differ from the harness's edge layout
#: (source id -> model prefix -> (layers per stage, citation)).
STATED_STAGE_LAYERS: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {
    "bloom-tr11": {
        "bloom prequel 182b (78x13824)": (
            (7,) * 11 + (1,),
            "chronicles-prequel.md 'Re-do': 78/12 = 6.5, so the last stage has 1 block and "
            "the rest 7"),
    },
}


def _stated_stage_layers(r: dict[str, str]) -> tuple[tuple[int, ...], str] | None:
    """The STATED_STAGE_LAYERS (layers per stage, citation) of this row, or None."""
    return _for_model(STATED_STAGE_LAYERS.get(r["source_id"], {}), r)
