"""The capability table's row and verdict types (spec/frameworks.py holds the rows).

A `Rule` names the plan field it restricts (or the job's: JOB_FIELDS), the rule, the framework
source that enforces it, and `broken(job, plan)`: the closest-plan changes when the plan breaks
it. A `Refusal` is one broken row, with its one-line message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

# refusals no plan can fix (sliding_window_left: a model field)
JOB_FIELDS = ("model", "recipe", "seq_len", "sliding_window_left")


@dataclass(frozen=True)
class Refusal:
    """A plan field the framework cannot run as planned, and the closest plan it can."""

    framework: str
    field: str
    reason: str
    source: str
    closest: dict[str, Any]

    def message(self, plan: Plan) -> str:
        fix = ",".join(f"{k}={v}" for k, v in self.closest.items())
        head = f"{self.framework} cannot run this plan: {self.field}: {self.reason} [{self.source}]"
        if self.field in JOB_FIELDS:  # not a plan field: the job itself must change
            how = {"recipe": "--recipe", "seq_len": "--seq-len"}.get(self.field)
            return head + (f"; it runs the job with {how} {self.closest[self.field]}" if how
                           else f"; it needs {self.closest.get(self.field, '')}")
        return (f"{head}; closest plan it runs: {fix} "
                f"(evaluate it with --plan, or solve with --fix {fix})")


@dataclass(frozen=True)
class Rule:
    """One row of the capability table."""

    framework: str
    field: str
    rule: str
    source: str
    broken: Callable[[Job, Plan], dict[str, Any] | None]  # closest-plan changes, or None
    #: the exact formats the row applies to (None: every format of `framework`'s family)
    formats: tuple[str, ...] | None = None
    #: what the row reads: "key" (the search key's axes: tp, pp, cp, dp, ep, vpp, sp, zero,
    #: mbs, micro-batches, recompute mode; the space's etp), "split" (the layer split or the
    #: recompute count, which the search space expresses itself: framework_space.py) or "job"
    scope: str = "key"
    #: the axis values the row allows whatever the other axes, for the job (the search
    #: narrows those domains up front; every value left out is one `broken` refuses)
    domain: Callable[[Job], dict[str, tuple[Any, ...]]] | None = None
