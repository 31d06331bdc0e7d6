"""Each rule learned from a framework's source, pinned to that source (spec/frameworks.py).

Sources: Megatron-LM main d98e8a64, torchtitan 0.3.0 / v0.2.2, DeepSpeed 0.19.8 (file:line in
each test). `benchmarks/frameworks_check.py` runs the frameworks' own validators on the emits.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import deepspeed_config, emit, megatron_args, megatron_env
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.frameworks import RULES, refusals
from autoparallel_cp.spec.params import count_params as param_counts
from autoparallel_cp.spec.plan import parse_plan
from autoparallel_cp.spec.recipe import TrainingRecipe


@pytest.fixture(scope="module")
def job() -> Job:
    return make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64)


@pytest.fixture(scope="module")
def tt() -> Job:
    """The same job costed with torchtitan's own recipe (fp32 FSDP2 weights, op-level SAC)."""
    return make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64,
                    recipe="torchtitan-fsdp")


def _tt_fp8() -> TrainingRecipe:
    return RECIPES["torchtitan-fsdp"].model_copy(update={"name": "tt-fp8",
                                                          "compute_dtype": "fp8"})


def _arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_rule_names_its_source() -> None:
    for r in RULES:
        if r.framework == "pytorch-fsdp":  # PyTorch's own modules, by file and object name
            assert re.search(r"torch/[a-z_/]+\.py", r.source) and "PyTorch" in r.source, r
            continue
        assert re.search(r"\.py:\d+", r.source), r  # file:line
        assert re.search(r"(Megatron-LM|torchtitan|DeepSpeed) [0-9a-fv]", r.source), r


@pytest.mark.parametrize("pp,vpp", [(2, 1), (4, 1), (2, 2), (4, 2)])
def test_torchtitan_layer_count_rule(tt: Job, pp: int, vpp: int) -> None:
    """torchtitan 0.3.0 distributed/pipeline_parallel.py:223-237: stages =
    ceil((layers + first_less + last_less) / per_stage) must be a multiple of pp, and equal pp for
    1F1B / 2*pp for interleaving. The emit must give exactly pp * vpp stages."""
    tomllib = pytest.importorskip("tomllib")
    plan = parse_plan(f"pp={pp},vpp={vpp},zero=3,mbs=1", tt)
    par = tomllib.loads(emit(tt, plan, "torchtitan-toml").text)["parallelism"]
    stages = math.ceil((32 + par["pipeline_parallel_first_stage_less_layers"]
                        + par["pipeline_parallel_last_stage_less_layers"])
                       / par["pipeline_parallel_layers_per_stage"])
    assert stages % pp == 0 and stages == pp * vpp
    # torchtitan's own default (1 + 1) would have made 80 layers / 5 per stage = 17 stages
    assert math.ceil((80 + 1 + 1) / 5) == 17


def test_torchtitan_uneven_split_is_given_module_by_module(tt: Job) -> None:
    tomllib = pytest.importorskip("tomllib")
    plan = parse_plan("pp=4,zero=3,mbs=1,stage_layers=7:9:9:7", tt)
    par = tomllib.loads(emit(tt, plan, "torchtitan-toml").text)["parallelism"]
    parts = par["module_fqns_per_model_part"]
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [7, 9, 9, 7]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]


def test_torchtitan_float8_converter_name() -> None:
    """v0.2.2 components/quantization/float8.py:238 registers "quantize.linear.float8";
    0.3.0 takes Float8LinearConverter.Config (models/llama3/config_registry.py:96-106)."""
    tomllib = pytest.importorskip("tomllib")
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=32,
                   recipe=_tt_fp8())
    plan = parse_plan("zero=3,mbs=1", job)
    doc = tomllib.loads(emit(job, plan, "torchtitan-toml").text)
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert "Float8LinearConverter.Config(model_compile_enabled=True)" in emit(
        job, plan, "torchtitan").text


