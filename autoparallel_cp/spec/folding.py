"""MoE parallel folding: the experts' own rank grid and its rules (pure functions of counts;
`spec.plan.Plan` carries the `etp` field and applies them).

Megatron-LM d98e8a64 megatron/core/parallel_state.py `initialize_model_parallel` (:857-902);
Megatron-Core MoE paper arXiv 2603.07685 ("Parallel Folding"); Megatron-Bridge
docs/training/moe-optimization.md "Parallel Folding" @067f987:

- the attention layers use the rank grid tp x cp x dp x pp (order "tp-cp-ep-dp-pp" with
  ep = 1), the MoE layers a second grid etp x ep x edp x pp over the same ranks (the same order,
  cp = 1), so within a pipeline stage's tp*cp*dp ranks the expert-TP groups are consecutive
  ranks, the EP groups have stride etp and the expert-data-parallel groups stride etp*ep;
- `--expert-tensor-parallel-size` defaults to tp (training/arguments.py:587-588,
  core/model_parallel_config.py:506-507): `etp=None` is that default, where the rule below
  reduces to ep | dp*cp, the tool's rule before folding;
- world % (etp*ep*pp) == 0 (parallel_state.py:880-884), i.e. etp*ep | tp*cp*dp, and the expert
  data-parallel size is world / (etp*ep*pp) (:880).
"""

from __future__ import annotations

from typing import Protocol


class _Experts(Protocol):
    @property
    def expert_ffn_hidden_size(self) -> int: ...


def folding_violations(moe: _Experts | None, tp: int, cp: int, dp: int, ep: int, etp: int,
                       sp: int) -> list[str]:
    """The rules an explicit expert-tensor-parallel size `etp` breaks (module docstring):

    - etp*ep divides the tp*cp*dp ranks of a stage;
    - the expert FFN splits over etp (column/row-parallel expert linears);
    - a folded layout (etp != tp) with tp > 1 needs sequence parallelism: the MoE layer raises
      in training when attention TP runs without it (megatron/core/transformer/moe/
      moe_layer.py:636-640; model_parallel_config.py:560-565 warns that EP with TP needs SP).
    """
    if moe is None:
        return [f"etp={etp} needs an MoE model"]
    out: list[str] = []
    ranks = tp * cp * dp
    if ranks % (etp * ep):
        out.append(f"(tp*cp*dp) % (etp*ep): {ranks} % ({etp}*{ep}) != 0 (the expert grid "
                   "etp x ep x edp covers a stage's tp*cp*dp ranks)")
    if moe.expert_ffn_hidden_size % etp:
        out.append(f"expert ffn % etp: {moe.expert_ffn_hidden_size} % {etp} != 0")
    if etp != tp and tp > 1 and not sp:
        out.append(f"etp={etp} with tp={tp} needs sp=1 (Megatron's MoE layer refuses tensor "
                   "parallelism without sequence parallelism in training)")
    return out
