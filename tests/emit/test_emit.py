"""Launch-settings export: Megatron-LM arguments, torchtitan TOML, DeepSpeed JSON."""

from __future__ import annotations

import json

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import EMIT_FORMATS, deepspeed_config, emit, megatron_args
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import parse_plan, plan_violations


@pytest.fixture(scope="module")
def job() -> Job:
    return make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64)


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_megatron_parallel_and_batch_args(job: Job) -> None:
    plan = parse_plan("tp=4,pp=2,vpp=2,cp=2,sp=1,zero=1,mbs=1,recompute=selective", job)
    assert plan_violations(job, plan) == []
    args, notes = megatron_args(job, plan)
    assert _arg(args, "--tensor-model-parallel-size") == "4"
    assert _arg(args, "--pipeline-model-parallel-size") == "2"
    assert _arg(args, "--context-parallel-size") == "2"
    assert _arg(args, "--num-layers-per-virtual-pipeline-stage") == "8"  # 32 / (2*2)
    assert "--sequence-parallel" in args
    assert "--use-distributed-optimizer" in args
    assert _arg(args, "--micro-batch-size") == "1"
    assert _arg(args, "--global-batch-size") == "64"
    assert _arg(args, "--seq-length") == "8192"
    assert _arg(args, "--recompute-granularity") == "selective"
    assert "--bf16" in args and "--fp8-format" not in args
    assert _arg(args, "--num-query-groups") == "8"
    # pp 2 interleaved: Megatron overlaps the pipeline sends, as the default recipe costs them
    assert notes == [] and "--no-overlap-p2p-communication" not in args


def test_megatron_selective_recompute_modules(job: Job) -> None:
    """A recipe's `recompute_modules` become `--recompute-modules` (space-separated list, as
    Megatron-LM's docs write it: `--recompute-modules layernorm moe_act`); the default
    ["core_attn"] is Megatron's own default and is not repeated."""
    plan = parse_plan("tp=4,pp=2,mbs=1,recompute=selective", job)
    args, _ = megatron_args(job, plan)
    assert "--recompute-modules" not in args
    rec = job.recipe.model_copy(update={"behaviour": job.recipe.behaviour.model_copy(
        update={"recompute_modules": ("layernorm", "mlp")})})
    args, _ = megatron_args(job.model_copy(update={"recipe": rec}), plan)
    i = args.index("--recompute-modules")
    assert args[i + 1:i + 3] == ["layernorm", "mlp"]
    assert args[i + 3].startswith("--")


def test_megatron_full_and_partial_recompute(job: Job) -> None:
    full = parse_plan("tp=8,pp=4,mbs=1,recompute=full", job)
    args, _ = megatron_args(job, full)
    assert _arg(args, "--recompute-method") == "uniform"
    assert _arg(args, "--recompute-num-layers") == "1"
    part = parse_plan("tp=8,pp=4,mbs=1,recompute=full,recompute_layers=3", job)
    args, _ = megatron_args(job, part)
    assert _arg(args, "--recompute-method") == "block"
    assert _arg(args, "--recompute-num-layers") == "3"


def test_megatron_zero3_fp8_and_uneven_partition() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=32,
                   recipe="megatron-fp8")
    plan = parse_plan("tp=4,pp=4,zero=3,mbs=1,stage_layers=7:9:9:7", job)
    assert plan_violations(job, plan) == []
    args, notes = megatron_args(job, plan)
    assert _arg(args, "--data-parallel-sharding-strategy") == "optim_grads_params"
    assert "--use-megatron-fsdp" in args
    assert _arg(args, "--fp8-format") == "hybrid"
    assert _arg(args, "--decoder-first-pipeline-num-layers") == "7"
    assert _arg(args, "--decoder-last-pipeline-num-layers") == "7"
    assert notes == []


def test_megatron_moe_expert_parallel() -> None:
    job = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    plan = parse_plan("tp=2,pp=4,ep=8,sp=1,zero=1,mbs=1", job)
    assert plan_violations(job, plan) == []
    args, _ = megatron_args(job, plan)
    assert _arg(args, "--expert-model-parallel-size") == "8"
    assert _arg(args, "--num-experts") == "8"
    assert _arg(args, "--moe-router-topk") == "2"


def test_megatron_mtp_layers_and_its_recompute_method() -> None:
    """DeepSeek-V3's MTP depth is built (`--mtp-num-layers`, Megatron-LM arguments.py); the cost
    model replays it exactly when the emitted method is uniform (factors.mtp_recomputed):
    Megatron's MTP layer checkpoints under uniform and skips recompute under block."""
    from autoparallel_cp.cost.factors import mtp_recomputed

    job = make_job("deepseek-v3", "dgx-h800", gpus=1024, seq_len=4096, global_batch=1024)
    for text in ("tp=2,pp=8,ep=64,sp=1,zero=1,mbs=1,recompute=full",
                 "tp=2,pp=8,ep=64,sp=1,zero=1,mbs=1,recompute=full,recompute_layers=2"):
        plan = parse_plan(text, job)
        args, _ = megatron_args(job, plan)
        assert _arg(args, "--mtp-num-layers") == "1"
        assert (_arg(args, "--recompute-method") == "uniform") == mtp_recomputed(
            plan.recompute, plan.recompute_layers)
    dense = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=32)
    args, _ = megatron_args(dense, parse_plan("tp=8,mbs=1", dense))
    assert "--mtp-num-layers" not in args