def test_torchtitan_python_config_is_valid_python(tt: Job) -> None:
    plan = parse_plan("tp=4,pp=2,vpp=2,cp=2,sp=1,zero=3,mbs=2,recompute=full", tt)
    text = emit(tt, plan, "torchtitan").text
    compile(text, "<emit>", "exec")
    assert "torchtitan 0.3.0" in text.splitlines()[0]
    assert "pipeline_parallel_microbatch_size=2" in text
    assert "local_batch_size=32" in text  # mbs * num_microbatches through the pipeline


def test_torchtitan_refuses_partial_recompute_and_zero1(tt: Job) -> None:
    with pytest.raises(UserError, match="recompute_layers"):
        emit(tt, parse_plan("pp=2,zero=3,mbs=1,recompute=full,recompute_layers=3", tt),
             "torchtitan")
    with pytest.raises(UserError, match="zero: .*closest plan it runs: zero=2"):
        emit(tt, parse_plan("zero=1,mbs=1", tt), "torchtitan")
    mix = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256,
                   recipe="torchtitan-fsdp")
    with pytest.raises(UserError, match="model"):
        emit(mix, parse_plan("tp=2,ep=8,zero=3,mbs=1", mix), "torchtitan")


def test_deepspeed_batch_identity(job: Job) -> None:
    """0.19.8 runtime/config.py:600-604: train_batch_size == micro * gas * world_size, where
    world_size is the mpu's data-parallel size (config.py:456-470)."""
    for text in ("zero=2,mbs=2", "tp=2,sp=0,zero=2,mbs=1", "pp=4,zero=1,mbs=1"):
        plan = parse_plan(text, job)
        cfg, notes = deepspeed_config(job, plan)
        assert (cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
                * plan.dp == cfg["train_batch_size"])
        if plan.tp > 1 or plan.pp > 1:  # the mpu/topology that makes world_size = dp
            assert any(f"{plan.dp}" in n and ("mpu" in n or "Topology" in n) for n in notes)


def test_deepspeed_zero_pipeline_exclusion(job: Job) -> None:
    """0.19.8 runtime/pipe/engine.py:76-77: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline
    parallelism'."""
    for zero in (2, 3):
        with pytest.raises(UserError, match="zero: .*closest plan it runs: zero=1"):
            emit(job, parse_plan(f"pp=2,zero={zero},mbs=1", job), "deepspeed")
    assert refusals(job, parse_plan("pp=2,zero=1,mbs=1", job), "deepspeed") == []
    assert refusals(job, parse_plan("zero=3,mbs=1", job), "deepspeed") == []


def test_megatron_fsdp_env_var(job: Job) -> None:
    """Megatron-LM arguments.py:1166-1167 (FSDP: != "1") and :1452-1479 (tp/cp > 1 without
    FSDP: == "1" before Blackwell)."""
    fsdp = parse_plan("tp=2,zero=3,mbs=1", job)
    assert megatron_env(fsdp)["CUDA_DEVICE_MAX_CONNECTIONS"] != "1"
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8" in emit(job, fsdp, "megatron").text
    assert megatron_env(parse_plan("tp=2,zero=1,mbs=1", job)) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert megatron_env(parse_plan("zero=1,mbs=1", job)) == {}


def test_megatron_partial_recompute_per_chunk(job: Job) -> None:
    """transformer_config.py:551-555: block recompute counts layers per TransformerBlock, one per
    model chunk, so a stage with vpp chunks recomputes vpp * k layers."""
    ok = parse_plan("pp=2,vpp=2,zero=1,mbs=1,recompute=full,recompute_layers=4", job)
    args, _ = megatron_args(job, ok)
    assert _arg(args, "--recompute-num-layers") == "2"  # 2 per chunk * 2 chunks = 4 costed
    bad = parse_plan("pp=2,vpp=2,zero=1,mbs=1,recompute=full,recompute_layers=3", job)
    with pytest.raises(UserError, match="recompute_layers: .*closest plan it runs: "
                       "recompute_layers=4"):
        megatron_args(job, bad)


