"""Every published row becomes a job and a plan the cost model accepts, or says why not; the
held-out rows per source are the counts `data/heldout_sources.md` documents."""

from __future__ import annotations

import collections
import csv
import re
from pathlib import Path

import pytest
from harness.heldout import heldout_rows
from harness.train_rows import published_rows

from autoparallel_cp.spec.plan import plan_violations

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
HEADING = re.compile(r"^## (\S+) — .*\((\d+) rows?\)\s*$", re.M)


@pytest.fixture(scope="module")
def held() -> list:
    return heldout_rows()


@pytest.fixture(scope="module")
def train() -> list:
    return published_rows()


def _csv(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("which", ["held", "train"])
def test_every_row_has_a_plan_or_a_stated_reason(which: str,
                                                 request: pytest.FixtureRequest) -> None:
    rows = request.getfixturevalue(which)
    bad = []
    for r in rows:
        if r.job is None or r.plan is None:
            if r.job is not None or r.plan is not None or len(r.skip.strip()) < 10:
                bad.append(f"#{r.idx} {r.name}: skipped without a reason ({r.skip!r})")
        elif r.skip:
            bad.append(f"#{r.idx} {r.name}: has a plan and a skip reason {r.skip!r}")
        elif plan_violations(r.job, r.plan):
            bad.append(f"#{r.idx} {r.name}: {plan_violations(r.job, r.plan)}")
        elif not r.measured_tps or r.measured_tps <= 0:
            bad.append(f"#{r.idx} {r.name}: a plan but no measured tokens/s/GPU")
    assert bad == []
    assert sum(r.plan is not None for r in rows) > len(rows) // 2  # not all skipped


@pytest.mark.parametrize(("which", "csv_name"), [("held", "published_runs_heldout.csv"),
                                                ("train", "published_runs_train.csv")])
def test_one_row_per_csv_line(which: str, csv_name: str,
                              request: pytest.FixtureRequest) -> None:
    rows = request.getfixturevalue(which)
    lines = _csv(csv_name)
    assert len(rows) == len(lines)
    assert len({r.idx for r in rows}) == len(rows)
    assert [r.name for r in rows] == [line["model"] for line in lines]


def test_heldout_counts_per_source_match_the_sources_file(held: list) -> None:
    text = (DATA / "heldout_sources.md").read_text(encoding="utf-8")
    documented = {m.group(1): int(m.group(2)) for m in HEADING.finditer(text)}
    parsed = collections.Counter(r.source for r in held)
    in_csv = collections.Counter(line["source_id"] for line in _csv("published_runs_heldout.csv"))
    assert dict(parsed) == dict(in_csv) == documented
    total = re.search(r"^(\d+) rows from (\d+) independent sources", text, re.M)
    assert total is not None
    assert (int(total.group(1)), int(total.group(2))) == (len(held), len(documented))


def test_deepspeed_hf_rows_take_the_ds_config_rules(held: list) -> None:
    """FlagPerf's Hugging Face models under DeepSpeed (family deepspeed-hf): HF eager modules,
    bf16 accumulation in .grad under ZeRO (DeepSpeed v0.11.1), the ZeRO stage of each
    ds_config, FlashAttention-2 only where the model enables it, the overlapped reduce only at
    ZeRO-3, ALiBi and the eager scale / mask / clamp / softmax chain for Baichuan2-13B, the
    fp32-upcast HF norms everywhere, and the H800 hosts' stated 200 Gb/s per GPU."""
    rows = [r for r in held if r.family == "deepspeed-hf"]
    assert {r.name for r in rows} == {"Baichuan2-13B", "Llama2-7B HF"} and len(rows) == 6
    for r in rows:
        b = r.job.recipe.behaviour
        assert b.fused is False and b.autograd_grad_accum and not b.bf16_accum_pass
        baichuan = r.name == "Baichuan2-13B"
        assert r.plan.zero == (1 if baichuan else 3)
        assert b.dp_overlap is (not baichuan)
        assert r.job.recipe.flash_attention is (not baichuan)
        assert r.job.model.position_embedding == ("alibi" if baichuan else "rope")
        # HF modules: fp32-upcast RMSNorm, op-by-op RoPE / SwiGLU; Baichuan2's eager chain
        assert b.eager_ops == "llama-upcast"
        assert b.eager_attention == ("scale-mask-clamp" if baichuan else "fused")
    h800 = [r for r in rows if "H800" in r.job.cluster.node_groups[0].gpu.name]
    assert len(h800) == 3  # both Baichuan2-13B runs and one Llama 2 7B run
    assert all(r.job.cluster.node_groups[0].inter_node.bandwidth_gbps == 25.0 for r in h800)
    pair = sorted((r for r in rows if r.name == "Baichuan2-13B"),
                  key=lambda r: r.plan.num_microbatches)
    assert [r.plan.num_microbatches for r in pair] == [8, 64]
    assert [r.job.global_batch for r in pair] == [128, 1024]
