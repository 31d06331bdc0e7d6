"""What is emitted runs what was costed (issue #32): torch.compile, async TP and the fp8 library.

Sources: torchtitan 0.3.0 torchtitan/config/configs.py:290-310 (CompileConfig: enable,
enable_async_tensor_parallel; async TP raises without compile), models/llama3/config_registry.py
:295-299 (the llama3_405b() baseline turns compile and async TP on), v0.2.2
torchtitan/config/job_config.py:357 ([parallelism] enable_async_tensor_parallel) and :721-723
([compile] enable).
"""

from __future__ import annotations

import pytest

from autoparallel_cp.api import make_job
from autoparallel_cp.cost.common import _fp8_lib
from autoparallel_cp.emit import emit
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import RECIPES, Job
from autoparallel_cp.spec.frameworks import fp8_library
from autoparallel_cp.spec.plan import parse_plan


def _job(model: str, gpus: int, recipe: str | object = "torchtitan-fsdp") -> Job:
    return make_job(model, "dgx-h100", gpus=gpus, seq_len=8192, global_batch=gpus,
                    recipe=recipe)  # type: ignore[arg-type]


def _recipe(name: str, **behaviour: object) -> object:
    r = RECIPES[name]
    return r.model_copy(update={"name": f"{name}-x",
                                "behaviour": r.behaviour.model_copy(update=behaviour)})


@pytest.mark.parametrize("recipe,compiled", [("torchtitan-fsdp", True), ("pytorch-fsdp", False)])
def test_torchtitan_compiles_exactly_when_the_recipe_costs_it(recipe: str, compiled: bool
                                                              ) -> None:
    """torchtitan-fsdp costs torch.compile per block (fused); pytorch-fsdp costs eager."""
    tomllib = pytest.importorskip("tomllib")
    job = _job("llama3-8b", 16, recipe)
    assert bool(job.recipe.behaviour.fused) is compiled
    plan = parse_plan("tp=2,sp=1,zero=3,mbs=1", job)
    py = emit(job, plan, "torchtitan").text
    assert f"config.compile = CompileConfig(enable={compiled}, " \
           "enable_async_tensor_parallel=False)" in py
    toml = tomllib.loads(emit(job, plan, "torchtitan-toml").text)
    assert toml["compile"] == {"enable": compiled}
    assert toml["parallelism"]["enable_async_tensor_parallel"] is False


def test_405b_baseline_async_tp_follows_the_recipe() -> None:
    """The llama3_405b() baseline turns async TP on; the recipe costs TP exposed, so the
    emitted config turns it off, and on only for a recipe that costs it."""
    tomllib = pytest.importorskip("tomllib")
    job = _job("llama3-405b", 512)
    plan = parse_plan("tp=8,pp=8,sp=1,zero=3,mbs=1,recompute=full", job)
    py = emit(job, plan, "torchtitan").text
    assert "llama3_405b()" in py
    assert "CompileConfig(enable=True, enable_async_tensor_parallel=False)" in py
    overlapped = _job("llama3-405b", 512, _recipe("torchtitan-fsdp", tp_comm_overlap=0.5))
    py = emit(overlapped, plan, "torchtitan").text
    assert "CompileConfig(enable=True, enable_async_tensor_parallel=True)" in py
    toml = tomllib.loads(emit(overlapped, plan, "torchtitan-toml").text)
    assert toml["parallelism"]["enable_async_tensor_parallel"] is True
    eager = _job("llama3-405b", 512, _recipe("torchtitan-fsdp", tp_comm_overlap=0.5,
                                              fused=False))
    with pytest.raises(UserError, match=r"recipe: async tensor parallelism.*configs\.py:303"):
        emit(eager, plan, "torchtitan")


def test_fp8_library_is_the_costed_one() -> None:
    """DeepSpeed's notes name the fp8 library the recipe was costed with; torchtitan runs
    torchao float8 only (float8.py:53,77-79)."""
    tt_fp8 = RECIPES["torchtitan-fsdp"].model_copy(update={"name": "tt-fp8",
                                                          "compute_dtype": "fp8"})
    plan_text = "zero=1,mbs=1"
    job = _job("llama3-8b", 16, tt_fp8)
    notes = " ".join(emit(job, parse_plan(plan_text, job), "deepspeed").notes)
    assert "torchao float8" in notes and "not Transformer Engine" in notes
    mg = _job("llama3-8b", 16, "megatron-fp8")
    notes = " ".join(emit(mg, parse_plan(plan_text, mg), "deepspeed").notes)
    assert "Transformer Engine layers" in notes and "torchao" not in notes
    te = RECIPES["pytorch-fsdp"].model_copy(update={"name": "fsdp-fp8", "compute_dtype": "fp8"})
    tej = _job("llama3-8b", 16, te)
    with pytest.raises(UserError, match=r"recipe: fp8 linears are torchao's"):
        emit(tej, parse_plan("zero=3,mbs=1", tej), "torchtitan")
    assert "converters=[Float8LinearConverter.Config(model_compile_enabled=True)]" in emit(
        job, parse_plan("zero=3,mbs=1", job), "torchtitan").text


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("lib", [None, "te", "torchao", "xla"])
def test_fp8_library_matches_the_cost_model(name: str, lib: str | None) -> None:
    recipe = _recipe(name, fp8_linear=lib)
    job = _job("llama3-8b", 8, recipe)
    assert fp8_library(job) == _fp8_lib(job)
