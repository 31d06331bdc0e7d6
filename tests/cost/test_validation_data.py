"""The published-run validation (benchmarks/validate.py) stays where it was recorded, both ways.

Every row's signed error is pinned to `benchmarks/data/validation_snapshot.json` within
PIN_POINTS, so a change that makes any prediction faster *or* slower fails here and must be
explained in its commit (then `python benchmarks/validate.py --write-snapshot`). The signed
bias overall and per source, and the worst row, are bounded too: a MAPE bound alone rewards a
bug that slows an optimistic model down.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autoparallel_cp.cost.evaluate import evaluate

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from harness import crossval, train_rows  # noqa: E402

#: Allowed drift of one row's signed error (percentage points) before the snapshot is updated.
PIN_POINTS = 1.0

SNAPSHOT: dict[str, float] = json.loads(
    (BENCH / "data" / "validation_snapshot.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def errors() -> dict[str, tuple[crossval.Case, float]]:
    return {f"{c.split}:{c.key[1]}": (c, (crossval.predict(c) / c.measured - 1) * 100)
            for c in crossval.cases()}


def test_every_row_pinned_both_ways(errors: dict[str, tuple[crossval.Case, float]]) -> None:
    assert set(errors) == set(SNAPSHOT), "rows added or lost: rerun --write-snapshot"
    moved = {k: (round(e, 2), SNAPSHOT[k]) for k, (_, e) in errors.items()
             if abs(e - SNAPSHOT[k]) > PIN_POINTS}
    assert moved == {}, f"signed error moved (now, recorded): {moved}"


def _by_source(errors: dict[str, tuple[crossval.Case, float]], split: str
               ) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for key, (c, e) in errors.items():
        if key.startswith(split):
            out.setdefault(c.source, []).append(e)
    return out


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_signed_bias_and_worst_row_bounded(
        errors: dict[str, tuple[crossval.Case, float]], split: str) -> None:
    """Overall and per-source signed mean and the worst row match the snapshot's (the
    recorded state of the model, RESULTS.md), within PIN_POINTS."""
    now = _by_source(errors, split)
    rec: dict[str, list[float]] = {}
    for key, (c, _) in errors.items():
        if key.startswith(split):
            rec.setdefault(c.source, []).append(SNAPSHOT[key])
    for src, errs in now.items():
        mean_now = sum(errs) / len(errs)
        mean_rec = sum(rec[src]) / len(rec[src])
        assert abs(mean_now - mean_rec) <= PIN_POINTS, (src, mean_now, mean_rec)
    all_now = [e for v in now.values() for e in v]
    all_rec = [e for v in rec.values() for e in v]
    assert abs(sum(all_now) / len(all_now) - sum(all_rec) / len(all_rec)) <= PIN_POINTS
    assert max(map(abs, all_now)) <= max(map(abs, all_rec)) + PIN_POINTS


def test_development_rows_fit_and_memory_bound() -> None:
    """No development run is predicted not to fit; no predicted torchtitan peak (allocated)
    exceeds the measured max reserved memory, and predicted reserved memory (peak +
    fragmentation on the transient bytes, `train_rows.predicted_reserved_bytes`) is within 10% of
    it on average (9.3% with torchtitan's default layer split for the 405B rows; 11.0% when
    the old rule charged 5% on the whole peak)."""
    mem_errs = []
    for row in train_rows.published_rows():
        if row.job is None or row.plan is None:
            assert row.skip
            continue
        ev = evaluate(row.job, row.plan, row.options)
        assert ev.fits, f"published run #{row.idx} predicted not to fit"
        if row.measured_mem_gib:
            assert ev.memory.peak_bytes / 2**30 <= row.measured_mem_gib, row.idx
            reserved = train_rows.predicted_reserved_bytes(ev) / 2**30
            mem_errs.append(abs(reserved / row.measured_mem_gib - 1))
    assert len(mem_errs) == 18
    assert sum(mem_errs) / len(mem_errs) < 0.10


def test_every_unstated_choice_is_flagged() -> None:
    """A row that uses a tuned constant says so in `assumed` (issue 16: unflagged choices)."""
    from harness.heldout import heldout_rows
    from harness.tuned import flag

    n = 0
    for row in train_rows.published_rows():
        for k in row.knobs:
            assert flag(k) in row.assumed, (row.idx, k)
            n += 1
    for h in heldout_rows():
        for k in h.knobs:
            assert flag(k) in h.assumed, (h.idx, k)
            n += 1
    assert n > 0


def test_plain_megatron_lm_rows_take_their_commits_defaults() -> None:
    """MegaScale's Megatron-LM baseline states only commit 285068c8: the flags it leaves out
    take that commit's argument defaults (megatron/arguments.py: `--use-flash-attn` and
    `--use-distributed-optimizer` are store_true, dropout defaults to 0.1, DP reduction is not
    overlapped), and the memory flags Korthikanti et al. 2022 (Table 5) give GPT-3 175B:
    sequence parallelism + selective recompute. Rows of other frameworks keep theirs."""
    from harness.heldout import heldout_rows

    ms = [h for h in heldout_rows() if h.source == "megascale-2024" and h.plan is not None]
    assert len(ms) == 8
    for h in ms:
        assert h.job.recipe.flash_attention is False
        assert h.options.dropout is True and h.options.dp_overlap is False
        assert (h.plan.sp, h.plan.zero, h.plan.recompute) == (1, 0, "selective")
        assert any("285068c8 defaults" in a for a in h.assumed)
    others = [h for h in heldout_rows() if h.source == "flagperf" and h.plan is not None]
    assert others and not any("285068c8" in a for h in others for a in h.assumed)


def test_interleaved_megatron_rows_take_their_sources_p2p_overlap() -> None:
    """The megatron-bf16 / megatron-fp8 recipes overlap the interleaved p2p as Megatron-LM main
    does (store_false `--no-overlap-p2p-communication`, arguments.py:3118-3120 @d98e8a64), but
    a row runs what its source or software era had: on where the NeMo 24.07 / dgxc v25.02 YAMLs
    set `overlap_p2p_comm: true` or Megatron-Bridge's CommOverlapConfig sets it at vpp > 1
    (comm_overlap.py l. 453-457: mbridge-perf, the mbridge-cards DeepSeek-V3 card); off for
    NeMo 24.07's Nemotron-340B (nemotron_340b.yaml l. 135 `overlap_p2p_comm: False`), for
    MegaScale's Megatron-LM 285068c8 (2023-01-11) and the 2021-22 papers' Megatron-LM, which
    predate the option (f9283c5a8a, 2023-05-31); on for the Zero Bubble paper's fork 6574e0ea
    (its arguments.py l. 1167, store_false). No interleaved row is left to the recipe's
    default."""
    from harness.heldout import heldout_rows
    from harness.heldout_megatron import P2P_MAIN_DEFAULT

    on = {"dgxc-bench-25.02", "mbridge-perf", "mbridge-cards", "zero-bubble-iclr24"}
    off = {"megascale-2024"}
    seen: set[str] = set()
    for h in heldout_rows():
        if h.plan is None or h.plan.vpp == 1 or h.job is None or \
                h.job.recipe.framework != "megatron" or h.job.recipe.name == "deepspeed":
            continue
        seen.add(h.source)
        assert not any(P2P_MAIN_DEFAULT in a for a in h.assumed), h.idx
        assert any(a.startswith("pipeline p2p ") for a in h.assumed), h.idx
        want = h.source in on or (h.source == "nemo-perf-24.07" and h.name != "Nemotron-340B")
        assert h.source in on | off | {"nemo-perf-24.07"}, h.source
        assert h.job.recipe.behaviour.overlap_p2p_comm is want, (h.idx, h.name)
    assert seen == on | off | {"nemo-perf-24.07"}
    train = [r for r in train_rows.published_rows()
             if r.plan is not None and r.plan.vpp > 1 and r.source in ("sc21", "korthikanti")]
    assert len(train) == 8
    for r in train:
        assert r.job is not None and r.job.recipe.behaviour.overlap_p2p_comm is False
        assert "pipeline p2p not overlapped" in r.assumed


def test_bloom_row_runs_its_slurm_scripts_settings() -> None:
    """BLOOM's tr11 slurm script sets no dropout flag (the bigscience Megatron-DeepSpeed fork's
    default is 0.1) and the fork has no sequence parallelism: dropout on, sp off."""
    from harness.heldout import heldout_rows

    rows = [h for h in heldout_rows() if h.source == "bloom-tr11" and h.plan is not None]
    (h,) = [h for h in rows if "prequel" not in h.name]
    assert h.options.dropout is True
    assert h.plan.sp == 0 and h.plan.tp == 4
    assert h.job.recipe.flash_attention is False
    # the prequel's fp16 throughput experiments (chronicles-prequel.md): the same fork's
    # defaults, and fp16 gradients held in .grad and reduced in fp16
    prequel = [h for h in rows if "prequel" in h.name]
    assert len(prequel) == 10
    for h in prequel:
        assert h.options.dropout is True and h.plan.sp == 0
        assert h.job.recipe.flash_attention is False
        assert h.job.recipe.grad_bytes == 2 and h.job.recipe.grad_reduce_bytes == 2
        assert h.job.recipe.behaviour.autograd_grad_accum
    warmup = sorted((h for h in prequel if h.job.model.num_layers == 78),
                    key=lambda h: h.plan.num_microbatches)
    assert [h.plan.num_microbatches for h in warmup] == [32, 64, 96, 128]
    assert all(h.plan.stage_layers == (7,) * 11 + (1,) for h in warmup)
    assert sorted(h.plan.zero for h in prequel) == [0] + [1] * 9


def test_gpt_bloom_mpt_rows_share_embedding_and_output() -> None:
    """Megatron-LM / NeMo GPT, BLOOM and MPT tie the output layer to the word embedding by
    default (none of these rows' configurations unties it); Llama-family rows do not, except
    FlagPerf's Llama 3 runs, whose launch script leaves Megatron-Core's default (tied: no
    --untie-embeddings-and-output-weights in pretrain_llama3.sh @1b5a030398)."""
    from harness.heldout import heldout_rows

    rows = [h for h in heldout_rows() if h.job is not None]
    for h in rows:
        name = h.job.model.name.lower()
        if any(k in name for k in ("gpt3", "gpt-3", "gpt 175b", "bloom", "mpt")):
            assert h.job.model.tie_embeddings, h.idx
        if "llama" in name:
            flagperf_llama3 = h.source == "flagperf" and name.startswith("llama3")
            assert h.job.model.tie_embeddings == flagperf_llama3, h.idx


def test_dgxc_rows_run_their_launch_files_plan_and_fp8_params() -> None:
    """dgxc-benchmarking v25.02 (@8f5cbb3799): nemotron/configure.sh runs the 340B with CP=2 in
    BF16 only (128 GPUs / (tp 8 x pp 8 x cp 2) = dp 1, 16 micro-batches of GBS 32 become 32),
    and the FP8 runs of Llama 3.1, Nemotron-4 and Grok-1 pass fp8_params=true (1-byte weights);
    BF16 runs keep 2 bytes."""
    from harness.heldout import heldout_rows

    rows = [h for h in heldout_rows() if h.source == "dgxc-bench-25.02" and h.plan is not None]
    nem = {(h.job.recipe.compute_dtype, h.plan.tp * h.plan.pp * h.plan.cp * h.plan.dp):
           h.plan for h in rows if h.name == "Nemotron-4 340B"}
    assert (nem[("bf16", 128)].cp, nem[("bf16", 128)].dp) == (2, 1)
    assert nem[("bf16", 128)].num_microbatches == 32
    assert (nem[("bf16", 2048)].cp, nem[("bf16", 2048)].dp) == (2, 16)
    assert (nem[("fp8", 128)].cp, nem[("fp8", 128)].dp) == (1, 2)
    for h in rows:
        if h.name.startswith(("Llama 3.1", "Nemotron-4", "Grok-1", "GPT-3")):
            fp8 = h.job.recipe.compute_dtype == "fp8"
            assert h.job.recipe.weight_bytes == (1 if fp8 else 2), h.name


def test_bridge_perf_rows_run_their_containers_perf_configs() -> None:
    """Megatron-Bridge's 25.11 performance table (NeMo 25.11 = Megatron-Bridge v0.2.0) states
    EP 8 for GPT-OSS 120B on 64 B200 and VP 24 for Qwen3 30B-A3B on 16 H100; v0.2.0's
    scripts/performance/configs set expert_model_parallel_size=64 (gpt_oss
    workload_base_configs.py, B200 BF16) and virtual_pipeline_model_parallel_size=12 (qwen3,
    H100 FP8-CS). With EP 64 on 64 GPUs and tp = 1 the expert-DP group is 64 / 64 = 1 rank.
    The table's 25.11 GPT-OSS H100 cells (MBS 4, GA 2) contradict each other (GBS 512 over
    dp 64 / pp 4 = 16 at MBS 4 is GA 8); the config runs MBS 1: GA 512 / 16 = 32.
    The 26.04.01 GPT-OSS B200 row (v0.4.x `_B200_BF16_V2`: EP 8, HybridEP) runs the flex
    dispatcher; the 26.04.01 H100 row (`_H100_BF16_V2`, no backend set) stays on alltoall."""
    from harness.heldout import heldout_rows

    rows = {(h.name, h.job.cluster.node_groups[0].gpu.name[:4], h.job.global_batch): h
            for h in heldout_rows() if h.source == "mbridge-perf" and h.job is not None}
    oss_25 = rows[("GPT OSS 120B", "B200", 512)]
    assert (oss_25.plan.ep, oss_25.plan.dp, oss_25.plan.expert_dp) == (64, 64, 1)
    assert oss_25.options.ep_dispatcher == "alltoall"
    assert any("ep=64" in a for a in oss_25.assumed)
    oss_h100 = rows[("GPT OSS 120B", "H100", 512)]
    assert (oss_h100.plan.pp, oss_h100.plan.dp, oss_h100.plan.mbs) == (4, 16, 1)
    assert oss_h100.plan.num_microbatches == 32
    qwen_25 = rows[("Qwen3_30B_a3B", "H100", 512)]
    assert (qwen_25.plan.pp, qwen_25.plan.vpp, qwen_25.plan.mbs) == (2, 12, 2)
    assert qwen_25.plan.num_microbatches == 512 // (8 * 2)
    oss_26 = rows[("GPT OSS 120B", "B200", 1280)]
    assert (oss_26.plan.ep, oss_26.options.ep_dispatcher) == (8, "flex")
    assert rows[("GPT OSS 120B", "H100", 1280)].options.ep_dispatcher == "alltoall"


def test_llmfoundry_pure_rows_reduce_gradients_in_bf16() -> None:
    """llm-foundry's benchmark tables state the FSDP "MP Mode": Composer's PURE sets the
    reduce dtype to the precision (bf16, 2 bytes on the wire), DEFAULT to fp32
    (composer/trainer/mosaic_fsdp_utils.py @v0.16.4 `get_mixed_precision`)."""
    import csv

    from harness.heldout import heldout_rows
    from harness.heldout_common import DATA

    with open(DATA / "published_runs_heldout.csv", newline="") as fh:
        notes = [r["notes"] for r in csv.DictReader(fh)]
    rows = [h for h in heldout_rows() if h.source == "llmfoundry-bench" and h.job is not None]
    modes = {"PURE": 0, "DEFAULT": 0}
    for h in rows:
        mode = "PURE" if "MP mode PURE" in notes[h.idx] else "DEFAULT"
        modes[mode] += 1
        assert h.job.recipe.grad_reduce_bytes == (2 if mode == "PURE" else 4), h.idx
    assert modes["PURE"] > 0 and modes["DEFAULT"] > 0


def test_olmo_core_rows_take_the_scripts_settings() -> None:
    """The olmo-core rows run what OLMo-core's scripts state at the README's commit
    (allenai/OLMo-core @a7de3f651c): one 8-GPU node (BeakerLaunchConfig num_nodes=1,
    num_gpus=8), FSDP2 resharding after forward (ZeRO-3), no activation checkpointing, the
    `rank_microbatch_size` / `global_batch_size` token counts of each script divided by the
    4096-token sequence, fused AdamW, SDPA on cuDNN attention (torch 2.6.0.dev20241009), torchao
    float8 only in the BF16/FP8 rows, and `llama_like`'s FFN rounding with QK-norm on the
    OLMo-1124 models only."""
    from harness.heldout import heldout_rows

    def ffn(d: int, mult: float | None, of: int) -> int:
        # llama_like: int(8d/3), times the multiplier, rounded up to a multiple of `of`
        width = int(8 * d / 3)
        if mult is not None:
            width = int(mult * width)
        return of * -(-width // of)

    seq = 4096
    # script: (rank_microbatch_size, global_batch_size) in tokens, d_model, ffn, qk-norm
    stated = {"OLMo-1124 1B": (8 * seq, 1024 * seq, 2048, ffn(2048, None, 256), True),
              "OLMo-1124 7B": (2 * seq, 1024 * seq, 4096, ffn(4096, None, 256), True),
              "Llama 8B (OLMo-core)": (2 * seq, 1024 * seq, 4096, ffn(4096, 1.3, 1024), False),
              "OLMo-1124 13B": (1 * seq, 2048 * seq, 5120, ffn(5120, None, 256), True)}
    rows = [h for h in heldout_rows() if h.source == "olmo-core"]
    assert len(rows) == 8 and all(h.job is not None and h.plan is not None for h in rows)
    precisions = []
    for h in rows:
        assert h.job is not None and h.plan is not None
        micro, glob, d, width, qk = stated[h.name]
        p, job, rec = h.plan, h.job, h.job.recipe
        assert (job.num_gpus, p.dp, p.tp, p.pp, p.cp, p.zero) == (8, 8, 1, 1, 1, 3)
        assert p.recompute == "none" and job.seq_len == seq
        assert p.mbs == micro // seq and job.global_batch == glob // seq
        assert p.num_microbatches == glob // (8 * micro)
        assert (job.model.hidden_size, job.model.ffn_hidden_size) == (d, width)
        assert job.model.qk_norm is qk and not job.model.tie_embeddings
        assert job.model.vocab_size == 128 * -(-100278 // 128)
        assert rec.optimizer_kernel == "fused" and h.options.attention_kernel == "cudnn"
        assert h.options.fused is True
        precisions.append(rec.compute_dtype)
    assert sorted(precisions) == ["bf16"] * 4 + ["fp8"] * 4
def test_automodel_rows_run_their_yamls_settings() -> None:
    """NeMo AutoModel's pre-training table (automodel-perf) as its benchmark YAMLs and
    framework code set it (benchmarks/harness/heldout_automodel.py), derived by hand:

    - DeepSeek-V3 on 256 GPUs, pp 4, `layers_per_stage: 2`: ceil(61 / 2) + 1 = 32 virtual
      stages (a multiple of 4: vpp 8), 61 = 32 + 29, so stages 0-28 hold 2 layers and 29-31
      one; stage s runs on rank s mod 4: rank 0 holds 8 x 2 = 16, ranks 1-3 7 x 2 + 1 = 15.
      GA 1, so its 512 / 64 = 8 micro-batches of 1 are one pipeline schedule; FSDP under PP
      with no reshard after forward gathers once per step (zero=1); no MTP module;
    - the 1,024-GPU DeepSeek-V3 row (GA 4) and Kimi K2 (GA 2) run GA pipeline schedules a
      step, which a plan cannot state: skipped with that reason;
    - Qwen3 30B-A3B: FSDP optimizations on, no reshard after forward (zero=1, fp32 unsharded
      gradients, the bf16 shard as the optimizer's copy); 512 / (8 x 4) = 16 micro-batches;
    - GPT-OSS 20B: reshard_after_forward False without the optimizations (zero=2), 120B:
      True (zero=3, no recompute); FlexAttention as the FA2-class curve, the window 128 - 1.
    Every row: bf16 parameters and Adam states, fp32 reduction, no clipping, DeepEP (flex)."""
    from harness import heldout_automodel as am
    from harness.heldout import heldout_rows

    rows = [h for h in heldout_rows() if h.source == am.SOURCE]
    assert len(rows) == 6
    skipped = {h.name: h.skip for h in rows if h.job is None}
    assert set(skipped) == {"DeepSeek V3 671B", "Kimi K2"}
    assert all("pipeline schedules per step" in why for why in skipped.values())
    by = {h.name.split(" (")[0]: h for h in rows if h.job is not None}
    ds = by["DeepSeek V3 671B"]
    assert (ds.plan.pp, ds.plan.vpp, ds.plan.dp, ds.plan.ep, ds.plan.expert_dp) == (4, 8, 64, 64, 1)
    assert (ds.plan.zero, ds.plan.mbs, ds.plan.num_microbatches) == (1, 1, 8)
    assert ds.plan.chunk_layers == (2,) * 29 + (1,) * 3
    assert ds.plan.layers_per_stage(61) == (16, 15, 15, 15)
    assert ds.job.model.mtp_layers == 0 and ds.plan.recompute == "full"
    qw = by["Qwen3 30B-A3B"]
    assert (qw.plan.zero, qw.plan.ep, qw.plan.mbs, qw.plan.num_microbatches) == (1, 8, 4, 16)
    assert (qw.job.recipe.grad_bytes, qw.job.recipe.master_weight_bytes) == (4, 2)
    oss20, oss120 = by["GPT OSS 20B"], by["GPT OSS 120B"]
    assert (oss20.plan.zero, oss20.plan.recompute) == (2, "full")
    assert (oss120.plan.zero, oss120.plan.recompute) == (3, "none")
    assert (oss20.job.recipe.grad_bytes, oss20.job.recipe.master_weight_bytes) == (2, 0)
    assert oss20.job.model.sliding_window_left == 127
    for h in by.values():
        rec = h.job.recipe
        assert (rec.weight_bytes, rec.optimizer_state_bytes, rec.grad_reduce_bytes) == (2, 4, 4)
        assert not rec.grad_clip and rec.optimizer_kernel == "foreach"
        assert h.options.ep_dispatcher == "flex" and h.options.unfused_ops == ("rope",)
        want = "fa2" if h.name.startswith("GPT OSS") else "cudnn"
        assert h.options.attention_kernel == want, h.name
    # the split rule on its own: 36 layers by 2 on pp 2 is 19 stages, rounded down to 18
    assert am.chunk_layers({"layers_per_stage": "2"}, 36, 2, 9) == (2,) * 18
    assert am.chunk_layers({"layers_per_stage": "2"}, 61, 8, 4) == (2,) * 29 + (1,) * 3
    assert am.chunk_layers({"layers_per_stage": "2"}, 61, 4, 4) is None


def test_deepseek_v3_report_runs_dualpipe_within_15_percent(
        errors: dict[str, tuple[crossval.Case, float]]) -> None:
    """Issue 31: DeepSeek-V3's published 1,543 tokens/s/GPU (2,048 H800, arXiv 2412.19437 §1)
    is a held-out row, evaluated with its stated DualPipe schedule and the deepseek-v3-fp8
    recipe (harness/heldout_deepseek.py), and predicted within 15%."""
    got = [(c, e) for c, e in errors.values() if c.source == "deepseek-v3-report"]
    assert len(got) == 1
    case, err = got[0]
    assert case.split == "heldout"
    assert case.plan.pipeline_schedule == "dualpipe"
    assert (case.plan.pp, case.plan.ep, case.plan.zero, case.plan.dp) == (16, 64, 1, 128)
    assert case.job.recipe.name == "deepseek-v3-fp8"
    assert abs(err) < 15.0
