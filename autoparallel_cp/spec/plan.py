"""A parallel training plan and the rules that make it legal for a job.

Field names are the stable surface of INTERFACE.md: dp, tp, pp, vpp, cp, ep, sp, zero, mbs,
num_microbatches, recompute, recompute_layers, plus the optional layer partition
(`stage_layers`, or per model chunk `chunk_layers`), on heterogeneous clusters the node group
of each stage (`stage_groups`), the expert-tensor-parallel size `etp` of MoE parallel
folding, and the replicas `dp_replicate` of hybrid sharding (`spec/hybrid_sharding.py`).

Layer splits (defaults, model chunks, micro-batch groups): `spec/splits.py`.

MoE parallel folding (`etp`, the expert grid and its rules): `spec/folding.py`.

Pipeline schedule and host offload (`schedule`, `optimizer_offload`, `activation_offload`: their
names, text form and rules): `spec/schedules.py`.

Kept whole: the Plan model, its text form and its legality rules are one surface (INTERFACE.md's
plan fields), parsed and checked together; each new axis keeps its helpers in its own module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.base import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_NODE_GROUPS,
    Bounded,
)
from autoparallel_cp.spec.folding import folding_violations
from autoparallel_cp.spec.hybrid_sharding import replicate_violations
from autoparallel_cp.spec.plan_text import int_list, json_object, split_items
from autoparallel_cp.spec.schedules import (
    V_SHAPED,
    Schedule,
    axis_key,
    axis_text,
    axis_value,
    default_schedule,
    offload_violations,
    schedule_violations,
)
from autoparallel_cp.spec.splits import default_split, stage_chunks

_DEGREE = (1, MAX_GPUS, "a degree cannot exceed the largest cluster")
_BATCH = (1, MAX_GLOBAL_BATCH, "cannot exceed the largest global batch")
Degree = Annotated[int, Bounded(*_DEGREE)]
Batch = Annotated[int, Bounded(*_BATCH)]
Flag = Annotated[int, Bounded(0, 1, "0 or 1")]
ZeroStage = Annotated[int, Bounded(0, 3, "ZeRO stages are 0..3")]
LayerCount = Annotated[int, Bounded(0, MAX_LAYERS, "cannot exceed the deepest model")]
# >= 0 here; >= 1 but a V's empty rank 0 (`split_violations`, `empty_first_ok`)
StageLayers = Annotated[int, Bounded(0, MAX_LAYERS, "cannot exceed the deepest model")]
ChunkLayers = Annotated[int, Bounded(0, MAX_LAYERS, "cannot exceed the deepest model")]
GroupIndex = Annotated[int, Bounded(0, MAX_NODE_GROUPS - 1, "cannot exceed the node groups")]
Fraction = Annotated[float, Bounded(0.0, 1.0, "a fraction is at most 1", low_open=False)]

RecomputeMode = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[RecomputeMode, ...] = ("none", "selective", "full")


class Plan(BaseModel):
    """One point of the plan space. `num_microbatches` is per pipeline per step."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dp: Degree = 1
    tp: Degree = 1
    pp: Degree = 1
    vpp: Degree = 1  # model chunks per pipeline rank (interleaved 1F1B when > 1)
    cp: Degree = 1
    ep: Degree = 1
    sp: Flag = 0  # Megatron sequence parallelism (needs tp > 1 to matter)
    zero: ZeroStage = 0
    mbs: Batch = 1
    num_microbatches: Batch = 1
    recompute: RecomputeMode = "none"
    # Partial full recompute: layers per stage that checkpoint their input and recompute.
    # None means "all layers of the stage" when recompute == "full", and 0 otherwise.
    recompute_layers: LayerCount | None = None
    stage_layers: tuple[StageLayers, ...] | None = None  # per pipeline stage; None = default
    # per model chunk (pp*vpp entries, chunk v of stage j at v*pp + j); None: `stage_chunks`
    chunk_layers: tuple[ChunkLayers, ...] | None = None
    stage_groups: tuple[GroupIndex, ...] | None = None  # node group of each stage; None: in order
    # expert tensor parallelism (Megatron --expert-tensor-parallel-size); None: = tp (default)
    etp: Degree | None = None
    schedule: Schedule | None = None  # spec/schedules.py; None: default_schedule(vpp)
    optimizer_offload: Fraction = 0.0  # share of the optimizer states kept in host memory
    activation_offload: LayerCount = 0  # layers per stage whose activations go to the host
    dp_replicate: Degree = 1  # hybrid sharding: replicas of the dp*cp/dp_replicate shard group

    def __init__(self, **fields: Any) -> None:
        """Validate the fields; a bad one is a PlanError (a UserError) naming the field."""
        try:
            super().__init__(**fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            raise PlanError(f"plan field {loc!r}: {msg}") from None

    def key(self) -> tuple[Any, ...]:
        """A hashable identity used to de-duplicate and tie-break plans deterministically."""
        return (
            self.tp, self.pp, self.cp, self.dp, self.ep, self.vpp, self.sp, self.zero,
            self.mbs, RECOMPUTE_MODES.index(self.recompute), self.recompute_layers or 0,
            self.stage_layers or (), self.stage_groups or (),
        ) + ((self.chunk_layers,) if self.chunk_layers is not None else ()) + (
            ((self.etp,),) if self.etp is not None else ()) + axis_key(  # ints: comparable
            self.schedule, self.optimizer_offload, self.activation_offload) + (
            ((-2, self.dp_replicate),) if self.dp_replicate != 1 else ())  # no chunk is < 0

    def short(self) -> str:
        """Compact `key=value` text, accepted back by `parse_plan`."""
        parts = [
            f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"vpp={self.vpp}",
            f"cp={self.cp}", f"ep={self.ep}", f"sp={self.sp}", f"zero={self.zero}",
            f"mbs={self.mbs}", f"recompute={self.recompute}",
        ]
        if self.recompute_layers is not None:
            parts.append(f"recompute_layers={self.recompute_layers}")
        if self.stage_layers is not None:
            parts.append("stage_layers=" + ":".join(map(str, self.stage_layers)))
        if self.stage_groups is not None:
            parts.append("stage_groups=" + ":".join(map(str, self.stage_groups)))
        if self.chunk_layers is not None:
            parts.append("chunk_layers=" + ":".join(map(str, self.chunk_layers)))
        if self.etp is not None:
            parts.append(f"etp={self.etp}")
        parts += axis_text(self.schedule, self.optimizer_offload, self.activation_offload)
        if self.dp_replicate != 1:
            parts.append(f"dp_replicate={self.dp_replicate}")
        return ",".join(parts)

    @property
    def pipeline_schedule(self) -> Schedule:
        """The schedule the plan runs: `schedule`, else `default_schedule(vpp)`."""
        return self.schedule if self.schedule is not None else default_schedule(self.vpp)

    @property
    def expert_tp(self) -> int:
        """Tensor-parallel size of the routed experts: `etp`, Megatron's default tp when unset."""
        return self.tp if self.etp is None else self.etp

    @property
    def folded(self) -> bool:
        """True when the experts use a tensor-parallel size other than tp (parallel folding)."""
        return self.expert_tp != self.tp

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel size: tp*cp*dp / (etp*ep) ranks of a stage hold the same
        experts (Megatron parallel_state.py:880, world / (etp*ep*pp)); dp*cp/ep by default."""
        return max(self.tp * self.cp * self.dp // (self.expert_tp * self.ep), 1)

    @property
    def dp_shard(self) -> int:
        """Data-parallel ranks of one shard group (torchtitan's dp_shard): dp / dp_replicate."""
        return max(self.dp // self.dp_replicate, 1)

    @property
    def state_shard(self) -> int:
        """Ranks the dense states shard over under ZeRO: dp·cp/dp_replicate (hybrid_sharding)."""
        return max(self.dp * self.cp // self.dp_replicate, 1)

    @property
    def expert_state_shard(self) -> int:
        """Ranks the expert states shard over under ZeRO: `expert_dp` / dp_replicate."""
        return max(self.expert_dp // self.dp_replicate, 1)

    def layers_per_stage(self, num_layers: int) -> tuple[int, ...]:
        """Transformer layers held by each pipeline stage: the stage sums of `chunk_layers`,
        `stage_layers` (which must agree), else `default_split` (the even split when pp*vpp
        divides the layers)."""
        if self.chunk_layers is not None and len(self.chunk_layers) == self.pp * self.vpp:
            return tuple(sum(self.chunk_layers[v * self.pp + j] for v in range(self.vpp))
                         for j in range(self.pp))
        if self.stage_layers is not None:
            return self.stage_layers
        return default_split(num_layers, self.pp, self.vpp)

    def chunks_per_stage(self, num_layers: int) -> tuple[tuple[int, ...], ...]:
        """Layers of each stage's vpp model chunks (in chunk order): `chunk_layers`, else
        `stage_chunks` of every stage's count (module docstring)."""
        pp, vpp = self.pp, self.vpp
        if self.chunk_layers is not None and len(self.chunk_layers) == pp * vpp:
            return tuple(tuple(self.chunk_layers[v * pp + j] for v in range(vpp))
                         for j in range(pp))
        return tuple(stage_chunks(n, vpp, j == 0, j == pp - 1)
                     for j, n in enumerate(self.layers_per_stage(num_layers)))

    def layout(self, num_layers: int) -> tuple[int, ...]:
        """Layers of every model chunk in Megatron's layout order (chunk v of stage j at
        v*pp + j), the order of `chunk_layers` and `--pipeline-model-parallel-layout`."""
        per = self.chunks_per_stage(num_layers)
        return tuple(per[j][v] for v in range(self.vpp) for j in range(self.pp))

    def recomputed_layers(self, stage_layer_count: int) -> int:
        """Layers of a stage with `stage_layer_count` layers that use full recompute."""
        if self.recompute != "full":
            return 0
        if self.recompute_layers is None:
            return stage_layer_count
        return min(self.recompute_layers, stage_layer_count)


def uneven_chunks(plan: Plan, num_layers: int) -> bool:
    """Whether some stage's model chunks hold different layer counts (vpp > 1 only)."""
    return plan.vpp > 1 and any(len(set(c)) > 1 for c in plan.chunks_per_stage(num_layers))


class PlanError(UserError, ValueError):
    """A plan string or plan that cannot be used; the message names the field (a UserError:
    the CLI exits 2)."""


_INT_FIELDS = {"dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches",
               "recompute_layers", "etp", "activation_offload", "dp_replicate"}
_TUPLE_FIELDS = {"stage_layers", "stage_groups", "chunk_layers"}
_AXIS_FIELDS = {"schedule", "optimizer_offload"}  # spec/schedules.py `axis_value`
PLAN_FIELDS = tuple(sorted(_INT_FIELDS | _TUPLE_FIELDS | _AXIS_FIELDS | {"recompute"}))


def _range_error(k: str, exc: ValidationError) -> PlanError:
    err = exc.errors()[0]
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    msg = msg.removeprefix(f"plan field {k!r}: ")  # Plan.__init__ names the field already
    if err.get("type") != "value_error" and "input" in err:
        msg += f" (got {err['input']!r})"
    return PlanError(f"field {k!r}: {msg}")


def check_field(k: str, v: Any) -> Any:
    """The typed value of plan field `k`, or PlanError naming the field (bounds of `Plan`:
    degrees and mbs >= 1, sp 0..1, zero 0..3, stage_layers and chunk_layers >= 0 each (a
    stage without layers: `split_violations`); booleans refused)."""
    if k not in PLAN_FIELDS:
        raise PlanError(f"unknown plan field {k!r}; known: {', '.join(PLAN_FIELDS)}")
    if k == "recompute":
        if not isinstance(v, str) or v not in RECOMPUTE_MODES:
            raise PlanError(f"field 'recompute': expected one of {RECOMPUTE_MODES}, got {v!r}")
        return v
    if k in _AXIS_FIELDS:
        try:
            v = axis_value(k, v)
        except ValueError as exc:
            raise PlanError(f"field {k!r}: {exc}") from None
    elif k in _TUPLE_FIELDS:
        if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple)):
            raise PlanError(f"field {k!r}: expected a list of integers, got {v!r}")
        if not v:
            raise PlanError(f"field {k!r}: expected at least one entry")
    elif isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(f"field {k!r}: expected an integer, got {v!r}")
    try:
        return getattr(Plan.model_validate({k: v}), k)
    except ValidationError as exc:
        raise _range_error(k, exc) from None


def check_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`check_field` over a mapping of plan fields (None values are dropped)."""
    if not isinstance(fields, Mapping):
        raise PlanError(f"expected a mapping of plan fields, got {type(fields).__name__}")
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if not isinstance(k, str):
            raise PlanError(f"plan field names are strings, got {k!r}")
        if isinstance(v, str) and k not in ("recompute", "schedule"):  # text form: {"tp": "8"}
            if "," in v or "=" in v:
                raise PlanError(f"field {k!r}: expected one value, got {v!r}")
            out.update(parse_assignments(f"{k}={v}"))
        elif v is not None:
            out[k] = check_field(k, v)
    return out


def parse_assignments(text: str) -> dict[str, Any]:
    """Parse `key=value[,key=value...]` (as in `--plan` and `--fix`) into typed values.

    Lists and JSON as the outputs write a plan are read too (spec/plan_text.py). Every value is
    range-checked (`check_field`) and a key given twice is an error."""
    if not isinstance(text, str):
        raise PlanError(f"expected 'key=value,...' text, got {type(text).__name__}")
    if text.lstrip().startswith(("{", '"')):
        try:
            fields = json_object(text)
        except ValueError as exc:
            raise PlanError(f"expected 'key=value,...' or a JSON plan object: {exc}") from None
        return check_fields(fields)
    out: dict[str, Any] = {}
    for raw in split_items(text):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            raise PlanError(f"expected KEY=VALUE, got {item!r}")
        k, v = (s.strip() for s in item.split("=", 1))
        if k in out:
            raise PlanError(f"field {k!r} is given twice ({k}={out[k]!r} and {k}={v})")
        value: Any
        if k in _INT_FIELDS:
            try:
                value = int(v)
            except ValueError:
                raise PlanError(f"field {k!r}: expected an integer, got {v!r}") from None
        elif k in _TUPLE_FIELDS:
            try:
                value = int_list(v)
            except ValueError:
                raise PlanError(
                    f"field {k!r}: expected integers separated by ':' (or a [list]), got {v!r}"
                ) from None
        else:
            value = v
        out[k] = check_field(k, value)
    return out


def parse_plan(text: str, job: Job | None = None) -> Plan:
    """Build a Plan from `key=value` text; missing dp / num_microbatches are derived from `job`."""
    fields = parse_assignments(text)
    if job is not None:
        tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
        if "dp" not in fields and job.num_gpus % (tp * pp * cp) == 0:
            fields["dp"] = job.num_gpus // (tp * pp * cp)
        dp, mbs = fields.get("dp", 1), fields.get("mbs", 1)
        if "num_microbatches" not in fields and job.global_batch % (dp * mbs) == 0:
            fields["num_microbatches"] = job.global_batch // (dp * mbs)
    return Plan(**fields)


def plan_violations(job: Job, plan: Plan) -> list[str]:
    """Every rule the plan breaks for `job`, each message showing the factors involved.

    Rules follow Megatron-LM's argument checks (arguments.py, transformer_config.py) and its
    interleaved schedule (d98e8a64 schedules.py: m >= pp, with a micro-batch group size
    `microbatch_group` when pp does not divide m; Narayanan et al. §2.2 had pp | m).
    """
    m = job.model
    out: list[str] = []
    n = job.num_gpus
    if plan.dp * plan.tp * plan.pp * plan.cp != n:
        out.append(
            f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = "
            f"{plan.dp * plan.tp * plan.pp * plan.cp} != {n} GPUs"
        )
    if m.num_attention_heads % plan.tp:
        out.append(f"heads % tp: {m.num_attention_heads} % {plan.tp} != 0")
    kv = m.kv_heads if m.mla is None else m.num_attention_heads
    if kv % plan.tp and plan.tp % kv:
        out.append(f"KV heads vs tp: {kv} KV heads neither divisible by nor dividing tp={plan.tp}")
    if m.ffn_hidden_size % plan.tp:
        out.append(f"ffn_hidden % tp: {m.ffn_hidden_size} % {plan.tp} != 0")
    if plan.cp > 1 and job.seq_len % (2 * plan.cp):
        out.append(
            f"seq % (2*cp): {job.seq_len} % {2 * plan.cp} != 0 (load-balanced ring attention)"
        )
    if plan.ep > 1:
        if m.moe is None:
            out.append(f"ep={plan.ep} needs an MoE model")
        elif m.moe.num_experts % plan.ep:
            out.append(f"experts % ep: {m.moe.num_experts} % {plan.ep} != 0")
        if plan.etp is None and (plan.dp * plan.cp) % plan.ep:
            out.append(f"(dp*cp) % ep: {plan.dp * plan.cp} % {plan.ep} != 0 (with etp = tp, "
                       "Megatron's default; set etp to fold ep over tensor ranks)")
    if plan.etp is not None:
        out += folding_violations(m.moe, plan.tp, plan.cp, plan.dp, plan.ep, plan.expert_tp,
                                  plan.sp)
    if plan.sp and plan.tp == 1:
        out.append("sp=1 needs tp > 1")
    out += replicate_violations(plan.dp, plan.zero, plan.expert_dp, plan.dp_replicate,
                                m.moe is not None)
    out += split_violations(m.num_layers, plan)
    if plan.stage_groups is not None:
        if len(plan.stage_groups) != plan.pp:
            out.append(f"stage_groups has {len(plan.stage_groups)} entries for pp={plan.pp}")
        if any(g < 0 or g >= len(job.cluster.node_groups) for g in plan.stage_groups):
            out.append(
                f"stage_groups refers to a node group outside 0..{len(job.cluster.node_groups) - 1}"
            )
    if plan.vpp > 1 and plan.pp == 1:
        out.append("vpp > 1 needs pp > 1")
    if job.global_batch % (plan.dp * plan.mbs):
        out.append(
            f"global_batch % (dp*mbs): {job.global_batch} % ({plan.dp}*{plan.mbs}) != 0"
        )
    elif plan.num_microbatches != job.global_batch // (plan.dp * plan.mbs):
        out.append(
            f"num_microbatches = {plan.num_microbatches} but global_batch/(dp*mbs) = "
            f"{job.global_batch // (plan.dp * plan.mbs)}"
        )
    if plan.vpp > 1 and plan.num_microbatches < plan.pp:
        out.append(
            f"interleaving needs num_microbatches >= pp: {plan.num_microbatches} < {plan.pp} "
            "(Megatron's micro-batch groups hold pp to m micro-batches)"
        )
    if plan.recompute_layers is not None and plan.recompute != "full":
        out.append("recompute_layers is only meaningful with recompute=full")
    elif plan.recompute_layers is not None and not split_violations(m.num_layers, plan):
        most = max(plan.layers_per_stage(m.num_layers))
        if plan.recompute_layers > most:
            out.append(f"recompute_layers={plan.recompute_layers} exceeds the {most} layers "
                       "of the largest pipeline stage (layers per stage that recompute)")
    out += schedule_violations(plan.schedule, plan.pp, plan.vpp, plan.num_microbatches)
    if not split_violations(m.num_layers, plan):
        out += offload_violations(plan.activation_offload, plan.optimizer_offload,
                                  plan.layers_per_stage(m.num_layers),
                                  all(g.host is not None for g in job.cluster.node_groups))
    return out


def empty_first_ok(plan: Plan) -> bool:
    """Whether the plan's rank 0 may hold no transformer layer: under a V schedule (`zbv`,
    `dualpipev`) rank 0 holds model chunks 0 and 2·pp - 1, so the word embedding and the LM
    head (with the loss and any MTP), and may run those only, both its chunks empty (the Zero
    Bubble paper's ZB-V runs, arXiv 2401.10241 §6.1 Table 6: sail-sg/zero-bubble-pipeline-
    parallelism @6574e0ea pads 2·pp - 2 layers so that chunks 0 and 2pp-1 are empty). Every
    other rank, and every rank of any other schedule, holds >= 1 layer."""
    return plan.pp > 1 and plan.pipeline_schedule in V_SHAPED


#: The rule `split_violations` states when a stage is left without layers
EMPTY_RULE = ("every pipeline stage holds >= 1 layer, but under schedule=zbv / dualpipev "
              "rank 0 (the embedding and the head) may hold none")


def _empty_stages(per: tuple[int, ...], plan: Plan) -> list[int]:
    """Stages without layers that the rule (`empty_first_ok`) refuses."""
    lo = 1 if empty_first_ok(plan) else 0
    return [j for j in range(lo, len(per)) if per[j] < 1]


def split_violations(num_layers: int, plan: Plan) -> list[str]:
    """Rules of the layer split: sums, lengths, and layers enough for every model chunk (the
    first / last stage may give a whole chunk to the embedding / the loss; a V's rank 0, both
    edges, may give both its chunks: `empty_first_ok`)."""
    out: list[str] = []
    pp, vpp, L = plan.pp, plan.vpp, num_layers
    sl, cl = plan.stage_layers, plan.chunk_layers
    if sl is not None:
        if len(sl) != pp:
            out.append(f"stage_layers has {len(sl)} entries for pp={pp}")
        if sum(sl) != L:
            out.append(f"sum(stage_layers) = {sum(sl)} != {L} layers")
        elif len(sl) == pp and _empty_stages(sl, plan):
            out.append(f"stage_layers leaves pipeline stage "
                       f"{_empty_stages(sl, plan)[0]} without layers ({EMPTY_RULE})")
    if cl is not None:
        if len(cl) != pp * vpp:
            out.append(f"chunk_layers has {len(cl)} entries for pp*vpp = {pp}*{vpp}")
        if sum(cl) != L:
            out.append(f"sum(chunk_layers) = {sum(cl)} != {L} layers")
        if out:
            return out
        per = plan.layers_per_stage(L)
        if _empty_stages(per, plan):
            out.append(f"chunk_layers leaves a pipeline stage without layers (stage "
                       f"{_empty_stages(per, plan)[0]}; {EMPTY_RULE})")
        if sl is not None and tuple(sl) != per:
            out.append(f"stage_layers {':'.join(map(str, sl))} != the stage sums of "
                       f"chunk_layers {':'.join(map(str, per))}")
        return out
    if out:
        return out
    per = plan.layers_per_stage(L)
    how = "stage_layers" if sl is not None else f"the default split {':'.join(map(str, per))}"
    if sl is None and pp > L:
        return [f"layers < pp: {L} < {pp}"]
    if vpp > 1:
        lo_edge = vpp - 1
        lo_first = 0 if empty_first_ok(plan) and per[0] == 0 else lo_edge
        if any(n < vpp for n in per[1:-1]) or per[0] < lo_first or per[-1] < lo_edge:
            out.append(f"{how}: with vpp={vpp} every stage needs at least vpp layers, the first "
                       f"and last at least vpp-1 = {lo_edge}" + (
                           " (or a V's rank 0 none)" if empty_first_ok(plan) else ""))
    elif sl is None and min(per) < 1:
        out.append(f"{how} leaves a pipeline stage without layers")
    return out


def canonical(plan: Plan, num_layers: int) -> Plan:
    """Drop a `stage_layers` that equals the default uniform split."""
    if (plan.stage_layers is not None and num_layers % (plan.pp * plan.vpp) == 0
            and plan.stage_layers == plan.model_copy(
                update={"stage_layers": None}).layers_per_stage(num_layers)):
        return plan.model_copy(update={"stage_layers": None})
    return plan
