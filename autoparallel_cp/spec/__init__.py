"""Inputs: the model, cluster, recipe and job specifications, the plan, presets and loaders.

The bottom layer of the data flow (docs/design.md): nothing here imports the cost model, the
search or the user-facing modules.
"""

from __future__ import annotations

from .base import GIB
from .cluster import ClusterSpec, GPUSpec, HostSpec, LinkSpec, NodeGroup
from .job import Job
from .model import MLASpec, ModelSpec, MoESpec
from .recipe import RECIPES, FrameworkBehaviour, TrainingRecipe

__all__ = [
    "GIB", "ClusterSpec", "GPUSpec", "HostSpec", "LinkSpec", "NodeGroup", "Job", "MLASpec",
    "MoESpec", "ModelSpec", "RECIPES", "FrameworkBehaviour", "TrainingRecipe",
]
