"""A training framework as a search space: the rows of `spec/frameworks.py` read as domains,
key rules and split rules, so the search proves its optimum over the plans the framework runs.

- `--recipe deepspeed`, `torchtitan-fsdp` and `pytorch-fsdp` name their framework
  (`RECIPE_FRAMEWORKS`: Megatron-DeepSpeed, which the deepspeed recipe costs; torchtitan 0.3.0;
  PyTorch FSDP1); `--emit X` names the framework the plans are launched on, whose rows
  then apply instead (its recipe row refuses a recipe it does not run).
- A row with a `domain` narrows axis domains up front (`SearchSpace.for_job`): DeepSpeed's
  vpp 1, cp 1, sp 0; torchtitan's zero 0/2/3; FSDP1's pure data parallelism.
- A row of scope "key" reads only the search key's axes (tp, pp, cp, dp, ep, vpp, sp, zero,
  mbs, micro-batches, recompute mode) and the space's etp: `key_refusals` is applied to every
  key the best-first loop (`search/solve.py`) lists and to every key's best plan in the
  enumerator (`search/enumerate.py`). A key's plans all break it or none does, so skipping a key
  keeps the proof exact over the framework's space (and CP-SAT equal to the enumerator).
- Rows of scope "split" are the space's own: torchtitan's FullAC has no per-stage count (no
  partial recompute); Megatron counts `--recompute-num-layers` per model chunk, so with
  interleaving the count is a multiple of vpp (`recompute_step`; free splits hold multiples of
  vpp, so their chunks are equal and that is the whole rule); a middle chunk without a layer
  (torchtitan) occurs only in a pinned split, which `split_refusals` checks.
- torchtitan 0.3.0 runs routed experts at etp 1 with ep > 1 (`etp_axis`): an MoE job's space
  is the folded one (as `--fix etp=1`); the other frameworks but Megatron search the default
  etp only, so every key row reads the one etp of the space.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import JOB_FIELDS, Refusal, Rule, job_refusal, rules_for
from autoparallel_cp.spec.plan import RECOMPUTE_MODES, Plan
from autoparallel_cp.spec.schedules import default_schedule

#: the recipes that name the framework they were costed for (spec/recipe.py sources)
RECIPE_FRAMEWORKS: dict[str, str] = {
    "deepspeed": "megatron-deepspeed",  # its source: Megatron-DeepSpeed's layers and engine
    "torchtitan-fsdp": "torchtitan",
    "pytorch-fsdp": "pytorch-fsdp",
}


def frameworks_of(job: Job, emit_fmt: str | None = None) -> tuple[str, ...]:
    """The framework whose rows a search of `job` obeys: `--emit`'s (the plans are launched
    there; its recipe row says whether the job's recipe is one it runs), else the recipe's."""
    if emit_fmt:
        return (emit_fmt,)
    name = RECIPE_FRAMEWORKS.get(job.recipe.name)
    return (name,) if name else ()


class KeyView(NamedTuple):
    """A search key's fields (those of `search.cpsat_master.Key`)."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    vpp: int
    sp: int
    zero: int
    mbs: int
    m: int
    mode: int


@dataclass(frozen=True, slots=True)
class KeyPlan:
    """The fields of a `Plan` that the key rows read, with its `expert_tp` and `folded`: a
    search key's plans seen by those rows (a pydantic Plan per key costs ~20x more;
    tests/search/test_framework_space.py checks every key row gives the same verdict)."""

    dp: int
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    sp: int
    zero: int
    mbs: int
    num_microbatches: int
    recompute: str
    etp: int | None
    recompute_layers: None = None
    schedule: None = None  # a pinned schedule is one per space, checked against the rows up
    optimizer_offload: float = 0.0  # the space's share (one value per variant space)
    activation_offload: int = 0  # not searched
    dp_replicate: int = 1  # the space's (one value per space, as a pinned etp)

    @property
    def pipeline_schedule(self) -> str:
        return default_schedule(self.vpp)  # Plan.pipeline_schedule without `schedule`

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp  # Plan.expert_tp

    @property
    def folded(self) -> bool:
        return self.expert_tp != self.tp  # Plan.folded


