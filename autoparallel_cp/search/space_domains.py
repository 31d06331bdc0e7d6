"""The default domain of every plan axis of a job, narrowed by the `--fix` pins: the
`SearchSpace` fields `SearchSpace.for_job` starts from (search/space.py, before the
framework restriction and hybrid sharding's replicas).

Axes and their default domains (every value is also checked against the job):
- `tp`: divisors of the attention heads, at most the GPUs per node of the smallest node group,
  compatible with the KV heads and the FFN width (Megatron's argument checks);
- `cp`: divisors of the GPU count with `seq % (2 cp) == 0` (load-balanced ring attention),
  at most `max_cp`;
- `pp`: divisors of the GPU count, at most the number of layers (uniform partitions: dividing
  the layers), at most `max_pp`;
- `dp`: derived, `N / (tp pp cp)`;
- `ep`: divisors of the routed experts (1 for dense models) with ep | dp cp under Megatron's
  default expert-TP size (etp = tp), or etp*ep | tp cp dp under a folded one (MoE parallel
  folding, spec/folding.py), where a folded plan (etp != tp) with tp > 1 needs sp = 1;
- `etp` (`etp_axis`), the experts' tensor-parallel size, for MoE models: Megatron's default
  (tp) and `ETP_VALUES` (1: Megatron-Bridge's folded MoE recipes), each dividing the expert
  FFN; `--fix etp=E` searches E only. Each size is a one-etp space (`etp_variants`) with its
  own factor tables (`tables.Tables.variants`: the factor functions take etp as a parameter,
  so no table gains an axis); a key's plans are the union over the sizes it is legal under
  (`etp_legal`), its best the best over them, its bounds the least (cpsat_master.py's
  docstring: the master's tables are the elementwise least over the sizes). etp = tp written
  out is the default's plan and is not searched twice.
- `dp_replicate` (hybrid sharding, `rep_axis`): for the frameworks that run it (every
  restriction whose rows do not refuse it, `Restriction.replicates`: Megatron's distributed-
  optimizer instances and Megatron-FSDP, torchtitan's FSDP2, PyTorch FSDP's HYBRID_SHARD;
  not DeepSpeed), 1 and, per key, the replicas of a shard group of whole nodes
  (`spec.hybrid_sharding.node_shard_replicas`: one node, PyTorch HYBRID_SHARD's layout, or
  the fewest nodes with two shard ranks when tp·cp fills a node). Each value R is a variant
  space as an expert-TP size is (`etp_variants`: the product of the two axes) whose keys are
  those with that R (`rep_ok`) and zero >= 2 (hybrid FSDP, `zero_ok`); R | the experts' DP group
  (`ep_ok`). `--fix dp_replicate=R` searches R alone (any R | dp, zero >= 1:
  `pins.replicate_zeros`). The tables read the shard group dp·cp/R from the cost functions.
- `vpp`: `1..max_vpp` (interleaved 1F1B needs `pp > 1` and `num_microbatches >= pp`: Megatron's
  micro-batch groups, `spec.plan.microbatch_group`);
- `mbs`: powers of two up to `max_mbs` dividing the global batch;
- `zero`: 0-3, `sp`: 0/1 (1 only with tp > 1), `recompute`: none / selective / full;
- partial recompute (`recompute_layers` with `recompute=full`, Megatron's
  `--recompute-num-layers`: the first r layers of each stage recompute);
- the layer partition, a union of *families* per (pp, vpp) (`split_families`): the space's
  own partitions, `uniform` (Megatron's default split, pp*vpp | layers) or `free` (any
  per-stage counts, multiples of vpp, every stage at least vpp layers: the splits that balance
  the stages' time and memory, each stage's chunks equal), and, in a free space, the *named
  uneven layouts* (`layouts`, `spec.splits.named_layouts`): the layers plus 0/1 embedding and
  0/1 loss slots spread evenly over the pp*vpp model chunks, the remainder to the earliest
  chunks, as Megatron-Core lays them out with and without --account-for-embedding/loss-in-
  pipeline-split and torchtitan with its first/last-stage weights. So pp*vpp need not divide
  the layers (Llama 3.1 405B's 126 layers on pp 8 x vpp 8: 1,2,...,2,1 layers per chunk, as
  NVIDIA runs it). Megatron's --decoder-first/last-pipeline-num-layers give every chunk of a
  stage the same count, so their splits are free partitions. Each named layout is searched
  as a pinned `chunk_layers` (the machinery of a `--fix`ed split: its stages' own in-flight
  counts); a layout the free family already holds (equal chunks per stage) is not repeated.
  A pinned `stage_layers` or `chunk_layers` may be any split `spec.plan.plan_violations`
  accepts, and is the only partition searched;
- on a heterogeneous cluster, the node group of every stage (a stage's dp*tp*cp GPUs sit in one
  group; each group holds exactly `gpus_in_group / (dp tp cp)` stages);
- a framework restriction (`restriction`, spec/framework_space.py: the recipe's framework and
  `--emit`'s): narrowed domains, partial recompute and etp here; its key rules
  (`refusals_of_key`) applied by the best-first loop and the enumerator alike.

Split out of space.py (no behaviour change): the domains are computed once per job, the
space's methods read them.
"""

from __future__ import annotations

from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.search.pins import check_structural_pins, replicate_zeros
from autoparallel_cp.search.schedule_axis import narrow, narrow_placements, narrow_recompute
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, RecomputeMode