def test_megatron_layout_for_uneven_interleaved_split(job: Job) -> None:
    plan = parse_plan("pp=2,vpp=2,zero=1,mbs=1,stage_layers=14:18", job)
    args, _ = megatron_args(job, plan)
    assert _arg(args, "--pipeline-model-parallel-layout") == "E,t*7|t*9|t*7|t*9,L"


def _params_from_args(args: list[str]) -> int:
    """Parameters of the model Megatron builds from these flags (GPTModel with TE layers)."""
    g = {a: _arg(args, a) for a in args if a.startswith("--") and args.index(a) + 1 < len(args)
         and not args[args.index(a) + 1].startswith("--")}
    flags = set(args)
    h, L, f = int(g["--hidden-size"]), int(g["--num-layers"]), int(g["--ffn-hidden-size"])
    heads, vocab = int(g["--num-attention-heads"]), int(g["--vocab-size"])
    glu = 2 if "--swiglu" in flags else 1
    if "--multi-latent-attention" in flags:
        qr, kvr = int(g["--q-lora-rank"]), int(g["--kv-lora-rank"])
        qk, rope, v = int(g["--qk-head-dim"]), int(g["--qk-pos-emb-head-dim"]), int(
            g["--v-head-dim"])
        # the q/kv low-rank norms exist only with --qk-layernorm (gpt_layer_specs.py:104-114)
        norms = qr + kvr if "--qk-layernorm" in flags else 0
        attn = (h * qr + qr * heads * (qk + rope) + h * (kvr + rope)
                + kvr * heads * (qk + v) + heads * v * h + norms)
    else:
        d = h // heads
        kv = int(g.get("--num-query-groups", heads))
        attn = h * d * (heads + 2 * kv) + heads * d * h
    dense_mlp = (glu + 1) * h * f
    moe_flags = [1] * L
    if "--moe-layer-freq" in g:
        moe_flags = eval(g["--moe-layer-freq"])  # Megatron's own list syntax
    layer_norms = 2 * h
    total = 0
    for i in range(L):
        if "--num-experts" in g and moe_flags[i]:
            e, ef = int(g["--num-experts"]), int(g["--moe-ffn-hidden-size"])
            shared = int(g.get("--moe-shared-expert-intermediate-size", 0))
            mlp = e * (glu + 1) * h * ef + h * e + (glu + 1) * h * shared
            mlp += e if "--moe-router-enable-expert-bias" in flags else 0
        else:
            mlp = dense_mlp
        total += attn + mlp + layer_norms
    total += vocab * h * (2 if "--untie-embeddings-and-output-weights" in flags else 1) + h
    return total


@pytest.mark.parametrize("model,gpus", [("llama3-8b", 32), ("mixtral-8x7b", 64),
                                        ("deepseek-v3", 1024)])
def test_megatron_emit_builds_the_planned_parameter_count(model: str, gpus: int) -> None:
    """The flags carry every field the parameter count depends on: recounting the model from the
    flags alone gives the planned total (params.py), to within MLA/MoE norm vectors (< 1e-4)."""
    j = make_job(model, "dgx-h100", gpus=gpus, seq_len=4096, global_batch=gpus)
    ep = 8 if j.model.moe else 1
    plan = parse_plan(f"tp=8,ep={ep},sp=1,zero=1,mbs=1", j)
    args, _ = megatron_args(j, plan)
    planned = param_counts(j.model).total
    assert _params_from_args(args) == pytest.approx(planned, rel=1e-4)


