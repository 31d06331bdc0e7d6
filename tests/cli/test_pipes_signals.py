"""Pipes, closed streams, encodings and signals, as a shell user meets them: a reader of stdout
that goes away (`| head -1`) or a closed stdout (`>&-`) is no error; an ASCII-only stdout gets
ASCII; SIGINT is exit 130 and SIGTERM exit 143, one line, no traceback; a Ray sweep stops
cleanly and leaves no Ray process behind; a Ray address that is not Ray fails in bounded time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["-m", "gpt3-1.3b", "-c", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "32"]
RUNS = ("model,cluster,gpus,seq_len,global_batch,recipe,plan,step_s,peak_gib\n"
        'llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8,mbs=1",6.1,\n'
        'llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=2,mbs=1,zero=1",5.1,\n')


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "autoparallel_cp.cli", *args]


def commands(tmp: Path) -> dict[str, list[str]]:
    """One command of each kind that prints a report on stdout and writes a file."""
    runs = tmp / "runs.csv"
    runs.write_text(RUNS)
    fix = ["--fix", "pp=1,cp=1,vpp=1", "-q"]
    return {
        "solve": ["solve", *SMALL, *fix, "--json", str(tmp / "solve.json")],
        "evaluate": ["evaluate", *SMALL, "--plan", "tp=2,mbs=1", "-q", "--json",
                     str(tmp / "evaluate.json")],
        "calibrate": ["calibrate", "--runs", str(runs), "--out", str(tmp / "calib.yaml"),
                      "-q"],
        "whatif": ["whatif", *SMALL, *fix, "-j", "1", "--time-limit", "5", "--csv",
                   str(tmp / "whatif.csv")],
    }


@pytest.mark.parametrize("name", ["solve", "evaluate", "calibrate", "whatif"])
def test_a_reader_that_went_away_is_no_error(tmp_path: Path, name: str) -> None:
    """stdout is a pipe whose reader has closed it before the first write (`| head -0`; the
    same as `| head -1` once head has its line): exit 0, nothing on stderr, the file written."""
    cmd = commands(tmp_path)[name]
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(cli(*cmd), stdout=w, stderr=subprocess.PIPE, env=env(), cwd=ROOT,
                           timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0, p.stderr
    assert p.stderr == b"", p.stderr
    assert Path(cmd[cmd.index(next(o for o in cmd if o in ("--json", "--out", "--csv"))) + 1]
                ).stat().st_size > 0


def test_a_reader_that_went_away_from_dev_stdout_is_no_error(tmp_path: Path) -> None:
    """`--json /dev/stdout` is stdout too: a closed pipe there is no error either."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(cli("solve", *SMALL, "--fix", "pp=1,cp=1,vpp=1", "-q", "--json",
                               "/dev/stdout"), stdout=w, stderr=subprocess.PIPE, env=env(),
                           cwd=ROOT, timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0 and p.stderr == b"", p.stderr


def test_head_minus_one_in_a_shell(tmp_path: Path) -> None:
    """The shell's own `| head -1`, with pipefail: the pipeline's status is 0."""
    cmd = " ".join(f"'{a}'" for a in cli(*commands(tmp_path)["solve"]))
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd} | head -1"], env=env(),
                       cwd=ROOT, capture_output=True, timeout=300)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    assert len(p.stdout.splitlines()) == 1


@pytest.mark.parametrize("name", ["solve", "calibrate"])
def test_closed_stdout_is_no_error(tmp_path: Path, name: str) -> None:
    """`>&-`: Python starts with sys.stdout None; the file is still written, exit 0."""
    cmd = commands(tmp_path)[name]
    shell = " ".join(f"'{a}'" for a in cli(*cmd))
    p = subprocess.run(["bash", "-c", f"exec {shell} >&-"], env=env(), cwd=ROOT,
                       capture_output=True, timeout=300)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    out = cmd[cmd.index("--json" if name == "solve" else "--out") + 1]
    assert Path(out).stat().st_size > 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("json_out", ["-", "file"])
def test_a_full_stdout_is_exit_2_in_one_line(tmp_path: Path, json_out: str) -> None:
    """stdout that fails otherwise (`>/dev/full`: ENOSPC) is an error: exit 2, one line naming
    stdout, no traceback; a file output is still written."""
    cmd = commands(tmp_path)["solve"]
    if json_out == "-":
        cmd[cmd.index("--json") + 1] = "-"
    with open("/dev/full", "w") as full:
        p = subprocess.run(cli(*cmd), stdout=full, stderr=subprocess.PIPE, env=env(),
                           cwd=ROOT, timeout=300)
    assert p.returncode == 2, p.stderr
    assert p.stderr == b"ap-solve: error: stdout: cannot write: No space left on device\n"
    if json_out == "file":
        assert (tmp_path / "solve.json").stat().st_size > 0


