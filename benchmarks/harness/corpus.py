"""Hardware, links and recipes of the published runs, as their sources state them (the GPUs,
NVLink and InfiniBand generations, the Megatron-LM of 2021-22 and torchtitan recipes, the H200
of the measurements), shared by the row readers (train_rows, heldout_models)."""

from __future__ import annotations

from autoparallel_cp.spec import RECIPES, ClusterSpec, GPUSpec, LinkSpec, NodeGroup, TrainingRecipe

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


H200 = GPUSpec(name="H200", memory_gib=139.8, bf16_tflops=989.0, fp8_tflops=1979.0,
               hbm_gbps=4800.0, source="H200 SXM datasheet; 139.8 GiB per torch")


#: measure_h200.py: fp32 params under autocast, fused AdamW, no gradient clipping.
H200_RECIPE = RECIPES["pytorch-amp"].model_copy(update={"grad_clip": False})
