"""Output files: the CSV columns and JSON documents of INTERFACE.md, written atomically.

Regular files are written atomically: the text goes to a temporary file in the target's folder,
which then replaces the target (`os.replace`); on any error the temporary file is removed and
the target is left as it was. `-`, FIFOs and character devices are streamed to; symlinks are
followed; other special files are refused (`write_atomic`).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autoparallel_cp.errors import UserError
from autoparallel_cp.streams import SafeText, safe_stream, stdout_gone

__all__ = ["SafeText", "safe_stream"]  # re-exported: the report and CLI import them from here

GIB = 1024**3

PLAN_FIELDS: tuple[str, ...] = (
    "dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "num_microbatches", "recompute",
)
TIME_FIELDS: tuple[str, ...] = (
    "compute_s", "bubble_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s",
    "optimizer_s",
)

MEMORY_FIELDS: tuple[str, ...] = (
    "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes",
)

CSV_COLUMNS: tuple[str, ...] = (
    ("rank",) + PLAN_FIELDS + ("recompute_layers", "stage_layers", "fits", "peak_bytes",
                                "peak_gib", "capacity_gib", "step_s")
    + TIME_FIELDS + ("tokens_per_s", "tokens_per_s_per_gpu", "mfu")
    # nominal 80 % prediction intervals (cost/uncertainty.py)
    + ("step_s_lo", "step_s_hi", "tokens_per_s_per_gpu_lo", "tokens_per_s_per_gpu_hi",
       "peak_bytes_lo", "peak_bytes_hi", "fixed_s")
    # columns added later go last, so scripts that read columns by position keep working
    + ("etp",)
    # near-capacity plans (search/capacity.py) and claims against evidence (cost/evidence.py)
    + ("oom_risk", "near_capacity", "beyond_evidence")
    # pipeline schedule and host offload (spec/schedules.py; empty: the plan's default / none)
    + ("schedule", "optimizer_offload", "activation_offload", "offload_s")
)


def _identity(path: str) -> tuple[Any, ...]:
    """What a path writes to: (device, inode) when it exists (so `-`, /dev/stdout, hard links
    and symlinks to one file compare equal), else its resolved absolute path."""
    if path == "-":
        try:
            st = os.fstat(sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            return ("stdout",)
        return ("inode", st.st_dev, st.st_ino)
    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def is_stdout(path: str | None) -> bool:
    """Whether `path` is `-` or the same file as stdout (e.g. /dev/stdout)."""
    return path is not None and (path == "-" or _identity(path) == _identity("-"))


def check_output_paths(paths: Mapping[str, str | None]) -> None:
    """`check_paths` for a command without file inputs."""
    check_paths({}, paths)


def input_identities(path: str) -> list[tuple[Any, ...]]:
    """What an input path reads (the identities of `_identity`): a preset name that is no file
    gives none; `hf:PATH` is PATH; a folder also stands for the `config.json` it holds."""
    if not path or path == "-":
        return []
    path = path.removeprefix("hf:")
    out: list[tuple[Any, ...]] = []
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return out
    out.append(("inode", st.st_dev, st.st_ino))
    if stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError, ValueError):
            inner = os.stat(os.path.join(path, "config.json"))
            out.append(("inode", inner.st_dev, inner.st_ino))
    return out


def check_paths(inputs: Mapping[str, str | Sequence[str] | None],
                outputs: Mapping[str, str | None]) -> None:
    """The one output rule (INTERFACE.md "Exit codes"), checked before any work.

    `inputs` and `outputs` map an option (`--model`) to its path (a list for options naming
    several files). Every output must be writable as `write_atomic` writes it; no two outputs may
    name the same file; and no output that would be replaced may name an input of the command:
    compared by (device, inode), so another spelling, a symlink or a hard link of the input is
    caught too. Streamed outputs (`-`, FIFOs, character devices) replace nothing and are not
    compared with inputs. UserError (exit 2) naming both options."""
    read: dict[tuple[Any, ...], str] = {}
    for option, value in inputs.items():
        for src in [value] if isinstance(value, str) else list(value or ()):
            for ident in input_identities(src):
                read.setdefault(ident, f"the input {option} {src}")
    seen: dict[tuple[Any, ...], str] = {}
    for option, path in outputs.items():
        if not path:
            continue
        kind = _kind(path)
        ident = _identity(path)
        if kind == "replace" and ident in read:
            raise UserError(f"{option} {path}: the same file as {read[ident]}; an output never "
                            "replaces an input: write it elsewhere")
        if ident in seen:
            raise UserError(f"{option} {path}: the same file as {seen[ident]}; give each "
                            "output its own file")
        seen[ident] = f"{option} {path}"


def is_stream(path: str) -> bool:
    """Whether `path` is written in place (`-`, a FIFO, a character device), not replaced."""
    return _kind(path) == "stream"


#: Folders whose entries are never replaced, only written through (devices, /proc/self/fd/N).
_SYSTEM = ("/dev/", "/proc/")


def _kind(path: str) -> str:
    """How `path` is written: "stream" (`-`, FIFO, character device: written to in place),
    "replace" (a regular file or a new path: replaced atomically; symlinks are followed).
    UserError (exit 2) for anything else (a folder, socket, block device, missing folder)."""
    if path == "-":
        return "stream"
    if path == "":
        raise UserError("an output path is empty")
    try:
        st = os.stat(path)  # follows symlinks
    except FileNotFoundError:
        real = os.path.realpath(path)  # a new file, or a dangling symlink's target
        folder = os.path.dirname(real) or "."
        if not os.path.isdir(folder):
            raise UserError(f"{path}: cannot write file: folder {folder} does not exist"
                            ) from None
        _check_folder(path, folder)
        return "replace"
    except OSError as exc:
        raise UserError(f"{path}: cannot write file: {exc.strerror or exc}") from None
    if os.path.abspath(path).startswith(_SYSTEM) or os.path.realpath(path).startswith(_SYSTEM):
        # /dev/stdout, /dev/fd/N, /proc/self/fd/N: write through them, never replace them
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{path}: cannot write file: it is a folder")
        return "stream"
    mode = st.st_mode
    if stat.S_ISREG(mode):
        _check_folder(path, os.path.dirname(os.path.realpath(path)) or ".")
        return "replace"
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return "stream"
    what = ("a folder" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a block device" if stat.S_ISBLK(mode) else "not a regular file")
    raise UserError(f"{path}: cannot write file: it is {what}")


def _check_folder(path: str, folder: str) -> None:
    """A replaced file's folder must take a new entry (the temporary file): checked before any
    work, so a read-only folder fails at once, not after a long measurement or search."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{path}: cannot write file: folder {folder} is not writable")


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write `data` (text, or bytes such as a PNG) to `path` (INTERFACE.md "Output paths").

    `-` writes to stdout; FIFOs and character devices (/dev/null, /dev/stdout) are written to
    in place, never replaced; a regular file or a new path is replaced atomically (the data goes
    to a temporary file in the target's folder, which then replaces it with `os.replace`,
    keeping the old file's permission bits); a symlink is followed, so its target is replaced
    and the link stays a link. Anything else is refused. Raises UserError (exit 2) naming the
    file when it cannot be written; the target is then untouched and no temporary file is left.
    A stdout whose reader has gone (a closed pipe) takes the data silently (`PipeSafe`).
    """
    name = os.fspath(path)
    kind = _kind(name)
    if name == "-" or (kind == "stream" and is_stdout(name)):  # also /dev/stdout, /dev/fd/1
        _write_stdout(data)
        return
    if kind == "stream":
        try:
            if isinstance(data, bytes):
                with open(name, "wb") as fb:
                    fb.write(data)
            else:
                with open(name, "w", encoding="utf-8", newline="") as fh:
                    fh.write(data)
        except OSError as exc:
            raise UserError(f"{name}: cannot write file: {exc.strerror or exc}") from exc
        return
    replace_atomic(name, data)


def _write_stdout(data: str | bytes) -> None:
    try:
        if isinstance(data, str):
            sys.stdout.write(data)
            sys.stdout.flush()
            return
        sys.stdout.flush()
        buf = getattr(sys.stdout, "buffer", None)
        if buf is None:
            raise UserError("-: this stdout takes no binary data; give a file")
        buf.write(data)
        buf.flush()
    except OSError as exc:
        stdout_gone(exc)


def replace_atomic(path: str, data: str | bytes) -> None:
    """Replace the regular file (or new path) `path`, following symlinks, atomically."""
    target = Path(os.path.realpath(path))
    tmp_name: str | None = None
    try:
        try:
            old_mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            old_mode = None
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                        dir=target.parent)
        with os.fdopen(fd, "wb") as fb:
            fb.write(data.encode("utf-8") if isinstance(data, str) else data)
            fb.flush()
            os.fsync(fb.fileno())
        if old_mode is None:  # a new file gets the usual 0666 & ~umask, not mkstemp's 0600
            umask = os.umask(0)
            os.umask(umask)
            old_mode = 0o666 & ~umask
        os.chmod(tmp_name, old_mode)
        os.replace(tmp_name, target)
        tmp_name = None
    except OSError as exc:
        raise UserError(f"{path}: cannot write file: {exc.strerror or exc}") from exc
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)


def write_all(items: Sequence[tuple[str, str | bytes]]) -> None:
    """Write several outputs as one step: every path is checked first, so a bad one leaves
    all of them untouched; files are replaced before anything is streamed, so a reader that
    goes away early (`| head`) cannot keep a file from being written."""
    streamed = [_kind(path) == "stream" for path, _ in items]
    for _, (path, data) in sorted(zip(streamed, items, strict=True), key=lambda t: t[0]):
        write_atomic(path, data)


def plans_csv(plans: Sequence[Mapping[str, Any]]) -> str:
    """CSV text, one row per PLAN dict (best first), columns CSV_COLUMNS."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    w.writeheader()
    for rank, p in enumerate(plans, start=1):
        w.writerow(csv_row(p, rank))
    return buf.getvalue()


def csv_row(p: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """The CSV row of one PLAN dict."""
    plan = p.get("plan", {})
    mem = p.get("memory", {})
    t = p.get("time", {})
    thr = p.get("throughput", {})
    row: dict[str, Any] = {"rank": rank}
    for f in PLAN_FIELDS:
        row[f] = plan.get(f)
    row["recompute_layers"] = plan.get("recompute_layers")
    sl = plan.get("stage_layers")
    row["stage_layers"] = ":".join(map(str, sl)) if sl else ""
    row["etp"] = plan.get("etp")  # expert-TP size of a folded MoE plan; empty: = tp
    for f in ("schedule", "optimizer_offload", "activation_offload"):
        row[f] = plan.get(f)
    row["offload_s"] = t.get("offload_s") or None
    row["fits"] = p.get("fits")
    peak = mem.get("peak_bytes")
    cap = mem.get("capacity_bytes")
    row["peak_bytes"] = peak
    row["peak_gib"] = round(peak / GIB, 3) if peak is not None else None
    row["capacity_gib"] = round(cap / GIB, 3) if cap is not None else None
    row["step_s"] = t.get("step_s")
    for f in TIME_FIELDS:
        row[f] = t.get(f)
    row["tokens_per_s"] = thr.get("tokens_per_s")
    row["tokens_per_s_per_gpu"] = thr.get("tokens_per_s_per_gpu")
    row["mfu"] = thr.get("mfu")
    for name, d, key in (("step_s", t, "step_s_interval"),
                         ("tokens_per_s_per_gpu", thr, "tokens_per_s_per_gpu_interval"),
                         ("peak_bytes", mem, "peak_bytes_interval")):
        iv = d.get(key)
        row[f"{name}_lo"], row[f"{name}_hi"] = (iv[0], iv[1]) if iv else (None, None)
    row["fixed_s"] = t.get("fixed_s")  # calibrated fixed time per step
    row["oom_risk"] = mem.get("oom_risk")
    row["near_capacity"] = mem.get("near_capacity")
    row["beyond_evidence"] = (p.get("evidence") or {}).get("beyond_evidence")
    return row


def result_json(
    status: str, solve_time_s: float, space_size: Any, plans: Sequence[Mapping[str, Any]],
    space: Mapping[str, Any] | None = None,
) -> str:
    """The solve/enumerate JSON document of INTERFACE.md: its four keys, and `space` (the axes
    and values the search, and so its proof, covered: `SearchSpace.describe`) when given."""
    doc: dict[str, Any] = {"status": status, "solve_time_s": solve_time_s,
                           "space_size": space_size, "plans": list(plans)}
    if space is not None:
        doc["space"] = dict(space)
    return json.dumps(doc, indent=2, default=_json_default) + "\n"


def plan_json(plan: Mapping[str, Any]) -> str:
    """One PLAN as JSON text (the `evaluate --json` document)."""
    return json.dumps(plan, indent=2, default=_json_default) + "\n"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
