"""Held-out rows on Megatron-LM / Megatron-Core: the framework's defaults where a source states
nothing (main-branch argument defaults, P2P overlap) and the Megatron-Core version of a row."""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Argument defaults of the plain Megatron-LM commits rows state as their software, for the
#: flags a row's source does not state (`megatron/arguments.py` at that commit; read at the
#: NVIDIA/Megatron-LM mirror). 285068c8 (2023-01-11, MegaScale's baseline): `--use-flash-attn`
#: store_true (l. 655: attention through the fused-softmax kernel otherwise),
#: `--attention-dropout` / `--hidden-dropout` default 0.1 (ll. 531-534),
#: `--use-distributed-optimizer` store_true (l. 874); with bf16, gradients are accumulated and
#: all-reduced in fp32 (ll. 155-158), as the megatron-bf16 recipe has it. Those defaults alone
#: do not fit a 175B model on 80 GB (attention scores materialised on every layer), so the
#: memory flags are the ones Megatron-LM's authors give for GPT-3 175B at that time: sequence
#: parallelism with selective recomputation (`--sequence-parallel`, `--recompute-activations`;
#: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
#: MLSys 2023, Table 5: GPT-3 175B with both; the Megatron-LM README of 2022 reports its
#: scaling table with the same two). The interleaved schedule's p2p ran exposed: Megatron-LM
#: gained `--overlap-p2p-communication` (store_true) in f9283c5a8a, 2023-05-31, and made the
#: overlap the default (`--no-overlap-p2p-communication`) in 4eeff55d1f, 2023-10-23, both after
#: 285068c8 (`git merge-base --is-ancestor` at the mirror: neither is its ancestor).
#: 6574e0ea is the Megatron-LM fork of the Zero Bubble paper (sail-sg/zero-bubble-pipeline-
#: parallelism, the commit that added the paper, 2024-01-17): its arguments.py has the same
#: store_true `--use-flash-attn` (l. 924), dropout 0.1 (ll. 765-767) and store_true
#: `--use-distributed-optimizer` (l. 1212); the p2p overlap is on unless
#: `--no-overlap-p2p-communication` (l. 1167, store_false); examples/pretrain_zero_bubble.sh
#: passes none of these and no recompute flag.
MEGATRON_LM_DEFAULTS: dict[str, dict[str, object]] = {
    "285068c8": {"distributed_optimizer": False,
                 "memory": "sequence parallelism + selective recompute (Korthikanti et al. "
                           "2022, the Megatron-LM authors' 175B setting)",
                 "overlap_p2p": (False, "Megatron-LM 285068c8 (2023-01-11) has no p2p overlap: "
                                        "the option came with f9283c5a8a (2023-05-31), the "
                                        "default with 4eeff55d1f (2023-10-23)")},
    "6574e0ea": {"distributed_optimizer": False,
                 "memory": "no recompute flag (examples/pretrain_zero_bubble.sh @6574e0ea)",
                 "overlap_p2p": (True, "the ZB fork's arguments.py @6574e0ea l. 1167: "
                                       "--no-overlap-p2p-communication, store_false")},
}


def _megatron_lm_defaults(r: dict[str, str]) -> dict[str, object]:
    """MEGATRON_LM_DEFAULTS of a plain Megatron-LM row's stated commit, with the commit under
    "commit" ({} otherwise)."""
    if r["framework"] != "megatron":
        return {}
    m = re.search(r"Megatron-LM commit ([0-9a-f]{7,40})", r["framework_version"])
    if m is None:
        return {}
    return next(({"commit": k, **v} for k, v in MEGATRON_LM_DEFAULTS.items()
                 if m.group(1).startswith(k)), {})


#: The `assumed` note of an interleaved Megatron-Core row whose source states no p2p overlap
#: setting: it runs the megatron-bf16 / megatron-fp8 recipe's, Megatron-LM main's default
#: (spec/recipe.py MEGATRON_MAIN_P2P_OVERLAP). No row of the corpus takes it (every
#: interleaved row's source or software era states the setting; tests/cost/
#: test_validation_data.py checks that).
P2P_MAIN_DEFAULT = "Megatron-LM main default; the source states no setting"


def _p2p_overlap(stated: Mapping[str, object], defaults: Mapping[str, object]
                 ) -> tuple[bool, str]:
    """(overlap_p2p_comm, citation) of an interleaved Megatron-Core row: what the source's
    files state (STATED_SETTINGS `overlap_p2p` / `no_overlap_p2p`), else the default of the
    plain Megatron-LM commit it names (MEGATRON_LM_DEFAULTS `overlap_p2p`), else the recipe's
    (Megatron-LM main: on, flagged P2P_MAIN_DEFAULT)."""
    if stated.get("overlap_p2p"):
        return True, str(stated["overlap_p2p"])
    if stated.get("no_overlap_p2p"):
        return False, str(stated["no_overlap_p2p"])
    era = defaults.get("overlap_p2p")
    if isinstance(era, tuple):
        return bool(era[0]), str(era[1])
    return True, P2P_MAIN_DEFAULT


#: The first NeMo container of Megatron-Core 0.13 (tag core_v0.13.0, c550cf6c41, 2025-07-25,
#: the first tag holding 2659630721 "Memory efficient token permutation", which moved the
#: router-probability scaling from the unpermute into the experts' activation): NeMo
#: containers ship a released Megatron-Core, and 25.07 is the first one dated after it.
#: Megatron-Bridge rows run Megatron-Core 0.14 or later (Megatron-Bridge v0.1.0 pyproject:
#: megatron-core>=0.14.0a0; v0.2.0: >=0.15.0a0).
_NEMO_MCORE_013 = (25, 7)


def _mcore_before_013(r: dict[str, str]) -> bool:
    """Whether the row's stated software is a Megatron-Core older than 0.13 (its MoE layers
    scale by the router probabilities at the combine: behaviour `moe_prob_scaling`)."""
    ver = r["framework_version"]
    if "megatron-bridge" in ver.lower():
        return False
    m = re.search(r"core_v0\.(\d+)", ver)
    if m is not None:
        return int(m.group(1)) < 13
    m = re.search(r"NeMo (\d\d)\.(\d\d)", ver)
    return m is not None and (int(m.group(1)), int(m.group(2))) < _NEMO_MCORE_013


def _plain_mcore_minor(r: dict[str, str]) -> int | None:
    """The Megatron-Core minor version (core_v0.N) a plain Megatron-LM row states, or None.
    `moe_comm.allgather_permute_bytes` counts the allgather dispatcher of core_v0.6.0."""
    m = re.search(r"core_v0\.(\d+)", r["framework_version"])
    return int(m.group(1)) if m is not None and r["framework"] == "megatron" else None
