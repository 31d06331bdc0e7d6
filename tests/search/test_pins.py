"""search/pins.py: `--fix` pins that no plan of the job can have are refused with an error
naming the pin and the rule (exit 2 at the CLI), each rule at its boundary; legal pins at the
boundary pass (issue 16, mutation testing pass 4). The rules are spec/plan.py's, restated in
pins.py's docstrings: degrees >= 1, ZeRO 0-3, sp 0/1, stage / chunk layer counts that add up to
the model's layers (gpt3-1.3b: 24) and match pp (x vpp), node groups that exist (the mixed
cluster has two: 0 and 1), expert TP only on an MoE model whose expert FFN (Mixtral 8x7B:
14,336) it divides, and 0 <= recompute_layers <= layers."""

from __future__ import annotations

from typing import Any

import pytest
from test_solver_vs_enumerate import _mixed_small

from autoparallel_cp import api
from autoparallel_cp.errors import InputError
from autoparallel_cp.search.pins import check_structural_pins
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec.plan import EMPTY_RULE


@pytest.fixture(scope="module")
def dense() -> Any:
    return api.make_job("gpt3-1.3b", "dgx-h100", gpus=8, seq_len=2048, global_batch=32)


REFUSED: list[tuple[dict[str, Any], str, str]] = [
    ({"tp": 0}, "tp", "--fix tp=0: must be >= 1"),
    ({"pp": 0}, "pp", "--fix pp=0: must be >= 1"),
    ({"cp": -1}, "cp", "--fix cp=-1: must be >= 1"),
    ({"ep": 0}, "ep", "--fix ep=0: must be >= 1"),
    ({"vpp": 0}, "vpp", "--fix vpp=0: must be >= 1"),
    ({"mbs": 0}, "mbs", "--fix mbs=0: must be >= 1"),
    ({"dp": 0}, "dp", "--fix dp=0: must be >= 1"),
    ({"num_microbatches": 0}, "num_microbatches", "--fix num_microbatches=0: must be >= 1"),
    ({"etp": 2}, "etp", "--fix etp=2: expert tensor parallelism needs an MoE model"),
    ({"zero": 4}, "zero", "--fix zero=4: must be 0, 1, 2 or 3"),
    ({"zero": -1}, "zero", "--fix zero=-1: must be 0, 1, 2 or 3"),
    ({"sp": 2}, "sp", "--fix sp=2: must be 0 or 1"),
    ({"stage_layers": (24, 0)}, "stage_layers",
     "--fix stage_layers=24:0: every stage needs at least one layer"),
    ({"stage_layers": ()}, "stage_layers",
     "--fix stage_layers=: every stage needs at least one layer"),
    ({"stage_layers": (12, 11)}, "stage_layers",
     "--fix stage_layers=12:11: the stages hold 23 layers, the model has 24"),
    ({"stage_layers": (12, 13)}, "stage_layers",
     "--fix stage_layers=12:13: the stages hold 25 layers, the model has 24"),
    ({"stage_layers": (12, 12), "pp": 4}, "stage_layers",
     "--fix stage_layers=12:12: 2 stages for pp=4"),
    ({"chunk_layers": (12, 11)}, "chunk_layers",
     "--fix chunk_layers=12:11: the chunks hold 23 layers, the model has 24"),
    ({"chunk_layers": (6, 6, 6, 6), "pp": 2, "vpp": 3}, "chunk_layers",
     "--fix chunk_layers=6:6:6:6: 4 chunks for pp*vpp = 2*3"),
    ({"chunk_layers": (8, 8, 8), "stage_layers": (12, 12)}, "chunk_layers",
     "--fix chunk_layers and stage_layers: the chunks do not split over the stages"),
    # issue 32: a split no (pp, vpp) can run is the pin's error, not "no feasible plan"
    ({"chunk_layers": (0, 0, 0, 24), "pp": 2, "vpp": 2}, "chunk_layers",
     "--fix chunk_layers=0:0:0:24: chunk_layers leaves a pipeline stage without layers "
     "(stage 0; " + EMPTY_RULE + ")"),
    ({"chunk_layers": (0, 0, 0, 24)}, "chunk_layers",
     "--fix chunk_layers=0:0:0:24: chunk_layers leaves a pipeline stage without layers "
     "(stage 0; " + EMPTY_RULE + ")"),
    ({"chunk_layers": (6, 6, 6, 6), "stage_layers": (10, 14)}, "chunk_layers",
     "--fix chunk_layers=6:6:6:6: stage_layers 10:14 != the stage sums of chunk_layers 12:12"),
    ({"stage_groups": (0, 1)}, "stage_groups",
     "--fix stage_groups=0:1: the cluster has node groups 0..0"),
    ({"stage_groups": (0, -1)}, "stage_groups",
     "--fix stage_groups=0:-1: the cluster has node groups 0..0"),
    ({"stage_groups": ()}, "stage_groups", "--fix stage_groups=: the cluster has node groups 0..0"),
    ({"stage_groups": (0, 0), "pp": 4}, "stage_groups",
     "--fix stage_groups=0:0: 2 stages for pp=4"),
    ({"stage_groups": (0, 0), "stage_layers": (8, 8, 8)}, "stage_groups",
     "--fix stage_groups and stage_layers: different numbers of stages"),
    ({"recompute_layers": 25}, "recompute_layers", "--fix recompute_layers=25: must be in 0..24"),
    ({"recompute_layers": -1}, "recompute_layers", "--fix recompute_layers=-1: must be in 0..24"),
]


