"""When a pipelined stage reduces its sharded gradients: PyTorch's pipelining defers FSDP's
reduce-scatter to the step's last backward (recipe behaviour `pp_defers_reduce`).

torch v2.13.0 torch/distributed/pipelining/stage.py:843-848 (`backward_maybe_with_nosync`) runs
every micro-batch's backward of an FSDP2 stage with `set_requires_gradient_sync(False)` and
`set_reshard_after_backward(False)`; `perform_reduce_grad` (stage.py:1164-1195, the schedules'
REDUCE_GRAD action after all backwards: schedules.py:960, 1177, 2605-2607) reduces once. Read by
cost/sync.py (time) and cost/model_state.py (whole gradients until the step).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.common import ArrayLike, _f
from autoparallel_cp.spec import Job, TrainingRecipe


def deferred_by_pp(recipe: TrainingRecipe, pp: ArrayLike) -> npt.NDArray[np.bool_]:
    """True where `recipe`'s pipelining defers the reduction and the plan has pp > 1."""
    return np.asarray(np.logical_and(recipe.behaviour.pp_defers_reduce, _f(pp) > 1.5))


def pp_deferred(job: Job, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike) -> npt.NDArray[np.bool_]:
    """`deferred_by_pp` with pp = N / (tp·cp·dp) (spec/plan.py: dp·tp·pp·cp = N), so the
    search's tables, which hold no pp axis, read the same rule from their (tp, cp, dp) axes."""
    pp = float(job.num_gpus) / (_f(tp) * _f(cp) * _f(dp))
    return deferred_by_pp(job.recipe, pp)
