"""SearchSpace domains, pins and counting."""

from __future__ import annotations

import pytest

from autoparallel_cp.errors import InputError
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.search.space_domains import divisors
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.loaders import load_cluster, load_model
from autoparallel_cp.spec.plan import PlanError


def _job(model: str = "llama3-8b", gpus: int = 16, batch: int = 64) -> Job:
    return Job(model=load_model(model), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               seq_len=4096, global_batch=batch)


def test_divisors() -> None:
    assert divisors(12) == [1, 2, 3, 4, 6, 12]


def test_domains_respect_job_rules() -> None:
    s = SearchSpace.for_job(_job())
    assert set(s.tp) <= {1, 2, 4, 8}
    for d in s.degrees():
        assert d.tp * d.pp * d.cp * d.dp == 16
        assert 64 % (d.dp * d.mbs) == 0 and d.num_microbatches == 64 // (d.dp * d.mbs)
        if d.vpp > 1:
            assert d.pp > 1 and d.num_microbatches % d.pp == 0


def test_size_counts_uniform_space_by_brute_force() -> None:
    both = _job(gpus=8, batch=16).model_copy(update={"search_also": ("schedule", "offload")})
    s = SearchSpace.for_job(both, partition="uniform", partial_recompute=False)
    assert s.schedules == (None, "zb-h1", "zb-h2", "zbv", "dualpipev")
    # every node group has a host: each key once per offload share its hosts hold
    assert len(s.off_axis) > 1
    shares = [v for v in s.etp_variants()]
    brute = 0
    for d in s.degrees():
        # the default schedule, zb-h1 / zb-h2 wherever pp > 1 at vpp 1, zbv at vpp 2 and
        # dualpipev there with m >= 2pp (schedule_axis.py; a uniform split: one layout each)
        v = d.pp > 1 and d.vpp == 2
        for _ in range(3 if d.pp > 1 and d.vpp == 1 else
                       2 + (d.num_microbatches >= 2 * d.pp) if v else 1):
            for sp in s.sp:
                if sp and d.tp == 1:
                    continue
                for z in s.zero:
                    brute += len(s.recompute) * sum(v.host_ok(d.tp, d.ep, z, d.dp, d.cp)
                                                    for v in shares)
    # and the activation-offload sub-spaces (search/act_offload.py): one stage, no recompute
    subs = [u for u in s.schedule_variants() if "activation_offload" in u.fixed]
    assert [v.fixed["activation_offload"] for v in subs] == list(s.act_axis)
    for u in subs:
        assert u.pp == (1,) and u.recompute == ("none",)
        for d in u.degrees():
            for sp in u.sp:
                if sp and d.tp == 1:
                    continue
                for z in u.zero:
                    brute += sum(w.host_ok(d.tp, d.ep, z, d.dp, d.cp) for w in u.etp_variants())
    assert s.size() == brute


def test_free_partitions_count() -> None:
    s = SearchSpace.for_job(_job(gpus=8, batch=16), fix="pp=4,vpp=1")
    assert s.num_partitions(4, 1) == 4495  # C(31, 3)
    assert s.size() > s.with_(partition="uniform").size()


def test_fix_pins_and_errors() -> None:
    s = SearchSpace.for_job(_job(), fix="tp=4,sp=1,zero=1")
    assert s.tp == (4,) and s.sp == (1,) and s.zero == (1,)
    with pytest.raises(InputError):
        SearchSpace.for_job(_job(), fix="tp=3")
    with pytest.raises((InputError, PlanError)):
        SearchSpace.for_job(_job(), fix="bogus=1")


def test_moe_ep_domain_and_dense_prefix() -> None:
    j = Job(model=load_model("deepseek-v3"), cluster=load_cluster("dgx-h800").take_gpus(256),
            seq_len=4096, global_batch=256)
    s = SearchSpace.for_job(j)
    assert 256 in s.ep and all(256 % e == 0 for e in s.ep)
    assert s.first_stage_min_units(1) == 3
    for d in list(s.degrees())[:200]:
        assert (d.dp * d.cp) % d.ep == 0


