"""Launch settings for a chosen plan, in the option names of Megatron-LM, torchtitan and DeepSpeed.

Each emitter returns the text to paste plus `notes`: the parts of the plan the target framework
cannot express exactly (they are printed next to the text, never silently dropped).

Option names follow the projects' own argument parsers / config classes:
- Megatron-LM `megatron/training/arguments.py` (e.g. `--tensor-model-parallel-size`,
  `--num-layers-per-virtual-pipeline-stage`, `--recompute-granularity`, `--fp8-format`,
  Megatron-FSDP `--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params`);
- torchtitan `torchtitan/config/job_config.py` sections `[training]`, `[parallelism]`,
  `[activation_checkpoint]`;
- DeepSpeed's JSON config keys (`train_batch_size`, `train_micro_batch_size_per_gpu`,
  `gradient_accumulation_steps`, `zero_optimization.stage`, `bf16.enabled`,
  `tensor_parallel.autotp_size`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from autoparallel_cp.emit.deepspeed import deepspeed_config
from autoparallel_cp.emit.megatron import megatron_args, megatron_text
from autoparallel_cp.emit.torchtitan import torchtitan_toml
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.plan import Plan

__all__ = ["EMIT_FORMATS", "Emitted", "deepspeed_config", "emit", "megatron_args",
           "torchtitan_toml"]

EMIT_FORMATS: tuple[str, ...] = ("megatron", "torchtitan", "deepspeed")


@dataclass(frozen=True)
class Emitted:
    """Launch settings in one framework's syntax, and what they cannot express."""

    fmt: str
    text: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def emit(job: Job, plan: Plan, fmt: str) -> Emitted:
    """Render `plan` for `job` as launch settings of framework `fmt` (see EMIT_FORMATS)."""
    if fmt == "megatron":
        args, notes = megatron_args(job, plan)
        return Emitted(fmt, megatron_text(job, plan, args, notes), tuple(notes))
    if fmt == "torchtitan":
        text, notes = torchtitan_toml(job, plan)
        return Emitted(fmt, text, tuple(notes))
    if fmt == "deepspeed":
        cfg, notes = deepspeed_config(job, plan)
        return Emitted(fmt, json.dumps(cfg, indent=2) + "\n", tuple(notes))
    raise UserError(f"--emit: unknown format {fmt!r}; choose one of {', '.join(EMIT_FORMATS)}")