@dataclass(frozen=True)
class Restriction:
    """The plans frameworks `formats` run, for one job (see the module docstring)."""

    job: Job
    formats: tuple[str, ...]
    #: key-row verdicts by key (`key_rows`), not part of the restriction's identity
    _verdicts: dict[tuple[Any, ...], tuple[tuple[str, str], ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def of(cls, job: Job, emit_fmt: str | None = None) -> Restriction | None:
        """The restriction of `--emit`'s format, else of the job's recipe; None when neither
        names a framework."""
        fmts = frameworks_of(job, emit_fmt)
        return cls(job, fmts) if fmts else None

    def _rows(self) -> list[tuple[str, Rule]]:
        return [(f, r) for f in self.formats for r in rules_for(f)]

    @cached_property
    def _key_rows(self) -> list[tuple[str, Rule]]:
        """The rows that read the search key only (listed once: `key_rows` runs per key)."""
        return [(f, r) for f, r in self._rows() if r.scope == "key" and r.field not in JOB_FIELDS]

    def job_refusal(self) -> str | None:
        """Why one of the frameworks cannot train the job at all (no plan helps), or None."""
        for f in self.formats:
            if (why := job_refusal(self.job, f)) is not None:
                return why
        return None

    def domains(self) -> dict[str, tuple[tuple[Any, ...], Rule]]:
        """Axis -> (the values every row allows, the first row that narrows it)."""
        out: dict[str, tuple[tuple[Any, ...], Rule]] = {}
        for _, r in self._rows():
            if r.domain is None:
                continue
            for axis, allowed in r.domain(self.job).items():
                if axis in out:
                    prev, first = out[axis]
                    out[axis] = (tuple(v for v in prev if v in allowed), first)
                else:
                    out[axis] = (tuple(allowed), r)
        return out

    @property
    def partial_recompute(self) -> bool:
        """False when a framework recomputes every layer or none (torchtitan's FullAC)."""
        return not any(r.scope == "split" and r.field == "recompute_layers"
                       and r.framework.startswith("torchtitan") for _, r in self._rows())

    @property
    def replicates(self) -> bool:
        """Whether every framework runs hybrid sharding (no row of theirs reads
        `dp_replicate`: DeepSpeed's refuses it, spec/frameworks.py), so the search tries it."""
        return not any(r.field == "dp_replicate" for _, r in self._rows())

    def recompute_step(self, vpp: int) -> int:
        """Partial recompute counts are multiples of this (Megatron with interleaving)."""
        mg = any(f == "megatron" for f in self.formats)
        return vpp if mg and vpp > 1 else 1

    @property
    def etp_axis(self) -> tuple[int | None, ...] | None:
        """The one expert-TP size an MoE job runs at when a framework's rows read it:
        torchtitan 0.3.0 shards routed experts over ep at etp 1; torchtitan v0.2.2 (etp tp or
        1), DeepSpeed's AutoEP and Megatron-DeepSpeed (no expert TP of their own) and FSDP1
        are searched at the default (tp). None: every size the space searches (Megatron, whose
        rows do not read etp). One size, so a key's verdict holds for all its plans."""
        if self.job.model.moe is None or "megatron" in self.formats:
            return None
        return (1,) if "torchtitan" in self.formats else (None,)

    def narrow(self, domains: dict[str, tuple[Any, ...]], fixed: Any) -> dict[str, Any]:
        """The search-space fields this restriction changes: every axis domain less the values
        a row refuses whatever the other axes, `partial_recompute` and `etp`. A `--fix` pin
        (in `fixed`) outside a row's values is an InputError naming the row and its source."""
        out: dict[str, Any] = {}
        for axis, (allowed, row) in self.domains().items():
            dom = tuple(v for v in domains[axis] if v in allowed)
            if not dom and axis in fixed:
                raise InputError(f"--fix {axis}={fixed[axis]}: {self.describe()} cannot run "
                                 f"it: {row.rule} [{row.source}]", field=axis)
            out[axis] = dom
        if not self.partial_recompute:
            out["partial_recompute"] = False
        etps = self.etp_axis
        if etps is not None and "etp" not in fixed:
            out["etp"], out["etp_axis"] = etps[0], etps
            if etps[0] is not None:  # as `--fix etp=1` (SearchSpace.etp_legal reads the pin)
                out["fixed"] = {**dict(fixed), "etp": etps[0]}
        return out

    def key_rows(self, key: Any, etp: int | None, dp_replicate: int = 1,
                 optimizer_offload: float = 0.0) -> tuple[tuple[str, str], ...]:
        """(framework, field) of the key rows a search key breaks (`key`: tp, cp, pp, dp, ep,
        vpp, sp, zero, mbs, m, mode as `KeyView`; `etp`, `dp_replicate`, `optimizer_offload`:
        the space's). The rows read only those fields, so every plan of the key breaks the
        same rows."""
        k = (key.tp, key.pp, key.cp, key.dp, key.ep, key.vpp, key.sp, key.zero, key.mbs,
             key.m, key.mode, etp, dp_replicate, optimizer_offload)
        got = self._verdicts.get(k)
        if got is None:
            plan = KeyPlan(key.dp, key.tp, key.pp, key.vpp, key.cp, key.ep, key.sp, key.zero,
                           key.mbs, key.m, RECOMPUTE_MODES[key.mode], etp,
                           dp_replicate=dp_replicate, optimizer_offload=optimizer_offload)
            got = tuple((f.framework, f.field) for f in self.key_refusals(plan))  # type: ignore[arg-type]
            self._verdicts[k] = got
        return got

    def key_refusals(self, plan: Plan) -> list[Refusal]:
        """The key-scope rows `plan` breaks (its split and recompute count are not read)."""
        out = []
        for f, r in self._key_rows:
            closest = r.broken(self.job, plan)
            if closest is not None:
                out.append(Refusal(f, r.field, r.rule, r.source, closest))
        return out

    def split_refusals(self, plan: Plan) -> list[Refusal]:
        """The split-scope rows `plan` breaks (checked on a key's best plan when the split is
        pinned: free and uniform splits obey them by construction)."""
        out = []
        for f, r in self._rows():
            if r.scope == "split" and (closest := r.broken(self.job, plan)) is not None:
                out.append(Refusal(f, r.field, r.rule, r.source, closest))
        return out

    def describe(self) -> str:
        return " and ".join(self.formats)


def emptied_by(restriction: Restriction, refused: dict[tuple[str, str], int],
               runnable: int = 0) -> str:
    """The error when no plan the frameworks run fits: the rows that refused the layouts that
    may fit, most layouts first, each with its reason and source; `runnable` layouts the
    frameworks run were scored exactly and none fits in memory."""
    rows = {(f, r.field): r for f, r in restriction._rows()}
    parts = []
    for (f, name), n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0])):
        r = rows.get((f, name))
        why = f"{r.rule} [{r.source}]" if r is not None else ""
        parts.append(f"{f} {name} ({n} layout{'s' if n != 1 else ''}): {why}")
    fw = restriction.describe()
    head = (f"no plan that {fw} runs fits this job: " + (
        f"the {runnable} parallel layout{'s' if runnable != 1 else ''} it runs that may fit "
        "were scored and none fits in memory; the others break its rules: " if runnable else
        "every parallel layout that may fit breaks one of its rules: "))
    return head + "; ".join(parts)
