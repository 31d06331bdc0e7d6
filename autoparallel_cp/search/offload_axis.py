"""Host optimizer offload as a search axis (issue 31.2): the share x of the optimizer states
kept in host memory (`Plan.optimizer_offload`, cost/offload.py).

Domain (`offload_axis`): `OFFLOAD_SHARES` where every node group states its host
(spec/cluster.py `HostSpec`; else {0}), narrowed to the shares the space's frameworks run at
some ZeRO stage of the space (spec/frameworks.py rows on `optimizer_offload`: Megatron any
share with the distributed optimizer, zero >= 1; DeepSpeed the whole optimizer at ZeRO 1-2
and a `ratio` at ZeRO-3; torchtitan none: its CPUOffloadPolicy moves parameters and
gradients too). A per-key row (Megatron's and DeepSpeed's ZeRO rules) leaves the share out
of that key only (`SearchSpace.refusals_of_key` with the variant's share). `--fix
optimizer_offload=x` searches x alone (any x in [0, 1] the frameworks run).

Integration: each share is a variant space, as an expert-TP size or a replicas count is
(`SearchSpace.etp_variants` is the product of the three axes; a key's plans are the union
over the variants it is legal under, its best the best over them). The share changes only
two per-parameter factors, so no table gains an axis and the composition is unchanged
(tables.py `_replica_parts`, one leading axis over the variants):
- GPU optimizer bytes per parameter x (1 - x·(1 - k)), k the share a recipe keeps on the GPU
  (memory.py; cost/offload.py `gpu_kept_optimizer_share`: 0 but for Megatron-Core without
  the precision-aware optimizer, which keeps the fp32 main copy);
- optimizer seconds per local parameter (1 - x)·o_g + x·h_g, o_g = `optimizer_factor`,
  h_g = `optimizer_offload_s_per_param` (steptime.py: (1 - x)·opt + `optimizer_offload_s`,
  whose stages are each linear in the offloaded count, so their max or sum is too).

Host memory (a constraint: cost/evaluate.py `host_fits`): a stage's GPU keeps x·(optimizer
bytes + 4 bytes of fp32 gradient) per locally updated parameter on the host, and a node's
GPUs share it. The search takes a share on a key only where the host bytes of the largest
stage any partition of the key can have fit (`host_ok`): at most `stage_layers_bound` layers
(L - (pp - 1)·vpp in a free split, L/pp in a uniform one, a named or pinned layout's largest
stage), each at the larger kind's bytes, plus the embedding, the head and the MTP depths; so
every plan of a key that passes fits its hosts (evaluate agrees on every searched plan), and
a key whose largest possible stage would not fit is left out at that share even where its
best split would (evaluate it with `--plan`; `explain` marks it outside the space).
`host_ok` reads (tp, ep, zero, dp, cp) only (pp = N/(tp·cp·dp)), so it is a key rule like a
framework row.

Why the bounds stay valid (cpsat_master.py, key_bounds.py, cpsat_partition.py): each
variant's tables are the factor functions at its share, every entry stays >= 0 ((1 - x)·o +
x·h >= 0 and 1 - x·(1 - k) >= 0 for 0 <= x, k <= 1), and the composition is the same, so each
variant's own bounds bound its plans exactly as the no-offload ones do. Across variants:
- the master takes every table elementwise as the least over the variants (`bound_tables`),
  here the most-offloaded share's memory and the no-offload optimizer time wherever offload
  is slower (h_g >= o_g; the least of (1 - x)·o + x·h over x otherwise), without masking
  the keys a share is illegal on (a least over more variants is still <= each legal one's),
  so LB(key) <= every plan of the key whatever its share;
- the key bounds and the partition models are per variant and `key_variants` gives each
  key only its legal shares (`host_ok`, the framework rows), so a key's bound is the least of
  its legal variants' bounds, each a lower bound of that variant's plans.
Offload rarely wins at scale: there the no-offload variant's best is already at or below the
offloading variants' key bounds (their optimizer time is larger, h_g > o_g), and
`solve_partition_proven` stops at the first family whose bound exceeds the best so far.

Activation offload (`activation_offload`) is searched when pinned, on one-stage plans: its
own module, search/act_offload.py (the memory identity, the copy time, the bounds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autoparallel_cp.cost import factors as fx
from autoparallel_cp.cost.offload import host_bytes_per_param, optimizer_offload_s_per_param
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.plan import Plan

#: the shares of the optimizer states on the host searched by default (issue 31.2: a small
#: documented domain; Mist, EuroSys 2025, tunes the ratio jointly with the parallelism). Each
#: share is a variant (its key-bound rows and partition families are solved per key), so the
#: domain is kept to none, half and all: with five shares (0.25 steps) the DeepSeek-V3 bench
#: job took 14.3 s against 10.8 s with these three (profiled, loaded 2-core machine); any
#: other share is searched with `--fix optimizer_offload=x`.
OFFLOAD_SHARES: tuple[float, ...] = (0.0, 0.5, 1.0)


def has_hosts(job: Job) -> bool:
    """Every node group states its host link and memory (spec/cluster.py `HostSpec`)."""
    return all(g.host is not None for g in job.cluster.node_groups)


def refuse_pin(job: Job, pins: Mapping[str, Any]) -> float | None:
    """The pinned share (`--fix optimizer_offload=x`), None without one; InputError (exit 2)
    for a value outside [0, 1] or a cluster without hosts (a pinned activation offload:
    search/act_offload.py `narrow`)."""
    if "optimizer_offload" not in pins:
        return None
    x = pins["optimizer_offload"]
    if not isinstance(x, (int, float)) or not 0.0 <= float(x) <= 1.0:
        raise InputError(f"--fix optimizer_offload={x}: expected a share in [0, 1]",
                         field="optimizer_offload")
    if float(x) > 0.0 and not has_hosts(job):
        raise InputError(f"--fix optimizer_offload={x}: offloading needs every node group's "
                         "host (cluster field `host`: link_gbps, memory_gib, memory_gbps)",
                         field="optimizer_offload")
    return float(x)


def offload_axis(job: Job, restriction: Restriction | None, zeros: tuple[int, ...],
                 pinned: float | None) -> tuple[float, ...]:
    """The shares searched (module docstring): the pin, else `OFFLOAD_SHARES` where every
    node group has a host ({0} otherwise), each kept when some ZeRO stage of `zeros` runs it
    under the frameworks' `optimizer_offload` rows. A pin no stage runs is an InputError."""
    if pinned is not None:
        cands: tuple[float, ...] = (pinned,)
    elif not has_hosts(job):
        return (0.0,)
    else:
        cands = OFFLOAD_SHARES
    out = tuple(x for x in cands if _runs(restriction, x, zeros))
    if pinned is not None and not out:
        assert restriction is not None
        raise InputError(f"--fix optimizer_offload={pinned:g}: {restriction.describe()} does "
                         f"not run it at ZeRO {list(zeros)} (spec/frameworks.py "
                         "optimizer_offload rows)", field="optimizer_offload")
    return out


