"""Megatron-Core's pipeline splits written as launch settings that rebuild the plan's chunks.

Each Megatron emit is read back the way Megatron-LM d98e8a64 builds the model, written out in
`_megatron_chunks` from its rules (transformer_block.py `get_num_layers_to_build`: with
--account-for-embedding/loss-in-pipeline-split every chunk holds (layers + e + l)/(pp*vpp)
slots and the first / last chunk gives one to the embedding / the loss; the layout string of
pipeline_parallel_layer_layout.py: chunks split by '|', `t` one decoder layer, `x*n` n copies).
"""

from __future__ import annotations

import re

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.emit import emit, megatron_args
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import Plan, parse_plan


def _arg(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _layout_chunks(text: str) -> list[int]:
    """Decoder layers per chunk of a --pipeline-model-parallel-layout string (Megatron's
    parse_str_to_list: drop commas, unroll `x*n`, split on '|', count 't')."""
    flat = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text.replace(",", ""))
    return [chunk.count("t") for chunk in flat.split("|")]


def _megatron_chunks(args: list[str], layers: int) -> list[int]:
    """The chunks (layout order) Megatron builds from the emitted flags."""
    pp = int(_arg(args, "--pipeline-model-parallel-size") or 1)
    layout = _arg(args, "--pipeline-model-parallel-layout")
    if layout is not None:
        return _layout_chunks(layout)
    vpp = int(_arg(args, "--num-virtual-stages-per-pipeline-rank") or 0) or (
        (layers // pp) // int(_arg(args, "--num-layers-per-virtual-pipeline-stage") or 0)
        if "--num-layers-per-virtual-pipeline-stage" in args else 1)
    e = int("--account-for-embedding-in-pipeline-split" in args)
    loss = int("--account-for-loss-in-pipeline-split" in args)
    slots = layers + e + loss
    assert slots % pp == 0 and (slots // pp) % vpp == 0  # Megatron's own asserts
    per = [slots // (pp * vpp)] * (pp * vpp)
    per[0] -= e
    per[-1] -= loss
    return per


@pytest.fixture(scope="module")
def l405() -> Job:
    return make_job("llama3-405b", "dgx-h100", gpus=1024, seq_len=8192, global_batch=512)


def test_126_layers_pp8_vpp8_as_account_for_flags(l405: Job) -> None:
    """Llama 3.1 405B on pp 8 x vpp 8 with no stage_layers: 128 slots, 2 per chunk; Megatron's
    --account-for-* flags rebuild exactly the plan's chunks (1 on the first, 1 on the last)."""
    plan = parse_plan("tp=8,pp=8,vpp=8,cp=2,sp=1,zero=1,mbs=1", l405)
    args, _ = megatron_args(l405, plan)
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert _arg(args, "--num-virtual-stages-per-pipeline-rank") == "8"
    assert "--pipeline-model-parallel-layout" not in args
    chunks = _megatron_chunks(args, 126)
    assert chunks == list(plan.layout(126))
    assert chunks[0] == 1 and chunks[-1] == 1 and set(chunks[1:-1]) == {2}


def test_loss_slot_only_when_layers_plus_one_divide() -> None:
    """63 layers on pp 4 x vpp 2: 64 slots with the loss alone, 8 per chunk; the last chunk 7."""
    j = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=4096, global_batch=64)
    m63 = j.model.model_copy(update={"num_layers": 63})
    j63 = j.model_copy(update={"model": m63})
    plan = parse_plan("tp=8,pp=4,vpp=2,zero=1,mbs=1", j63)
    args, _ = megatron_args(j63, plan)
    assert "--account-for-loss-in-pipeline-split" in args
    assert "--account-for-embedding-in-pipeline-split" not in args
    assert _megatron_chunks(args, 63) == list(plan.layout(63)) == [8] * 7 + [7]


def test_deepseek_v3_pp8_vpp4_is_megatron_bridges_layout() -> None:
    """61 layers on pp 8 x vpp 4 (63 slots over 32 chunks: no flag fits) are written as a
    layout equal to Megatron-Bridge's perf recipe "Et|(tt|)*30mL"
    (perf_recipes/deepseek/h100/deepseek_v3.py:48)."""
    j = make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=8192)
    plan = parse_plan("tp=2,pp=8,vpp=4,ep=64,sp=1,zero=1,mbs=1", j)
    args, _ = megatron_args(j, plan)
    layout = _arg(args, "--pipeline-model-parallel-layout")
    assert layout is not None
    assert _layout_chunks(layout) == _layout_chunks("Et|(tt|)*30mL".replace(
        "(tt|)*30", "tt|" * 30))
    assert layout.startswith("E,") and layout.endswith("m,L")


def test_explicit_chunk_layers_round_trip() -> None:
    """Megatron-Bridge's DeepSeek-V3 pp 8 x vpp 2 layout (E + 4 | 4 x 14 | 1 + MTP + loss,
    recipes/deepseek/h100/deepseek_v3.py `_get_deepseek_v3_pipeline_layout`)."""
    j = make_job("deepseek-v3", "dgx-h100", gpus=256, seq_len=4096, global_batch=4096)
    layout = ":".join(["4"] * 15 + ["1"])
    plan = parse_plan(f"tp=1,pp=8,vpp=2,ep=32,zero=1,mbs=1,chunk_layers={layout}", j)
    args, _ = megatron_args(j, plan)
    assert _megatron_chunks(args, 61) == [4] * 15 + [1]


def test_microbatch_group_flag_when_pp_does_not_divide_m() -> None:
    """m = 12 on pp = 8 (vpp 2): Megatron's default group of pp = 8 leaves 4 < 8 micro-batches
    and schedules.py raises; groups of 12 (12 % 12 = 0; 9, 10, 11 leave 3, 2, 1) run."""
    j = make_job("llama3-8b", "dgx-h100", gpus=64, seq_len=4096, global_batch=12)
    plan = parse_plan("tp=8,pp=8,vpp=2,zero=1,mbs=1", j)
    assert plan.num_microbatches == 12
    args, _ = megatron_args(j, plan)
    assert _arg(args, "--microbatch-group-size-per-virtual-pipeline-stage") == "12"
    even = parse_plan("tp=8,pp=8,vpp=2,zero=1,mbs=1", make_job(
        "llama3-8b", "dgx-h100", gpus=64, seq_len=4096, global_batch=16))
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in megatron_args(
        make_job("llama3-8b", "dgx-h100", gpus=64, seq_len=4096, global_batch=16), even)[0]


def test_partial_recompute_with_uneven_chunks() -> None:
    """Block recompute counts per chunk (transformer_config.py:551-555): recompute_layers = 4
    over 2 chunks is 2 a chunk. Chunks (8, 8) and (13, 3) recompute 2 + 2 = 4 per stage, as
    planned; (15, 1) would recompute 2 + 1 = 3, not the plan's 4: refused, and the closest
    plan is 1 a chunk (the least chunk holds 1) = 2 a stage."""
    j = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64)
    ok = parse_plan("pp=2,vpp=2,zero=1,mbs=1,recompute=full,recompute_layers=4,"
                    "chunk_layers=8:8:8:8", j)
    assert _arg(megatron_args(j, ok)[0], "--recompute-num-layers") == "2"
    assert refusals(j, ok.model_copy(update={"chunk_layers": (8, 13, 8, 3)}), "megatron") == []
    bad = ok.model_copy(update={"chunk_layers": (8, 15, 8, 1)})
    with pytest.raises(UserError, match="closest plan it runs: recompute_layers=2"):
        megatron_args(j, bad)


