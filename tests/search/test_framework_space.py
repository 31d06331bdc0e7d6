"""A framework recipe or `--emit` format is a search space (spec/framework_space.py): the search
proves its optimum over the plans the framework runs, CP-SAT equal to the enumerator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel_cp.api import make_job
from autoparallel_cp.cli import main
from autoparallel_cp.errors import InfeasibleError, InputError
from autoparallel_cp.search.solve import enumerate_plans, solve
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import RECIPES, Job, ModelSpec, MoESpec
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.frameworks import JOB_FIELDS, refusals
from autoparallel_cp.spec.loaders import load_cluster

GPT_OSS_120B = "hf:" + str(Path(__file__).parents[2] / "benchmarks" / "data" / "hf_configs"
                           / "gpt-oss-120b.json")
README = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len", "4096",
          "--global-batch", "128"]


def _runs(job: Job, plans: list, fmt: str) -> bool:
    return all(not refusals(job, ev.plan, fmt) for ev in plans)


@pytest.mark.parametrize("recipe,fmt", [("deepspeed", "megatron-deepspeed"),
                                        ("torchtitan-fsdp", "torchtitan"),
                                        ("pytorch-fsdp", "pytorch-fsdp")])
def test_recipe_searches_only_its_frameworks_plans(recipe: str, fmt: str) -> None:
    """Without --emit the recipe names its framework: every plan of the top 10 runs there,
    where the unrestricted space's top 10 holds plans it does not run (the README job)."""
    job = make_job("llama3-70b", "dgx-h100", gpus=64, seq_len=4096, global_batch=128,
                   recipe=recipe)
    free = solve(job, SearchSpace.for_job(job, by_framework=False), top_k=10)
    assert not _runs(job, free.plans, fmt)  # the test can fail
    res = solve(job, top_k=10)
    assert res.status == "optimal" and res.plans  # pure FSDP1: 2 keys fit the 70B
    assert _runs(job, res.plans, fmt)
    assert res.stats["ranked"][0][0] >= free.stats["ranked"][0][0]


def test_emit_keeps_searching_past_the_top_k(tmp_path: Path) -> None:
    """The README job with --emit deepspeed: the unrestricted top 5 all break a DeepSpeed row
    (this stopped at 'none of the 5 best plans runs'); the search now finds 5 plans it runs."""
    job = make_job("llama3-70b", "dgx-h100", gpus=64, seq_len=4096, global_batch=128,
                   recipe="torchtitan-fsdp")
    free = solve(job, SearchSpace.for_job(job, by_framework=False), top_k=5)
    assert all(refusals(job, ev.plan, "deepspeed") for ev in free.plans)
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["solve", *README, "--recipe", "torchtitan-fsdp", "--emit",
                                    "deepspeed", "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert len(doc["plans"]) == 5
    for d in doc["plans"]:
        assert d["plan"]["cp"] == 1 and d["plan"]["vpp"] == 1
        assert d["plan"]["pp"] == 1 or (d["plan"]["tp"] == 1 and d["plan"]["zero"] <= 1)


def test_gpt_oss_emit_megatron_finds_a_plan_megatron_runs() -> None:
    """Attention sinks run under CP only with TE's a2a exchange (frameworks.py): the unrestricted
    best plan and most of its top 5 have cp > 1, the restricted search finds cp 1 plans only."""
    job = make_job(GPT_OSS_120B, "dgx-h100", gpus=64, seq_len=65536, global_batch=64)
    free = solve(job, SearchSpace.for_job(job, by_framework=False), top_k=5)
    assert free.plans[0].plan.cp > 1 and sum(ev.plan.cp > 1 for ev in free.plans) >= 3
    res = solve(job, top_k=3, emit="megatron")
    assert res.plans and _runs(job, res.plans, "megatron")
    assert all(ev.plan.cp == 1 for ev in res.plans)


def test_a_rule_that_empties_the_space_is_named() -> None:
    """DeepSpeed runs no tensor parallelism inside its pipeline engine: tp=2,pp=2 pinned is
    exit 1 naming that row and its source, not a memory or divisibility message."""
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    with pytest.raises(InfeasibleError, match=r"deepspeed tp .*AutoTP.*__init__\.py:550"):
        solve(job, fix="tp=2,pp=2", emit="deepspeed", top_k=3)
    with pytest.raises(InfeasibleError, match=r"deepspeed tp"):
        enumerate_plans(job, fix="tp=2,pp=2,mbs=1,recompute=none,zero=1", emit="deepspeed")
    res = CliRunner().invoke(main, ["solve", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus",
                                    "16", "--seq-len", "4096", "--global-batch", "64", "--fix",
                                    "tp=2,pp=2", "--emit", "deepspeed", "-q"])
    assert res.exit_code == 1 and "deepspeed tp" in res.output


def test_a_pin_the_framework_cannot_run_is_exit_2() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64)
    with pytest.raises(InputError, match=r"--fix cp=2: deepspeed cannot run it: .*config\.py"):
        SearchSpace.for_job(job, fix="cp=2", emit="deepspeed")
    res = CliRunner().invoke(main, ["solve", *README, "--fix", "vpp=2", "--recipe",
                                    "deepspeed", "-q"])
    assert res.exit_code == 2 and "--fix vpp=2: megatron-deepspeed cannot run it" in res.output