def test_ascii_stdout_gets_ascii_from_calibrate(tmp_path: Path) -> None:
    cmd = commands(tmp_path)["calibrate"]
    p = subprocess.run(cli(*cmd), env={**env(), "PYTHONIOENCODING": "ascii"}, cwd=ROOT,
                       capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert b"+/- 1 sd" in p.stdout and b"Traceback" not in p.stderr


@pytest.mark.parametrize("command", [["solve", *SMALL], ["enumerate", *SMALL],
                                     ["whatif", *SMALL]])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "0.5", "-0.1"])
def test_mem_headroom_must_be_a_finite_fraction(command: list[str], value: str) -> None:
    res = CliRunner().invoke(main, [*command, "--mem-headroom", value])
    assert res.exit_code == 2, res.output
    assert "--mem-headroom" in res.stderr and "Traceback" not in res.output


# ------------------------------------------------------------------------------------ signals

LONG_SOLVE = ["solve", "-m", "llama3-405b", "-c", "dgx-h100", "--gpus", "16384", "--seq-len",
              "8192", "--global-batch", "2048", "--time-limit", "300", "--top-k", "1000", "-q"]


LONG_WHATIF = ["whatif", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus",
               "1024,2048,4096,8192,16384", "--seq-len", "4096,8192,16384", "--global-batch",
               "2048,4096", "--time-limit", "300", "-j", "2", "-q"]