def test_solve_emit_only_recommends_plans_the_framework_runs(tmp_path: Path) -> None:
    """`solve --emit deepspeed` searches with DeepSpeed's pins and keeps only plans it runs."""
    import json as _json

    from click.testing import CliRunner

    from autoparallel_cp.cli import main

    base = ["solve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "--seq-len", "4096",
            "--global-batch", "64", "--time-limit", "5", "--workers", "1", "-q"]
    out = tmp_path / "plans.json"
    res = CliRunner().invoke(main, [*base, "--emit", "deepspeed", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = _json.loads(out.read_text())
    assert doc["plans"]
    j = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    for d in doc["plans"]:
        plan = parse_plan(",".join(f"{k}={d['plan'][k]}" for k in (
            "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches",
            "recompute")) + (f",recompute_layers={d['plan']['recompute_layers']}"
                            if d["plan"].get("recompute_layers") is not None else ""), j)
        assert refusals(j, plan, "deepspeed") == [], plan
    mix = CliRunner().invoke(main, [*base[:2], "mixtral-8x7b", *base[3:], "--recipe",
                                    "torchtitan-fsdp", "--emit", "torchtitan"])
    assert mix.exit_code == 2 and "cannot train mixtral-8x7b" in mix.output


def test_torchtitan_builds_deepseek_v3_with_its_mtp_module() -> None:
    """torchtitan 0.3.0 models/deepseek_v3/__init__.py:533-537,616-623: the 671B flavor has
    num_mtp_layers=0 unless asked; the plan costs one MTP module."""
    j = make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=1024,
                 recipe="torchtitan-fsdp")
    plan = parse_plan("ep=64,etp=1,zero=3,mbs=1", j)
    text = emit(j, plan, "torchtitan").text
    assert "model_registry('671B', num_mtp_layers=1)" in text
    # mtp.py:202 'MTP does not support pipeline parallelism yet' (and the same with cp > 1)
    piped = parse_plan("pp=16,ep=64,etp=1,zero=3,mbs=1,stage_layers=3" + ":4" * 14 + ":2", j)
    with pytest.raises(UserError, match=r"pp: .*mtp\.py:202.*closest plan it runs: pp=1"):
        emit(j, piped, "torchtitan")
    no_mtp = j.model_copy(update={"model": j.model.model_copy(update={"mtp_layers": 0})})
    text = emit(no_mtp, piped, "torchtitan").text
    assert "disable_cuda_graphs=True" in text  # pp > 1 (trainer.py:179-187)
    assert "module_fqns_per_model_part=" in text  # the uneven split, module by module


def test_megatron_refuses_a_model_it_cannot_build() -> None:
    """BLOOM's ALiBi and embedding norm have no Megatron-LM option: no silent GPT stand-in."""
    j = make_job("bloom-176b", "dgx-h100", gpus=64, seq_len=2048, global_batch=64)
    with pytest.raises(UserError, match="model: Megatron builds no ALiBi"):
        emit(j, parse_plan("tp=8,pp=8,zero=1,mbs=1", j), "megatron")
    gpt = make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=64)
    args, _ = megatron_args(gpt, parse_plan("zero=1,mbs=1", gpt))
    assert _arg(args, "--position-embedding-type") == "learned_absolute"
    assert "--disable-bias-linear" not in args  # GPT-3 has biases on every linear
    assert "--untie-embeddings-and-output-weights" not in args  # and tied embeddings


