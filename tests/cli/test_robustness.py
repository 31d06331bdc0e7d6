"""Issue 11, the CLI half: output paths, collisions, NaN/inf options, time-outs, structural
pins, ASCII terminals, Ctrl-C, and a hypothesis fuzz over hostile option values.

Every run asserts the INTERFACE.md contract: exit code in {0, 1, 2, 3, 130}, no traceback,
existing output files byte-identical after a failure or an interrupt, special files untouched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel_cp.cli import main
from autoparallel_cp.outputs import SafeText

ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = {0, 1, 2, 3, 130}
SMALL = ["--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "32"]
NARROW = ["--fix", "pp=1,cp=1,vpp=1", "--quiet"]
PLAN = ["--plan", "tp=2,mbs=1,zero=1"]


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args))
    out = result.output
    assert "Traceback" not in out, out
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"raised {result.exception!r}: {out}")
    assert result.exit_code in EXIT_CODES, (result.exit_code, out)
    return result


def snapshot(folder: Path) -> dict[str, Any]:
    """What every entry of `folder` is: kind, link target, bytes of regular files."""
    out: dict[str, Any] = {}
    for p in sorted(folder.iterdir()):
        st_ = os.lstat(p)
        if stat.S_ISLNK(st_.st_mode):
            out[p.name] = ("link", os.readlink(p))
        elif stat.S_ISREG(st_.st_mode):
            out[p.name] = ("file", p.read_bytes())
        else:
            out[p.name] = ("special", stat.S_IFMT(st_.st_mode))
    return out


@pytest.fixture
def fifo_reader(tmp_path: Path) -> Iterator[tuple[Path, list[bytes]]]:
    """A FIFO with a thread that reads whatever is written to it, until the test ends."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            with open(fifo, "rb") as fh:
                got.append(fh.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    yield fifo, got
    done.set()
    with open(fifo, "wb"):  # unblock the reader's open
        pass
    t.join(timeout=5)


# ------------------------------------------------------------------------------ output paths


def test_symlink_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)
    r = invoke("evaluate", *SMALL, *PLAN, "--json", str(link), "--quiet")
    assert r.exit_code == 0
    assert link.is_symlink() and os.readlink(link) == target.name
    assert json.loads(target.read_text())["plan"]["tp"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_fifo_is_streamed_to_not_replaced(fifo_reader: tuple[Path, list[bytes]]) -> None:
    fifo, got = fifo_reader
    r = invoke("evaluate", *SMALL, *PLAN, "--json", str(fifo), "--quiet")
    assert r.exit_code == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert json.loads(got[0])["plan"]["tp"] == 2


def test_dev_null_is_streamed_to() -> None:
    r = invoke("evaluate", *SMALL, *PLAN, "--json", "/dev/null", "--quiet")
    assert r.exit_code == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_new_file_and_regular_file_keep_mode(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    out.write_text("old\n")
    out.chmod(0o640)
    assert invoke("evaluate", *SMALL, *PLAN, "--json", str(out), "--quiet").exit_code == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert json.loads(out.read_text())["fits"] in (True, False)


def test_special_files_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    with tempfile.TemporaryDirectory(dir="/tmp") as short:  # AF_UNIX paths are short
        sock_path = os.path.join(short, "s")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(sock_path)
        try:
            for bad, why in ((folder, "folder"), (sock_path, "socket"),
                             (tmp_path / "no" / "x.json", "does not exist")):
                r = invoke("evaluate", *SMALL, *PLAN, "--json", str(bad))
                assert r.exit_code == 2 and why in r.output, r.output
            assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
        finally:
            sock.close()
    assert folder.is_dir() and not list(folder.iterdir())


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_colliding_outputs_are_refused(tmp_path: Path, spelling: str) -> None:
    f = tmp_path / "out"
    f.write_text("old\n")
    other = {"same": str(f), "dot": str(tmp_path / "." / "out"), "link": str(tmp_path / "l")}
    if spelling == "link":
        (tmp_path / "l").symlink_to(f)
    before = snapshot(tmp_path)
    r = invoke("solve", *SMALL, *NARROW, "--csv", str(f), "--json", other[spelling])
    assert r.exit_code == 2 and "same file" in r.output
    r = invoke("evaluate", *SMALL, *PLAN, "--json", str(f), "--emit", "megatron",
               "--emit-out", other[spelling])
    assert r.exit_code == 2 and "same file" in r.output
    assert snapshot(tmp_path) == before


def test_new_file_collision_is_refused(tmp_path: Path) -> None:
    r = invoke("solve", *SMALL, *NARROW, "--csv", str(tmp_path / "a"),
               "--json", str(tmp_path / "sub" / ".." / "a"))
    assert r.exit_code == 2
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------ numbers, time-outs, pins


@pytest.mark.parametrize("option,value", [
    ("--tolerance", "nan"), ("--tolerance", "inf"), ("--tolerance", "-0.1"),
    ("--tolerance", "1e300"), ("--time-limit", "nan"), ("--time-limit", "inf"),
    ("--time-limit", "-inf"), ("--time-limit", "0"), ("--time-limit", "1e300"),
    ("--global-batch", str(10**15)), ("--seq-len", "1e30"), ("--top-k", "0"),
])
def test_bad_numbers_are_exit_2(option: str, value: str) -> None:
    r = invoke("solve", *SMALL, *NARROW, option, value)
    assert r.exit_code == 2, r.output
    assert option in r.output


@pytest.mark.parametrize("option,value", [
    ("--tokens", "nan"), ("--tokens", "inf"), ("--tokens", "0"),
    ("--inter-node-gbps", "nan"), ("--inter-node-gbps", "50,inf"), ("--gpus", "8,0"),
])
def test_whatif_bad_numbers_are_exit_2(option: str, value: str) -> None:
    r = invoke("whatif", "-m", "gpt3-1.3b", "-c", "dgx-h100", "--gpus", "8", option, value)
    assert r.exit_code == 2, r.output


def test_timeout_is_exit_3_with_status_timeout(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget spent before the first plan: exit 3, status timeout. The search now scores its
    first key within any positive --time-limit (the key's model gets CP-SAT's least budget), so
    the deterministic budget is made empty (0 deterministic seconds per second)."""
    from autoparallel_cp.search import limits

    monkeypatch.setattr(limits, "DTIME_PER_SECOND", 0.0)
    out = tmp_path / "r.json"
    out.write_text("old\n")
    r = invoke("solve", "-m", "llama3-70b", "-c", "mixed-h100-a100", "--time-limit", "0.01",
               "--json", str(out), "--quiet")
    assert r.exit_code == 3, r.output
    assert "time limit" in r.output and "not proven" in r.output
    assert "status feasible" not in r.output
    doc = json.loads(out.read_text())
    assert doc["status"] == "timeout" and doc["plans"] == []


def test_infeasible_is_exit_1_and_leaves_outputs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text("old\n")
    r = invoke("solve", "-m", "llama3-405b", "-c", "dgx-h100", "--gpus", "8", "--json",
               str(out), "--quiet")
    assert r.exit_code == 1
    assert out.read_text() == "old\n"


@pytest.mark.parametrize("pin,why", [
    ("stage_layers=1:1", "the model has 24"), ("stage_groups=5", "node groups 0..0"),
    ("pp=2,stage_layers=12:6:6", "3 stages for pp=2"), ("zero=7", "ZeRO stages are 0..3"),
])
def test_structurally_impossible_pins_say_why(pin: str, why: str) -> None:
    r = invoke("solve", *SMALL, "--fix", pin, "--quiet")
    assert r.exit_code == 2, r.output
    assert why in r.output
    assert "more GPUs" not in r.output


# ----------------------------------------------------------------------------- encodings


def test_safe_text_falls_back_to_ascii() -> None:
    import io

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    SafeText(stream).write("step \u2264 1 s \u2192 tp\u00d72 \u2500\u2502 \u00e9\n")
    stream.flush()
    assert raw.getvalue() == b"step <= 1 s -> tpx2 -| ?\n"


def test_ascii_terminal_gets_tables_without_traceback() -> None:
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "autoparallel_cp.cli", "solve", *SMALL,
                        *NARROW], capture_output=True, env=env, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert b"Traceback" not in p.stderr
    p.stdout.decode("ascii")
    assert b"recommended" in p.stdout


def test_wall_clock_net_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoparallel_cp.search import limits

    monkeypatch.setattr(limits, "WALL_FACTOR", 0.0)
    monkeypatch.setattr(limits, "WALL_SLACK_S", 0.0)
    r = invoke("solve", *SMALL, "--quiet")
    assert r.exit_code in (0, 3), r.output
    assert "wall-clock safety net" in r.output


# ------------------------------------------------------------------------------- Ctrl-C


#: searches that run well past the SIGINT at 3 s on 2 cores (the 405B top 5 now ends in about
#: 2.5 s with start-up; its top 100 takes about 20 s, each mixtral-8x7b point 10-17 s)
#: Commands that run well past the 3 s at which the test interrupts them (idle 2-core machine,
#: session 7: the solve about 18 s, the 45-point sweep about 18 s; the searches got faster
#: twice, and a command that ends before the signal cannot test it).
CTRL_C = {
    "solve": ["solve", "-m", "llama3-405b", "-c", "dgx-h100", "--gpus", "16384", "--seq-len",
              "8192", "--global-batch", "2048", "--time-limit", "300", "--top-k", "300"],
    "whatif": ["whatif", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus",
               "1024,2048,4096,8192,16384", "--seq-len", "4096,8192,16384", "--global-batch",
               "2048,4096,8192", "--time-limit", "300", "-j", "2"],
}


@pytest.mark.serial  # exit within 10 s of the signal (pyproject.toml)
@pytest.mark.parametrize("command", sorted(CTRL_C))
def test_ctrl_c_stops_and_leaves_outputs(tmp_path: Path, command: str) -> None:
    """SIGINT 3 s into a long search: exit 130 promptly, "interrupted", files untouched."""
    old_json = tmp_path / "old.json"
    old_json.write_text('{"old": true}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "autoparallel_cp.cli", *CTRL_C[command],
           "--json", str(old_json), "--csv", str(tmp_path / "new.csv")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    time.sleep(3.0)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert p.returncode == 130, err
    assert b"interrupted" in err and b"Traceback" not in err
    assert old_json.read_text() == '{"old": true}\n'
    assert sorted(x.name for x in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.serial
def test_ctrl_c_while_importing_is_exit_130() -> None:
    """A Ctrl-C that lands while the solver's libraries import (a busy machine) is exit 130 with
    "interrupted", not a traceback: an import hook raises KeyboardInterrupt at OR-Tools' import."""
    hook = ("import sys\n"
            "class Stop:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'ortools':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Stop())\n"
            "import runpy\n"
            "sys.argv = ['ap-solve', 'models']\n"
            "runpy.run_module('autoparallel_cp.cli', run_name='__main__')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", hook], capture_output=True, env=env, cwd=ROOT,
                       timeout=120)
    assert p.returncode == 130, p.stderr
    assert b"interrupted" in p.stderr and b"Traceback" not in p.stderr


# -------------------------------------------------------------------------------- fuzzing

HOSTILE_NUMBERS = ["nan", "NaN", "inf", "-inf", "+inf", "1e308", "1e-308", "-1", "0", "-0",
                   "0.0", "1e30", str(2**63), str(10**15), "0x10", "1_000", "", " ", "1,2",
                   "\u221e", "\u0661", "1e", "--", "-", "8", "3"]
HOSTILE_TEXT = ["", "-", "nope", "\u00fc.yaml", "../../etc/passwd", "x" * 300, "a=b", "=",
                "tp=0", "tp=8,tp=4", "stage_groups=5", "stage_layers=1:1", "tp=-1", "mbs=0",
                "pp=1,cp=1,vpp=1", "recompute=sometimes", "tp=1e9", "zero=9"]


def _path_choices(tmp: Path) -> list[str]:
    return [str(tmp / "out.json"), str(tmp / "out.csv"), str(tmp / "link"), str(tmp / "pipe"),
            str(tmp / "d"), str(tmp / "new.json"), str(tmp / "missing" / "x"), "-",
            "/dev/null", ""]


SEARCH_OPTIONS = {
    "--gpus": HOSTILE_NUMBERS, "--seq-len": HOSTILE_NUMBERS,
    "--global-batch": HOSTILE_NUMBERS, "--top-k": HOSTILE_NUMBERS,
    "--tolerance": HOSTILE_NUMBERS, "--time-limit": HOSTILE_NUMBERS,
    "--workers": HOSTILE_NUMBERS, "--objective": HOSTILE_TEXT + ["cost", "throughput"],
    "--recipe": HOSTILE_TEXT + ["megatron-bf16"], "--fix": HOSTILE_TEXT,
    "--model": HOSTILE_TEXT + ["gpt3-1.3b"], "--cluster": HOSTILE_TEXT + ["dgx-h100"],
}
OUTPUT_OPTIONS = ("--json", "--csv", "--emit-out")


@pytest.fixture(scope="module")
def playground() -> Iterator[Path]:
    """Existing outputs, a symlink, a FIFO (with a reader) and a folder, shared by the fuzz."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "out.json").write_text('{"keep": 1}\n')
        (tmp / "out.csv").write_text("keep\n")
        (tmp / "target").write_text("target\n")
        (tmp / "link").symlink_to("target")
        (tmp / "d").mkdir()
        os.mkfifo(tmp / "pipe")
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                with open(tmp / "pipe", "rb") as fh:
                    fh.read()

        t = threading.Thread(target=read, daemon=True)
        t.start()
        yield tmp
        done.set()
        with open(tmp / "pipe", "wb"):
            pass
        t.join(timeout=5)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_cli_options(playground: Path, data: Any) -> None:
    tmp = playground
    command = data.draw(st.sampled_from(["solve", "enumerate", "evaluate"]), label="command")
    args = {"--model": "gpt3-1.3b", "--cluster": "dgx-h100", "--gpus": "8",
            "--seq-len": "2048", "--global-batch": "32", "--fix": "pp=1,cp=1,vpp=1"}
    for opt in data.draw(st.lists(st.sampled_from(sorted(SEARCH_OPTIONS)), max_size=3,
                                  unique=True), label="hostile"):
        args[opt] = data.draw(st.sampled_from(SEARCH_OPTIONS[opt]), label=opt)
    if command == "evaluate":
        args["--plan"] = args.pop("--fix")
        for k in ("--top-k", "--tolerance", "--time-limit", "--workers", "--objective"):
            args.pop(k, None)
    elif command == "enumerate":
        args.pop("--time-limit", None)
        args.pop("--workers", None)
    outs = data.draw(st.lists(st.sampled_from(OUTPUT_OPTIONS), max_size=2, unique=True),
                     label="outputs")
    for opt in outs:
        if command == "evaluate" and opt == "--csv":
            continue
        args[opt] = data.draw(st.sampled_from(_path_choices(tmp)), label=opt)
    if "--emit-out" in args:
        args["--emit"] = "megatron"
    argv = [command] + [x for kv in args.items() for x in kv] + ["--quiet"]
    before = snapshot(tmp)
    t0 = time.monotonic()
    r = invoke(*argv)
    assert time.monotonic() - t0 < 60, argv
    after = snapshot(tmp)
    for name in ("link", "pipe", "d"):  # special files stay what they are
        assert after[name] == before[name], (name, argv)
    if r.exit_code in (1, 2, 130):
        assert after == before, argv
    (tmp / "new.json").unlink(missing_ok=True)
    for name, text in (("out.json", '{"keep": 1}\n'), ("out.csv", "keep\n"),
                       ("target", "target\n")):
        (tmp / name).write_text(text)


WHATIF_OPTIONS = {
    "--gpus": HOSTILE_NUMBERS + ["8,16", "8,8", "8,,16", "16,8,0"],
    "--seq-len": HOSTILE_NUMBERS + ["2048,4096"],
    "--global-batch": HOSTILE_NUMBERS + ["32,64"],
    "--inter-node-gbps": HOSTILE_NUMBERS + ["25,50", "1e-9", "50,nan"],
    "--tokens": HOSTILE_NUMBERS + ["15e12"], "--time-limit": HOSTILE_NUMBERS,
    "--objective": HOSTILE_TEXT + ["cost"],
    "--fix": HOSTILE_TEXT, "--cluster": HOSTILE_TEXT + ["dgx-h100,dgx-h100", "dgx-h100,"],
}


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_whatif_options(playground: Path, data: Any) -> None:
    tmp = playground
    args = {"--model": "gpt3-1.3b", "--cluster": "dgx-h100", "--gpus": "8",
            "--seq-len": "2048", "--global-batch": "32", "--fix": "pp=1,cp=1,vpp=1",
            "--jobs": "1"}  # the sweep stays in this process: bounded and fast
    for opt in data.draw(st.lists(st.sampled_from(sorted(WHATIF_OPTIONS)), max_size=3,
                                  unique=True), label="hostile"):
        args[opt] = data.draw(st.sampled_from(WHATIF_OPTIONS[opt]), label=opt)
    for opt in data.draw(st.lists(st.sampled_from(["--json", "--csv"]), max_size=2,
                                  unique=True), label="outputs"):
        args[opt] = data.draw(st.sampled_from(_path_choices(tmp)), label=opt)
    argv = ["whatif"] + [x for kv in args.items() for x in kv] + ["--quiet"]
    before = snapshot(tmp)
    t0 = time.monotonic()
    r = invoke(*argv)
    assert time.monotonic() - t0 < 60, argv
    after = snapshot(tmp)
    for name in ("link", "pipe", "d"):
        assert after[name] == before[name], (name, argv)
    if r.exit_code in (1, 2, 130):
        assert after == before, argv
    (tmp / "new.json").unlink(missing_ok=True)
    for name, text in (("out.json", '{"keep": 1}\n'), ("out.csv", "keep\n"),
                       ("target", "target\n")):
        (tmp / name).write_text(text)
