"""Job spec: what is to be trained, where (a model, the GPUs used, a recipe, sequence, batch)."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from .base import Strict
from .calibration import Calibration
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
    #: applied calibration (spec/calibration.py; the cluster above is already scaled by it)
    calibration: Calibration | None = None
    #: fraction of each GPU's memory kept free (--mem-headroom): a capacity reduction
    mem_headroom: float = Field(0.0, ge=0.0, lt=0.5)

    def calibrated(self, calibration: Calibration | None = None,
                   mem_headroom: float | None = None) -> Job:
        """This job with `calibration` applied (its cluster scaled) and/or a memory headroom."""
        upd: dict[str, object] = {}
        if calibration is not None:
            if self.calibration is not None:
                raise ValueError("the job already carries a calibration")
            upd["calibration"] = calibration
            upd["cluster"] = calibration.scale_cluster(self.cluster)
        if mem_headroom is not None:
            if not 0.0 <= mem_headroom < 0.5:
                raise ValueError(f"mem_headroom must be in [0, 0.5), got {mem_headroom}")
            upd["mem_headroom"] = float(mem_headroom)
        return self.model_copy(update=upd) if upd else self

    @property
    def num_gpus(self) -> int:
        return self.cluster.num_gpus

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch
