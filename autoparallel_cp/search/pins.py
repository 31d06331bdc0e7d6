"""`--fix` pins that no plan of the job can have, whatever the other fields (search/space.py
checks them before building the space)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan, split_violations


def check_structural_pins(job: Job, pins: Mapping[str, Any]) -> None:
    """Pins that no plan of the job can have, whatever the other fields: InputError (exit 2)
    saying why, as `evaluate` refuses them (`spec.plan.plan_violations`), instead of an empty
    space later reported as a memory problem."""
    L = job.model.num_layers
    groups = len(job.cluster.node_groups)
    pp = pins.get("pp")
    for name in ("tp", "pp", "cp", "ep", "vpp", "mbs", "dp", "num_microbatches", "etp"):
        if name in pins and pins[name] < 1:
            raise InputError(f"--fix {name}={pins[name]}: must be >= 1", field=name)
    if "etp" in pins and job.model.moe is None:
        raise InputError(f"--fix etp={pins['etp']}: expert tensor parallelism needs an MoE model",
                         field="etp")
    if "etp" in pins and job.model.moe is not None and \
            job.model.moe.expert_ffn_hidden_size % pins["etp"]:
        raise InputError(f"--fix etp={pins['etp']}: the expert FFN "
                         f"({job.model.moe.expert_ffn_hidden_size}) does not split over it",
                         field="etp")
    if "zero" in pins and pins["zero"] not in (0, 1, 2, 3):
        raise InputError(f"--fix zero={pins['zero']}: must be 0, 1, 2 or 3", field="zero")
    if "sp" in pins and pins["sp"] not in (0, 1):
        raise InputError(f"--fix sp={pins['sp']}: must be 0 or 1", field="sp")
    sl = pins.get("stage_layers")
    if sl is not None:
        text = ":".join(map(str, sl))
        if not sl or min(sl) < 1:
            raise InputError(f"--fix stage_layers={text}: every stage needs at least one layer",
                             field="stage_layers")
        if sum(sl) != L:
            raise InputError(f"--fix stage_layers={text}: the stages hold {sum(sl)} layers, "
                             f"the model has {L}", field="stage_layers")
        if pp is not None and len(sl) != pp:
            raise InputError(f"--fix stage_layers={text}: {len(sl)} stages for pp={pp}",
                             field="stage_layers")
    cl = pins.get("chunk_layers")
    if cl is not None:
        text = ":".join(map(str, cl))
        if sum(cl) != L:
            raise InputError(f"--fix chunk_layers={text}: the chunks hold {sum(cl)} layers, "
                             f"the model has {L}", field="chunk_layers")
        vpp = pins.get("vpp")
        if pp is not None and vpp is not None and len(cl) != pp * vpp:
            raise InputError(f"--fix chunk_layers={text}: {len(cl)} chunks for pp*vpp = "
                             f"{pp}*{vpp}", field="chunk_layers")
        if sl is not None and len(cl) % len(sl):
            raise InputError("--fix chunk_layers and stage_layers: the chunks do not split "
                             "over the stages", field="chunk_layers")
        _check_pinned_split(job, pins, cl, sl)
    sg = pins.get("stage_groups")
    if sg is not None:
        text = ":".join(map(str, sg))
        if not sg or min(sg) < 0 or max(sg) >= groups:
            raise InputError(f"--fix stage_groups={text}: the cluster has node groups "
                             f"0..{groups - 1}", field="stage_groups")
        if pp is not None and len(sg) != pp:
            raise InputError(f"--fix stage_groups={text}: {len(sg)} stages for pp={pp}",
                             field="stage_groups")
        if sl is not None and len(sl) != len(sg):
            raise InputError("--fix stage_groups and stage_layers: different numbers of stages",
                             field="stage_groups")
    rl = pins.get("recompute_layers")
    if rl is not None and not 0 <= rl <= L:
        raise InputError(f"--fix recompute_layers={rl}: must be in 0..{L}",
                         field="recompute_layers")


def replicate_zeros(pins: dict[str, Any], zeros: list[int]) -> list[int]:
    """The ZeRO domain under a pinned `dp_replicate` R: zero 0 leaves it when R > 1 (hybrid
    sharding replicates sharded states; spec/plan.py `replicate_violations`), and a pinned
    zero=0 with R > 1 is an InputError naming the field."""
    rep = int(pins.get("dp_replicate", 1))
    if rep == 1:
        return zeros
    if pins.get("zero") == 0:
        raise InputError(f"--fix dp_replicate={rep} needs zero >= 1: hybrid sharding shards "
                         "the states within the shard group, and zero=0 shards none",
                         field="dp_replicate")
    return [z for z in zeros if z >= 1]
def _check_pinned_split(job: Job, pins: Mapping[str, Any], cl: Any, sl: Any) -> None:
    """A pinned `chunk_layers` that no (pp, vpp) the pins allow can run (a stage without
    layers, or stage sums that contradict a pinned `stage_layers`): InputError naming the pin
    and `spec.plan.split_violations`' reason, not an empty space reported as infeasible."""
    n = len(cl)
    # interleaving (n / pp chunks per stage > 1) needs pp > 1 (SearchSpace.degrees)
    pps = [pins["pp"]] if "pp" in pins else [p for p in range(1, n + 1)
                                              if n % p == 0 and (p > 1 or n == 1)]
    if sl is not None:
        pps = [p for p in pps if p == len(sl)]
    if "vpp" in pins:
        pps = [p for p in pps if p * pins["vpp"] == n]
    why: list[str] = []
    for pp in pps:
        why = split_violations(job.model.num_layers, Plan.model_construct(
            pp=pp, vpp=n // pp, chunk_layers=tuple(cl),
            stage_layers=None if sl is None else tuple(sl)))
        if not why:
            return
    text = ":".join(map(str, cl))
    reason = why[0] if why else (f"{n} chunks for " + ", ".join(
        f"{k}={pins[k]}" for k in ("pp", "vpp") if k in pins))
    raise InputError(f"--fix chunk_layers={text}: {reason}", field="chunk_layers")