@pytest.mark.parametrize(("pins", "field", "message"), REFUSED)
def test_structural_pins_are_refused_with_the_rule(dense: Any, pins: dict[str, Any], field: str,
                                                   message: str) -> None:
    with pytest.raises(InputError) as err:
        check_structural_pins(dense, pins)
    assert err.value.field == field
    assert str(err.value) == f"field '{field}': {message}"


def test_pins_at_the_boundary_pass(dense: Any) -> None:
    for pins in ({"tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "mbs": 1, "dp": 1,
                  "num_microbatches": 1},
                 {"zero": 0}, {"zero": 3}, {"sp": 0}, {"sp": 1},
                 {"stage_layers": (23, 1), "pp": 2}, {"stage_layers": (24,)},
                 {"chunk_layers": (6, 6, 6, 6), "pp": 2, "vpp": 2, "stage_layers": (12, 12)},
                 {"chunk_layers": (24,)},
                 {"stage_groups": (0, 0), "pp": 2, "stage_layers": (12, 12)},
                 {"recompute_layers": 0}, {"recompute_layers": 24}):
        check_structural_pins(dense, pins)


def test_expert_tp_pins() -> None:
    moe = api.make_job("mixtral-8x7b", "dgx-h100", gpus=64, seq_len=4096, global_batch=64)
    check_structural_pins(moe, {"etp": 2})
    check_structural_pins(moe, {"etp": 7})  # 14,336 = 2^11 x 7
    with pytest.raises(InputError) as err:
        check_structural_pins(moe, {"etp": 3})
    assert str(err.value) == ("field 'etp': --fix etp=3: the expert FFN (14336) does not split "
                              "over it")
    with pytest.raises(InputError, match="--fix etp=0: must be >= 1"):
        check_structural_pins(moe, {"etp": 0})


def test_two_node_groups_accept_group_one() -> None:
    job = api.make_job("gpt3-1.3b", _mixed_small(), seq_len=2048, global_batch=32)
    check_structural_pins(job, {"stage_groups": (1, 0), "pp": 2})
    with pytest.raises(InputError, match=r"stage_groups=0:2: the cluster has node groups 0\.\.1"):
        check_structural_pins(job, {"stage_groups": (0, 2)})


def test_the_space_checks_the_pins_first(dense: Any) -> None:
    # the text form reaches the same rule (after parse_assignments' own checks)
    with pytest.raises(InputError, match="the stages hold 23 layers, the model has 24"):
        SearchSpace.for_job(dense, fix="stage_layers=12:11")
    with pytest.raises(InputError) as err:
        SearchSpace.for_job(dense, fix={"bogus": 1})
    assert err.value.field == "bogus"
    assert str(err.value).startswith("field 'bogus': cannot fix 'bogus'; fixable: ")


def test_pins_outside_the_default_caps_are_kept() -> None:
    """space.py honours pins beyond its default caps when the job allows them: cp above
    max_cp (16) when it divides the GPUs, tp above the GPUs of a node when it divides the
    heads, pp above the layer count, vpp above max_vpp."""
    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=64, seq_len=2048, global_batch=64)
    assert SearchSpace.for_job(job, fix="cp=32").cp == (32,)
    assert SearchSpace.for_job(job, fix="tp=16").tp == (16,)
    assert SearchSpace.for_job(job, fix="pp=32").pp == (32,)
    assert SearchSpace.for_job(job, fix="vpp=6").vpp == (6,)
