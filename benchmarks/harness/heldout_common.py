"""Held-out rows, shared pieces: the row record, the CSV's data folder, the model-name
lookups of the per-source tables, the family of a row and the mbridge-cards settings cell."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from autoparallel_cp.cost.factors import CostOptions
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass
class HeldOutRow:
    """One held-out run as the cost model sees it (job is None when skipped)."""

    idx: int
    name: str
    source: str  # the source_id (one independent source)
    family: str
    job: Job | None
    plan: Plan | None
    options: CostOptions
    measured_tps: float | None
    measured_mem_gib: float | None
    assumed: list[str] = field(default_factory=list)
    skip: str = ""
    #: which tuned constants (tuned.TUNED) this row's prediction depends on
    knobs: tuple[str, ...] = ()


def _int(x: str) -> int | None:
    x = (x or "").strip()
    if not x:
        return None
    try:
        return int(float(x))
    except ValueError:
        return None


#: Settings of the mbridge-cards rows (Megatron-Bridge model verification cards): each row's
#: `extra_config` states, as `key=value` items separated by ';', what its card and the recipe
#: at the card's bridge commit set (the citations are in the row's `source` and `notes`):
#: `grads` (bf16: grad_reduce_in_fp32=False), `dispatcher` (alltoall, or flex after
#: apply_flex_dispatcher_backend), `ep_overlap` (overlap_moe_expert_parallel_comm), `tp_overlap`
#: (comm_overlap.tp_comm_overlap), `dp_overlap` (ddp.overlap_grad_reduce), `etp`
#: (expert_tensor_parallel_size), `recompute_modules` ('/'-joined), `cuda_graphs` (TE CUDA-graph
#: scopes, '/'-joined: behaviour `cuda_graph_scopes`); `routing` is recorded, not modelled.
#: The mbridge-offload-card rows (Megatron-Bridge's CPU-offloading skill card, heldout_offload)
#: state their recipe's settings the same way, plus their offload settings.
CARD_SOURCE = "mbridge-cards"
CARD_SETTING_SOURCES = (CARD_SOURCE, "mbridge-offload-card")


def _card_settings(r: dict[str, str]) -> dict[str, str]:
    """The `key=value` settings of an mbridge-cards or mbridge-offload-card row ({} for every
    other source)."""
    if r["source_id"] not in CARD_SETTING_SOURCES:
        return {}
    items = (part.partition("=") for part in r["extra_config"].split(";"))
    return {k.strip(): v.strip() for k, sep, v in items if sep}


def _model_name(r: dict[str, str]) -> str:
    """The row's model name as the lookup tables spell their prefixes."""
    return r["model"].lower().replace("_", " ")


T = TypeVar("T")


def _for_model(table: Mapping[str, T], r: dict[str, str]) -> T | None:
    """The entry of a model-prefix table that this row's model name starts with, or None."""
    return next((v for k, v in table.items() if _model_name(r).startswith(k)), None)


def _family(r: dict[str, str]) -> str | None:
    fw = r["framework"]
    if fw in ("nemo", "megatron"):
        return "megatron-core"
    if fw in ("pytorch-fsdp", "torchtitan", "megatron-deepspeed", "olmo-core",
              "automodel"):
        return fw
    if fw == "deepspeed" and "transformers" in r["framework_version"].lower():
        # Hugging Face transformers models under the DeepSpeed engine (FlagPerf's
        # *-deepspeed cases); DeepSpeed with Megatron layers is "megatron-deepspeed"
        return "deepspeed-hf"
    if fw == "other" and "maxtext" in r["model"].lower():
        return "maxtext"
    return None
