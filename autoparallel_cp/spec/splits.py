"""Layer splits of a pipeline as Megatron-Core lays them out, and its interleaved schedule's
micro-batch groups (pure functions of counts; `spec.plan.Plan` applies them). Sources:
Megatron-LM d98e8a64 megatron/core/transformer/transformer_block.py `get_num_layers_to_build`,
transformer_config.py `__post_init__` ("Uneven PP", "PP layout"),
pipeline_parallel_layer_layout.py, core/pipeline_parallel/schedules.py:

- no `stage_layers`: pp*vpp | layers is Megatron's default even split; otherwise the embedding
  and the loss count as one layer slot each (`--account-for-embedding-in-pipeline-split`,
  `--account-for-loss-in-pipeline-split`): the layers + 2 slots are spread over the pp*vpp
  model chunks, the earlier chunks (in layer order) taking the remainder, and the first chunk
  gives its slot to the embedding, the last to the loss; `default_split` keeps each stage's
  total, whose chunks then follow `stage_chunks` below. Where (layers + 2) or (layers + 1)
  divide by pp*vpp this is exactly those flags (the two rules give the same chunks there);
  otherwise it is the same slot balance written as `--pipeline-model-parallel-layout`.
- the vpp chunks of a stage (`stage_chunks`): a stage whose layer count divides by vpp splits
  evenly (Megatron's --decoder-first/last-pipeline-num-layers give every chunk of the stage
  the same count); any other stage fills its slots in chunk order, the first stage's embedding
  and the last stage's loss taking one slot each, so 126 layers on pp 8 x vpp 8 hold
  1,2,...,2 chunks on the first stage and 2,...,2,1 on the last, as --account-for-* do.
- `chunk_layers` gives every chunk outright (pp*vpp entries, chunk v of stage j at v*pp + j:
  the order of `--pipeline-model-parallel-layout`), e.g. Megatron-Bridge's DeepSeek-V3 layouts.
- the named layouts the search tries for a pp*vpp that need not divide the layers
  (`named_layouts`, `slot_layout`): the layers plus 0/1 embedding and 0/1 loss slots spread
  over the chunks, the remainder to the earliest; with one slot each that is `default_split`'s
  layout, and torchtitan's `generate_llm_fqn_per_model_part` with its default weights.
"""

from __future__ import annotations


