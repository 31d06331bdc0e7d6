"""Held-out rows of the DeepSeek-V3 technical report (source `deepseek-v3-report`, arXiv
2412.19437): the conversion rule of its one run, trained on DeepSeek's in-house HAI-LLM.

HAI-LLM has no open recipe, but the report states the settings the cost model needs, and the
project's `deepseek-v3-fp8` recipe (autoparallel_cp/spec/recipe.py) is written from them:
- schedule DualPipe (§3.2.1), a plan field: `schedule=dualpipe`;
- 16-way pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no tensor
  parallelism (§3.2; the row's cells);
- recompute of every RMSNorm (their outputs not kept in any form, the linears' fp8 caches
  included) and MLA up-projection in the backward (§3.2.3) and the MoE SwiGLU output from
  its cached input (§3.3.3): `recompute=selective` with the recipe's modules;
- FP8 GEMMs, fp32 master weights and gradients, BF16 AdamW moments (§3.3), the MoE SwiGLU
  inputs cached in FP8 and one E5M6 copy of the attention output (§3.3.3): the recipe;
- DualPipe holds p - j micro-batches on stage j, p + 1 per rank (Table 2; deepseek-ai/DualPipe
  `DualPipe.step`), and its rank 0 shares the embedding with the MTP module (§3.2.3).
The micro-batch is not stated in the report: 1 (flagged, `assumed`); with 2048 GPUs and 15,360
sequences it gives 120 micro-batches per step, an even count DualPipe needs. DeepSeek's training
profile (deepseek-ai/profile-data train.json: one forward-backward chunk pair of DualPipe, 4 MoE
layers a chunk, "aligns with DeepSeek-V3 pretraining settings: EP64, TP1 with 4K sequence
length") agrees: its per-token fp8 casts run 4096 blocks, one a token, and its FlashAttention
forward a [32, 128, 1] grid (4096/128 query tiles x 128 heads x 1 sequence).
"""

from __future__ import annotations

from autoparallel_cp.spec import RECIPES, TrainingRecipe

SOURCE = "deepseek-v3-report"
FAMILY = "hai-llm"

#: Plan cells the report states that the CSV's columns do not hold (section cited).
STATED: dict[str, str] = {"schedule": "dualpipe", "recompute": "selective"}


def family(r: dict[str, str]) -> str | None:
    """"hai-llm" for the report's rows (framework "other", in-house), else None."""
    return FAMILY if r["source_id"] == SOURCE else None


def recipe(assumed: list[str]) -> tuple[TrainingRecipe, str, tuple[str, ...]]:
    """(recipe, sp rule, tuned knobs) of the report's run, as heldout_recipes._recipe."""
    assumed.append("deepseek-v3-fp8 recipe (2412.19437 §3.2.3, §3.3); schedule=dualpipe "
                   "(§3.2.1); selective recompute of RMSNorm / MLA up-proj / SwiGLU (§3.2.3); "
                   "FP8 MoE SwiGLU inputs, E5M6 attention output (§3.3.3)")
    return RECIPES["deepseek-v3-fp8"], "0", ()
