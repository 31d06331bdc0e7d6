"""The deepseek-v3-fp8 recipe's activation mechanisms (FP8 MoE SwiGLU inputs, one E5M6 copy of
the attention output, RMSNorm recompute dropping the linears' caches: arXiv 2412.19437 §3.2.3,
§3.3.3; cost/activations.py) reach the solver's tables: CP-SAT's top k equals the
enumerator's on a tiny MLA MoE model, and the master's bound stays below every key's best."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel_cp.search.space import SearchSpace
from autoparallel_cp.spec import RECIPES, Job, MLASpec, ModelSpec, MoESpec
from autoparallel_cp.spec.loaders import load_cluster
from tests.search.test_solver_vs_enumerate import _assert_master_bounds, _compare_tol


def _mini_mla(layers: int) -> ModelSpec:
    return ModelSpec(
        name="mini-mla", num_layers=layers, hidden_size=1024, ffn_hidden_size=2816,
        num_attention_heads=8, vocab_size=32000,
        mla=MLASpec(q_lora_rank=384, kv_lora_rank=128, qk_nope_head_dim=64,
                    qk_rope_head_dim=32, v_head_dim=64),
        moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=512, num_shared_experts=1,
                    first_k_dense_layers=1))


def _job(layers: int, gpus: int, seq: int) -> Job:
    return Job(model=_mini_mla(layers), cluster=load_cluster("dgx-h100").take_gpus(gpus),
               recipe=RECIPES["deepseek-v3-fp8"], seq_len=seq, global_batch=16)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(layers=st.sampled_from([4, 6]), gpus=st.sampled_from([4, 8]),
       seq=st.sampled_from([2048, 8192]))
def test_deepseek_recipe_matches_enumeration(layers: int, gpus: int, seq: int) -> None:
    job = _job(layers, gpus, seq)
    space = SearchSpace.for_job(job, max_pp=2, max_vpp=2, max_mbs=2, zero=(1,))
    _compare_tol(job, space, 4)


def test_master_bound_holds_for_the_deepseek_recipe() -> None:
    job = _job(6, 8, 4096)
    space = SearchSpace.for_job(job, max_pp=4, max_vpp=2, max_mbs=2, zero=(0, 1))
    _assert_master_bounds(job, space, 5)
