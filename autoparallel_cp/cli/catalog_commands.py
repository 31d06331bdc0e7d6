"""`ap-solve models`, `ap-solve clusters` and `ap-solve validate`."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import click
from rich.table import Table

from autoparallel_cp import outputs, report
from autoparallel_cp.cli.common import check_outputs, guarded
from autoparallel_cp.errors import UserError


@click.command()
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the catalog as JSON.")
@guarded
def models(json_path: str | None) -> None:
    """List the model presets."""
    from autoparallel_cp.spec.loaders import model_catalog

    check_outputs(json_path=json_path)
    rows = model_catalog()
    if json_path:
        import json

        outputs.write_atomic(json_path, json.dumps(rows, indent=2) + "\n")
        if outputs.is_stdout(json_path):
            return
    table = Table(title="Model presets (--model NAME)", title_justify="left",
                  header_style="bold")
    for col, just in (("name", "left"), ("params", "right"), ("active", "right"),
                      ("layers", "right"), ("hidden", "right"), ("heads", "right"),
                      ("kv", "right"), ("attn", "left"), ("experts", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["name"], f"{r['params_b']:g}B", f"{r['active_b']:g}B", str(r["layers"]),
            str(r["hidden"]), str(r["heads"]), str(r["kv_heads"] or "-"), r["attention"],
            f"{r['experts']} (top-{r['top_k']})" if r.get("experts") else "-")
    report.stdout_console().print(table)


@click.command()
@click.option("--json", "json_path", default=None, metavar="FILE|-",
              help="Write the catalog as JSON.")
@guarded
def clusters(json_path: str | None) -> None:
    """List the cluster presets."""
    from autoparallel_cp.spec.loaders import cluster_catalog

    check_outputs(json_path=json_path)
    rows = cluster_catalog()
    if json_path:
        import json

        outputs.write_atomic(json_path, json.dumps(rows, indent=2) + "\n")
        if outputs.is_stdout(json_path):
            return
    table = Table(title="Cluster presets (--cluster NAME; --gpus/--nodes select a part)",
                  title_justify="left", header_style="bold")
    for col in ("name", "gpu", "GPUs", "nodes", "GPU/node", "mem GiB", "bf16 TF/s",
                "NVLink GB/s", "net GB/s/GPU"):
        table.add_column(col, justify="left" if col in ("name", "gpu") else "right")
    for r in rows:
        table.add_row(r["name"], str(r["gpu"]), str(r["gpus"]), str(r["nodes"]),
                      str(r["gpus_per_node"]), str(r["memory_gib"]), str(r["bf16_tflops"]),
                      str(r["intra_node_gbps"]), str(r["inter_node_gbps"]))
    report.stdout_console().print(table)


@click.command()
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@guarded
def validate(args: tuple[str, ...]) -> None:
    """Run the validation benchmark (benchmarks/validate.py) with ARGS."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / "validate.py"
    if not script.is_file():
        raise UserError(f"{script}: the validation benchmark is only in a source checkout")
    # the benchmark runs in its own session, so a Ctrl-C at the terminal reaches this process
    # only; SIGINT or SIGTERM here ends the benchmark's whole process group (SIGTERM: no
    # traceback of its own) and exits 130 / 143 (`guarded`)
    child = subprocess.Popen([sys.executable, str(script), *args], cwd=root,
                             start_new_session=True)
    try:
        rc = child.wait()
    except BaseException:
        _end_group(child)
        raise
    sys.exit(rc)


#: Seconds a stopped benchmark gets to exit on SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0


def _end_group(child: Any) -> None:
    """SIGTERM to `child`'s process group, then SIGKILL after STOP_GRACE_S; waits for it."""
    import os
    import signal
    import subprocess

    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)
        try:
            child.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