def test_torchtitan_refuses_mtp_with_pipeline_or_context_parallelism() -> None:
    """torchtitan 0.3.0 models/deepseek_v3/mtp.py:202: 'MTP does not support pipeline
    parallelism yet', and the same with cp > 1: the rows refuse them and the space has none."""
    job = make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=1024,
                   recipe="torchtitan-fsdp")
    assert job.model.mtp_layers == 1
    from autoparallel_cp.spec.plan import Plan

    pp = Plan(pp=8, dp=128, ep=8, zero=3, num_microbatches=8, etp=1)
    cp = Plan(cp=2, dp=512, ep=8, zero=3, num_microbatches=2, etp=1)
    assert [r.field for r in refusals(job, pp, "torchtitan")] == ["pp"]
    assert [r.field for r in refusals(job, cp, "torchtitan")] == ["cp"]
    assert "mtp.py:202" in refusals(job, pp, "torchtitan")[0].source
    space = SearchSpace.for_job(job)
    assert space.etp == 1
    key = type("K", (), dict(tp=1, cp=1, pp=8, dp=128, ep=8, vpp=1, sp=0, zero=3, mbs=1, m=8,
                             mode=0))
    assert ("torchtitan", "pp") in space.refusals_of_key(key)
    no_mtp = job.model_copy(update={"model": job.model.model_copy(update={"mtp_layers": 0})})
    assert not refusals(no_mtp, pp, "torchtitan")


# ---------------------------------------------------------------------------------------------
# CP-SAT == the enumerator on restricted spaces (the proof holds over the framework's space)
# ---------------------------------------------------------------------------------------------


def _mini(moe: bool, layers: int) -> ModelSpec:
    return ModelSpec(
        name="mini-moe" if moe else "mini", num_layers=layers, hidden_size=1024,
        ffn_hidden_size=2816, num_attention_heads=8, num_kv_heads=4, vocab_size=32000,
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=1408,
                    first_k_dense_layers=1) if moe else None)


def _compare(job: Job, space: SearchSpace, k: int, fmt: str) -> list:
    a = solve(job, space, top_k=k, time_limit=120)
    b = enumerate_plans(job, space, top_k=k)
    assert a.status == "optimal"
    ca = [c for c, _ in a.stats["ranked"]]
    cb = [c for c, _ in b.stats["ranked"]]
    assert len(ca) == len(cb) > 0
    tol = a.error_bound_s + 1e-9
    for x, y in zip(ca, cb, strict=True):
        assert x == pytest.approx(y, abs=tol)
    for _, p in [*a.stats["ranked"], *b.stats["ranked"]]:  # the job's own rows aside (model)
        assert not [r for r in refusals(job, p, fmt) if r.field not in JOB_FIELDS], p
    return [p for _, p in b.stats["ranked"]]


