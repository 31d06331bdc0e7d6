"""The spec fields of the newer architectures: parameters, validation, cost, Megatron emit.

Expected differences are derived by hand from what each field adds (module docstrings of
spec/model.py): sinks a per layer, post norms 2h per layer (RMSNorm), the router Linear bias
E per MoE layer, the shared-expert gate h per MoE layer.
"""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel_cp.cost.activations import layer_activation_per_token
from autoparallel_cp.cost.factors import recipe_options
from autoparallel_cp.cost.layer_ops import elementwise_bytes_fwd
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import Job, ModelSpec, MoESpec
from autoparallel_cp.spec.frameworks import job_refusal
from autoparallel_cp.spec.loaders import load_cluster
from autoparallel_cp.spec.params import count_params
from autoparallel_cp.spec.validation import validate_model

L, H, A, E, F = 6, 512, 8, 16, 256
BASE = ModelSpec(name="t", num_layers=L, hidden_size=H, ffn_hidden_size=4 * H,
                 num_attention_heads=A, num_kv_heads=2, vocab_size=1000,
                 moe=MoESpec(num_experts=E, top_k=2, expert_ffn_hidden_size=F,
                             first_k_dense_layers=2))
N_MOE = L - 2


def _with(**kw: object) -> ModelSpec:
    moe_kw = {k: kw.pop(k) for k in list(kw) if k in MoESpec.model_fields}
    assert BASE.moe is not None
    return BASE.model_copy(update={**kw, "moe": BASE.moe.model_copy(update=moe_kw)})


def test_each_field_adds_its_parameters() -> None:
    base = count_params(BASE)
    assert count_params(_with(attention_sinks=True)).total - base.total == L * A
    assert count_params(_with(post_norms=True)).total - base.total == L * 2 * H
    assert count_params(_with(router_linear_bias=True)).total - base.total == N_MOE * E
    both = _with(router_linear_bias=True, router_bias=True)
    assert count_params(both).total - base.total == 2 * N_MOE * E
    shared = _with(num_shared_experts=1, shared_expert_ffn_hidden_size=F)
    gated = _with(num_shared_experts=1, shared_expert_ffn_hidden_size=F, shared_expert_gate=True)
    assert count_params(gated).total - count_params(shared).total == N_MOE * H
    # none of them is a routed expert: active grows by as much as total
    for m, ref in ((_with(attention_sinks=True), BASE), (_with(post_norms=True), BASE),
                   (_with(router_linear_bias=True), BASE), (gated, shared)):
        pc, pr = count_params(m), count_params(ref)
        assert pc.expert_total == pr.expert_total
        assert pc.active_per_token - pr.active_per_token == pc.total - pr.total > 0


def test_shared_expert_gate_needs_a_shared_expert() -> None:
    data = BASE.model_dump()
    data["moe"]["shared_expert_gate"] = True
    with pytest.raises(InputError, match="shared_expert_gate"):
        validate_model(data, "m.yaml")


def _job(model: ModelSpec) -> Job:
    return Job(model=model, cluster=load_cluster("dgx-h100").take_gpus(8), seq_len=1024,
               global_batch=8)


def test_post_norms_cost_their_traffic_and_saved_inputs() -> None:
    one = np.array([1.0])
    plain, post = _job(BASE), _job(_with(post_norms=True))
    opts = recipe_options(plain.recipe)
    ab = float(plain.recipe.activation_bytes)
    for tp, sp in ((1.0, 0.0), (4.0, 1.0)):
        rep = 1.0 / tp if sp else 1.0
        t, s = one * tp, one * sp
        a0 = layer_activation_per_token(plain, False, t, one, one, s, opts).kept
        a1 = layer_activation_per_token(post, False, t, one, one, s, opts).kept
        assert a1 - a0 == pytest.approx(2 * ab * H * rep)  # two saved norm inputs
        e0 = elementwise_bytes_fwd(plain, False, t, s, opts)
        e1 = elementwise_bytes_fwd(post, False, t, s, opts)
        assert e1 - e0 == pytest.approx(2 * 2 * ab * H * rep)  # read + write, two norms


def test_qk_norm_costs_its_traffic() -> None:
    """q and k normed per head (Megatron --qk-layernorm: q_layernorm / k_layernorm over
    head_dim, a separate kernel each): read + write of A + kv query / key heads of head_dim
    64 per token, split over tp (heads are tp-sharded, sequence parallelism or not)."""
    one = np.array([1.0])
    plain, qk = _job(BASE), _job(_with(qk_norm=True))
    opts = recipe_options(plain.recipe)
    ab = float(plain.recipe.activation_bytes)
    d = H // A
    for tp, sp in ((1.0, 0.0), (4.0, 1.0)):
        e0 = elementwise_bytes_fwd(plain, False, one * tp, one * sp, opts)
        e1 = elementwise_bytes_fwd(qk, False, one * tp, one * sp, opts)
        assert e1 - e0 == pytest.approx(2 * ab * (A + 2) * d / tp)


def test_megatron_refuses_post_norms_and_a_lone_router_bias() -> None:
    ok = _job(BASE)
    assert job_refusal(ok, "megatron") is None
    for model in (_with(post_norms=True), _with(router_linear_bias=True)):
        why = job_refusal(ok.model_copy(update={"model": model}), "megatron")
        assert why is not None and "post-sublayer norms" in why
    # GPT-OSS's router bias with biases on every linear is what Megatron builds
    oss = _with(router_linear_bias=True, qkv_bias=True, attn_out_bias=True, mlp_bias=True)
    assert job_refusal(ok.model_copy(update={"model": oss}), "megatron") is None
