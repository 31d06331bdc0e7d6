"""SearchSpace domains, pins and counting."""

from __future__ import annotations

import pytest

from autoparallel_cp.errors import InputError
from autoparallel_cp.search.space import SearchSpace, divisors
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
    s = SearchSpace.for_job(_job(gpus=8, batch=16), partition="uniform", partial_recompute=False)
    brute = 0
    for d in s.degrees():
        for sp in s.sp:
            if sp and d.tp == 1:
                continue
            brute += len(s.zero) * len(s.recompute)
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
