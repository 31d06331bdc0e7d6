"""The Megatron-LM workers of benchmarks/frameworks_check.py (its docstring says what they check
and how Megatron-LM d98e8a64 is set up): the emitted flags through `parse_args`,
`validate_args` and TransformerConfig, and the meta-device parameter count (`--params`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# ----------------------------------------------------------------- workers (one per framework)

def _megatron_setup(src: str) -> Any:
    import typing

    import typing_extensions
    typing.override = typing_extensions.override  # type: ignore[attr-defined]
    sys.path.insert(0, src)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.training import arguments as a
    a.get_device_arch_version = lambda: 9  # H100 (dgx-h100), no GPU here
    if rope_utils.fused_apply_rotary_pos_emb is None:  # Transformer Engine stand-in (see top)
        rope_utils.fused_apply_rotary_pos_emb = lambda *x, **k: None
    return a


def _bash_array(path: str) -> tuple[list[str], dict[str, str]]:
    """MEGATRON_ARGS and the exports, read back through bash exactly as a user's shell would."""
    script = (f"set -e; source {path}; for a in \"${{MEGATRON_ARGS[@]}}\"; do printf '%s\\0' "
              "\"$a\"; done; printf 'ENV\\0%s\\0' \"${CUDA_DEVICE_MAX_CONNECTIONS-}\"")
    raw = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    items = raw.stdout.split("\0")[:-1]
    i = items.index("ENV")
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": items[i + 1]} if items[i + 1] else {}
    return items[:i], env