def test_megatron_learned_position_table_is_the_models() -> None:
    """language_model_embedding.py:71 sizes the table by --max-position-embeddings: a longer
    sequence than GPT-3's 2048 would build a larger model than planned, so it is refused."""
    gpt = make_job("gpt3-13b", "dgx-h100", gpus=16, seq_len=2048, global_batch=64)
    args, _ = megatron_args(gpt, parse_plan("tp=4,zero=1,mbs=1", gpt))
    assert _arg(args, "--max-position-embeddings") == "2048"
    long = make_job("gpt3-13b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    with pytest.raises(UserError, match="seq_len: .*runs the job with --seq-len 2048"):
        megatron_args(long, parse_plan("tp=4,zero=1,mbs=1", long))


def test_precision_layout_must_be_the_recipes(job: Job, tt: Job) -> None:
    """The plan's memory counts the recipe's bytes per parameter: Megatron --bf16 is bf16
    weights + fp32 master (megatron-*), torchtitan FSDP2 fp32 weights (torchtitan-fsdp,
    pytorch-amp); DeepSpeed expresses both (bf16 + fp32 grad accumulation, or torch_autocast)."""
    plan = parse_plan("zero=3,mbs=1", job)
    with pytest.raises(UserError, match="recipe: .*runs the job with --recipe torchtitan-fsdp"):
        emit(job, plan, "torchtitan")
    with pytest.raises(UserError, match="recipe: .*runs the job with --recipe megatron-bf16"):
        emit(tt, plan, "megatron")
    cfg, _ = deepspeed_config(job, plan)
    assert cfg["bf16"] == {"enabled": True} and cfg["data_types"] == {"grad_accum_dtype": "fp32"}
    cfg, _ = deepspeed_config(tt, plan)
    assert cfg["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and "bf16" not in cfg
    # gradients accumulated in the bf16 .grad by autograd: DeepSpeed's bf16 grad_accum_dtype
    acc = job.model_copy(update={"recipe": job.recipe.with_behaviour(
        bf16_accum_pass=False, autograd_grad_accum=True)})
    cfg, _ = deepspeed_config(acc, parse_plan("zero=1,mbs=1", acc))
    assert cfg["data_types"] == {"grad_accum_dtype": "bf16"}


def test_deepspeed_expert_parallel_is_autoep() -> None:
    """0.19.8 AutoEP: `expert_parallel.autoep_size` (module_inject/auto_ep_config.py:42-50); it
    refuses TP from an mpu (runtime/engine.py:832-838), which tp > 1 needs for the batch check."""
    mix = make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=256)
    cfg, _ = deepspeed_config(mix, parse_plan("ep=8,zero=3,mbs=1", mix))
    assert cfg["expert_parallel"] == {"enabled": True, "autoep_size": 8}
    with pytest.raises(UserError, match="ep: .*closest plan it runs: tp=1"):
        deepspeed_config(mix, parse_plan("tp=2,ep=8,zero=1,mbs=1", mix))


def _window_flags(args: list[str], layers: int) -> list[bool]:
    """Megatron's reading of --window-attn-skip-freq (transformer/utils.py
    `is_layer_window_attention`, 1-based layer_number): N -> layer_number % N != 0; a list
    expression -> its entries."""
    freq = _arg(args, "--window-attn-skip-freq")
    if "[" not in freq:
        return [(i + 1) % int(freq) != 0 for i in range(layers)]
    flags = eval(freq)  # Megatron's own list syntax
    assert len(flags) == layers
    return [bool(f) for f in flags]


@pytest.mark.parametrize("pattern", [(True, False), (True,) * 5 + (False,), (False, True, True)])
def test_megatron_emit_carries_the_sliding_window(pattern: tuple[bool, ...]) -> None:
    base = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=8)
    model = base.model.model_copy(update={"sliding_window_left": 127,
                                          "sliding_window_layers": pattern})
    j = make_job(model, "dgx-h100", gpus=8, seq_len=8192, global_batch=8)
    args, _ = megatron_args(j, parse_plan("tp=8,zero=1,mbs=1", j))
    assert _arg(args, "--window-size") == "127,0"
    assert _window_flags(args, 32) == [pattern[i % len(pattern)] for i in range(32)]
    mistral = make_job("mistral-7b", "dgx-h100", gpus=8, seq_len=8192, global_batch=8)
    m_args, _ = megatron_args(mistral, parse_plan("tp=8,zero=1,mbs=1", mistral))
    assert _arg(m_args, "--window-size") == "4095,0"
    assert "--window-attn-skip-freq" not in m_args  # every layer windowed


def test_megatron_emit_windowed_layers_use_the_all_gather_cp() -> None:
    """TE v2.9 runs sliding windows under CP only with the all-gather (or a2a) exchange."""
    base = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=32768, global_batch=8)
    model = base.model.model_copy(update={"sliding_window_left": 127,
                                          "sliding_window_layers": (True, False)})
    j = make_job(model, "dgx-h100", gpus=16, seq_len=32768, global_batch=8)
    args, _ = megatron_args(j, parse_plan("tp=8,cp=2,zero=1,mbs=1", j))
    i = args.index("--cp-comm-type")
    assert args[i + 1:i + 33] == ["all_gather", "p2p"] * 16
    no_cp, _ = megatron_args(j, parse_plan("tp=8,zero=1,mbs=1", j))
    assert "--cp-comm-type" not in no_cp
    mistral = make_job("mistral-7b", "dgx-h100", gpus=16, seq_len=32768, global_batch=8)
    m_args, _ = megatron_args(mistral, parse_plan("tp=8,cp=2,zero=1,mbs=1", mistral))
    i = m_args.index("--cp-comm-type")
    assert m_args[i + 1] == "all_gather" and m_args[i + 2].startswith("--")


