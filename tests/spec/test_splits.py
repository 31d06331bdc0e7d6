"""Megatron-Core's layer splits (spec/splits.py), by hand from Megatron-LM d98e8a64
transformer_block.py `get_num_layers_to_build` and the Megatron-Bridge recipes' layouts."""

from __future__ import annotations

import pytest

from autoparallel_cp.spec.plan import Plan, parse_assignments
from autoparallel_cp.spec.splits import default_split, microbatch_group, stage_chunks


@pytest.mark.parametrize("layers,pp,vpp,stages", [
    (32, 4, 2, (8, 8, 8, 8)),  # pp*vpp | layers: Megatron's even split
    # 128 slots / 64 chunks = 2; the first / last chunk gives one to E / L
    (126, 8, 8, (15, 16, 16, 16, 16, 16, 16, 15)),
    (126, 8, 1, (15, 16, 16, 16, 16, 16, 16, 15)),
    (94, 8, 4, (11, 12, 12, 12, 12, 12, 12, 11)),  # 96 slots, 3 a chunk
    (94, 8, 2, (11, 12, 12, 12, 12, 12, 12, 11)),  # 96 slots, 6 a chunk
    # 63 slots over 32 chunks: 31 chunks of 2 and the last of 1, less E and L
    (61, 8, 4, (7, 8, 8, 8, 8, 8, 8, 6)),
    # 64 slots with the loss alone over 4 stages (the L+1 case): 16 each, the last 15
    (63, 4, 1, (16, 16, 16, 15)),
])
def test_default_split(layers: int, pp: int, vpp: int, stages: tuple[int, ...]) -> None:
    assert default_split(layers, pp, vpp) == stages
    assert sum(stages) == layers


def test_stage_chunks_match_megatron_and_bridge() -> None:
    # --account-for-*: 126 on pp 8 x vpp 8
    assert stage_chunks(15, 8, True, False) == (1,) + (2,) * 7
    assert stage_chunks(15, 8, False, True) == (2,) * 7 + (1,)
    assert stage_chunks(16, 8, False, False) == (2,) * 8
    # even counts split evenly on edge stages too (--decoder-first/last-pipeline-num-layers)
    assert stage_chunks(16, 8, True, False) == (2,) * 8
    assert stage_chunks(16, 8, False, True) == (2,) * 8
    # DeepSeek-V3 pp 8 x vpp 4, Bridge "Et|(tt|)*30mL": first stage 1,2,2,2; last 2,2,2,0
    assert stage_chunks(7, 4, True, False) == (1, 2, 2, 2)
    assert stage_chunks(6, 4, False, True) == (2, 2, 2, 0)
    plan = Plan(pp=8, vpp=4)
    assert plan.layout(61) == (1,) + (2,) * 30 + (0,)


def test_chunk_layers_field_round_trips() -> None:
    """chunk_layers is in layout order (chunk v of stage j at v*pp + j)."""
    fields = parse_assignments("pp=2,vpp=2,chunk_layers=4:4:4:1")
    plan = Plan(**fields)
    assert plan.layers_per_stage(13) == (8, 5)
    assert plan.chunks_per_stage(13) == ((4, 4), (4, 1))
    assert Plan(**parse_assignments(plan.short())) == plan
    assert Plan(pp=2).key() == Plan(pp=2).key()  # plans without it keep their key


def test_microbatch_group() -> None:
    """pp | m: Megatron's default pp; else the least N in [pp, m], m % N 0 or >= pp."""
    assert microbatch_group(8, 64) == 8
    assert microbatch_group(4, 10) == 5
    assert microbatch_group(8, 12) == 12
    assert microbatch_group(8, 7) == 0