def _runs(r: Restriction | None, x: float, zeros: tuple[int, ...]) -> bool:
    """Some ZeRO stage of `zeros` has no `optimizer_offload` row refusing share `x`."""
    if x == 0.0 or r is None:
        return True
    return any(not any(f.field == "optimizer_offload"
                       for f in r.key_refusals(Plan(zero=z, optimizer_offload=x)))
               for z in zeros)


def host_ok(space: Any, tp: int, ep: int, zero: int, dp: int, cp: int) -> bool:
    """The variant's share fits every node's host memory on a key with these axes, for any
    partition: the host bytes per GPU of the largest stage any partition family of the key's
    pp can have (`stage_layers_bound`, module docstring) times the node's GPUs within its host
    memory. Always True at share 0."""
    x = space.optimizer_offload
    if x == 0.0:
        return True
    memo: dict[tuple[int, ...], bool] = space.__dict__.setdefault("_host_ok", {})
    k = (tp, ep, zero, dp, cp)
    if k not in memo:
        pp = space.job.num_gpus // (tp * cp * dp)
        per_gpu = x * _memo(_BYTES_MEMO, space.job, model_host_bytes, tp, ep, space.etp,
                            zero, dp, cp, space.dp_replicate, stage_layers_bound(space, pp))
        memo[k] = all(g.host is not None and per_gpu * g.gpus_per_node <= g.host.memory_bytes
                      for g in space.job.cluster.node_groups)
    return memo[k]