def test_counting_helpers_by_hand() -> None:
    """gpt3-1.3b: 24 layers. Placements of stages on two node groups of 8 GPUs: a stage of
    dp*tp*cp GPUs, each group holds 8 / (dp*tp*cp) stages, in pp! / (n_0! n_1!) orders."""
    from test_solver_vs_enumerate import _mixed_small

    job = Job(model=load_model("gpt3-1.3b"), cluster=_mixed_small(), seq_len=2048,
              global_batch=32)
    s = SearchSpace.for_job(job)
    assert s.num_placements(1, 1, 4, 4) == 6  # 2 + 2 stages: 4!/(2!2!)
    assert s.num_placements(1, 1, 8, 2) == 2  # 1 + 1
    assert s.num_placements(1, 1, 2, 8) == 70  # 4 + 4: 8!/(4!4!)
    assert s.num_placements(1, 1, 4, 2) == 0  # 2 + 2 stages for pp = 2: not a placement
    assert s.num_placements(2, 1, 8, 1) == 0  # 16 GPUs a stage: more than a group
    assert s.stage_group_counts(2, 2, 1) == (2, 2) and s.stage_group_counts(1, 1, 16) is None
    assert SearchSpace.for_job(job, fix="stage_groups=0:1").num_placements(1, 1, 8, 2) == 1
    one = SearchSpace.for_job(_job("gpt3-1.3b", gpus=8, batch=32))
    assert one.num_placements(1, 1, 2, 4) == 1
    # (mode, recompute_layers) settings: partial full recompute counts r = 1 .. 20 and "all"
    # (the largest stage of 4 holds 24 - 3 = 21 layers); uniform: 1 .. 5 and "all"
    assert one.recompute_choices(4, 1) == 1 + 1 + 21
    assert one.recompute_choices(4, 2) == 1 + 1 + (24 - 3 * 2)
    assert one.with_(partition="uniform").recompute_choices(4, 1) == 1 + 1 + 6
    assert one.with_(partial_recompute=False).recompute_choices(4, 1) == 3
    pinned = SearchSpace.for_job(one.job, fix="recompute_layers=2")
    assert pinned.recompute == ("full",) and pinned.recompute_choices(4, 1) == 1
    # partitions: compositions of 24 / vpp units into pp parts
    assert one.num_partitions(2, 1) == 23 and one.num_partitions(2, 2) == 11
    assert one.num_partitions(3, 5) == 0  # 24 layers are not chunks of 5
    assert one.with_(partition="uniform").num_partitions(4, 1) == 1
    assert SearchSpace.for_job(one.job, fix="stage_layers=20:4").num_partitions(2, 1) == 1


def test_describe_lists_every_domain() -> None:
    s = SearchSpace.for_job(_job("gpt3-1.3b", gpus=8, batch=32),
                            fix="tp=2,pp=2,cp=1,vpp=1,mbs=4,zero=1,sp=1,recompute=full")
    d = s.describe()
    assert {k: d[k] for k in ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero", "sp", "recompute",
                              "etp", "partial_recompute")} == {
        "tp": [2], "pp": [2], "cp": [1], "ep": [1], "vpp": [1], "mbs": [4], "zero": [1],
        "sp": [1], "recompute": ["full"], "etp": ["tp"], "partial_recompute": [True]}
    assert d["partition"][0].startswith("free") and d["partition"][1].startswith("named")
    assert SearchSpace.for_job(s.job, fix="stage_layers=12:12").describe()["partition"] == [
        "pinned split (--fix stage_layers / chunk_layers)"]
    assert SearchSpace.for_job(s.job, partition="uniform").describe()["partition"] == [
        "uniform: Megatron's even split, pp*vpp | layers"]
    moe = Job(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100").take_gpus(64),
              seq_len=4096, global_batch=64)
    assert SearchSpace.for_job(moe, fix="etp=2").describe()["etp"] == [2]