def test_megatron_group_limited_routing_is_emitted_as_costed() -> None:
    """DeepSeek-V3 routes each token to 4 of 8 expert groups (the cost model's flex dispatch
    reads it, cost/comm.py `remote_nodes_per_token`); the launch settings ask Megatron for
    the same routing, and a model without groups gets no such flag."""
    job = make_job("deepseek-v3", "dgx-h800", gpus=1024, seq_len=4096, global_batch=1024)
    args, _ = megatron_args(job, parse_plan("tp=2,pp=8,ep=64,sp=1,zero=1,mbs=1", job))
    assert _arg(args, "--moe-router-num-groups") == "8"
    assert _arg(args, "--moe-router-group-topk") == "4"
    moe = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=64)
    args, _ = megatron_args(moe, parse_plan("tp=2,ep=8,sp=1,zero=1,mbs=1", moe))
    assert "--moe-router-num-groups" not in args


def test_megatron_text_is_a_bash_array(job: Job) -> None:
    plan = parse_plan("tp=8,pp=2,mbs=1,zero=1", job)
    text = emit(job, plan, "megatron").text
    assert "MEGATRON_ARGS=(" in text and text.rstrip().splitlines()[-2] == ")"
    assert "    --tensor-model-parallel-size 8" in text


def test_torchtitan_toml_parses_with_real_keys(job: Job) -> None:
    tomllib = pytest.importorskip("tomllib")
    job = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64,
                   recipe="torchtitan-fsdp")
    plan = parse_plan("tp=4,pp=2,vpp=2,cp=2,sp=1,zero=3,mbs=2,recompute=full", job)
    assert plan_violations(job, plan) == []
    doc = tomllib.loads(emit(job, plan, "torchtitan-toml").text)
    par = doc["parallelism"]
    assert par["tensor_parallel_degree"] == 4
    assert par["pipeline_parallel_degree"] == 2
    assert par["context_parallel_degree"] == 2
    assert par["data_parallel_shard_degree"] == plan.dp
    assert par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == 2
    assert par["pipeline_parallel_layers_per_stage"] == 8
    # torchtitan counts embedding/output as first/last_stage_less_layers layers (default 1):
    # emitted as 0 so ceil((32 + 0 + 0) / 8) = 4 stages = pp * vpp
    assert par["pipeline_parallel_first_stage_less_layers"] == 0
    assert par["pipeline_parallel_last_stage_less_layers"] == 0
    assert doc["activation_checkpoint"]["mode"] == "full"
    assert doc["training"]["global_batch_size"] == 64
    assert doc["training"]["seq_len"] == 8192
    # the per-replica batch goes through the pipeline: local = mbs * num_microbatches
    assert doc["training"]["local_batch_size"] * plan.dp == 64


def test_torchtitan_toml_ddp_with_tp_is_refused() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64,
                   recipe="torchtitan-fsdp")
    # torchtitan v0.2.2 models/llama3/infra/parallelize.py:148-151 "DDP has not supported > 1D"
    plan = parse_plan("tp=8,zero=0,mbs=1", job)
    with pytest.raises(UserError, match=r"zero: .*closest plan it runs: zero=3"):
        emit(job, plan, "torchtitan-toml")
    tomllib = pytest.importorskip("tomllib")
    par = tomllib.loads(emit(job, parse_plan("zero=0,mbs=1", job), "torchtitan-toml").text)
    assert par["parallelism"]["data_parallel_replicate_degree"] == 32


def test_deepspeed_batch_arithmetic(job: Job) -> None:
    plan = parse_plan("tp=2,zero=2,mbs=2", job)
    cfg, notes = deepspeed_config(job, plan)
    assert cfg["zero_optimization"]["stage"] == 2
    assert cfg["bf16"]["enabled"] is True
    assert cfg["tensor_parallel"]["autotp_size"] == 2
    assert (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
            * plan.dp == cfg["train_batch_size"] == 64)
    assert any("get_data_parallel_world_size() is 16" in n for n in notes)
    text = emit(job, plan, "deepspeed").text
    assert json.loads(text) == cfg


def test_deepspeed_states_the_topology_it_needs(job: Job) -> None:
    plan = parse_plan("pp=2,zero=1,mbs=1,recompute=full", job)
    e = emit(job, plan, "deepspeed")
    joined = " ".join(e.notes)
    assert "PipeDataParallelTopology(num_pp=2, num_dp=16)" in joined
    assert "deepspeed.checkpointing.checkpoint" in joined


def test_unknown_format_is_a_user_error(job: Job) -> None:
    assert set(EMIT_FORMATS) == {"megatron", "torchtitan", "torchtitan-toml", "deepspeed"}
    with pytest.raises(UserError):
        emit(job, parse_plan("tp=8", job), "nemo")