def _megatron_chunks(cfg: Any, pp: int, vpp: int) -> list[int]:
    """Decoder layers Megatron builds in every model chunk (layout order: chunk v of rank j at
    v*pp + j): its parsed --pipeline-model-parallel-layout, else transformer_block.py
    `get_num_layers_to_build` per (rank, virtual stage)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    lay = cfg.pipeline_model_parallel_layout
    if lay is not None:
        return [lay.layout[j][v].count(LayerType.decoder) for v in range(vpp)
                for j in range(pp)]
    if pp == 1:
        return [cfg.num_layers]
    return [get_num_layers_to_build(cfg, vp_stage=v if vpp > 1 else None, pp_rank=j)
            for v in range(vpp) for j in range(pp)]


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """What Megatron derived that differs from the plan (per-layer lists: the first layer)."""
    out = []
    for k, w in want.items():
        g = got.get(k)
        if g == w:
            continue
        if k in ("windows", "cp_comm") and isinstance(g, list) and len(g) == len(w):
            i = next(i for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b)
            out.append(f"{k}: layer {i + 1} (1-based) derived {g[i]} != plan {w[i]}")
        else:
            out.append(f"{k}: derived {g} != plan {w}")
    return "; ".join(out)


def _megatron_attention(cfg: Any, cp: int) -> dict[str, Any]:
    """Each layer's window as Megatron builds it (transformer/utils.py:531-547
    `is_layer_window_attention`, 1-based layer numbers, read by both attention cores:
    dot_product_attention.py:93-98, extensions/transformer_engine.py:2163-2171) and, with
    cp > 1, each layer's context-parallel exchange (transformer_layer.py:378-385: the list's
    entry layer_number - 1, or the one string) and the layers Transformer Engine would refuse
    (v2.9 context_parallel.py, TE is not installed here: its rules are applied as written):
    3803-3809, a sliding window (window_size other than (-1, 0) / (-1, -1)) runs only with
    cp_comm_type "a2a" or "all_gather"; 3825-3827, a softmax_type other than "vanilla" (the
    attention sinks of --softmax-type learnable, handed over at
    extensions/transformer_engine.py:2184-2189) only with "a2a"; 3854-3888 knows only p2p,
    a2a+p2p, all_gather and a2a."""
    from megatron.core.transformer.utils import is_layer_window_attention

    n = cfg.num_layers
    win = [list(cfg.window_size) if is_layer_window_attention(
        cfg.window_size, cfg.window_attn_skip_freq, i + 1) else None for i in range(n)]
    out: dict[str, Any] = {"windows": win}
    if cp > 1:
        kinds = cfg.cp_comm_type if isinstance(cfg.cp_comm_type, list) else \
            [cfg.cp_comm_type] * n
        out["cp_comm"] = kinds
        out["te_refuses"] = [
            i + 1 for i, (w, k) in enumerate(zip(win, kinds, strict=True))
            if k not in ("p2p", "a2a+p2p", "all_gather", "a2a")
            or (w is not None and tuple(w) not in ((-1, 0), (-1, -1))
                and k not in ("a2a", "all_gather"))
            or (cfg.softmax_type != "vanilla" and k != "a2a")]
    return out


def worker_megatron(cases: list[dict[str, Any]], src: str) -> None:
    a = _megatron_setup(src)
    for c in cases:
        pid = os.fork()
        if pid == 0:  # a fresh process state per case
            try:
                args_list, env = _bash_array(c["file"])
                os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
                os.environ.update(env, WORLD_SIZE=str(c["gpus"]))
                sys.argv = ["pretrain_gpt.py", *args_list, "--tokenizer-type", "NullTokenizer"]
                args = a.parse_args()
                a.validate_args(args, {})
                cfg = a.core_transformer_config_from_args(args)
                p = c["plan_fields"]
                got = {"dp": args.data_parallel_size,
                       "vpp": args.virtual_pipeline_model_parallel_size or 1,
                       "chunks": _megatron_chunks(cfg, p["pp"], p["vpp"])}
                want = {"dp": p["dp"], "vpp": p["vpp"], "chunks": c["layout"]}
                # hybrid sharding and host offload as Megatron parsed them
                # (d98e8a64 arguments.py:3216, 2918-2923, 1950-1951)
                got["dp_replicate"] = args.num_distributed_optimizer_instances
                got["optimizer_offload"] = (args.optimizer_offload_fraction
                                            if args.optimizer_cpu_offload else 0.0)
                got["activation_offload"] = max(args.cpu_offloading_num_layers, 0)
                want.update(dp_replicate=p["dp_replicate"],
                            optimizer_offload=float(p["optimizer_offload"]),
                            activation_offload=p["activation_offload"])
                if p["pp"] > 1 and p["vpp"] > 1:
                    # the interleaved p2p overlap Megatron runs (model_parallel_config
                    # overlap_p2p_comm / batch_p2p_comm from the arguments) is the one the
                    # recipe costs; on pp 2 Megatron always overlaps (the emit's note)
                    got["overlap_p2p_comm"] = (cfg.overlap_p2p_comm, cfg.batch_p2p_comm)
                    on = bool(c["p2p_overlap"]) or p["pp"] == 2
                    want["overlap_p2p_comm"] = (on, not on)
                if p["recompute"] == "full" and p["recompute_layers"] is not None and \
                        p["recompute_layers"] < max(c["stage_layers"]):
                    got["recompute_layers"] = args.recompute_num_layers * got["vpp"]
                    want["recompute_layers"] = p["recompute_layers"]
                got.update(_megatron_attention(cfg, p["cp"]))
                want["windows"] = c["windows"] or [None] * c["num_layers"]
                if p["cp"] > 1:
                    # the exchange the cost model charges: the all-gather on windowed
                    # layers, the p2p ring on the others (cost/cp_ring.py)
                    want["cp_comm"] = ["all_gather" if w else "p2p" for w in want["windows"]]
                    want["te_refuses"] = []
                ok = got == want
                print(json.dumps({"id": c["id"], "ok": ok, "why": _differences(got, want)}),
                      flush=True)
            except BaseException as exc:  # noqa: BLE001 - report every rejection
                print(json.dumps({"id": c["id"], "ok": False,
                                  "why": f"{type(exc).__name__}: {str(exc)[:300]}"}),
                      flush=True)
            os._exit(0)
        os.waitpid(pid, 0)


def worker_megatron_params(jobs: list[dict[str, Any]], src: str) -> None:
    a = _megatron_setup(src)
    import torch
    for j in jobs:
        pid = os.fork()
        if pid == 0:
            try:
                args_list, _ = _bash_array(j["file"])
                os.environ.update(WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29591")
                sys.argv = ["pretrain_gpt.py", *args_list, "--tokenizer-type", "NullTokenizer",
                            "--use-cpu-initialization", "--transformer-impl", "local",
                            "--no-rope-fusion", "--no-bias-swiglu-fusion",
                            "--no-bias-dropout-fusion", "--no-masked-softmax-fusion",
                            "--no-gradient-accumulation-fusion"]
                args = a.parse_args()
                for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                          "expert_model_parallel_size", "context_parallel_size"):
                    setattr(args, k, 1)  # the whole model on one rank, same architecture
                args.sequence_parallel = False
                args.pipeline_model_parallel_layout = None
                args.decoder_first_pipeline_num_layers = None
                args.decoder_last_pipeline_num_layers = None
                args.num_layers_per_virtual_pipeline_stage = None
                args.use_megatron_fsdp = False
                # the token dispatcher holds no parameter; alltoall's constructor makes a CUDA
                # stream (moe/token_dispatcher.py:471-472), which a CPU has not (the dispatcher
                # flag itself is checked by the per-case worker)
                if args.moe_token_dispatcher_type == "alltoall":
                    args.moe_token_dispatcher_type = "allgather"
                args.global_batch_size = args.micro_batch_size
                a.validate_args(args, {})
                from megatron.core.tokenizers.utils.build_tokenizer import (
                    vocab_size_with_padding,
                )
                args.padded_vocab_size = vocab_size_with_padding(args.vocab_size, args)
                cfg = a.core_transformer_config_from_args(args)
                cfg.perform_initialization = False
                cfg.persist_layer_norm = False
                mtp_layers, cfg.mtp_num_layers = cfg.mtp_num_layers, None
                torch.distributed.init_process_group("gloo", world_size=1, rank=0)
                from megatron.core import parallel_state
                parallel_state.initialize_model_parallel()
                from megatron.core.models.gpt import GPTModel
                from megatron.core.models.gpt.gpt_layer_specs import (
                    get_gpt_decoder_block_spec,
                )
                from megatron.core.transformer.dot_product_attention import (
                    DotProductAttention,
                )
                def _dpa(self: Any, *x: Any, k_channels: Any = None, v_channels: Any = None,
                         _init: Any = DotProductAttention.__init__, **kw: Any) -> None:
                    _init(self, *x, **kw)
                DotProductAttention.__init__ = _dpa  # type: ignore[method-assign]
                torch.cuda.current_device = lambda: "meta"  # type: ignore[assignment,return-value]
                spec = get_gpt_decoder_block_spec(cfg, use_transformer_engine=False)
                with torch.device("meta"):
                    m = GPTModel(config=cfg, transformer_layer_spec=spec,
                                 vocab_size=args.padded_vocab_size,
                                 max_sequence_length=args.max_position_embeddings,
                                 position_embedding_type=args.position_embedding_type,
                                 share_embeddings_and_output_weights=(
                                     not args.untie_embeddings_and_output_weights))
                n = sum(p.numel() for p in m.parameters())
                bias = sum(b.numel() for k, b in m.named_buffers() if k.endswith("expert_bias"))
                # the window each built layer's softmax masks with (local core attention:
                # dot_product_attention.py:93-108 hands it to FusedScaleMaskSoftmax)
                wins = [list(w) if (w := layer.self_attention.core_attention
                                    .scale_mask_softmax.window_size) is not None else None
                        for layer in m.decoder.layers]
                print(json.dumps({"model": j["model"], "megatron_params": n,
                                  "expert_bias_buffers": bias, "mtp_layers": mtp_layers or 0,
                                  "padded_vocab": args.padded_vocab_size,
                                  "windows": wins}), flush=True)
            except BaseException as exc:  # noqa: BLE001
                print(json.dumps({"model": j["model"], "error": f"{type(exc).__name__}: {exc}"}),
                      flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