@pytest.mark.parametrize("recipe,emit,moe", [
    ("deepspeed", None, False), ("deepspeed", None, True), ("deepspeed", "deepspeed", True),
    ("torchtitan-fsdp", None, False), ("torchtitan-fsdp", None, True),
    ("pytorch-fsdp", None, False), ("megatron-bf16", "megatron", False),
    ("torchtitan-fsdp", "torchtitan-toml", False),
])
def test_restricted_space_matches_enumeration(recipe: str, emit: str | None, moe: bool
                                              ) -> None:
    job = Job(model=_mini(moe, 8), cluster=load_cluster("dgx-h100").take_gpus(8),
              recipe=RECIPES[recipe], seq_len=4096, global_batch=16)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, emit=emit)
    assert space.restriction is not None
    fmt = space.restriction.formats[0]
    plans = _compare(job, space, 4, fmt)
    free = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, by_framework=False)
    assert space.size() < free.size()
    assert plans


def test_megatron_partial_recompute_counts_per_chunk() -> None:
    """Megatron counts --recompute-num-layers per model chunk (transformer_config.py:551-555):
    with vpp 2 the space holds only even counts, and the enumerator and CP-SAT agree on it."""
    job = Job(model=_mini(False, 8), cluster=load_cluster("dgx-a100-40g").take_gpus(4),
              seq_len=8192, global_batch=16)
    fix = "pp=2,vpp=2,recompute=full,tp=1,cp=1,mbs=1,zero=1,sp=0"
    free = SearchSpace.for_job(job, fix=fix, by_framework=False)
    mg = SearchSpace.for_job(job, fix=fix, emit="megatron")
    assert mg.recompute_step(2) == 2 and free.recompute_step(2) == 1
    assert mg.size() < free.size()
    from autoparallel_cp.search.enumerate import enumerate_best

    _compare(job, mg, 1, "megatron")
    for _, p in enumerate_best(mg)[0]:
        assert p.recompute_layers is None or p.recompute_layers % 2 == 0


def test_restriction_of_names_the_framework() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64)
    assert Restriction.of(job) is None  # megatron-bf16: any plan, as before
    assert Restriction.of(job, "deepspeed").formats == ("deepspeed",)
    ds = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64,
                  recipe="deepspeed")
    assert Restriction.of(ds).formats == ("megatron-deepspeed",)  # what the recipe costs
    assert Restriction.of(ds, "deepspeed").formats == ("deepspeed",)
    assert Restriction.of(ds, "megatron").formats == ("megatron",)


def test_mt_nlg_tp_pp_plan_names_megatron_deepspeed() -> None:
    """MT-NLG 530B ran tp 8 x pp 35 on Megatron-DeepSpeed (Megatron's TP layers in DeepSpeed's
    PipelineModule): --emit deepspeed refuses it with that reason and both sources; the
    `deepspeed` recipe (which costs Megatron-DeepSpeed) finds it, and evaluate scores it."""
    from autoparallel_cp.api import evaluate
    from autoparallel_cp.emit import emit
    from autoparallel_cp.errors import UserError
    from autoparallel_cp.spec.plan import parse_plan

    job = make_job("sc21-gpt-530b", "dgx-a100", gpus=2240, seq_len=2048, global_batch=1920,
                   recipe="deepspeed")
    plan = parse_plan("tp=8,pp=35,zero=1,mbs=1,recompute=full", job)
    with pytest.raises(UserError, match=r"tp: .*Megatron-DeepSpeed.*gpt_model\.py:322.*"
                                        r"__init__\.py:550-553"):
        emit(job, plan, "deepspeed")
    assert evaluate(job, plan).plan == plan
    res = solve(job, fix="tp=8,pp=35,mbs=1", top_k=1)
    assert res.plans and res.plans[0].plan.zero <= 1 and res.plans[0].plan.vpp == 1
    with pytest.raises(InfeasibleError, match=r"deepspeed tp"):
        solve(job, fix="tp=8,pp=35,mbs=1", top_k=1, emit="deepspeed")


