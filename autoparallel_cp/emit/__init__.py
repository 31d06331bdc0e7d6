"""Launch settings for a chosen plan, for named framework versions (spec/frameworks.VERSIONS).

Formats: `megatron` (Megatron-LM main, megatron-core 0.16+ argument names), `torchtitan`
(torchtitan 0.3.0 Python Trainer.Config), `torchtitan-toml` (torchtitan v0.2.2 TOML job config)
and `deepspeed` (DeepSpeed 0.19 JSON). A plan the framework cannot run exactly raises UserError
(exit 2) naming the field and the closest plan it runs (spec/frameworks.py); `notes` only list
code-side settings the plan needs (a topology, an mpu, a wrapper), never a difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from autoparallel_cp.emit.deepspeed import deepspeed_config
from autoparallel_cp.emit.megatron import megatron_args, megatron_env, megatron_text
from autoparallel_cp.emit.torchtitan import torchtitan_python, torchtitan_toml
from autoparallel_cp.errors import UserError
from autoparallel_cp.spec import Job
from autoparallel_cp.spec.frameworks import FRAMEWORKS
from autoparallel_cp.spec.plan import Plan

__all__ = ["EMIT_FORMATS", "Emitted", "deepspeed_config", "emit", "megatron_args",
           "megatron_env", "torchtitan_python", "torchtitan_toml"]

EMIT_FORMATS: tuple[str, ...] = FRAMEWORKS


@dataclass(frozen=True)
class Emitted:
    """Launch settings in one framework's syntax, and the code-side settings they need."""

    fmt: str
    text: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def emit(job: Job, plan: Plan, fmt: str) -> Emitted:
    """Render `plan` for `job` as launch settings of framework `fmt` (see EMIT_FORMATS)."""
    if fmt == "megatron":
        args, notes = megatron_args(job, plan)
        return Emitted(fmt, megatron_text(job, plan, args, notes), tuple(notes))
    if fmt == "torchtitan":
        text, notes = torchtitan_python(job, plan)
        return Emitted(fmt, text, tuple(notes))
    if fmt == "torchtitan-toml":
        text, notes = torchtitan_toml(job, plan)
        return Emitted(fmt, text, tuple(notes))
    if fmt == "deepspeed":
        cfg, notes = deepspeed_config(job, plan)
        return Emitted(fmt, json.dumps(cfg, indent=2) + "\n", tuple(notes))
    raise UserError(f"--emit: unknown format {fmt!r}; choose one of {', '.join(EMIT_FORMATS)}")
