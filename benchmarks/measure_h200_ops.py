"""Mechanism microbenchmarks and held-out training steps on one GPU (session 15, H200): the
sections of `harness/h200_kit.py` (its docstring lists the rows), each stopping at its time
budget. Run: `python benchmarks/measure_h200_ops.py [--smoke] [--set 2]` (`--smoke`: tiny
sizes on the CPU; `--set 2`: GQA attention and the second set of training shapes).
"""
# ruff: noqa: E501

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import torch
from harness.h200_kit import (
    DEV,
    SMOKE,
    _probe,
    attn_section,
    emit,
    gemm_section,
    gqa_section,
    host_section,
    link_section,
    log,
    meta,
    ops_section,
    train_section,
)


def main() -> None:
    meta()
    if "--set" in sys.argv:  # the second set: GQA attention and more training shapes
        budgets: list[tuple[str, Callable[[float], None], int]] = [
            ("gqa", gqa_section, 30), ("train", train_section, 200)]
    else:
        budgets = ([("host", host_section, 25), ("ops", ops_section, 45), ("link", link_section, 70),
                ("attn", attn_section, 130), ("train", train_section, 330),
                ("gemm", gemm_section, 390)])
    for name, fn, end in budgets:
        try:
            fn(float(end) if not SMOKE else 1e9)
        except Exception as e:  # noqa: BLE001 - keep the other sections' measurements
            log(f"section {name} failed: {type(e).__name__}: {e}")
            emit({"kind": "error", "section": name, "error": f"{type(e).__name__}: {e}"[:500]})
        gc.collect()
        if DEV.type == "cuda":
            torch.cuda.empty_cache()
        log(f"section {name} ended")
    _probe.close()


if __name__ == "__main__":
    main()