def test_torchtitan_takes_uneven_chunks_module_by_module() -> None:
    """module_fqns_per_model_part lists every chunk's modules (torchtitan configs.py:181-189):
    uneven chunks go through; micro-batches pp does not divide do not (PyTorch's rounds)."""
    tomllib = pytest.importorskip("tomllib")
    tt = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=64,
                  recipe="torchtitan-fsdp")
    plan = parse_plan("pp=4,vpp=2,zero=3,mbs=1,stage_layers=7:9:9:7", tt)
    par = tomllib.loads(emit(tt, plan, "torchtitan-toml").text)["parallelism"]
    parts = par["module_fqns_per_model_part"]
    layers = [sum(x.startswith("layers.") for x in p) for p in parts]
    assert layers == list(plan.layout(32))
    assert layers[0] == 3 and layers[-1] == 3  # 7 = (3, 4) and (4, 3): slots of E and L
    empty = plan.model_copy(update={"stage_layers": None,
                                    "chunk_layers": (4, 4, 4, 4, 4, 0, 8, 4)})
    assert [r.field for r in refusals(tt, empty, "torchtitan")] == ["stage_layers"]
    odd = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=10,
                   recipe="torchtitan-fsdp")
    oplan = Plan(dp=1, tp=8, pp=4, vpp=2, zero=3, mbs=1, num_microbatches=10)
    assert [r.field for r in refusals(odd, oplan, "torchtitan")] == ["num_microbatches"]
    mg = make_job("llama3-8b", "dgx-h100", gpus=32, seq_len=8192, global_batch=10)
    assert refusals(mg, oplan.model_copy(update={"zero": 1}), "megatron") == []
