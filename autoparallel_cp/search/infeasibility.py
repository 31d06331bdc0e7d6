"""Why no plan fits: the rule or pin that empties the space (`empty_space`), else the smallest
memory any plan reaches vs the capacity, and what would help."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from autoparallel_cp.errors import UserError
from autoparallel_cp.search.schedule_axis import plan_schedule
from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import GIB, Job
from autoparallel_cp.spec.plan import Plan


def explain(job: Job, space: SearchSpace) -> str:
    """A user-actionable explanation (uniform partitions, the most memory-saving settings)."""
    from autoparallel_cp.cost.memory import stage_memory

    if space.num_degree_combinations() == 0:
        return empty_space(job, space)
    best: tuple[float, Plan, object] | None = None
    L = job.model.num_layers
    for d in space.degrees():
        split = None
        if L % d.pp:
            split = _even_free_split(space, d.pp, d.vpp)
            if split is None:
                continue
        for zero in (max(space.zero),):
            mode = "full" if "full" in space.recompute else space.recompute[-1]
            sp = 1 if d.tp > 1 and 1 in space.sp else 0
            if not space.sp_ok(d.tp, sp):
                continue
            p = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep,
                     sp=sp, zero=zero, mbs=d.mbs,
                     num_microbatches=d.num_microbatches, recompute=mode, etp=space.etp,
                     schedule=plan_schedule(space.schedule),
                     dp_replicate=space.dp_replicate,
                     stage_layers=split)
            stages = stage_memory(job, p)
            worst = max(stages, key=lambda s: s.required_bytes / s.capacity_bytes)
            ratio = worst.required_bytes / worst.capacity_bytes
            if best is None or ratio < best[0]:
                best = (ratio, p, worst)
    if best is None:
        return "no plan with an even layer partition exists in this space"
    ratio, p, w = best
    if ratio <= 1.0:
        need_fit = w.required_bytes / GIB  # type: ignore[attr-defined]
        cap_fit = w.capacity_bytes / GIB  # type: ignore[attr-defined]
        # memory is not what rules every plan out (a uniform split fits): say what does
        pins = ",".join(f"{k}={':'.join(map(str, v)) if isinstance(v, tuple) else v}"
                        for k, v in space.fixed.items())
        why = (f"the pins --fix {pins} leave no plan that fits" if pins else
               "no layer partition / placement of the legal degrees fits")
        return (f"no plan fits, although memory is not the limit: {p.short()} with a uniform "
                f"layer split needs {need_fit:.1f} of {cap_fit:.1f} GiB; {why}. Relax or drop "
                "the pins, or "
                "check them with `ap-solve evaluate --plan`")
    terms = {"parameters": w.params_bytes, "gradients": w.grads_bytes,  # type: ignore[attr-defined]
             "optimizer states": w.optimizer_bytes,  # type: ignore[attr-defined]
             "activations": w.activations_bytes,  # type: ignore[attr-defined]
             "other buffers": w.other_bytes}  # type: ignore[attr-defined]
    dom = max(terms, key=lambda k: terms[k])
    need = w.required_bytes / GIB  # type: ignore[attr-defined]
    cap = w.capacity_bytes / GIB  # type: ignore[attr-defined]
    hints = []
    if dom in ("parameters", "gradients", "optimizer states"):
        hints.append(f"more GPUs (about {ratio:.1f}x) or more tp/pp to shard the model states")
    else:
        hints.append("a shorter sequence, more cp/tp, or full recompute")
    if "full" not in space.recompute:
        hints.append("allow recompute=full")
    return (f"no plan fits: the smallest memory any plan reaches is {need:.1f} GiB on a "
            f"{cap:.1f} GiB GPU ({p.short()}); the largest term is {dom} "
            f"({terms[dom] / GIB:.1f} GiB). Would fit with: " + "; ".join(hints))


def _even_free_split(space: SearchSpace, pp: int, vpp: int) -> tuple[int, ...] | None:
    """The most even split of a free partition (per-stage multiples of vpp, the extra units on
    the last stages, which keep the fewest micro-batches in flight); None outside one."""
    L = space.num_layers
    if space.partition != "free" or space.fixed_split or L % vpp:
        return None
    units = L // vpp
    base, extra = divmod(units, pp)
    if base == 0:
        return None
    return tuple(vpp * (base + (1 if j >= pp - extra else 0)) for j in range(pp))


def _broken(space: SearchSpace, tp: int, cp: int, pp: int) -> Iterator[str]:
    """For one (tp, cp, pp) of the space's domains, the first rule each of its (ep, mbs, vpp)
    combinations breaks (search/space.py `degrees`, in its order), as a sentence naming the
    numbers; nothing for a combination that passes."""
    job, n = space.job, space.job.num_gpus
    if n % (tp * cp * pp):
        yield f"tp*cp*pp = {tp}*{cp}*{pp} does not divide the {n} GPUs"
        return
    dp = n // (tp * cp * pp)
    if "dp" in space.fixed and space.fixed["dp"] != dp:
        yield f"dp = GPUs/(tp*cp*pp) = {dp}, not the pinned dp={space.fixed['dp']}"
        return
    if dp % space.dp_replicate:
        yield (f"dp = GPUs/(tp*cp*pp) = {dp} does not split into dp_replicate="
               f"{space.dp_replicate} replicas of a shard group")
        return
    if space.heterogeneous and space.stage_group_counts(tp, cp, dp) is None:
        yield (f"a stage's dp*tp*cp = {dp * tp * cp} GPUs do not fill the node groups "
               "exactly")
        return
    for ep in space.ep:
        if not space.ep_ok(tp, cp, dp, ep):
            if len(space.etp_axis) > 1:
                sizes = ", ".join("tp" if e is None else str(e) for e in space.etp_axis)
                yield (f"ep={ep} fits no searched expert grid: ep | dp*cp = {dp * cp} with "
                       f"etp = tp, nor etp*ep | tp*cp*dp = {tp * cp * dp} for etp in {{{sizes}}}")
            elif space.etp is None:
                yield (f"ep={ep} does not divide dp*cp = {dp * cp} (the experts are carved "
                       "out of dp*cp; folding them over the tensor-parallel ranks, --fix "
                       f"etp=1, needs etp*ep | tp*cp*dp = {tp * cp * dp})")
            else:
                yield (f"etp*ep = {space.etp}*{ep} does not divide tp*cp*dp = {tp * cp * dp}")
            continue
        for mbs in space.mbs:
            if job.global_batch % (dp * mbs):
                yield (f"the global batch {job.global_batch} does not split into dp*mbs = "
                       f"{dp}*{mbs} sequences per micro-batch step")
                continue
            nmb = job.global_batch // (dp * mbs)
            if space.fixed.get("num_microbatches", nmb) != nmb:
                yield (f"num_microbatches = batch/(dp*mbs) = {nmb}, not the pinned "
                       f"{space.fixed['num_microbatches']}")
                continue
            for vpp in space.vpp:
                if vpp > 1 and (pp == 1 or nmb < pp):
                    yield (f"vpp={vpp} (interleaving) needs pp > 1 and num_microbatches "
                           f">= pp (pp={pp}, {nmb} micro-batches)")
                elif not space.placeable(pp, vpp):
                    yield _layout_rule(space, pp, vpp)


def _layout_rule(space: SearchSpace, pp: int, vpp: int) -> str:
    """Why no searched layer split places the model on (pp, vpp)."""
    L = space.num_layers
    if space.fixed_split:  # (a dense prefix longer than its first stage is searched)
        return f"the pinned layer split does not fit pp={pp}, vpp={vpp}"
    if space.partition == "uniform" and L % (pp * vpp):
        return (f"the {L} layers do not divide by pp*vpp = {pp}*{vpp} (this space searches "
                "uniform splits only)")
    if space.partition == "free" and (pp * vpp > L or L % vpp):
        named = " nor by a named uneven layout" if space.named_splits else ""
        return (f"the {L} layers split neither into multiples of vpp={vpp} with at least vpp "
                f"per stage over pp={pp}{named} (pin a layout with --fix chunk_layers)")
    return f"the first stage cannot hold the dense prefix layers with pp={pp}, vpp={vpp}"


def empty_space(job: Job, space: SearchSpace) -> str:
    """Which rule empties the space, and which pin: every (tp, cp, pp, ep, mbs, vpp)
    combination of the space's domains is checked against the rules of `SearchSpace.degrees`
    (the most frequent broken rules are named with their numbers), and every `--fix` pin is
    dropped in turn to say which pins leave plans when dropped."""
    rules: Counter[str] = Counter()
    n = job.num_gpus
    for tp in space.tp:
        for cp in space.cp:
            if n % (tp * cp):  # one sentence for every pp
                rules[f"tp*cp = {tp}*{cp} = {tp * cp} does not divide the {n} GPUs"] += \
                    len(space.pp)
                continue
            for pp in space.pp:
                rules.update(_broken(space, tp, cp, pp))
    pins = dict(space.fixed)
    freeing = []
    for k in pins:
        rest = {q: v for q, v in pins.items() if q != k}
        try:
            relaxed = SearchSpace.for_job(job, fix=rest, partition=space.partition,
                                          partial_recompute=space.partial_recompute)
        except UserError:
            continue
        if relaxed.num_degree_combinations() > 0:
            freeing.append(f"{k}={_pin_text(pins[k])}")
    head = (f"no plan of {job.num_gpus} GPUs, global batch {job.global_batch} and "
            f"{space.num_layers} layers passes the rules")
    if pins:
        head += " with --fix " + ",".join(f"{k}={_pin_text(v)}" for k, v in pins.items())
    if not rules:
        return head + " (check the pins against `ap-solve evaluate --plan`)"
    top = rules.most_common(3)
    why = "; ".join(r for r, _ in top)
    more = len(rules) - len(top)
    out = f"{head}: {why}" + (f" (and {more} other rule(s))" if more > 0 else "")
    if freeing:
        out += (". Dropping the pin " + " or ".join(freeing) + " leaves plans")
    elif pins:
        out += ". No single pin is to blame: relax several"
    return out


def _pin_text(v: object) -> str:
    return ":".join(map(str, v)) if isinstance(v, tuple | list) else str(v)
