"""HF config.json import: configs written here with the published values import to the presets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.hf_import import SUPPORTED_ARCHITECTURES, model_from_hf_config
from autoparallel_cp.spec.loaders import load_model
from autoparallel_cp.spec.params import count_params

# Values of the published config.json files (only the fields the importer reads, plus a few
# it must ignore).
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False,
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
    "tie_word_embeddings": False, "router_aux_loss_coef": 0.02,
}
QWEN25_72B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 152064,
    "max_position_embeddings": 32768, "tie_word_embeddings": False,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "num_nextn_predict_layers": 1, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "tie_word_embeddings": False,
}
GPT2 = {  # openai-community/gpt2
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
    "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": None,
    "vocab_size": 50257,
}

CASES = [
    (LLAMA3_8B, "llama3-8b"), (LLAMA2_7B, "llama2-7b"), (MISTRAL_7B, "mistral-7b"),
    (MIXTRAL_8X7B, "mixtral-8x7b"), (QWEN25_72B, "qwen2.5-72b"), (DEEPSEEK_V3, "deepseek-v3"),
]


def _shape(spec: Any) -> dict[str, Any]:
    return spec.model_dump(exclude={"name", "source"})


@pytest.mark.parametrize("cfg,preset", CASES, ids=[p for _, p in CASES])
def test_import_equals_preset(cfg: dict[str, Any], preset: str) -> None:
    spec = model_from_hf_config(cfg, "config.json")
    assert _shape(spec) == _shape(load_model(preset))


def test_gpt2_small_param_count() -> None:
    spec = model_from_hf_config(GPT2)
    assert spec.tie_embeddings and spec.position_embedding == "learned"
    assert spec.ffn_hidden_size == 3072
    assert count_params(spec).total == 124_439_808  # GPT-2 small: HF model.num_parameters()


def test_load_from_file_and_folder(tmp_path: Path) -> None:
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B))
    by_dir = load_model(d)
    by_file = load_model(d / "config.json")
    assert _shape(by_dir) == _shape(by_file) == _shape(load_model("llama3-8b"))
    assert "config.json" in by_dir.source and by_dir.name == "Meta-Llama-3-8B"


def test_model_type_only_and_unknown_architecture() -> None:
    cfg = {k: v for k, v in LLAMA3_8B.items() if k != "architectures"}
    assert _shape(model_from_hf_config(cfg)) == _shape(load_model("llama3-8b"))
    with pytest.raises(InputError) as ei:
        model_from_hf_config({"architectures": ["FalconForCausalLM"], "hidden_size": 8})
    msg = str(ei.value)
    assert "FalconForCausalLM" in msg and "field 'architectures'" in msg
    assert all(a in msg for a in SUPPORTED_ARCHITECTURES)


def test_missing_and_bad_fields_name_the_field() -> None:
    cfg = {k: v for k, v in LLAMA3_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(InputError, match=r"x/config.json: field 'num_hidden_layers'"):
        model_from_hf_config(cfg, "x/config.json")
    with pytest.raises(InputError, match=r"field 'num_kv_heads'"):
        model_from_hf_config({**LLAMA3_8B, "num_key_value_heads": 5}, "config.json")
    with pytest.raises(InputError, match=r"field 'hidden_act'"):
        model_from_hf_config({**LLAMA3_8B, "hidden_act": "relu"})


# ---- sliding windows (transformers' conventions, typed from the configuration classes) ----

QWEN2_SWA = {**QWEN25_72B, "num_hidden_layers": 8, "use_sliding_window": True,
             "sliding_window": 4096, "max_window_layers": 6}


def test_mistral_v01_window_counts_the_query_itself() -> None:
    # HF sliding_window 4096 = the query and the 4095 keys before it (masking_utils)
    spec = model_from_hf_config(MISTRAL_7B)
    assert spec.sliding_window_left == 4095 and spec.sliding_window_layers is None
    assert all(spec.is_window_layer(i) for i in range(32))
    v03 = model_from_hf_config({**MISTRAL_7B, "sliding_window": None})  # v0.3: null
    assert v03.sliding_window_left is None


def test_qwen2_window_only_with_use_sliding_window() -> None:
    # Qwen2Config: layers i >= max_window_layers slide, and only with use_sliding_window
    spec = model_from_hf_config(QWEN2_SWA)
    assert spec.sliding_window_left == 4095
    assert [spec.is_window_layer(i) for i in range(8)] == [False] * 6 + [True] * 2
    off = model_from_hf_config({**QWEN2_SWA, "use_sliding_window": False})
    assert off.sliding_window_left is None
    none_windowed = model_from_hf_config({**QWEN2_SWA, "max_window_layers": 8})
    assert none_windowed.sliding_window_left is None


def test_layer_types_and_gemma3_pattern() -> None:
    base = {**LLAMA3_8B, "num_hidden_layers": 12, "sliding_window": 128}
    alt = model_from_hf_config(
        {**base, "layer_types": ["sliding_attention", "full_attention"] * 6})
    assert alt.sliding_window_left == 127 and alt.sliding_window_layers == (True, False)
    g3 = model_from_hf_config({**base, "sliding_window_pattern": 6})
    # Gemma 3: layer i slides iff (i + 1) % 6 != 0: five local, then one global
    assert g3.sliding_window_layers == (True,) * 5 + (False,)
    assert g3.window_share(False) == pytest.approx(10 / 12)


@pytest.mark.parametrize(("bad", "field"), [
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"layer_types": ["chunked_attention"] * 12}, "layer_types"),
    ({"sliding_window_pattern": 0}, "sliding_window_pattern"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"sliding_window": "wide"}, "sliding_window"),
])
def test_bad_window_fields_name_the_field(bad: dict[str, Any], field: str) -> None:
    cfg = {**LLAMA3_8B, "num_hidden_layers": 12, "sliding_window": 128, **bad}
    with pytest.raises(InputError, match=rf"field '{field}'"):
        model_from_hf_config(cfg)