def test_torchtitan_selective_is_op_sac(job: Job) -> None:
    tomllib = pytest.importorskip("tomllib")
    from autoparallel_cp.spec import RECIPES

    plan = parse_plan("tp=8,sp=1,zero=3,mbs=1,recompute=selective", job)
    # a recipe costing attention-core recompute (pytorch-amp): torchtitan's op SAC is refused
    amp = job.model_copy(update={"recipe": RECIPES["pytorch-amp"]})
    with pytest.raises(UserError, match="recompute: .*closest plan it runs: recompute=full"):
        emit(amp, plan, "torchtitan-toml")
    tt = job.model_copy(update={"recipe": RECIPES["torchtitan-fsdp"]})
    ac = tomllib.loads(emit(tt, plan, "torchtitan-toml").text)["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "op"}
    assert "SelectiveAC.Config()" in emit(tt, plan, "torchtitan").text


def test_megatron_unfused_ops_turn_off_megatron_fusions(job: Job) -> None:
    """A recipe whose layer runs RoPE and SwiGLU unfused (behaviour `unfused_ops`) is launched
    with Megatron-LM's switches for those fusions (arguments.py @d98e8a64: --no-rope-fusion,
    --no-bias-swiglu-fusion); the default recipe keeps both fusions."""
    plan = parse_plan("tp=2,sp=1,zero=1,mbs=1", job)
    args, _ = megatron_args(job, plan)
    assert "--no-rope-fusion" not in args and "--no-bias-swiglu-fusion" not in args
    unfused = job.recipe.with_behaviour(unfused_ops=("rope", "swiglu"))
    args, _ = megatron_args(job.model_copy(update={"recipe": unfused}), plan)
    assert "--no-rope-fusion" in args and "--no-bias-swiglu-fusion" in args


def test_megatron_p2p_overlap_flag_follows_the_recipe(job: Job) -> None:
    """Megatron-LM main overlaps the interleaved schedule's p2p by default (arguments.py:
    3118-3120 @d98e8a64: `--no-overlap-p2p-communication` is store_false, there is no flag to
    turn it on), turns it off without interleaving (l. 1010-1012) and refuses interleaving
    without it on pp 2 (l. 1000-1009). The megatron-bf16 / megatron-fp8 recipes cost Megatron
    main's default, so their interleaved plans launch without a p2p flag and without a note.
    A recipe costed without the overlap (behaviour `overlap_p2p_comm` False, e.g. an era
    recipe) is launched with the switch on interleaved plans of pp > 2; on pp 2 Megatron
    overlaps anyway and the note says the cost is an upper estimate."""
    assert job.recipe.name == "megatron-bf16" and job.recipe.behaviour.overlap_p2p_comm
    inter = parse_plan("tp=2,pp=4,vpp=2,sp=1,zero=1,mbs=1", job)
    plain = parse_plan("tp=2,pp=4,sp=1,zero=1,mbs=1", job)
    two = parse_plan("tp=2,pp=2,vpp=2,sp=1,zero=1,mbs=1", job)
    for p in (inter, plain, two):
        args, notes = megatron_args(job, p)
        assert "--no-overlap-p2p-communication" not in args and notes == []
    fp8 = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64,
                   recipe="megatron-fp8")
    assert "--no-overlap-p2p-communication" not in megatron_args(fp8, inter)[0]
    off = job.model_copy(update={"recipe": job.recipe.with_behaviour(overlap_p2p_comm=False)})
    assert "--no-overlap-p2p-communication" in megatron_args(off, inter)[0]
    assert "--no-overlap-p2p-communication" not in megatron_args(off, plain)[0]
    args, notes = megatron_args(off, two)
    assert "--no-overlap-p2p-communication" not in args
    assert any("upper estimate" in n for n in notes)


def test_torchtitan_float8_all_gather_follows_the_recipe() -> None:
    """A recipe that gathers fp8 weights (behaviour fsdp_float8_all_gather) writes v0.2.2's
    `[quantize.linear.float8] enable_fsdp_float8_all_gather = true` (job_config.py:732); the
    0.3.0 module, whose float8 converter has no such option, says so in a note."""
    tomllib = pytest.importorskip("tomllib")
    from autoparallel_cp.spec import RECIPES

    base = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=16,
                    recipe="torchtitan-fsdp")
    rec = RECIPES["torchtitan-fsdp"].model_copy(update={"compute_dtype": "fp8"})
    plan = parse_plan("dp=8,zero=3,mbs=1", base)
    plain = base.model_copy(update={"recipe": rec})
    flag = base.model_copy(update={"recipe": rec.with_behaviour(fsdp_float8_all_gather=True)})
    doc = tomllib.loads(emit(flag, plan, "torchtitan-toml").text)
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    assert "quantize" not in tomllib.loads(emit(plain, plan, "torchtitan-toml").text)
    out = emit(flag, plan, "torchtitan")
    assert any("fsdp_float8_all_gather" in n for n in out.notes)
    assert not any("fsdp_float8_all_gather" in n for n in emit(plain, plan, "torchtitan").notes)