@pytest.mark.serial  # exit within 10 s of the signal
@pytest.mark.parametrize("command", [LONG_SOLVE, LONG_WHATIF], ids=["solve", "whatif"])
def test_sigterm_stops_a_search_with_143(tmp_path: Path, command: list[str]) -> None:
    """SIGTERM (a scheduler's time limit, `kill`) into a long search or a local sweep: exit
    143 within seconds, one line, the output untouched, no point process left running."""
    old = tmp_path / "old.json"
    old.write_text("{}\n")
    p = subprocess.Popen(cli(*command, "--json", str(old)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env(), cwd=ROOT)
    tree = Tree(p)
    if command is LONG_WHATIF:  # the sweep's point processes have started
        assert wait_for(lambda: len(tree.seen) >= 2, 120), tree.seen
    time.sleep(4.0)
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert p.returncode == 143, err
    # (on a loaded machine the signal may still land while the libraries import)
    assert err.startswith(b"ap-solve: terminated") and err.count(b"\n") == 1, err
    assert old.read_text() == "{}\n"
    assert wait_for(lambda: tree.left() == [], 10), tree.left()


@pytest.mark.serial
def test_ctrl_c_during_validate_is_130_without_traceback() -> None:
    """A terminal's Ctrl-C goes to the whole foreground process group: the benchmark runs in
    its own session, so only ap-solve gets it, ends the benchmark and exits 130."""
    # --cv: the leave-one-source-out pass takes minutes (the plain table ends in about 3 s)
    p = subprocess.Popen(cli("validate", "--", "--cv"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env(), cwd=ROOT, start_new_session=True)
    time.sleep(4.0)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err
    assert err.strip().endswith(b"ap-solve: interrupted (no output file written)")


# ------------------------------------------------------------------------------------ Ray

def descendants(root: int) -> dict[int, str]:
    """Every process below `root` (`ps`), pid -> command line."""
    out = subprocess.run(["ps", "-e", "-ww", "-o", "pid=,ppid=,args="], capture_output=True,
                         text=True, check=True).stdout
    kids: dict[int, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2:
            kids.setdefault(int(parts[1]), []).append(
                (int(parts[0]), parts[2] if len(parts) > 2 else ""))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, args in kids.get(todo.pop(), []):
            found[pid] = args
            todo.append(pid)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Tree:
    """The processes a command starts, watched until it exits (Ray's start Ray's GCS, raylet,
    agents and workers below the driver; orphans keep their pid)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc, self.seen = proc, {}  # type: dict[int, str]
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.seen.update(descendants(self.proc.pid))
            time.sleep(0.05)

    def has(self, word: str) -> bool:
        return any(word in a for a in list(self.seen.values()))

    def left(self) -> list[str]:
        self._t.join(timeout=10)
        return [f"{pid} {a}" for pid, a in self.seen.items() if alive(pid)]


RAY_SWEEP = ["whatif", "-m", "mixtral-8x7b", "-c", "dgx-h100", "--gpus",
             "1024,2048,4096,8192,16384", "--seq-len", "4096,8192,16384", "--global-batch",
             "2048,4096", "--time-limit", "300", "-j", "2", "--backend", "ray", "-q"]


def wait_for(pred: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.serial  # starts a local Ray runtime and watches its processes
@pytest.mark.parametrize(("sig", "when", "code", "group"), [
    (signal.SIGINT, "starting", 130, False), (signal.SIGINT, "running", 130, False),
    (signal.SIGTERM, "starting", 143, False), (signal.SIGTERM, "running", 143, False),
    (signal.SIGINT, "starting", 130, True)])
def test_signals_end_a_ray_sweep_cleanly(tmp_path: Path, sig: int, when: str, code: int,
                                         group: bool) -> None:
    """The signal while Ray starts (its GCS is up) or while tasks run, to the driver or, as a
    terminal's Ctrl-C, to its whole process group (Ray's processes too): exit 130 / 143 with
    one line, no traceback and no C++ stack dump, the output untouched, and none of the
    processes the sweep started (GCS, raylet, agents, workers, all counted) left running."""
    pytest.importorskip("ray")
    old = tmp_path / "old.json"
    old.write_text("{}\n")
    e = env()
    e.pop("RAY_ADDRESS", None)
    p = subprocess.Popen(cli(*RAY_SWEEP, "--json", str(old)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=e, cwd=ROOT, start_new_session=group)
    tree = Tree(p)
    try:
        assert wait_for(lambda: tree.has("gcs_server") or p.poll() is not None, 120)
        assert p.poll() is None, p.communicate()[1]
        if when == "running":
            assert wait_for(lambda: tree.has("ray::_ray_call"), 120), tree.seen
            time.sleep(2.0)
        sent = time.monotonic()
        if group:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert time.monotonic() - sent < 60
    assert p.returncode == code, err
    word = b"terminated" if code == 143 else b"interrupted"
    assert err.strip() == b"ap-solve: " + word + b" (no output file written)", err
    assert old.read_text() == "{}\n"
    assert len(tree.seen) >= 3, tree.seen  # GCS, raylet and more were counted
    assert wait_for(lambda: tree.left() == [], 15), tree.left()


class _Http(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.serial  # a local HTTP server on a free port
def test_a_ray_address_that_is_not_ray_fails_fast() -> None:
    """A service that is not a Ray GCS (here HTTP) on host:port: exit 2 within seconds, one
    line; `ray.init` itself hung there, deaf to SIGTERM."""
    pytest.importorskip("ray")
    srv = HTTPServer(("127.0.0.1", 0), _Http)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        port = srv.server_address[1]
        t0 = time.monotonic()
        p = subprocess.run(cli(*RAY_SWEEP, "--address", f"127.0.0.1:{port}"),
                           capture_output=True, env=env(), cwd=ROOT, timeout=120)
        assert time.monotonic() - t0 < 60
    finally:
        srv.shutdown()
    assert p.returncode == 2, p.stderr
    assert p.stderr.count(b"\n") == 1 and b"no Ray cluster (GCS) answers" in p.stderr


@pytest.mark.parametrize("address", [":", "host", "host:", ":80", "h:99999", "h:x",
                                     "ray://", "ray://:1"])
def test_malformed_ray_addresses_are_one_line(address: str) -> None:
    pytest.importorskip("ray")
    res = CliRunner().invoke(main, [*RAY_SWEEP, "--address", address])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.stderr.splitlines()) == 1
    assert "expected host:port" in res.stderr


def test_stop_watcher_maps_sigterm_to_143_and_restores_the_handlers() -> None:
    """In-process: inside the watcher SIGTERM raises KeyboardInterrupt and stops CP-SAT
    (`limits` records a stop); outside, the handlers are the ones from before."""
    from autoparallel_cp.cli import signals
    from autoparallel_cp.search import limits

    before = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    with pytest.raises(KeyboardInterrupt), signals.stop_watcher():
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(lambda: limits._STOP.is_set(), 5)  # the wakeup-fd thread saw it
        time.sleep(1.0)  # the handler runs between bytecodes: it has raised by now
    assert signals.exit_code() == 143 and signals.message() == "terminated"
    assert {s: signal.getsignal(s) for s in signals.STOP_SIGNALS} == before
    limits.reset()


def test_a_bad_ray_address_from_the_environment_names_ray_address() -> None:
    pytest.importorskip("ray")
    res = CliRunner().invoke(main, RAY_SWEEP, env={"RAY_ADDRESS": "nohost:"})
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("ap-solve: error: RAY_ADDRESS 'nohost:': expected host:port")


@pytest.mark.serial  # a local socket on a free port
def test_sigterm_ends_the_ray_address_probe_at_once() -> None:
    """A port that accepts and never answers: the probe would wait its 10 s; SIGTERM while
    it waits ends the command at once with 143."""
    import socket

    pytest.importorskip("ray")
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        p = subprocess.Popen(cli(*RAY_SWEEP, "--address", f"127.0.0.1:{port}"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), cwd=ROOT)
        srv.settimeout(120)
        conn, _ = srv.accept()  # the probe has connected
        with conn:
            time.sleep(0.5)
            sent = time.monotonic()
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=60)
    assert time.monotonic() - sent < 5
    assert p.returncode == 143, err
    assert err.strip() == b"ap-solve: terminated (no output file written)"


@pytest.mark.serial  # timing: the signal lands while the libraries import or click parses
@pytest.mark.parametrize("delay", [1.0, 2.0, 3.0])
def test_sigterm_before_the_command_runs_is_143(delay: float) -> None:
    """SIGTERM in the first seconds (imports, option parsing, the search starting): 143 and
    one "terminated" line wherever it lands, never the default death or a traceback."""
    p = subprocess.Popen(cli(*LONG_SOLVE), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env(), cwd=ROOT)
    time.sleep(delay)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    assert err.startswith(b"ap-solve: terminated") and err.count(b"\n") == 1, err
