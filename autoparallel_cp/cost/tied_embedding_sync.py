"""The tied word embedding's gradient all-reduce between the first and the last pipeline stage.

With pp > 1 and the input embedding tied to the output layer, Megatron keeps a copy of the
word embedding on the last stage (spec/params.py `embedding_copy`) and, after the pipeline
flush and the DP gradient synchronisation, all-reduces the two copies' gradients over the
embedding group, {first stage, last stage} of each model replica, before the optimizer step:
`finalize_model_grads` -> `_allreduce_word_embedding_grads`, `torch.distributed.all_reduce(grad,
group=parallel_state.get_embedding_group())` on `weight.main_grad` (the Zero Bubble fork,
sail-sg/zero-bubble-pipeline-parallelism @6574e0ea megatron/core/distributed/
finalize_model_grads.py ll. 16-52; Megatron-LM core_v0.10.0 the same function). It is issued
synchronously (async_op False) after the DP reduction, so nothing overlaps it: its whole time is
exposed (l. 156-164). Where the first and the last stage share a rank (DualPipe's mirror, the
V schedules: `head_stage`), no collective runs (the fork's ZB-V reduces locally, l. 40-46).
Under the fork's zero-bubble schedules (zb-h1 / zb-h2, `--enable-zero-bubble`) it is skipped
there and issued asynchronously from `WeightGradStore.clear()` "so that it won't generate
bubbles" (l. 160-164): 0 for those schedules too.

Bytes: the tp-local embedding gradient, V/tp x h in the main-gradient dtype (`recipe.grad_bytes`;
Megatron's VocabParallelEmbedding shards the vocabulary over tp). A two-rank ring all-reduce
(`comm.all_reduce`, n = 2) sends 2(n-1)/n = 1 x the buffer in two steps: two link latencies plus
bytes / bus bandwidth (nccl-tests doc/PERFORMANCE.md). Link: the pair is rank r of stage 0 and rank
r + (pp-1)·S of stage pp-1 (S = tp·cp·dp, pp outermost: comm.py module docstring); both lie on one
node for every r exactly when the replica's pp·S ranks fit one node (pp·S <= gpus_per_node, S |
gpus_per_node as the mesh requires), else the slowest pair crosses the network.

Placement in the step: steptime.py adds it to the head stage's raw DP synchronisation
(`dp_sync_s`), so the step's tail is max over stages of the exposed sync. With the DP reduction
not overlapped (exposure 1, 0) and the head stage's sync the largest (every plan with dp·cp = 1,
where no stage has any), that is exactly Megatron's order (DP sync, then this all-reduce); where
the first stage's sync exceeds the last's, or the DP reduction overlaps the last backward, the
charge is below the sequential one by at most min(this term, the difference). Search tables:
search/tables.py adds the same value to `head_dpsync` (pp = N/(tp·cp·dp) is fixed by its axes),
so the solver's composition equals this one exactly and every bound over those tables stays a
lower bound. PyTorch recipes: 0 (torch.distributed.pipelining does not tie weights across
stages; torchtitan unties them under pp).
"""

from __future__ import annotations

import numpy as np

from autoparallel_cp.cost import comm
from autoparallel_cp.cost.common import ArrayLike, FloatArray, _f, _is_pytorch, node
from autoparallel_cp.spec import Job

#: schedules whose first and last stage sit on one rank (no embedding collective)
_SAME_RANK = frozenset({"zbv", "dualpipev", "dualpipe"})
#: schedules whose runtime hides it (the Zero Bubble fork's async all-reduce)
_HIDDEN = frozenset({"zb-h1", "zb-h2"})


def tied_embedding_sync_s(job: Job, g: int, tp: ArrayLike, cp: ArrayLike, dp: ArrayLike,
                          pp: ArrayLike, schedule: str | None = None) -> FloatArray:
    """Seconds of the exposed all-reduce of the tied word embedding's gradient between the
    first and the last stage (module docstring); 0 where pp = 1, the embedding is untied, the
    recipe is PyTorch's, `schedule` puts both stages on one rank or hides it (zb-h1 / zb-h2)."""
    tp_, cp_, dp_, pp_ = np.broadcast_arrays(*(_f(x) for x in (tp, cp, dp, pp)))
    zero = np.zeros(tp_.shape)
    if (not job.model.tie_embeddings or _is_pytorch(job.recipe)
            or (schedule or "") in _SAME_RANK | _HIDDEN):
        return zero
    nd = node(job, g)
    nbytes = job.model.vocab_size / tp_ * job.model.hidden_size * float(job.recipe.grad_bytes)
    intra = pp_ * tp_ * cp_ * dp_ <= nd.gpus_per_node
    # a two-rank ring: stride 1 keeps both members on one node, stride G puts them on two
    stride = np.where(intra, 1.0, float(nd.gpus_per_node))
    t = comm.all_reduce(nd, 2.0 + zero, stride, nbytes)
    return np.where(pp_ > 1, t, zero)
