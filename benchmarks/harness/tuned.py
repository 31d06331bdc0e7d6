"""Constants of the validation chosen while looking at end-to-end rows, not at microbenchmarks
of the hardware they describe. `validate.py --cv` re-fits each without the held-out source;
every row that uses one names it (`Row.knobs`) and flags its value in `assumed`."""

from __future__ import annotations

from collections.abc import Mapping

#: Megatron-Core r0.8 README runs use --tp-comm-overlap (userbuffers): TP all-gather /
#: reduce-scatter pipelined with the GEMM chunks; assumed 80% hidden (first/last chunk exposed).
MCORE_TP_OVERLAP = 0.8
#: Constants chosen while looking at end-to-end rows (not at microbenchmarks of the hardware
#: they describe): `--cv` re-fits them without the held-out source. name -> (value used here,
#: grid searched by the cross-validation, what it is).
TUNED: dict[str, tuple[float, tuple[float, ...], str]] = {
    "megatron_tp_overlap": (MCORE_TP_OVERLAP, tuple(i / 10 for i in range(11)),
                            "share of TP collectives hidden by Megatron --tp-comm-overlap"),
    "h100_96_peak": (835.0, tuple(660.0 + 32.9 * i for i in range(11)),
                     "bf16 TFLOP/s of the 500 W H100 96 GB (between the NVL and SXM parts)"),
}


def knob(knobs: Mapping[str, float] | None, name: str) -> float:
    """The value of tuned constant `name` (the override in `knobs`, else TUNED's)."""
    return float(knobs[name]) if knobs and name in knobs else TUNED[name][0]




def flag(name: str, knobs: Mapping[str, float] | None = None) -> str:
    """The `assumed` note of a row that uses tuned constant `name`."""
    return f"{name}={knob(knobs, name):g} (tuned, no source)"
