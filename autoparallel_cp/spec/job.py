"""Job spec: what is to be trained, where (a model, the GPUs used, a recipe, sequence, batch)."""

from __future__ import annotations

from pydantic import PositiveInt

from .base import Strict
from .cluster import ClusterSpec
from .model import ModelSpec
from .recipe import RECIPES, TrainingRecipe


class Job(Strict):
    """One planning problem: a model, the GPUs used, a recipe, sequence length and global batch."""

    model: ModelSpec
    cluster: ClusterSpec  # already cut to the GPUs used (see ClusterSpec.take_gpus)
    recipe: TrainingRecipe = RECIPES["megatron-bf16"]
    seq_len: PositiveInt = 4096
    global_batch: PositiveInt = 512  # sequences per optimizer step

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