#: The expert-TP sizes searched besides Megatron's default (etp = tp) for an MoE model without
#: `--fix etp`: 1, the folded layout of Megatron-Bridge's MoE recipes (DeepSeek-V3, Qwen3,
#: GPT-OSS: `expert_tensor_parallel_size=1`, Megatron-Core MoE paper arXiv 2603.07685
#: "Parallel Folding"). Each size adds a copy of every MoE factor table and its keys' scoring.
ETP_VALUES: tuple[int, ...] = (1,)



def _etp_axis(job: Job, values: tuple[int, ...] | None) -> tuple[int | None, ...]:
    """(None, *values) for an MoE model (each value dividing the expert FFN), else (None,)."""
    moe = job.model.moe
    if moe is None:
        return (None,)
    vals = ETP_VALUES if values is None else values
    return (None, *(e for e in vals if moe.expert_ffn_hidden_size % e == 0))


def divisors(n: int) -> list[int]:
    """Positive divisors of `n`, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def job_domains(job: Job, pins: dict[str, Any], *, partition: str, partial_recompute: bool,
                max_tp: int | None, max_pp: int, max_cp: int, max_vpp: int, max_mbs: int,
                max_ep: int | None, zero: tuple[int, ...], named_splits: bool,
                etp_values: tuple[int, ...] | None) -> dict[str, Any]:
    """The `SearchSpace` fields of `job`'s default space narrowed by `pins` (the module
    docstring's domains; `pins` gains recompute=full when only recompute_layers is pinned)."""
    m, n = job.model, job.num_gpus
    gpn = min(g.gpus_per_node for g in job.cluster.node_groups)
    kv = m.kv_heads if m.mla is None else m.num_attention_heads
    tps = [
        t for t in divisors(m.num_attention_heads)
        if t <= (max_tp or gpn) and n % t == 0 and m.ffn_hidden_size % t == 0
        and (kv % t == 0 or t % kv == 0)
    ]
    cps = [c for c in divisors(n) if c <= max_cp and (c == 1 or job.seq_len % (2 * c) == 0)]
    pps = [p for p in divisors(n) if p <= min(max_pp, m.num_layers)]
    if partition == "uniform":
        pps = [p for p in pps if m.num_layers % p == 0]
    if m.moe is not None:
        eps = [e for e in divisors(m.moe.num_experts) if e <= (max_ep or n) and n % e == 0]
    else:
        eps = [1]
    vpps = list(range(1, max_vpp + 1))
    mbss = [b for b in (2**i for i in range(12)) if b <= max_mbs and job.global_batch % b == 0]
    zeros = replicate_zeros(pins, list(zero))
    sps = [0, 1]
    modes: list[RecomputeMode] = list(RECOMPUTE_MODES)
    if m.moe is not None and m.moe.moe_layer_freq > 1:
        partition = "uniform"  # interleaved dense/MoE layers: per-stage mix needs uniform

    def pin(name: str, dom: list[Any]) -> list[Any]:
        if name not in pins:
            return dom
        v = pins[name]
        if v not in dom:
            raise InputError(
                f"--fix {name}={v} is outside its domain {dom} for this job", field=name
            )
        return [v]

    # pins outside the default caps are honoured when they are legal for the job
    if "tp" in pins and pins["tp"] not in tps and m.num_attention_heads % pins["tp"] == 0:
        tps = [pins["tp"]]
    if "pp" in pins and pins["pp"] not in pps and n % pins["pp"] == 0:
        pps = [pins["pp"]]
    if "cp" in pins and pins["cp"] not in cps and n % pins["cp"] == 0:
        cps = [pins["cp"]]
    if "vpp" in pins and pins["vpp"] not in vpps:
        vpps = [pins["vpp"]]
    if "mbs" in pins and pins["mbs"] not in mbss and job.global_batch % pins["mbs"] == 0:
        mbss = [pins["mbs"]]
    check_structural_pins(job, pins)
    if "stage_layers" in pins:
        partition = "free"
        pps = [p for p in pps if p == len(pins["stage_layers"])]
    if "chunk_layers" in pins:
        partition = "free"
        pps = [p for p in pps if len(pins["chunk_layers"]) % p == 0]
        vpps = sorted({len(pins["chunk_layers"]) // p for p in pps})
    pps, vpps = narrow(pins.get("schedule"), pps, vpps)
    pps = narrow_placements(pins.get("schedule"), pps, job, pins)
    if "stage_groups" in pins:
        pps = [p for p in pps if p == len(pins["stage_groups"])]
    if "recompute_layers" in pins and "recompute" not in pins:
        pins["recompute"] = "full"
    return dict(
        job=job,
        tp=tuple(pin("tp", tps)),
        pp=tuple(pin("pp", pps)),
        cp=tuple(pin("cp", cps)),
        ep=tuple(pin("ep", eps)),
        vpp=tuple(pin("vpp", vpps)),
        mbs=tuple(pin("mbs", mbss)),
        zero=tuple(pin("zero", zeros)),
        sp=tuple(pin("sp", sps)),
        recompute=tuple(pin("recompute", modes)),
        partition=partition,
        partial_recompute=narrow_recompute(pins.get("schedule"), pins, partial_recompute),
        fixed=pins,
        etp=pins.get("etp"),
        dp_replicate=int(pins.get("dp_replicate", 1)),
        rep_axis=(int(pins.get("dp_replicate", 1)),),
        etp_axis=(pins["etp"],) if "etp" in pins else _etp_axis(job, etp_values),
        schedule=pins.get("schedule"),
        schedules=(pins.get("schedule"),),
        named_splits=named_splits and partition == "free" and not (
            "stage_layers" in pins or "chunk_layers" in pins),
    )