def test_megatron_window_flags_of_the_validated_tail_case() -> None:
    """The flags `benchmarks/frameworks_check.py` ran through Megatron-LM d98e8a64 for the
    `swa-tail-cp2-uneven` case, written out by hand. Pattern (full, windowed, windowed) over
    32 layers: 10 periods and a tail of 2; arguments.py:2387 `--window-attn-skip-freq` takes
    Megatron's list expression (moe_freq_type, arguments.py:327-350; _eval_pattern, 245-253,
    allows only digits, commas, brackets, parentheses, + and *), 1 = windowed layer
    (transformer/utils.py:541-542, list entry layer_number - 1). `--cp-comm-type` is nargs='+'
    (arguments.py:3221), one entry per layer (transformer_config.py:3103-3107, read at
    transformer_layer.py:378-385): all_gather on the windowed layers, which Transformer Engine
    v2.9 requires (context_parallel.py:3803-3809), p2p on the full ones."""
    base = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=16384, global_batch=64)
    model = base.model.model_copy(update={"sliding_window_left": 1023,
                                          "sliding_window_layers": (False, True, True)})
    j = make_job(model, "dgx-h100", gpus=32, seq_len=16384, global_batch=64)
    args, _ = megatron_args(j, parse_plan(
        "tp=2,pp=4,cp=2,sp=1,zero=1,mbs=1,stage_layers=7:9:9:7", j))
    assert _arg(args, "--window-size") == "1023,0"
    assert _arg(args, "--window-attn-skip-freq") == "([0,1,1]*10+[0,1])"
    i = args.index("--cp-comm-type")
    assert args[i + 1:i + 33] == (["p2p", "all_gather", "all_gather"] * 11)[:32]
    assert args[i + 33].startswith("--")


def test_torchtitan_refuses_sliding_windows() -> None:
    """torchtitan 0.3.0's llama3 / deepseek_v3 flavors build full causal attention
    (models/llama3/__init__.py:82, config_utils.py:83-96, common/attention.py:112 window_size
    (-1, 0)); v0.2.2 the same (llama3/model/model.py:510-522). A windowed model is refused
    (exit 2) naming the model field, even under a registry name, rather than emitted as full
    attention."""
    from click.testing import CliRunner

    from autoparallel_cp.cli import main

    base = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=8192, global_batch=64,
                    recipe="torchtitan-fsdp")
    model = base.model.model_copy(update={"sliding_window_left": 127,
                                          "sliding_window_layers": (True, False)})
    j = make_job(model, "dgx-h100", gpus=8, seq_len=8192, global_batch=64,
                 recipe="torchtitan-fsdp")
    plan = parse_plan("zero=3,mbs=1", j)
    for fmt in ("torchtitan", "torchtitan-toml"):
        [bad] = refusals(j, plan, fmt)
        assert bad.field == "sliding_window_left" and "torchtitan 0.3.0" in bad.source
        with pytest.raises(UserError, match="sliding_window_left: the llama3 and deepseek_v3"):
            emit(j, plan, fmt)
    assert not refusals(base, plan, "torchtitan")
    res = CliRunner().invoke(main, ["solve", "-m", "mistral-7b", "-c", "dgx-h100", "--gpus", "8",
                                    "--seq-len", "8192", "--global-batch", "64", "--recipe",
                                    "torchtitan-fsdp", "--emit", "torchtitan", "-q"])
    assert res.exit_code == 2
    # a model torchtitan has no flavor for is refused for that first (the window row is for
    # its own flavors given a window)
    assert "cannot train mistral-7b as planned: model" in res.output


