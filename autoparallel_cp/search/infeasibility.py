"""Why no plan fits: the smallest memory any plan reaches vs the capacity, and what would help."""

from __future__ import annotations

from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import GIB, Job
from autoparallel_cp.spec.plan import Plan


def explain(job: Job, space: SearchSpace) -> str:
    """A user-actionable explanation (uniform partitions, the most memory-saving settings)."""
    from autoparallel_cp.cost.memory import stage_memory

    if space.num_degree_combinations() == 0:
        return (f"no legal combination of tp/pp/cp/dp/ep/mbs for {job.num_gpus} GPUs, "
                f"global batch {job.global_batch} and seq {job.seq_len} in this space "
                "(check --fix pins and divisibility: heads % tp, GPUs % (tp*pp*cp), "
                "batch % (dp*mbs))")
    best: tuple[float, Plan, object] | None = None
    L = job.model.num_layers
    for d in space.degrees():
        if L % d.pp:
            continue
        for zero in (max(space.zero),):
            mode = "full" if "full" in space.recompute else space.recompute[-1]
            sp = 1 if d.tp > 1 and 1 in space.sp else 0
            if not space.sp_ok(d.tp, sp):
                continue
            p = Plan(dp=d.dp, tp=d.tp, pp=d.pp, vpp=d.vpp, cp=d.cp, ep=d.ep,
                     sp=sp, zero=zero, mbs=d.mbs,
                     num_microbatches=d.num_microbatches, recompute=mode, etp=space.etp)
            stages = stage_memory(job, p)
            worst = max(stages, key=lambda s: s.required_bytes / s.capacity_bytes)
            ratio = worst.required_bytes / worst.capacity_bytes
            if best is None or ratio < best[0]:
                best = (ratio, p, worst)
    if best is None:
        return "no plan with a uniform layer partition exists in this space"
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
