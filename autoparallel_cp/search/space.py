"""The search space of a job: the domain of every plan axis, `--fix` pins, and its size.

Axes and their default domains (every value is also checked against the job):
- `tp`: divisors of the attention heads, at most the GPUs per node of the smallest node group,
  compatible with the KV heads and the FFN width (Megatron's argument checks);
- `cp`: divisors of the GPU count with `seq % (2 cp) == 0` (load-balanced ring attention),
  at most `max_cp`;
- `pp`: divisors of the GPU count, at most the number of layers (uniform partitions: dividing
  the layers), at most `max_pp`;
- `dp`: derived, `N / (tp pp cp)`;
- `ep`: divisors of the routed experts (1 for dense models) dividing `dp cp`; with `--fix etp=E`
  (MoE parallel folding, spec/plan.py) `ep * E` divides `tp cp dp` instead, and a folded plan
  (E != tp) with tp > 1 needs sp = 1 (`sp_ok`). etp is not a search axis but one value per
  space (None: Megatron's default): searching it would add an axis to every MoE factor table
  and the master's literal families and score every key once per etp (slower MoE solves); a
  fixed value keeps every table's axes, so the bounds built on the tables hold as they are
  (cpsat_master.py). `--fix etp=1` searches the folded layouts of Megatron-Bridge's recipes.
- `vpp`: `1..max_vpp` (interleaved 1F1B needs `pp > 1` and `num_microbatches >= pp`: Megatron's
  micro-batch groups, `spec.plan.microbatch_group`);
- `mbs`: powers of two up to `max_mbs` dividing the global batch;
- `zero`: 0-3, `sp`: 0/1 (1 only with tp > 1), `recompute`: none / selective / full;
- partial recompute (`recompute_layers` with `recompute=full`, Megatron's
  `--recompute-num-layers`: the first r layers of each stage recompute);
- the layer partition: `uniform` (Megatron's default split, pp*vpp | layers) or `free`
  (any per-stage counts, multiples of vpp, every stage at least vpp layers); a pinned
  `stage_layers` or `chunk_layers` may be any split `spec.plan.plan_violations` accepts (uneven
  model chunks, the embedding and loss as layer slots), and is the only partition searched;
- on a heterogeneous cluster, the node group of every stage (a stage's dp*tp*cp GPUs sit in one
  group; each group holds exactly `gpus_in_group / (dp tp cp)` stages);
- a framework restriction (`restriction`, spec/framework_space.py: the recipe's framework and
  `--emit`'s): narrowed domains, partial recompute and etp here; its key rules
  (`refusals_of_key`) applied by the best-first loop and the enumerator alike.

`size()` counts complete plans (every field that changes the plan) without listing them.

Kept whole (about 440 lines): the domains, the degree rules and the counting of one space read
the same fields; split, a rule and its count would sit apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import product
from math import comb, factorial
from typing import Any, Literal

from autoparallel_cp.errors import InputError
from autoparallel_cp.search.pins import check_structural_pins
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_space import KeyView, Restriction
from autoparallel_cp.spec.plan import (
    RECOMPUTE_MODES,
    Plan,
    RecomputeMode,
    parse_assignments,
    split_violations,
)
from autoparallel_cp.spec.splits import stage_chunks

PartitionKind = Literal["uniform", "free"]

# Keys accepted by --fix; `dp` and `num_microbatches` restrict derived values.
FIXABLE = (
    "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches",
    "recompute", "recompute_layers", "stage_layers", "stage_groups", "chunk_layers", "etp",
)


def divisors(n: int) -> list[int]:
    """Positive divisors of `n`, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class Degrees:
    """One legal combination of the parallel degrees, mbs and the derived micro-batch count."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    vpp: int
    mbs: int
    num_microbatches: int


@dataclass(frozen=True)
class SearchSpace:
    """Domains of all plan axes for one job (see the module docstring)."""

    job: Job
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    vpp: tuple[int, ...]
    mbs: tuple[int, ...]
    zero: tuple[int, ...]
    sp: tuple[int, ...]
    recompute: tuple[RecomputeMode, ...]
    partition: PartitionKind = "free"
    partial_recompute: bool = True
    fixed: Mapping[str, Any] = field(default_factory=dict)
    #: expert-tensor-parallel size of every plan (`--fix etp`); None: Megatron's default (tp)
    etp: int | None = None
    #: the frameworks whose plans only are searched (spec/framework_space.py); None: any
    restriction: Restriction | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_job(
        cls,
        job: Job,
        *,
        fix: str | Mapping[str, Any] | None = None,
        partition: PartitionKind = "free",
        partial_recompute: bool = True,
        max_tp: int | None = None,
        max_pp: int = 64,
        max_cp: int = 16,
        max_vpp: int = 4,
        max_mbs: int = 8,
        max_ep: int | None = None,
        zero: tuple[int, ...] = (0, 1, 2, 3),
        emit: str | None = None,
        by_framework: bool = True,
    ) -> SearchSpace:
        """The default space of `job`, narrowed by `fix` (text `k=v,...` or a mapping) and,
        with `by_framework`, to the plans the recipe's framework and the `emit` format run
        (`Restriction.of`, applied by `_restrict`)."""
        pins: dict[str, Any] = dict(parse_assignments(fix) if isinstance(fix, str) else fix or {})
        for k in pins:
            if k not in FIXABLE:
                raise InputError(f"cannot fix {k!r}; fixable: {', '.join(FIXABLE)}", field=k)
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
        zeros = list(zero)
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
        if "stage_groups" in pins:
            pps = [p for p in pps if p == len(pins["stage_groups"])]
        if "recompute_layers" in pins and "recompute" not in pins:
            pins["recompute"] = "full"
        space = cls(
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
            partial_recompute=partial_recompute,
            fixed=pins,
            etp=pins.get("etp"),
        )
        restriction = Restriction.of(job, emit) if by_framework else None
        return space if restriction is None else space._restrict(restriction)

    def _restrict(self, r: Restriction) -> SearchSpace:
        """This space narrowed to the plans of `r`'s frameworks (`Restriction.narrow`: domains,
        partial recompute, etp; its key rules are applied by the search itself)."""
        return self.with_(restriction=r, **r.narrow(
            {a: getattr(self, a) for a in ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero", "sp",
                                           "recompute")}, self.fixed))

    def refusals_of_key(self, key: Any) -> tuple[tuple[str, str], ...]:
        """(framework, field) of the restriction's rows that search `key` breaks (every plan
        of the key breaks the same: `Restriction.key_rows`); empty without a restriction."""
        return () if self.restriction is None else self.restriction.key_rows(key, self.etp)

    def recompute_step(self, vpp: int) -> int:
        """Partial recompute counts of a free or uniform split are multiples of this (the
        restriction's, `Restriction.recompute_step`); 1 for a pinned split, whose best plan
        the search checks against the split rows instead."""
        if self.restriction is None or self.fixed_split:
            return 1
        return self.restriction.recompute_step(vpp)

    def with_(self, **changes: Any) -> SearchSpace:
        """A copy with some fields replaced."""
        return replace(self, **changes)

    # ------------------------------------------------------------------ helpers
    @property
    def num_layers(self) -> int:
        return self.job.model.num_layers

    @property
    def fixed_split(self) -> bool:
        """Whether --fix pins the layer split (`stage_layers` or `chunk_layers`)."""
        return "stage_layers" in self.fixed or "chunk_layers" in self.fixed

    def fixed_stage_layers(self, pp: int, vpp: int) -> tuple[int, ...] | None:
        """The pinned layers per stage for (pp, vpp) (stage sums of a pinned `chunk_layers`)."""
        if "stage_layers" in self.fixed:
            return tuple(self.fixed["stage_layers"])
        if "chunk_layers" in self.fixed:
            return Plan(pp=pp, vpp=vpp, chunk_layers=tuple(self.fixed["chunk_layers"])
                        ).layers_per_stage(self.num_layers)
        return None

    def chunks_of(self, pp: int, vpp: int, j: int, n: int) -> tuple[int, ...]:
        """Layers of the model chunks of stage j when it holds n layers (`Plan`'s rule, or the
        pinned `chunk_layers`)."""
        cl = self.fixed.get("chunk_layers")
        if cl is not None and len(cl) == pp * vpp:
            return tuple(int(cl[v * pp + j]) for v in range(vpp))
        return stage_chunks(n, vpp, j == 0, j == pp - 1)

    def _fixed_split_ok(self, pp: int, vpp: int) -> bool:
        """The pinned split is legal for (pp, vpp) (`spec.plan.split_violations`)."""
        cl = self.fixed.get("chunk_layers")
        sl = self.fixed.get("stage_layers")
        if cl is not None and len(cl) != pp * vpp:
            return False
        plan = Plan(pp=pp, vpp=vpp, stage_layers=None if sl is None else tuple(sl),
                    chunk_layers=None if cl is None else tuple(cl))
        return not split_violations(self.num_layers, plan)

    @property
    def heterogeneous(self) -> bool:
        return self.job.cluster.heterogeneous

    @property
    def dp_domain(self) -> tuple[int, ...]:
        """dp values some legal degree combination reaches."""
        return tuple(sorted({d.dp for d in self.degrees()}))

    def stage_group_counts(self, tp: int, cp: int, dp: int) -> tuple[int, ...] | None:
        """Stages each node group holds when a stage has dp*tp*cp GPUs; None if not whole."""
        per_stage = dp * tp * cp
        out = []
        for g in self.job.cluster.node_groups:
            if g.num_gpus % per_stage:
                return None
            out.append(g.num_gpus // per_stage)
        return tuple(out)

    def degrees(self) -> Iterator[Degrees]:
        """Legal degree combinations (tp, pp, cp, dp, ep, vpp, mbs); the other axes are free."""
        job, m, n = self.job, self.job.model, self.job.num_gpus
        for tp in self.tp:
            for cp in self.cp:
                for pp in self.pp:
                    if n % (tp * cp * pp):
                        continue
                    dp = n // (tp * cp * pp)
                    if "dp" in self.fixed and self.fixed["dp"] != dp:
                        continue
                    if self.heterogeneous and self.stage_group_counts(tp, cp, dp) is None:
                        continue
                    for ep in self.ep:
                        if not self.ep_ok(tp, cp, dp, ep):
                            continue
                        for mbs in self.mbs:
                            if job.global_batch % (dp * mbs):
                                continue
                            nmb = job.global_batch // (dp * mbs)
                            if self.fixed.get("num_microbatches", nmb) != nmb:
                                continue
                            for vpp in self.vpp:
                                if vpp > 1 and (pp == 1 or nmb < pp):
                                    continue
                                if self.fixed_split:
                                    if not self._fixed_split_ok(pp, vpp):
                                        continue
                                elif self.partition == "uniform":
                                    if m.num_layers % (pp * vpp):
                                        continue
                                elif m.num_layers < pp * vpp or m.num_layers % vpp:
                                    continue
                                if not self._moe_partition_ok(pp, vpp):
                                    continue
                                yield Degrees(tp, pp, cp, dp, ep, vpp, mbs, nmb)

    def ep_ok(self, tp: int, cp: int, dp: int, ep: int) -> bool:
        """Expert parallelism fits the stage's ranks: ep | dp*cp by default (etp = tp), else
        etp*ep | tp*cp*dp (Megatron's expert grid, spec/plan.py) and etp | the expert FFN."""
        if self.etp is None:
            return (dp * cp) % ep == 0
        moe = self.job.model.moe
        ffn_ok = moe is None or moe.expert_ffn_hidden_size % self.etp == 0
        return ffn_ok and (tp * cp * dp) % (self.etp * ep) == 0

    def sp_ok(self, tp: int, sp: int) -> bool:
        """sp = 1 needs tp > 1; a folded layout (etp != tp) with tp > 1 needs sp = 1."""
        if sp:
            return tp > 1
        return self.etp is None or tp == 1 or tp == self.etp

    def _moe_partition_ok(self, pp: int, vpp: int) -> bool:
        """Free partitions: the first stage must be able to hold the dense prefix layers."""
        if self.partition == "uniform":
            return True
        fixed = self.fixed_stage_layers(pp, vpp)
        if fixed is not None:
            moe = self.job.model.moe
            return fixed[0] >= (moe.first_k_dense_layers if moe is not None else 0)
        units = self.num_layers // self.layer_step(vpp)
        return units - self.first_stage_min_units(vpp) + 1 >= pp

    def layer_step(self, vpp: int) -> int:
        """Granularity of a stage's layer count in a free partition (multiples of vpp)."""
        return vpp

    def first_stage_min_units(self, vpp: int) -> int:
        """Least layer units (of `layer_step`) on the first stage: it holds the dense prefix."""
        moe = self.job.model.moe
        k = moe.first_k_dense_layers if moe is not None else 0
        step = self.layer_step(vpp)
        return max(1, -(-k // step))

    # ------------------------------------------------------------------ counting
    def num_partitions(self, pp: int, vpp: int) -> int:
        """Layer partitions over `pp` stages (compositions in steps of vpp*freq)."""
        if self.fixed_split:
            return 1
        if self.partition == "uniform":
            return 1
        step = self.layer_step(vpp)
        if self.num_layers % step:
            return 0
        units = self.num_layers // step - (self.first_stage_min_units(vpp) - 1)
        return comb(units - 1, pp - 1) if units >= pp else 0

    def num_placements(self, tp: int, cp: int, dp: int, pp: int) -> int:
        """Orders of node groups over the stages (1 on a homogeneous cluster)."""
        if not self.heterogeneous or "stage_groups" in self.fixed:
            return 1
        counts = self.stage_group_counts(tp, cp, dp)
        if counts is None or sum(counts) != pp:
            return 0
        out = factorial(pp)
        for c in counts:
            out //= factorial(c)
        return out

    def mode_choices(self, mode: RecomputeMode, pp: int, vpp: int) -> int:
        """Distinct recompute_layers settings of one mode per partition."""
        if mode == "full" and self.partial_recompute and "recompute_layers" not in self.fixed:
            # r = 1 .. (largest possible stage) - 1 in steps of `recompute_step`, plus "all"
            biggest = self.num_layers - (pp - 1) * self.layer_step(vpp)
            if self.partition == "uniform":
                biggest = self.num_layers // pp
            return (max(1, biggest) - 1) // self.recompute_step(vpp) + 1
        return 1

    def recompute_choices(self, pp: int, vpp: int) -> int:
        """Distinct (mode, recompute_layers) settings per partition, summed over the modes."""
        return sum(self.mode_choices(mode, pp, vpp) for mode in self.recompute)

    def size(self) -> int:
        """Number of complete plans in the space (counted, not listed; with a restriction,
        the keys it refuses are left out)."""
        per_rest = len(self.zero)
        total = 0
        for d in self.degrees():
            rest = self.num_partitions(d.pp, d.vpp) * self.num_placements(d.tp, d.cp, d.dp, d.pp)
            sps = [s for s in self.sp if self.sp_ok(d.tp, s)]
            if self.restriction is None:
                total += len(sps) * per_rest * self.recompute_choices(d.pp, d.vpp) * rest
                continue
            for s, z, mode in product(sps, self.zero, self.recompute):
                key = KeyView(d.tp, d.cp, d.pp, d.dp, d.ep, d.vpp, s, z, d.mbs,
                              d.num_microbatches, RECOMPUTE_MODES.index(mode))
                if not self.refusals_of_key(key):
                    total += self.mode_choices(mode, d.pp, d.vpp) * rest
        return total

    def num_degree_combinations(self) -> int:
        """Legal (tp, pp, cp, dp, ep, vpp, mbs) combinations."""
        return sum(1 for _ in self.degrees())

    def describe(self) -> str:
        """One line per axis with its domain."""
        rows = [
            f"tp {list(self.tp)}", f"pp {list(self.pp)}", f"cp {list(self.cp)}",
            f"ep {list(self.ep)}", f"vpp {list(self.vpp)}", f"mbs {list(self.mbs)}",
            f"zero {list(self.zero)}", f"sp {list(self.sp)}", f"recompute {list(self.recompute)}",
            f"partition {self.partition}", f"partial_recompute {self.partial_recompute}",
        ]
        if self.etp is not None:
            rows.append(f"etp {self.etp}")
        if self.restriction is not None:
            rows.append(f"frameworks {self.restriction.describe()} (spec/frameworks.py rows)")
        return "\n".join(rows)