def test_deepspeed_runs_windows_and_says_what_the_model_needs() -> None:
    """DeepSpeed trains the module it is given (0.19.8 deepspeed/__init__.py:433 initialize):
    no refusal, and the note names the window in flash-attn's (w, 0) and HF's w + 1 terms."""
    j = make_job("mistral-7b", "dgx-h100", gpus=16, seq_len=8192, global_batch=64)
    plan = parse_plan("zero=1,mbs=1", j)
    assert not refusals(j, plan, "deepspeed")
    _, notes = deepspeed_config(j, plan)
    [note] = [n for n in notes if "sliding window" in n]
    assert "every layer" in note and "window_size=(4095, 0)" in note and "4096" in note
    alt = make_job(j.model.model_copy(update={"sliding_window_left": 127,
                                              "sliding_window_layers": (True, False)}),
                   "dgx-h100", gpus=16, seq_len=8192, global_batch=64)
    _, notes = deepspeed_config(alt, parse_plan("zero=1,mbs=1", alt))
    [note] = [n for n in notes if "sliding window" in n]
    # the pattern, not a list of every layer: 0, 2, 4, ... of 32
    assert "the layers i with i mod 2 in {0} (0-based)" in note
    none = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=8192, global_batch=64)
    assert not [n for n in deepspeed_config(none, plan)[1] if "sliding" in n]


def test_megatron_refuses_context_parallel_attention_sinks() -> None:
    """Transformer Engine v2.9 context_parallel.py:3825-3827 asserts `softmax_type ==
    "vanilla" or cp_comm_type == "a2a"`: GPT-OSS's sinks (--softmax-type learnable, handed to
    TE at Megatron-LM d98e8a64 extensions/transformer_engine.py:2184-2189) never run on the
    p2p ring or the all-gather the cost model charges, so cp > 1 is refused with cp = 1 as the
    closest plan; cp = 1 is emitted with the sinks and the window."""
    gpt_oss = Path(__file__).parents[2] / "benchmarks" / "data" / "hf_configs" / "gpt-oss-20b.json"
    j = make_job(str(gpt_oss), "dgx-h100", gpus=32, seq_len=16384, global_batch=64)
    assert j.model.attention_sinks and j.model.sliding_window_left == 127
    cp2 = parse_plan("cp=2,ep=8,zero=1,mbs=1", j)
    [bad] = refusals(j, cp2, "megatron")
    assert bad.field == "cp" and bad.closest == {"cp": 1}
    assert "context_parallel.py:3825-3827" in bad.source
    with pytest.raises(UserError, match="megatron cannot run this plan: cp: attention sinks"):
        emit(j, cp2, "megatron")
    args, _ = megatron_args(j, parse_plan("ep=8,zero=1,mbs=1", j))
    assert _arg(args, "--softmax-type") == "learnable" and _arg(args, "--window-size") == "127,0"
    assert "--cp-comm-type" not in args
    plain = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=16384, global_batch=64)
    assert not refusals(plain, parse_plan("cp=2,zero=1,mbs=1", plain), "megatron")


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_hai_llm_activation_caches_are_refused_by_every_emitter(fmt: str) -> None:
    """deepseek-v3-fp8 costs DeepSeek's own caches (2412.19437 §3.2.3, §3.3.3: FP8 SwiGLU
    inputs, one E5M6 attention-output copy, norms recomputed without their caches); the
    emitted frameworks keep TE / bf16 copies, so the run would hold more than was costed."""
    ds = make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360,
                  recipe="deepseek-v3-fp8")
    plan = parse_plan("pp=16,ep=64,zero=1,mbs=1,recompute=selective", ds)
    hits = [r for r in refusals(ds, plan, fmt) if "HAI-LLM" in r.reason]
    assert hits and hits[0].closest == {"recipe": "megatron-fp8"}
    plain = make_job("deepseek-v3", "dgx-h800", gpus=2048, seq_len=4096, global_batch=15360,
                     recipe="megatron-fp8")
    assert not [r for r in refusals(plain, parse_plan("pp=16,ep=64,zero=1,mbs=1", plain), fmt)
                if "HAI-LLM" in r.reason]
