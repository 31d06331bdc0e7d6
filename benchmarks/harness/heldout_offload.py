"""Held-out rows with host offload (issue 31): the optimizer share kept on the host and the
activation-offloaded layers per stage that a row ran, as the plan's `optimizer_offload` and
`activation_offload` (cost/offload.py).

Source `mbridge-offload-card`: the measured results of Megatron-Bridge's CPU-offloading skill
card (NVIDIA-NeMo/Megatron-Bridge skills/perf-techniques/cpu-offloading/card.yaml @a59fb46ad,
PR #3062, 2026-04-16; unchanged at skills/nemo-mbridge-perf-cpu-offloading/card.yaml @067f987df):
Qwen3-30B-A3B pre-training, TP2 PP2 EP4 on two DGX-H100 nodes, at optimizer offload fractions
0 / 0.25 / 0.5 / 0.75 / 1.0 (`optimizer.optimizer_cpu_offload`, `optimizer_offload_fraction`:
Megatron-Core's HybridDeviceOptimizer) and 1.0 with `overlap_cpu_optimizer_d2h_h2d`.

The row's `extra_config` carries, besides the card settings of heldout_common `_card_settings`:
- `optimizer_offload=<fraction>`: the run's `optimizer_offload_fraction` (0 without offload);
- `offload_overlap=0|1`: whether the run set `overlap_cpu_optimizer_d2h_h2d` (Megatron-Core
  optimizer_config.py:356 default False): the recipe's behaviour `offload_copies_overlap`
  (cost/offload.py `overlaps_optimizer_copies`: serial D2H, CPU Adam and H2D without it);
- `precision_aware_optimizer=0|1`: the recipe's `use_precision_aware_optimizer`; without it
  the GPU keeps the offloaded parameters' fp32 main copy (behaviour `offload_gpu_master`,
  spec/recipe.py: the card's `mem_allocated_gb` falls by 2/3 of the optimizer bytes, not all);
- `activation_offload=<layers>`: `cpu_offloading_num_layers` (none of these rows sets it).
"""

from __future__ import annotations

from harness.heldout_common import _card_settings

SOURCE = "mbridge-offload-card"


def offload(r: dict[str, str]) -> tuple[float, int, dict[str, bool], list[str]]:
    """(optimizer_offload, activation_offload, recipe behaviours `offload_copies_overlap` and
    `offload_gpu_master`, `assumed` notes) of a row; (0.0, 0, {}, []) for a row of a source
    that states no offload."""
    s = _card_settings(r)
    if r["source_id"] != SOURCE:
        return 0.0, 0, {}, []
    try:
        share = float(s["optimizer_offload"])
        layers = int(s.get("activation_offload", "0"))
        overlap = s["offload_overlap"] == "1"
        gpu_master = s["precision_aware_optimizer"] == "0"
    except (KeyError, ValueError) as exc:
        raise ValueError(f"held-out row {r['model']}: offload settings {exc}") from exc
    if not 0.0 <= share <= 1.0 or layers < 0:
        raise ValueError(f"held-out row {r['model']}: offload {share}, layers {layers}")
    notes: list[str] = []
    if share > 0.0:
        notes.append(f"optimizer offload {share:g} (the card's optimizer_offload_fraction)")
        notes.append("D2H, CPU Adam and H2D " + (
            "pipelined (overlap_cpu_optimizer_d2h_h2d)" if overlap
            else "in turn (no overlap_cpu_optimizer_d2h_h2d)"))
        if gpu_master:
            notes.append("the GPU keeps the offloaded fp32 main params (no precision-aware "
                         "optimizer)")
    if layers:
        notes.append(f"{layers} activation-offloaded layers per stage")
    # the flags on every row of the source: one recipe per setting, whatever the share
    return share, layers, {"offload_copies_overlap": overlap,
                           "offload_gpu_master": gpu_master}, notes
