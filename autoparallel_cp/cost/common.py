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