@settings(max_examples=300, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8]), vpp=st.sampled_from([1, 2]), sp=st.integers(0, 1),
       zero=st.integers(0, 3), mbs=st.sampled_from([1, 2]), m=st.sampled_from([1, 3, 4, 8]),
       mode=st.integers(0, 2), etp=st.sampled_from([None, 1, 2]),
       recipe=st.sampled_from(sorted(RECIPES)))
def test_key_rows_read_the_key_as_a_plan_would(tp: int, pp: int, cp: int, dp: int, ep: int,
                                               vpp: int, sp: int, zero: int, mbs: int, m: int,
                                               mode: int, etp: int | None, recipe: str) -> None:
    """`Restriction.key_rows` reads a light `KeyPlan`; every key row gives the verdict it
    gives on the pydantic Plan of the key (DeepSeek-V3: MoE, MTP, the torchtitan registry)."""
    from autoparallel_cp.spec.framework_space import KeyView
    from autoparallel_cp.spec.frameworks import FRAMEWORKS
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

    job = _DSV3.model_copy(update={"recipe": RECIPES[recipe]})
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero=zero, mbs=mbs,
                num_microbatches=m, recompute=RECOMPUTE_MODES[mode], etp=etp)
    key = KeyView(tp, cp, pp, dp, ep, vpp, sp, zero, mbs, m, mode)
    for fmt in (*FRAMEWORKS, "pytorch-fsdp", "megatron-deepspeed"):
        r = Restriction(job, (fmt,))
        want = tuple((x.framework, x.field) for x in r.key_refusals(plan))
        assert r.key_rows(key, etp) == want, fmt


_DSV3 = make_job("deepseek-v3", "dgx-h100", gpus=1024, seq_len=4096, global_batch=1024)


def test_every_domain_value_left_out_is_one_its_row_refuses() -> None:
    """A row's `domain` (applied to the space up front) never drops a value its `broken`
    lets through, so narrowing the domains loses no plan the framework runs."""
    from autoparallel_cp.spec.frameworks import RULES
    from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan

    universe: dict[str, list] = {"tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1, 2], "ep": [1, 2],
                                 "vpp": [1, 2], "zero": [0, 1, 2, 3], "sp": [0, 1],
                                 "recompute": list(RECOMPUTE_MODES)}
    context = {"sp": {"tp": 2}, "vpp": {"pp": 2, "num_microbatches": 4}}
    checked = 0
    for recipe in sorted(RECIPES):
        job = _DSV3.model_copy(update={"recipe": RECIPES[recipe]})
        for r in RULES:
            if r.domain is None:
                continue
            for axis, allowed in r.domain(job).items():
                for v in universe[axis]:
                    if v in allowed:
                        continue
                    plan = Plan(**{**context.get(axis, {}), axis: v})
                    assert r.broken(job, plan) is not None, (r.framework, axis, v, recipe)
                    checked += 1
    assert checked > 20


def test_the_proof_names_the_frameworks_space() -> None:
    """The JSON `space` lists the frameworks whose rows the proof covers, and `outside` says
    why a plan they refuse (or a recompute count off Megatron's per-chunk step) is not in it."""
    from autoparallel_cp.search.space_proof import outside, proof_space
    from autoparallel_cp.spec.plan import Plan

    job = make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096, global_batch=64,
                   recipe="deepspeed")
    space = SearchSpace.for_job(job)
    desc = proof_space(space)
    json.dumps(desc)  # serialisable
    assert desc["frameworks"] == ["megatron-deepspeed"]
    assert desc["axes"]["vpp"] == [1] and desc["axes"]["cp"] == [1]
    assert "zero: megatron-deepspeed" in (outside(space, Plan(dp=8, pp=2, zero=3,
                                                              num_microbatches=8)) or "")
    mg = SearchSpace.for_job(make_job("llama3-8b", "dgx-h100", gpus=16, seq_len=4096,
                                      global_batch=64), emit="megatron")
    odd = Plan(dp=8, pp=2, vpp=2, zero=1, num_microbatches=8, recompute="full",
               recompute_layers=3)
    assert outside(mg, odd) is not None
    assert outside(mg, odd.model_copy(update={"recompute_layers": 4})) is None