def default_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Layers per stage of a plan without `stage_layers` (module docstring): pp*vpp | layers:
    the even split; otherwise layers + 2 slots (embedding and loss one each) over the pp*vpp
    chunks, the remainder to the earliest chunks in layer order (chunk v of stage j is number
    v*pp + j), less the embedding's slot on the first chunk and the loss's on the last.

    Megatron-LM d98e8a64 transformer_block.py `get_num_layers_to_build`: with
    --account-for-embedding/loss-in-pipeline-split every chunk holds (layers + 2)/(pp*vpp)
    slots and the first / last chunk one layer fewer."""
    chunks = pp * vpp
    if num_layers % chunks == 0:
        return (num_layers // pp,) * pp
    q, r = divmod(num_layers + 2, chunks)
    per = [q + (1 if i < r else 0) for i in range(chunks)]
    per[0] -= 1
    per[-1] -= 1
    return tuple(sum(per[v * pp + j] for v in range(vpp)) for j in range(pp))


def stage_chunks(n: int, vpp: int, first: bool, last: bool) -> tuple[int, ...]:
    """Layers of the vpp chunks of a stage holding n layers (module docstring): n % vpp == 0
    splits evenly (Megatron's uneven first/last stages, transformer_config.py "Uneven PP");
    otherwise the stage's n + [first] + [last] slots fill its chunks in order, the remainder
    to the earlier chunks, and the first chunk of the first stage gives one slot to the
    embedding, the last chunk of the last stage one to the loss (transformer_block.py
    `get_num_layers_to_build` with --account-for-*-in-pipeline-split). A count may come out
    negative only for a last stage below vpp - 1 layers, which `plan_violations` refuses."""
    if vpp == 1 or n % vpp == 0:
        return (n // vpp,) * vpp
    q, r = divmod(n + int(first) + int(last), vpp)
    per = [q + (1 if v < r else 0) for v in range(vpp)]
    if first:
        per[0] -= 1
    if last:
        per[-1] -= 1
    return tuple(per)


def microbatch_group(pp: int, m: int) -> int:
    """Megatron's --microbatch-group-size-per-virtual-pipeline-stage for m micro-batches: pp
    (its default) when pp | m, else the least N in [pp, m] with m % N == 0 or m % N >= pp.

    Megatron-LM d98e8a64 core/pipeline_parallel/schedules.py
    `forward_backward_pipelining_with_interleaving` raises unless pp <= N <= m and the last
    group (m % N) is empty or holds >= pp micro-batches; model_parallel_config.py defaults N to
    pp. So the interleaved schedule runs any m >= pp (N = m always qualifies). 0 when m < pp."""
    if m < pp:
        return 0
    for n in range(pp, m + 1):
        if m % n == 0 or m % n >= pp:
            return n
    return m  # not reached: n = m qualifies


#: Slots the embedding / the loss may take in a named layout: 0 (Megatron's plain split), 1
#: (`--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`,
#: torchtitan's default `input_weight` / `output_weight` of 1).
EDGE_SLOTS = (0, 1)
#: Where the remainder chunks go: the earliest (Megatron-Core's and torchtitan's rule); the
#: latest (lighter early stages, which hold the most in-flight micro-batches) is not searched
#: for every model: it doubled the per-key models of the named layouts for no framework's
#: default. A model with a dense prefix adds it (`named_layouts(latest=True)`): DeepSeek-V3's
#: published DualPipe split of 61 layers on pp 16, 2:4x14:3 (arXiv 2412.19437 §3.2.1's
#: layout, Megatron's `--pipeline-model-parallel-layout` for it), is the one embedding and
#: one loss slot layout with the remainder on the latest chunks, its first stage short of the
#: 3-layer prefix (the cost model spreads it over the first stages, spec/splits.py
#: `prefix_counts`).
REMAINDER_FIRST = (True,)
REMAINDER_LATEST = (True, False)


def slot_layout(num_layers: int, pp: int, vpp: int, emb: int, loss: int,
                extra_first: bool = True) -> tuple[int, ...] | None:
    """Layers of the pp*vpp model chunks (in layer order: chunk v of stage j is number
    v*pp + j, the order of `chunk_layers`) when the layers plus `emb` embedding slots and
    `loss` loss slots are spread evenly over the chunks, the remainder to the earliest
    (`extra_first`) or the latest chunks, and the first / last chunk give their edge slots
    back. None when a chunk would hold no layer (the first / last chunk may hold only the
    embedding / the loss).

    Megatron-LM d98e8a64 transformer_block.py `get_num_layers_to_build` (the
    --account-for-*-in-pipeline-split slots), pipeline_parallel_layer_layout.py (any per-chunk
    layout written as --pipeline-model-parallel-layout); torchtitan
    distributed/pipeline_parallel.py `generate_llm_fqn_per_model_part` (num_layers +
    input_weight + output_weight effective layers over the virtual stages, the remainder to
    the first stages, `pipeline_parallel_first/last_stage_less_layers` as the weights)."""
    chunks = pp * vpp
    q, r = divmod(num_layers + emb + loss, chunks)
    per = [q + (1 if (i < r if extra_first else i >= chunks - r) else 0)
           for i in range(chunks)]
    per[0] -= emb
    per[-1] -= loss
    for i, n in enumerate(per):
        edge = (i == 0 and emb > 0) or (i == chunks - 1 and loss > 0)
        if n < (0 if edge else 1):
            return None
    if sum(per) != num_layers:  # a single chunk holding both edges: not a pipeline
        return None
    return tuple(per)


def named_layouts(num_layers: int, pp: int, vpp: int, latest: bool = False
                  ) -> tuple[tuple[int, ...], ...]:
    """The distinct `slot_layout`s of (pp, vpp) over EDGE_SLOTS x EDGE_SLOTS x
    REMAINDER_FIRST (`latest`: REMAINDER_LATEST), in that order (deterministic): the splits
    frameworks make by default for pp*vpp model chunks (Megatron-Core with and without
    embedding / loss accounting, torchtitan with its first/last-stage weights; with `latest`
    also the remainder on the latest chunks, DeepSeek-V3's published layout), none needing
    pp*vpp to divide the layers."""
    out: list[tuple[int, ...]] = []
    for emb in EDGE_SLOTS:
        for loss in EDGE_SLOTS:
            for extra_first in (REMAINDER_LATEST if latest else REMAINDER_FIRST):
                lay = slot_layout(num_layers, pp, vpp, emb, loss, extra_first)
                if lay is not None and lay not in out:
                    out.append(lay)
    return tuple(out)


def model_order(layout: tuple[int, ...], pp: int, v_shaped: bool) -> tuple[int, ...]:
    """Layers of the model chunks in model (pipeline stage) order from a `chunk_layers` layout
    (chunk v of rank j at v*pp + j). Interleaved: the same order. In a V (zbv, dualpipev)
    stage s sits on rank s (s < pp) or 2pp-1-s (torch `generate_stage_to_rank_mapping(
    style="v")`), so the second half is reversed: stage pp + i is chunk 1 of rank pp-1-i, and
    rank 0's chunks are the first and the last stage (the embedding's and the head's)."""
    return tuple(layout[:pp]) + tuple(layout[pp:][::-1]) if v_shaped else tuple(layout)


def prefix_counts(k: int, per_stage: tuple[int, ...]) -> tuple[int, ...]:
    """Layers of a k-layer dense prefix (MoE `first_k_dense_layers`) each stage holds when the
    stages hold `per_stage` layers in rank order, as the cost model lays them out
    (cost/memory.py `stage_layer_kinds`: stage j holds layers [S_j, S_j + n_j), S_j the layers
    of the stages before it, layer i dense iff i < k with `moe_layer_freq` 1): min(n_j,
    max(k - S_j, 0)). A V's empty rank 0 holds none of it, the next rank the prefix's start."""
    out, start = [], 0
    for n in per_stage:
        out.append(min(n, max(k - start, 0)))
        start += n
    return tuple(out)
