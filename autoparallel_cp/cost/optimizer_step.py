"""The optimizer step's time per locally updated parameter (HBM-bound Adam)."""

from __future__ import annotations

from autoparallel_cp.cost.common import _is_pytorch, node
from autoparallel_cp.cost.constants import (
    ADAM_BYTES_PER_PARAM,
    ADAM_FOREACH_BYTES_PER_PARAM,
    GRAD_CLIP_BYTES_PER_PARAM,
)
from autoparallel_cp.cost.efficiency import FUSED_ADAMW_HBM_FRACTION, hbm_time, hbm_time_at
from autoparallel_cp.spec import Job


def optimizer_factor(job: Job, g: int) -> float:
    """Seconds per locally updated parameter of one fused Adam step (HBM-bound)."""
    gpu = node(job, g).gpu
    recipe = job.recipe
    if recipe.optimizer_kernel == "foreach":
        # + the bf16 working copy (r4 w2) when the optimizer updates an fp32 master
        per = ADAM_FOREACH_BYTES_PER_PARAM + (6.0 if recipe.master_weight_bytes > 0 else 0.0)
    else:
        per = ADAM_BYTES_PER_PARAM - (2.0 if recipe.master_weight_bytes == 0 else 0.0)
    if recipe.grad_clip:
        per += GRAD_CLIP_BYTES_PER_PARAM
    if recipe.optimizer_kernel == "fused" and _is_pytorch(recipe):
        # torch's fused AdamW at its measured rate (efficiency.FUSED_ADAMW_HBM_FRACTION); the
        # clipping passes are foreach kernels at the streaming rate
        adam = per - (GRAD_CLIP_BYTES_PER_PARAM if recipe.grad_clip else 0.0)
        return float(hbm_time_at(gpu, adam, FUSED_ADAMW_HBM_FRACTION)
                     + hbm_time(gpu, per - adam))
    return float(hbm_time(gpu, per))
