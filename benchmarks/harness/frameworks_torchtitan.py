"""The torchtitan (0.3.0 module, v0.2.2 TOML) and DeepSpeed 0.19.8 workers of
benchmarks/frameworks_check.py (its docstring says what they check and how they are set up)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _check_split(c: dict[str, Any], fqns: list[list[str]]) -> str:
    p = c["plan_fields"]
    chunks = c["layout"] if p["pp"] > 1 else [c["num_layers"]]
    got = [sum(m.startswith("layers.") for m in part) for part in fqns]
    return "" if got == chunks else f"stage split {got} != plan {chunks}"


def _batch_rule(c: dict[str, Any], local: int, gbs: int, mb: int, dp: int, pp: int) -> str:
    """torchtitan trainer.py:415-437 (0.3.0): gbs % (local * dp) == 0 and the microbatches."""
    p = c["plan_fields"]
    if gbs % (local * dp):
        return f"global batch {gbs} not a multiple of local {local} * dp {dp}"
    accum = gbs // (local * dp)
    n_mb = local // mb if pp > 1 else 1
    if accum * n_mb != p["num_microbatches"] or (pp > 1 and mb != p["mbs"]):
        return f"micro-batches {accum}*{n_mb} != plan {p['num_microbatches']}"
    return ""


#: the torch.distributed.pipelining class (torch v2.13.0 schedules.py) of each plan schedule
_TORCH_SCHEDULE = {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                   "gpipe": "ScheduleGPipe", "zbv": "ScheduleZBVZeroBubble",
                   "dualpipev": "ScheduleDualPipeV"}


def worker_torchtitan(cases: list[dict[str, Any]]) -> None:
    import torchtitan.components.quantization.float8 as tt_float8
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )
    tt_float8.has_cuda_capability = lambda major, minor: (major, minor) <= (9, 0)  # H100
    import torch
    built: dict[str, int] = {}
    for c in cases:
        try:
            d = os.path.dirname(c["file"])
            if d not in sys.path:
                sys.path.insert(0, d)
            mod = Path(c["file"]).stem.replace(".", "_").replace("-", "_").replace("+", "_")
            Path(d, mod + ".py").write_text(Path(c["file"]).read_text())
            cfg = ConfigManager().parse_args(["--module", mod, "--config", "autoparallel_plan"])
            cfg.__post_init__()  # Trainer.Config checks on the final values
            par, tr = cfg.parallelism, cfg.training
            dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                dp_shard=par.data_parallel_shard_degree,
                                cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                                pp=par.pipeline_parallel_degree,
                                ep=par.expert_parallel_degree, world_size=c["gpus"])
            why = ""
            dense = dims.dp_shard * dims.cp * dims.tp  # parallel_dims.py:277-279, 338-339
            if (dense // dims.ep) * dims.ep != dense:
                why = f"sparse mesh: dp_shard*cp*tp = {dense} not a multiple of ep = {dims.ep}"
            if c["model"] not in built:  # the model torchtitan builds, on the meta device
                with torch.device("meta"):
                    m = cfg.model_spec.model.build()
                built[c["model"]] = sum(p.numel() for p in m.parameters()) + sum(
                    b.numel() for k, b in m.named_buffers() if "expert_bias" in k)
                del m
            if built[c["model"]] != c["planned_params"]:
                why = (f"torchtitan builds {built[c['model']]:,} parameters (+ expert-bias "
                       f"buffers), the plan {c['planned_params']:,}")
            p = c["plan_fields"]
            # zero = 0 is DDP: every data-parallel rank a replica (configs.py:124-150);
            # otherwise FSDP over dp/dp_replicate ranks, replicated dp_replicate times
            want_rs = ((p["dp"], 1) if p["zero"] == 0
                       else (p["dp_replicate"], p["dp"] // p["dp_replicate"]))
            if (dims.dp_replicate, dims.dp_shard) != want_rs:
                why = (f"dp_replicate, dp_shard = {dims.dp_replicate}, {dims.dp_shard} != plan "
                       f"{want_rs[0]}, {want_rs[1]}")
            if dims.pp > 1 and not why:
                # the schedule class torch builds (torch schedules.py get_schedule_class)
                # must be the plan's, under torchtitan's name for it
                cls = get_schedule_class(par.pipeline_parallel_schedule).__name__
                want_cls = _TORCH_SCHEDULE[c["schedule"]]
                if cls != want_cls:
                    why = f"schedule {cls} != plan {want_cls}"
            if dims.pp > 1 and not why:
                if par.module_fqns_per_model_part is None:
                    n, layers, iw, ow = _get_pipeline_metadata(dims, par, cfg.model_spec.model)
                    fqns = _generate_llm_fqn_per_model_part(n, layers, iw, ow)
                else:
                    fqns = par.module_fqns_per_model_part
                    single = issubclass(get_schedule_class(par.pipeline_parallel_schedule),
                                        PipelineScheduleSingle)
                    if len(fqns) % dims.pp or (single and len(fqns) != dims.pp):
                        why = f"{len(fqns)} stages do not fit {par.pipeline_parallel_schedule}"
                why = why or _check_split(c, fqns)
            dp = dims.dp_replicate * dims.dp_shard
            why = why or _batch_rule(c, tr.local_batch_size, tr.global_batch_size,
                                     par.pipeline_parallel_microbatch_size, dp, dims.pp)
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)


def worker_torchtitan_toml(cases: list[dict[str, Any]], src: str) -> None:
    import math
    sys.path.insert(0, src)
    import torchtitan.components.quantization  # noqa: F401 - registers the converters
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.protocols.model_converter import _registry_model_converter_cls
    assert src in (torchtitan.__file__ or ""), torchtitan.__file__
    for c in cases:
        try:
            cfg = ConfigManager().parse_args(["--job.config_file", c["file"]])
            par, tr = cfg.parallelism, cfg.training
            dims = ParallelDims(dp_replicate=par.data_parallel_replicate_degree,
                                dp_shard=par.data_parallel_shard_degree,
                                cp=par.context_parallel_degree, tp=par.tensor_parallel_degree,
                                pp=par.pipeline_parallel_degree, ep=par.expert_parallel_degree,
                                etp=par.expert_tensor_parallel_degree, world_size=c["gpus"])
            why = ""
            for name in cfg.model.converters:
                if name not in _registry_model_converter_cls:
                    why = f"converter {name!r} is not registered"
            if dims.pp > 1 and not why:
                if par.module_fqns_per_model_part is None:
                    # v0.2.2 distributed/pipeline_parallel.py:72-105
                    iw = par.pipeline_parallel_first_stage_less_layers
                    ow = par.pipeline_parallel_last_stage_less_layers
                    n = math.ceil((c["num_layers"] + iw + ow)
                                  / par.pipeline_parallel_layers_per_stage)
                    per_rank = n // dims.pp
                    single = par.pipeline_parallel_schedule in ("1F1B", "GPipe")
                    if n % dims.pp or (single and per_rank != 1) or (not single
                                                                    and per_rank < 2):
                        why = f"{n} virtual stages for pp={dims.pp}"
                    else:
                        fqns = generate_llm_fqn_per_model_part(n, c["num_layers"], iw, ow)
                        why = _check_split(c, fqns)
                else:
                    why = _check_split(c, par.module_fqns_per_model_part)
            dp = dims.dp_replicate * dims.dp_shard
            why = why or _batch_rule(c, tr.local_batch_size, tr.global_batch_size,
                                     par.pipeline_parallel_microbatch_size, dp, dims.pp)
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)


def worker_deepspeed(cases: list[dict[str, Any]]) -> None:
    import deepspeed.comm as dist
    from deepspeed.module_inject.auto_ep_config import (
        parse_autoep_config,
        validate_autoep_config,
    )
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.topology import (
        PipeDataParallelTopology,
        PipeModelDataParallelTopology,
    )
    from deepspeed.runtime.zero.config import ZeroStageEnum
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29592", RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    dist.init_distributed(dist_backend="gloo")  # DeepSpeedConfig asks deepspeed.comm

    class Mpu:
        def __init__(self, dp: int) -> None:
            self.dp = dp

        def get_data_parallel_world_size(self) -> int:
            return self.dp

    for c in cases:
        try:
            p = c["plan_fields"]
            cfg = json.loads(Path(c["file"]).read_text())
            if p["pp"] > 1:
                dp = PipeDataParallelTopology(num_pp=p["pp"], num_dp=p["dp"]).get_dim("data")
            elif p["tp"] > 1:
                dp = PipeModelDataParallelTopology(num_pp=1, num_mp=p["tp"],
                                                   num_dp=p["dp"]).get_dim("data")
            else:
                dp = c["gpus"]  # no mpu: DeepSpeed counts every rank
            ds = DeepSpeedConfig(cfg, mpu=Mpu(dp))
            why = ""
            # ZeRO-Offload as DeepSpeed parsed it (0.19.8 runtime/zero/config.py:171,
            # offload_config.py:99 ratio); hybrid sharding is refused by --emit (MiCS removed)
            zc = ds.zero_config
            off = zc.offload_optimizer
            on_cpu = off is not None and str(off.device).endswith("cpu")
            got_off = off.ratio if on_cpu else 0.0
            if abs(got_off - p["optimizer_offload"]) > 1e-9:
                why = f"offload_optimizer ratio {got_off} != plan {p['optimizer_offload']}"
            if "expert_parallel" in cfg:  # AutoEP's own validation (folding of EP onto ranks)
                validate_autoep_config(parse_autoep_config(cfg["expert_parallel"]),
                                       world_size=c["gpus"], pp_size=p["pp"], tp_size=p["tp"],
                                       sp_size=1, zero_stage=p["zero"])
            if p["pp"] > 1 and not ds.zero_optimization_stage < ZeroStageEnum.gradients:
                why = "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
            print(json.dumps({"id": c["id"], "ok": not why, "why": why}), flush=True)
        except BaseException as exc:  # noqa: BLE001
            print(json.dumps({"id": c["id"], "ok": False,
                              "why": f"{type(exc).__name__}: {str(exc)[:300]}"}), flush=True)
