"""torchtitan runs a V whose rank 0 holds no layer (spec/plan.py `empty_first_ok`): its model
parts are listed in stage order (spec/splits.py `model_order`: stage pp + i is chunk 1 of rank
pp-1-i), the first holding the embedding only and the last the norm and head; a middle part
without a layer stays refused."""

from __future__ import annotations

from autoparallel_cp.api import make_job
from autoparallel_cp.emit.torchtitan import module_fqns
from autoparallel_cp.spec.frameworks import refusals
from autoparallel_cp.spec.plan import parse_plan
from autoparallel_cp.spec.splits import model_order


def test_model_order_reverses_a_vs_second_half() -> None:
    assert model_order((0, 1, 2, 3, 0, 5, 6, 7), 4, True) == (0, 1, 2, 3, 7, 6, 5, 0)
    assert model_order((0, 1, 2, 3, 0, 5, 6, 7), 4, False) == (0, 1, 2, 3, 0, 5, 6, 7)


def test_torchtitan_parts_of_an_empty_rank_0() -> None:
    job = make_job("llama3-8b", "dgx-h100", gpus=8, global_batch=64, recipe="torchtitan-fsdp")
    plan = parse_plan("tp=2,pp=4,vpp=2,schedule=zbv,chunk_layers=0:5:5:6:0:5:5:6", job)
    assert refusals(job, plan, "torchtitan") == []
    parts = module_fqns(job, plan)
    assert parts[0] == ["tok_embeddings"] and parts[-1] == ["norm", "lm_head"]
    # stages 1..6 in model order: ranks 1, 2, 3 then 3, 2, 1
    assert [len(p) for p in parts[1:-1]] == [5, 5, 6, 6, 5, 5]
    assert [x for p in parts for x in p if x.startswith("layers.")] == [
        f"layers.{i}" for i in range(32)]
    middle = plan.model_copy(update={"chunk_layers": (4, 0, 6, 6, 4, 6, 6, 0)})
    assert [r.field for r in refusals(job, middle, "torchtitan")] == ["stage_layers"]
