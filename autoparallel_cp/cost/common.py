"""Shared helpers of the cost functions: array coercion, recompute-mode codes, framework tests."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from autoparallel_cp.cost.constants import MODE_CODES
from autoparallel_cp.spec import FrameworkBehaviour, Job, NodeGroup, TrainingRecipe

FloatArray = npt.NDArray[np.float64]
ArrayLike = npt.ArrayLike

#: Framework behaviours that are not plan axes; one per recipe (`TrainingRecipe.behaviour`),
#: overridable per call (`evaluate(job, plan, options)`). Field meanings: `FrameworkBehaviour`.
CostOptions = FrameworkBehaviour


def recipe_options(recipe: TrainingRecipe) -> CostOptions:
    """The cost options a recipe's `behaviour` describes."""
    return recipe.behaviour


def options_for(job: Job, options: CostOptions | None) -> CostOptions:
    """`options` when given (an explicit override), else the job's recipe behaviour."""
    return options if options is not None else recipe_options(job.recipe)


def _f(x: ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def _mode(mode: ArrayLike | str) -> FloatArray:
    if isinstance(mode, str):
        return np.asarray(float(MODE_CODES[mode]))
    m = np.asarray(mode)
    if m.dtype.kind in "US":
        return np.vectorize(lambda x: float(MODE_CODES[str(x)]))(m).astype(np.float64)
    return m.astype(np.float64)


def _is_pytorch(recipe: TrainingRecipe) -> bool:
    return recipe.framework == "pytorch"


def _fp8_lib(job_or_recipe: Job | TrainingRecipe) -> str:
    """The library of the recipe's fp8 linears (behaviour `fp8_linear`; None: TE for
    Megatron recipes, torchao float8 for PyTorch ones)."""
    recipe = job_or_recipe.recipe if isinstance(job_or_recipe, Job) else job_or_recipe
    lib = recipe.behaviour.fp8_linear
    if lib is None:
        lib = "torchao" if _is_pytorch(recipe) else "te"
    return lib


def _te_fp8(recipe: TrainingRecipe) -> bool:
    """The recipe computes in fp8 through Transformer Engine linears (`_fp8_lib`)."""
    return recipe.compute_dtype == "fp8" and _fp8_lib(recipe) == "te"


def _fp32_residual(recipe: TrainingRecipe) -> bool:
    """PyTorch autocast over fp32 weights: the fp32 embedding output keeps the residual stream
    (and every norm input) in fp32. FSDP mixed precision (bf16 params, no autocast copies) and
    Megatron keep it in the activation dtype."""
    return _is_pytorch(recipe) and recipe.transient_weight_copy_bytes > 0


def _fused(recipe: TrainingRecipe, options: CostOptions) -> bool:
    return (not _is_pytorch(recipe)) if options.fused is None else options.fused


def node(job: Job, g: int) -> NodeGroup:
    return job.cluster.node_groups[int(g)]


def routed_load(job: Job, ep: ArrayLike) -> FloatArray:
    """Routed work of the most-loaded EP rank over the balanced mean, per MoE layer and
    micro-batch: min(rho, ep), rho = `Job.moe_load_imbalance` (--moe-load-imbalance).

    Mechanism: Megatron-Core's dropless MoE (no `moe_expert_capacity_factor`) hands each EP
    rank's experts exactly the tokens routed to them: the dispatcher counts them per expert
    (`tokens_per_expert`, megatron/core/transformer/moe/token_dispatcher.py
    `MoEAlltoAllTokenDispatcher.preprocess` / `dispatch_postprocess`), the all-to-all splits
    follow those counts, and `TEGroupedMLP.forward(permuted_input, tokens_per_expert)` runs the
    grouped GEMM with one row block per local expert (experts.py). Every rank then waits in the
    combine all-to-all (and in the next layer's collectives) for the rank that received the most
    rows, so a layer's time on every rank is the most-loaded rank's. Its routed rows are
    rho x the balanced top_k·tokens·ep/E, and so are its permute / re-sort copies, the routed
    elementwise and activation traffic, the all-to-all bytes it receives (dispatch) and sends
    back (combine), and its routed activation memory (peak memory is that rank's). Router,
    attention, shared experts and dense layers see every token once and do not scale.

    rho is the user's statement from their own run (max over EP ranks / mean of each rank's
    summed `tokens_per_expert`, docs/user-guide.md), not a fitted number; the default 1 is
    balanced routing and leaves every cost unchanged. It is capped at ep: a rank holds at most
    all ep ranks' routed tokens (ep = 1: one rank holds every expert, nothing waits). A recipe
    that drops tokens at a capacity factor would cap it at min(rho, capacity); no recipe here
    drops (the spec has no capacity factor: every MoE is costed dropless).
    """
    ep_ = _f(ep)
    rho = float(job.moe_load_imbalance)
    if rho == 1.0:
        return np.ones_like(ep_)
    return np.minimum(rho, np.maximum(ep_, 1.0))