def stage_layers_bound(space: Any, pp: int) -> int:
    """The most layers one stage holds in any partition of the space at `pp` stages: over the
    space's vpp values and each partition family (`SearchSpace.split_families`), a pinned or
    named layout's largest stage, L/pp for uniform splits, L - (pp - 1)·vpp for free ones
    (every other stage holds >= vpp layers; L - (pp - 2)·vpp where a V's rank 0 may hold none,
    search/empty_rank.py); L when no family places the layers (no plan)."""
    memo: dict[int, int] = space.__dict__.setdefault("_stage_bound", {})
    if pp not in memo:
        L = space.num_layers
        most = 0
        for vpp in space.vpp:
            for f in space.split_families(pp, vpp):
                pinned = f.fixed_stage_layers(pp, vpp)
                if pinned is not None:
                    most = max(most, max(pinned))
                elif f.partition == "uniform":
                    most = max(most, -(-L // pp))
                else:  # a V's rank 0 may be empty (empty_rank.py): one stage fewer
                    most = max(most, L - (pp - 1 - int(
                        pp > 1 and f.first_stage_min_units(vpp) == 0)) * vpp)
        memo[pp] = most or L
    return memo[pp]


#: `_params` and `model_host_bytes` by (job id, arguments): the same for every share (and
#: for every ZeRO stage and dp: `_params`) of one job's variants (copies, each with its own
#: instance memo); the job is kept with its value so an id is never read for another job
_PARAMS_MEMO: dict[tuple[Any, ...], tuple[Job, Any]] = {}
_BYTES_MEMO: dict[tuple[Any, ...], tuple[Job, Any]] = {}


def _memo(memo: dict[tuple[Any, ...], tuple[Job, Any]], job: Job, fn: Any, *args: Any
          ) -> Any:
    """`fn(job, *args)`, memoized in `memo` by (id(job), args) (module comment above)."""
    k = (id(job), *args)
    got = memo.get(k)
    if got is None or got[0] is not job:
        if len(memo) > 1 << 16:
            memo.clear()
        got = memo[k] = (job, fn(job, *args))
    return got[1]


def _params(job: Job, tp: int, ep: int, etp: int | None
            ) -> tuple[tuple[tuple[float, float], ...], float]:
    """((dense, expert) parameters per GPU of one layer of each kind, the embedding, LM head
    and MTP extras' parameters) at (tp, ep, etp), memoized."""
    return _memo(_PARAMS_MEMO, job, _count_params, tp, ep, etp)


def _count_params(job: Job, tp: int, ep: int, etp: int | None
                  ) -> tuple[tuple[tuple[float, float], ...], float]:
    """`_params`, computed."""
    m = job.model
    kinds = tuple((float(a), float(b)) for a, b in (
        fx.layer_param_counts(job, moe, tp, ep, etp)
        for moe in sorted({m.is_moe_layer(i) for i in range(m.num_layers)})))
    ef = fx.edge_factors(job, 0, tp, 1, 0, 1)
    extra = float(ef.emb_params) + float(ef.head_params)
    if m.mtp_layers:
        mf = fx.mtp_factors(job, 0, tp, 1, 0, 1)
        extra += m.mtp_layers * float(mf.params) + float(mf.copy_params)
    return kinds, extra


def model_host_bytes(job: Job, tp: int, ep: int, etp: int | None, zero: int, dp: int,
                     cp: int, dp_replicate: int = 1, layers: int | None = None) -> float:
    """Host bytes per GPU at share 1 of a stage holding `layers` layers (the whole model by
    default), each at the larger kind's bytes, and the embedding, the LM head and the MTP
    depths: an upper bound of every stage's (memory.py's `host_bytes` / x) with at most that
    many layers on a key with these axes."""
    shard_d = dp * cp / dp_replicate
    shard_e = float(fx.expert_dp_size(tp, cp, dp, ep, etp)) / dp_replicate
    hd = host_bytes_per_param(job, zero, shard_d)
    he = host_bytes_per_param(job, zero, shard_e)
    kinds, extra = _params(job, tp, ep, etp)
    per_layer = max(pd * hd + pe * he for pd, pe in kinds)
    m = job.model
    n = m.num_layers if layers is None else layers
    return (n + m.mtp_layers) * per_layer + extra * hd

def gpu_share(offs: Sequence[float], k: int, keep: float = 0.0) -> Any:
    """1 - x·(1 - keep) of each variant's share x on a leading axis before `k` table axes: the
    GPU's part of the optimizer bytes (memory.py; `keep` = cost/offload.py
    `gpu_kept_optimizer_share`, the fp32 main copy a recipe keeps on the GPU); the float 1.0
    when no share is offloaded (so the tables keep their bits)."""
    if not any(offs):
        return 1.0
    return 1.0 - np.array(offs, float).reshape((-1,) + (1,) * k) * (1.0 - keep)


def opt_seconds(job: Job, g: int, offs: Sequence[float], k: int) -> Any:
    """Optimizer seconds per local parameter on node group `g`, (1 - x)·o + x·h with each
    variant's share x on a leading axis before `k` table axes (module docstring); the float
    o = `optimizer_factor` alone when no share is offloaded. At x = 0 the entry is o·1 + 0·h
    = o, the same float."""
    o = fx.optimizer_factor(job, g)
    if not any(offs):
        return o
    x = np.array(offs, float).reshape((-1,) + (1,) * k)
    return o * (1.0 - x) + x * optimizer_offload_s_per_param(job, g)
