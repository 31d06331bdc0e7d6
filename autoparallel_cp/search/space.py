"""The search space of a job: the domain of every plan axis, `--fix` pins, and its size.

Axes and their default domains: search/space_domains.py (`job_domains`).

`size()` counts complete plans (every field that changes the plan) without listing them.

Kept whole (about 530 lines): the degree rules, the partition families, the
expert-TP sizes and the counting of one space read the same fields; split, a rule and its
count would sit apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from autoparallel_cp.errors import InputError
from autoparallel_cp.search import act_offload, offload_axis, space_count, space_proof
from autoparallel_cp.search.empty_rank import dense_prefix, empty_first, prefix_min_units
from autoparallel_cp.search.replay_axis import free_family, free_pp_ok
from autoparallel_cp.search.schedule_axis import (
    SCANNED,
    degree_ok,
    narrow_recompute,
    placement_capped,
    refuse_unrun,
    refuse_unsearched,
    union_schedules,
    variant_domains,
)
from autoparallel_cp.search.space_domains import job_domains
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.framework_space import Restriction
from autoparallel_cp.spec.hybrid_sharding import node_shard_replicas
from autoparallel_cp.spec.plan import (
    Plan,
    RecomputeMode,
    parse_assignments,
    split_violations,
)
from autoparallel_cp.spec.schedules import V_SHAPED
from autoparallel_cp.spec.splits import named_layouts, stage_chunks

PartitionKind = Literal["uniform", "free"]

# Keys accepted by --fix; `dp` and `num_microbatches` restrict derived values.
FIXABLE = (
    "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches",
    "recompute", "recompute_layers", "stage_layers", "stage_groups", "chunk_layers", "etp",
    "dp_replicate", "schedule", "optimizer_offload", "activation_offload",
)


#: The least ZeRO stage of a searched hybrid-sharding plan: hybrid FSDP, as the frameworks
#: that run it name it (torchtitan FSDP2's data_parallel_replicate_degree over fully_shard,
#: zero 2 / 3; Megatron-FSDP's outer data-parallel group, --use-megatron-fsdp; PyTorch FSDP's
#: HYBRID_SHARD and _HYBRID_SHARD_ZERO2). Megatron's distributed-optimizer instances at zero 1
#: (--num-distributed-optimizer-instances) are evaluated and searched when pinned.
SEARCHED_REPLICA_ZERO = 2


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
    dp_replicate: int = 1  #: hybrid sharding's replicas of every plan (`--fix dp_replicate`)
    #: the replica counts searched (`etp_variants`): (dp_replicate,) unless the search tries
    #: hybrid sharding too: (1, every `node_shard_replicas` value of the space's keys)
    rep_axis: tuple[int, ...] = (1,)
    #: the expert-TP sizes searched (`etp_variants`): (etp,) unless the search folds the
    #: experts too (MoE models without `--fix etp`: (None, *ETP_VALUES))
    etp_axis: tuple[int | None, ...] = (None,)
    #: search the named uneven layouts (`layouts`) besides the space's own partitions
    named_splits: bool = True
    #: the pipeline schedule of every plan (`--fix schedule`, search/schedule_axis.py
    #: `SEARCHED`); None: today's default, 1f1b at vpp 1 and interleaved at vpp > 1
    schedule: str | None = None
    #: the sub-spaces' schedules (`schedule_variants`; None: today's default): (schedule,)
    #: when one is pinned, else search/schedule_axis.py `union_schedules`
    schedules: tuple[str | None, ...] = (None,)
    #: the frameworks whose plans only are searched (spec/framework_space.py); None: any
    restriction: Restriction | None = None
    #: the share of the optimizer states on the host of every plan (search/offload_axis.py)
    optimizer_offload: float = 0.0
    #: the shares searched (`etp_variants`): (optimizer_offload,) unless the search tries
    #: host offload too (`offload_axis.offload_axis`: every node group has a host)
    off_axis: tuple[float, ...] = (0.0,)
    #: the offloaded-layer counts whose one-stage sub-spaces join the union
    #: (`schedule_variants`, search/act_offload.py `variants`): () unless --search-also offload
    act_axis: tuple[int, ...] = ()

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
        named_splits: bool = True,
        etp_values: tuple[int, ...] | None = None,
        emit: str | None = None,
        by_framework: bool = True,
        hybrid: bool = True,
    ) -> SearchSpace:
        """The default space of `job`, narrowed by `fix` (text `k=v,...` or a mapping) and,
        with `by_framework`, to the plans the recipe's framework and the `emit` format run
        (`Restriction.of`, applied by `_restrict`); with `hybrid`, hybrid sharding's replicas
        too where those frameworks run it (`rep_axis`)."""
        pins: dict[str, Any] = dict(parse_assignments(fix) if isinstance(fix, str) else fix or {})
        off_pin = offload_axis.refuse_pin(job, pins)
        refuse_unsearched({k: v for k, v in pins.items()
                           if k not in ("optimizer_offload", "activation_offload")})
        for k in pins:
            if k not in FIXABLE:
                raise InputError(f"cannot fix {k!r}; fixable: {', '.join(FIXABLE)}", field=k)
        space = cls(**job_domains(
            job, pins, partition=partition, partial_recompute=partial_recompute,
            max_tp=max_tp, max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp, max_mbs=max_mbs,
            max_ep=max_ep, zero=zero, named_splits=named_splits, etp_values=etp_values))
        restriction = Restriction.of(job, emit) if by_framework else None
        if restriction is not None:
            space = space._restrict(restriction)
        if "schedule" not in pins and "schedule" in job.search_also:
            # the schedules costed exactly (schedule_axis.py), on request (Job.search_also)
            space = space.with_(schedules=union_schedules(restriction, space.pp, space.vpp, job))
        if hybrid and "dp_replicate" not in pins and (
                restriction is None or restriction.replicates):
            space = space._with_replicas()
        offs = (offload_axis.offload_axis(job, restriction, space.zero, off_pin)
                if off_pin is not None or "offload" in job.search_also else (0.0,))
        if off_pin is not None or len(offs) > 1:
            space = space.with_(optimizer_offload=offs[0], off_axis=offs)
        return act_offload.apply(space, pins)  # a pinned or searched activation offload

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node of the smallest node group (the shard group's unit)."""
        return min(g.gpus_per_node for g in self.job.cluster.node_groups)

    def _with_replicas(self) -> SearchSpace:
        """This space searching hybrid sharding too: `rep_axis` = 1 and the
        `node_shard_replicas` of its keys (none when zero >= 2 is not searched)."""
        if not any(z >= SEARCHED_REPLICA_ZERO for z in self.zero):
            return self
        gpn = self.gpus_per_node
        reps = sorted({node_shard_replicas(d.tp, d.cp, d.dp, gpn) for d in self.degrees()}
                      - {1})
        if not reps:
            return self
        # R > 1 only adds variants: this space's degree combinations and its R = 1 variants'
        # (`ep_ok` under `multi` reads those) are the listings already made (`etp_variants`)
        new = self.with_(rep_axis=(1, *reps))
        new.__dict__["_degrees"] = dict(self.__dict__["_degrees"])
        new.__dict__["_r1"] = {(v.etp, v.optimizer_offload): dict(v.__dict__["_degrees"])
                               for v in self.etp_variants() if "_degrees" in v.__dict__}
        return new

    def _restrict(self, r: Restriction) -> SearchSpace:
        """This space narrowed to the plans of `r`'s frameworks (`Restriction.narrow`: domains,
        partial recompute, etp; its key rules are applied by the search itself). A pinned
        schedule the framework does not run is an InputError (one schedule per space)."""
        refuse_unrun(self.schedule, r, max(self.pp), min(self.vpp))
        return self.with_(restriction=r, **r.narrow(
            {a: getattr(self, a) for a in ("tp", "pp", "cp", "ep", "vpp", "mbs", "zero", "sp",
                                           "recompute")}, self.fixed))

    def refusals_of_key(self, key: Any) -> tuple[tuple[str, str], ...]:
        """(framework, field) of the restriction's rows that search `key` breaks (every plan
        of the key breaks the same: `Restriction.key_rows`); empty without a restriction."""
        return () if self.restriction is None else self.restriction.key_rows(
            key, self.etp, self.dp_replicate, self.optimizer_offload)

    def host_ok(self, tp: int, ep: int, zero: int, dp: int, cp: int) -> bool:
        """The space's offload share fits the hosts on a key with these axes
        (`offload_axis.host_ok`: whole-model bytes); always at share 0."""
        return offload_axis.host_ok(self, tp, ep, zero, dp, cp)

    def recompute_step(self, vpp: int) -> int:
        """Partial recompute counts are multiples of this (the restriction's,
        `Restriction.recompute_step`; "all layers" stays searched)."""
        return 1 if self.restriction is None else self.restriction.recompute_step(vpp)

    def schedule_variants(self) -> tuple[SearchSpace, ...]:
        """One space per schedule of `schedules`, each the space `--fix schedule=X` would
        search (X's pp and vpp, `narrow_recompute`; the default's: this space's domains), in
        `schedules` order; the space itself when it has one schedule. Disjoint: their plans
        differ in `schedule` (search/schedule_axis.py). Then one one-stage sub-space per
        searched activation-offload count (`act_axis`, search/act_offload.py `variants`)."""
        if len(self.schedules) == 1:
            return act_offload.variants(self, (self,))
        memo: dict[str, tuple[SearchSpace, ...]] = self.__dict__.setdefault("_sched", {})
        if "v" not in memo:
            out = []
            for s in self.schedules:
                if s is None:
                    out.append(self.with_(schedules=(None,)))
                    continue
                pps, vpps = variant_domains(s, self.pp, self.vpp)
                pps = tuple(placement_capped(s, pps, self.job, self.fixed))
                if pps and vpps:
                    out.append(self.with_(schedule=s, schedules=(s,), pp=pps, vpp=vpps,
                                          partial_recompute=narrow_recompute(
                                              s, self.fixed, self.partial_recompute)))
            memo["v"] = act_offload.variants(self, tuple(out))
        return memo["v"]

    @property
    def multi(self) -> bool:
        """Whether the space is a union of variants (several expert-TP sizes, replicas or
        offload shares)."""
        return len(self.etp_axis) > 1 or len(self.rep_axis) > 1 or len(self.off_axis) > 1

    def etp_variants(self) -> tuple[SearchSpace, ...]:
        """One space per searched (expert-TP size, offload share, replicas) triple (`etp_axis`
        x `off_axis` x `rep_axis`), each with all three fixed: the spaces whose union this one
        is (the space itself when it searches one of each). A key's plans are the union over
        the variants it is legal under (`etp_legal`, `zero_ok`, `host_ok`, the framework rows
        at the variant's share and replicas)."""
        if not self.multi:
            return (self,)
        cache: dict[str, tuple[SearchSpace, ...]] = self.__dict__.setdefault("_etp", {})
        if "v" not in cache:
            out: list[SearchSpace] = []
            gpn = self.gpus_per_node
            for e in self.etp_axis:
                base: tuple[Degrees, ...] | None = None
                first = self
                by_rep: dict[int, list[Degrees]] = {}
                for x in self.off_axis:
                    one = None
                    for r in self.rep_axis:
                        v = self.with_(etp=e, etp_axis=(e,), dp_replicate=r, rep_axis=(r,),
                                       optimizer_offload=x, off_axis=(x,))
                        if r == 1:
                            one = v
                            if base is None:
                                if (e, x) in self.__dict__.get("_r1", {}):  # `_with_replicas`
                                    v.__dict__["_degrees"] = dict(self.__dict__["_r1"][e, x])
                                first, base = v, tuple(v.degrees())
                                # the sibling's degrees by their searched replicas (`rep_ok`)
                                for d in base:
                                    by_rep.setdefault(node_shard_replicas(d.tp, d.cp, d.dp,
                                                                          gpn), []).append(d)
                            else:  # no degree rule reads the offload share
                                v.__dict__["_degrees"] = {"d": base}
                                v.__dict__["_sibling"] = first  # (space_count.count)
                        elif one is not None:
                            # its degrees are its R = 1 sibling's that take R (`rep_ok`, and
                            # the expert grid with R, `ep_ok`): every other rule of
                            # `_list_degrees` reads no R, so the same list without listing
                            # the space again
                            v.__dict__["_degrees"] = {"d": tuple(
                                d for d in by_rep.get(r, ()) if v.ep_ok(d.tp, d.cp, d.dp, d.ep))}
                            v.__dict__["_sibling"] = first  # (space_count.count reads its plans)
                        out.append(v)
            cache["v"] = tuple(out)
        return cache["v"]

    def base_variants(self) -> tuple[SearchSpace, ...]:
        """The variants of the space's first replicas value (R = 1 when hybrid sharding is
        searched) and first offload share (0 when offload is searched): a key legal under
        some variant is legal under one of these (R > 1 only adds rules: `rep_ok`,
        `zero_ok`, R | the expert-DP group; a share > 0 only `host_ok` and framework rows)."""
        memo: dict[str, tuple[SearchSpace, ...]] = self.__dict__.setdefault("_base", {})
        if "v" not in memo:
            memo["v"] = tuple(v for v in self.etp_variants()
                              if v.dp_replicate == self.rep_axis[0]
                              and v.optimizer_offload == self.off_axis[0])
        return memo["v"]

    def rep_ok(self, tp: int, cp: int, dp: int) -> bool:
        """The key's dp takes this space's replicas: R | dp, and a searched (not pinned)
        R > 1 is the key's `node_shard_replicas`."""
        r = self.dp_replicate
        if r == 1:
            return True
        if dp % r:
            return False
        return "dp_replicate" in self.fixed or node_shard_replicas(
            tp, cp, dp, self.gpus_per_node) == r

    def zero_ok(self, zero: int) -> bool:
        """Hybrid sharding replicates sharded states: R > 1 needs zero >= 1, and the searched
        (not pinned) R > 1 is hybrid FSDP, zero 2 or 3 (`SEARCHED_REPLICA_ZERO`)."""
        if self.dp_replicate == 1:
            return True
        return zero >= (1 if "dp_replicate" in self.fixed else SEARCHED_REPLICA_ZERO)

    def etp_legal(self, tp: int, cp: int, dp: int, ep: int, sp: int) -> bool:
        """The key (these axes) is a plan of this one-etp, one-R space: the expert grid, the
        SP rule and the replicas' rule hold, and an explicit etp equal to tp is left to the
        default (the same plan). ZeRO is the caller's (`zero_ok`)."""
        memo: dict[tuple[int, ...], bool] = self.__dict__.setdefault("_etp_legal", {})
        k = (tp, cp, dp, ep, sp)
        if k not in memo:
            memo[k] = not (self.etp is not None and len(self.etp_axis) == 1
                           and "etp" not in self.fixed and self.etp == tp) \
                and self.rep_ok(tp, cp, dp) \
                and self.ep_ok(tp, cp, dp, ep) and self.sp_ok(tp, sp)
        return memo[k]

    def key_legal(self, tp: int, cp: int, dp: int, ep: int, sp: int) -> bool:
        """Some searched variant takes these axes (`etp_legal`); with one, the expert grid
        and SP rules (`ep_ok`, `sp_ok`)."""
        if not self.multi:
            return self.ep_ok(tp, cp, dp, ep) and self.sp_ok(tp, sp)
        return any(v.etp_legal(tp, cp, dp, ep, sp) for v in self.base_variants())

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
                    chunk_layers=None if cl is None else tuple(cl),
                    schedule=self.schedule if self.schedule in V_SHAPED else None)
        return not split_violations(self.num_layers, plan)  # (a V's rank 0 may be empty)

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
        """Legal degree combinations (tp, pp, cp, dp, ep, vpp, mbs); the other axes are free.
        Listed once per space (the size, the tables, the key listing and the bounds read
        them again)."""
        memo: dict[str, tuple[Degrees, ...]] = self.__dict__.setdefault("_degrees", {})
        if "d" not in memo:
            memo["d"] = tuple(self._list_degrees())
        return iter(memo["d"])

    def _list_degrees(self) -> Iterator[Degrees]:
        """`degrees`, generated."""
        job, n = self.job, self.job.num_gpus
        placeable: dict[tuple[int, int], bool] = {}
        for tp in self.tp:
            for cp in self.cp:
                for pp in self.pp:
                    if n % (tp * cp * pp):
                        continue
                    dp = n // (tp * cp * pp)
                    if ("dp" in self.fixed and self.fixed["dp"] != dp) \
                            or not self.rep_ok(tp, cp, dp):
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
                                if not degree_ok(self.schedule, pp, vpp, nmb):
                                    continue
                                if (pp, vpp) not in placeable:
                                    placeable[pp, vpp] = self.placeable(pp, vpp)
                                if not placeable[pp, vpp]:
                                    continue
                                yield Degrees(tp, pp, cp, dp, ep, vpp, mbs, nmb)

    def free_ok(self, pp: int, vpp: int) -> bool:
        """The space's own partitions (pinned, uniform or free) place the layers on (pp, vpp)."""
        L = self.num_layers
        if self.fixed_split:
            if not self._fixed_split_ok(pp, vpp):
                return False
        elif self.partition == "uniform":
            if L % (pp * vpp):
                return False
        elif (pp - int(empty_first(self))) * vpp > L or L % vpp or (
                self.schedule in SCANNED and not (free_family(self) and free_pp_ok(
                    self, pp, vpp))) or (
                act_offload.scored(self) and pp > 1 and not act_offload.free_at(self, pp, vpp)):
            return False  # named layouts only (replay_axis.py `free_family`; act_offload.py
            # `free_at`: a pinned offload's free splits, act_offload_free.py)
        return self._moe_partition_ok(pp, vpp)

    def layouts(self, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
        """The named uneven layouts searched for (pp, vpp) besides the space's own partitions
        (`spec.splits.named_layouts`, `chunk_layers` order; the remainder also on the latest
        chunks where the first stage then holds less than the dense prefix, DeepSeek-V3's
        published layout among them): only with `named_splits`, legal for the model
        (`split_violations`; a dense prefix may spread over the first stages), and not
        already a partition of the free family (every stage's chunks equal, so a multiple of
        vpp layers), which would list the same plan twice."""
        return tuple(f.fixed["chunk_layers"] for f in self.split_families(pp, vpp)
                     if f is not self)

    def _named(self, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
        """`layouts`, computed."""
        if not self.named_splits or pp == 1:
            return ()
        L = self.num_layers
        free = self.free_ok(pp, vpp)
        out, k, first = [], dense_prefix(self), set(named_layouts(L, pp, vpp))
        for cl in named_layouts(L, pp, vpp, latest=k > 0):
            stages = [cl[j::pp] for j in range(pp)]
            if (free and all(len(set(c)) == 1 for c in stages) and sum(stages[0]) >= k) or (
                    cl not in first and sum(stages[0]) >= k):
                continue  # a split of the free family (equal chunks, the prefix whole on
                # stage 0); the latest-remainder layouts: where they spill the prefix only
            if min(map(sum, stages)) < act_offload.act_layers(self):
                continue  # a stage of < k offloaded layers (act_offload.py); a dense prefix
                # longer than the first stage spreads over the next (cpsat_prefix.py)
            if split_violations(L, Plan(pp=pp, vpp=vpp, chunk_layers=cl)):
                continue
            out.append(cl)
        return tuple(out)

    def split_families(self, pp: int, vpp: int) -> tuple[SearchSpace, ...]:
        """The partition families of (pp, vpp), each a space the per-key model, the bounds and
        the enumerator handle as they are: the space itself when its own partitions place the
        layers (`free_ok`), then one space per named layout (`layouts`), that layout pinned as
        `chunk_layers`. A key's best plan is the best over its families."""
        # built once per space: a cache in the instance's dict, not a field (a copy made by
        # `with_` starts without it; the space's fields stay its description)
        cache: dict[tuple[int, int], tuple[SearchSpace, ...]] = self.__dict__.setdefault(
            "_split_families", {})
        if (pp, vpp) not in cache:
            out: list[SearchSpace] = [self] if self.free_ok(pp, vpp) else []
            for cl in self._named(pp, vpp):
                out.append(self.with_(fixed={**dict(self.fixed), "chunk_layers": cl},
                                      partition="free", named_splits=False))
            cache[pp, vpp] = tuple(out)
        return cache[pp, vpp]

    def placeable(self, pp: int, vpp: int) -> bool:
        """Some partition family places the layers on (pp, vpp)."""
        return bool(self.split_families(pp, vpp))

    def ep_ok(self, tp: int, cp: int, dp: int, ep: int) -> bool:
        """Expert parallelism fits the stage's ranks: ep | dp*cp by default (etp = tp), else
        etp*ep | tp*cp*dp (Megatron's expert grid, spec/plan.py) and etp | the expert FFN;
        with several expert-TP sizes searched, under one of them; with hybrid sharding the
        expert-DP group also divides by dp_replicate (MoE models)."""
        if self.multi:
            return any(v.ep_ok(tp, cp, dp, ep) for v in self.base_variants())
        moe = self.job.model.moe
        r = self.dp_replicate if moe is not None else 1
        if self.etp is None:
            return (dp * cp) % (ep * r) == 0
        ffn_ok = moe is None or moe.expert_ffn_hidden_size % self.etp == 0
        return ffn_ok and (tp * cp * dp) % (self.etp * ep * r) == 0

    def sp_ok(self, tp: int, sp: int) -> bool:
        """sp = 1 needs tp > 1; a folded layout (etp != tp) with tp > 1 needs sp = 1."""
        if sp:
            return tp > 1
        if self.multi:
            return any(v.sp_ok(tp, sp) for v in self.base_variants())
        return self.etp is None or tp == 1 or tp == self.etp

    def _moe_partition_ok(self, pp: int, vpp: int) -> bool:
        """Free partitions: the stage holding the dense prefix (`prefix_min_units`) can."""
        if self.partition == "uniform":
            return True
        if self.fixed_stage_layers(pp, vpp) is not None:
            return True  # any pinned split: the prefix spread as the cost model lays it out
        units = self.num_layers // self.layer_step(vpp)
        return units - prefix_min_units(self, vpp) + 1 + int(
            self.first_stage_min_units(vpp) == 0 and pp > 1) >= pp

    def layer_step(self, vpp: int) -> int:
        """Granularity of a stage's layer count in a free partition (multiples of vpp)."""
        return vpp

    def first_stage_min_units(self, vpp: int) -> int:
        """Least layer units (of `layer_step`) on the first stage: `prefix_min_units`; 0 for
        a V's rank 0 that may hold none (search/empty_rank.py)."""
        return 0 if empty_first(self) else prefix_min_units(self, vpp)

    # ------------------------------------------------------------------ counting
    # (search/space_count.py: the size of the space, counted without listing it)
    def num_partitions(self, pp: int, vpp: int) -> int:
        """Layer partitions over `pp` stages (`space_count.num_partitions`)."""
        return space_count.num_partitions(self, pp, vpp)

    def num_placements(self, tp: int, cp: int, dp: int, pp: int) -> int:
        """Orders of node groups over the stages (`space_count.num_placements`)."""
        return space_count.num_placements(self, tp, cp, dp, pp)

    def mode_choices(self, mode: RecomputeMode, pp: int, vpp: int) -> int:
        """Distinct recompute_layers settings of one mode per partition."""
        return space_count.mode_choices(self, mode, pp, vpp)

    def recompute_choices(self, pp: int, vpp: int) -> int:
        """Distinct (mode, recompute_layers) settings per partition, summed over the modes."""
        return sum(self.mode_choices(mode, pp, vpp) for mode in self.recompute)

    def size(self) -> int:
        """Number of complete plans in the space (counted, not listed, once per space; with a
        restriction, the keys it refuses are left out: `space_count.count`)."""
        memo: dict[str, int] = self.__dict__.setdefault("_size", {})
        if "n" not in memo:
            parts = self.schedule_variants()
            memo["n"] = (space_count.count(self) if len(parts) == 1
                         else sum(v.size() for v in parts))
        return memo["n"]

    def num_degree_combinations(self) -> int:
        """Legal (tp, pp, cp, dp, ep, vpp, mbs) combinations."""
        return sum(1 for _ in self.degrees())

    def describe(self) -> dict[str, list[Any]]:
        """Every axis searched with the values covered (`space_proof.describe`)."""
        return space_proof.describe(self)
