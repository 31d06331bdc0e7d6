"""The one output rule (outputs.check_paths) on every command that writes files, fuzzed: no
output replaces an input of the same command, however the path is spelled (another spelling, a
symlink, a hard link); `-`, FIFOs and character devices are streamed to, symlinks followed, for
`--plot`, `measure --out` and `calibrate --out` too; a bad output path fails before any work."""

from __future__ import annotations

import os
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoparallel_cp import outputs
from autoparallel_cp.cli import main
from autoparallel_cp.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
JOB = ["--gpus", "8", "--seq-len", "2048", "--global-batch", "32"]
RUNS = ("model,cluster,gpus,seq_len,global_batch,recipe,plan,step_s,peak_gib\n"
        'llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8,mbs=1",6.1,\n'
        'llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=2,mbs=1,zero=1",5.1,\n')


def run(*args: str) -> Any:
    res = CliRunner().invoke(main, list(args))
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def inputs(folder: Path) -> dict[str, Path]:
    """An input file for every input option: a model spec, a cluster, a recipe, a calibration
    file and a runs CSV (their contents are never read: the rule refuses first)."""
    files = {"--model": folder / "model.yaml", "--cluster": folder / "cluster.yaml",
             "--recipe": folder / "recipe.yaml", "--calibration": folder / "calib.yaml",
             "--runs": folder / "runs.csv"}
    shutil.copy(ROOT / "models" / "llama2-7b.yaml", files["--model"])
    shutil.copy(ROOT / "clusters" / "dgx-h100.yaml", files["--cluster"])
    files["--recipe"].write_text("name: my-recipe\n")
    files["--calibration"].write_text("format: ap-solve-calibration\nversion: 1\n")
    files["--runs"].write_text(RUNS)
    return files


def command(name: str, f: dict[str, Path]) -> list[str]:
    """`name` reading every input of `f` it takes, before its output options."""
    job = ["--model", str(f["--model"]), "--cluster", str(f["--cluster"]), *JOB,
           "--recipe", str(f["--recipe"]), "--calibration", str(f["--calibration"])]
    return {"solve": ["solve", *job, "--emit", "megatron"],
            "enumerate": ["enumerate", *job, "--emit", "megatron"],
            "evaluate": ["evaluate", *job, "--plan", "tp=2", "--emit", "megatron"],
            "explain": ["explain", *job, "--plan", "tp=2"],
            "whatif": ["whatif", "--model", str(f["--model"]), "--cluster",
                       f"dgx-a100,{f['--cluster']}", "--recipe", str(f["--recipe"]),
                       "--calibration", str(f["--calibration"])],
            "calibrate": ["calibrate", "--runs", str(f["--runs"]), "--model",
                          str(f["--model"]), "--cluster", str(f["--cluster"]), "--recipe",
                          str(f["--recipe"])]}[name]


OUTPUTS = {"solve": ["--json", "--csv", "--emit-out", "--trace", "--html"],
           "enumerate": ["--json", "--csv", "--emit-out", "--trace", "--html"],
           "evaluate": ["--json", "--emit-out", "--trace", "--html"],
           "explain": ["--json", "--trace", "--html"],
           "whatif": ["--json", "--csv", "--plot", "--html"], "calibrate": ["--out"]}
INPUTS = {"calibrate": ["--runs", "--model", "--cluster", "--recipe"]}
JOB_INPUTS = ["--model", "--cluster", "--recipe", "--calibration"]


def spell(path: Path, how: str, tmp: Path) -> str:
    """Another way to name `path`: relative with `./`, through `sub/..`, a symlink, a chain of
    two symlinks, a hard link."""
    if how == "same":
        return str(path)
    if how == "dot":
        return os.path.relpath(path)
    if how == "detour":
        (tmp / "sub").mkdir(exist_ok=True)
        return str(tmp / "sub" / ".." / "." / path.name)
    if how == "symlink":
        link = tmp / f"link-{path.name}"
        link.unlink(missing_ok=True)
        link.symlink_to(path)
        return str(link)
    if how == "chain":
        a, b = tmp / f"a-{path.name}", tmp / f"b-{path.name}"
        for x in (a, b):
            x.unlink(missing_ok=True)
        a.symlink_to(path)
        b.symlink_to(a)
        return str(b)
    hard = tmp / f"hard-{path.name}"
    hard.unlink(missing_ok=True)
    os.link(path, hard)
    return str(hard)


CASES = [(c, o, i) for c, outs in OUTPUTS.items() for o in outs
         for i in INPUTS.get(c, JOB_INPUTS)]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES),
       how=st.sampled_from(["same", "dot", "detour", "symlink", "chain", "hard"]))
def test_no_output_replaces_an_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     case: tuple[str, str, str], how: str) -> None:
    cmd, out_opt, in_opt = case
    folder = tmp_path / f"{cmd}{out_opt}{in_opt}{how}"
    folder.mkdir()
    monkeypatch.chdir(folder)
    f = inputs(folder)
    before = {k: p.read_bytes() for k, p in f.items()}
    listing = sorted(os.listdir(folder))
    res = run(*command(cmd, f), out_opt, spell(f[in_opt], how, folder))
    assert res.exit_code == 2, res.output
    assert f"{out_opt} " in res.stderr and f"the input {in_opt} " in res.stderr, res.stderr
    assert "never replaces an input" in res.stderr and len(res.stderr.splitlines()) == 1
    assert {k: p.read_bytes() for k, p in f.items()} == before
    assert all(not n.endswith(".tmp") for n in os.listdir(folder)), os.listdir(folder)
    assert set(listing) <= set(os.listdir(folder))


def test_a_folder_input_protects_its_config_json(tmp_path: Path) -> None:
    """A Hugging Face model given as a folder reads its config.json: that file is an input."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(UserError, match="the input --model"):
        outputs.check_paths({"--model": f"hf:{hf}"}, {"--json": str(hf / "config.json")})
    outputs.check_paths({"--model": str(hf)}, {"--json": str(hf / "out.json")})


def test_streams_are_not_inputs_and_presets_are_not_files(tmp_path: Path) -> None:
    """/dev/null as input and output replaces nothing; a preset name is no file."""
    outputs.check_paths({"--model": os.devnull}, {"--json": os.devnull})
    outputs.check_paths({"--model": "llama3-8b", "--cluster": ["dgx-h100", "dgx-a100"]},
                        {"--json": str(tmp_path / "llama3-8b")})


def test_read_only_folder_fails_before_any_work(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = run("solve", "-m", "gpt3-1.3b", "-c", "dgx-h100", *JOB, "--json",
                  str(ro / "x.json"))
        assert res.exit_code == 2 and "not writable" in res.stderr
    finally:
        ro.chmod(0o755)


# ------------------------------------------------------------------ --plot and special files

WHATIF = ["whatif", "-m", "gpt3-1.3b", "-c", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
          "--global-batch", "32", "--fix", "pp=1,cp=1,vpp=1", "--time-limit", "5", "-j", "1",
          "-q"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def fifo_bytes(tmp_path: Path) -> Any:
    """A FIFO with a reader thread collecting what is written to it."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    yield fifo, got, t
    if t.is_alive():
        with open(fifo, "wb"):
            pass
        t.join(timeout=5)


def test_plot_streams_to_a_fifo(fifo_bytes: Any) -> None:
    pytest.importorskip("matplotlib")
    fifo, got, t = fifo_bytes
    res = run(*WHATIF, "--plot", str(fifo))
    assert res.exit_code == 0, res.output
    t.join(timeout=10)
    assert fifo.is_fifo() and got and got[0].startswith(PNG)


def test_plot_follows_a_symlink_and_streams_to_devices(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "real.png"
    target.write_bytes(b"old")
    link = tmp_path / "plot.png"
    link.symlink_to(target)
    res = run(*WHATIF, "--plot", str(link), "--csv", os.devnull)
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and target.read_bytes().startswith(PNG)
    res = run(*WHATIF, "--plot", os.devnull)
    assert res.exit_code == 0 and Path(os.devnull).is_char_device()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "real.png"]


def test_plot_to_stdout_moves_the_report_to_stderr() -> None:
    pytest.importorskip("matplotlib")
    res = CliRunner().invoke(main, [*WHATIF, "--plot", "-"])
    assert res.exit_code == 0, res.output
    assert res.stdout_bytes.startswith(PNG) and b"what-if" not in res.stdout_bytes


# ---------------------------------------------------------------------------- measure --out


@pytest.fixture
def fake_measure(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`measure` with its measurement replaced by one that writes a fixed CSV through the
    writer the CLI passes (and a stand-in torch module when torch is not installed)."""
    import autoparallel_cp.calibrate.measure as m

    calls: list[str] = []

    def fake_run(s: Any, out: str, *args: Any,
                 write: Callable[[str, str], None] | None = None) -> None:
        calls.append(out)
        assert write is outputs.write_atomic
        write(out, "kind,time_s\ngemm,1.0\n")

    monkeypatch.setattr(m, "run", fake_run)
    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:
            monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    return calls


MEASURE = ["measure", "--cluster", "dgx-h100", "--cpu", "--out"]


def test_measure_out_follows_the_rule(tmp_path: Path, fake_measure: list[str],
                                      fifo_bytes: Any) -> None:
    fifo, got, t = fifo_bytes
    assert run(*MEASURE, str(fifo)).exit_code == 0
    t.join(timeout=10)
    assert fifo.is_fifo() and got == [b"kind,time_s\ngemm,1.0\n"]
    target = tmp_path / "rows.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert run(*MEASURE, str(link)).exit_code == 0
    assert link.is_symlink() and target.read_text() == "kind,time_s\ngemm,1.0\n"
    assert run(*MEASURE, os.devnull).exit_code == 0 and Path(os.devnull).is_char_device()


def test_measure_out_dash_is_stdout(tmp_path: Path, fake_measure: list[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = run(*MEASURE, "-")
    assert res.exit_code == 0 and res.stdout == "kind,time_s\ngemm,1.0\n"
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("where", ["folder", "missing/x.csv", "cluster"])
def test_measure_bad_out_fails_before_measuring(tmp_path: Path, fake_measure: list[str],
                                                where: str) -> None:
    (tmp_path / "folder").mkdir()
    cluster = tmp_path / "cluster.yaml"
    shutil.copy(ROOT / "clusters" / "dgx-h100.yaml", cluster)
    res = run("measure", "--cluster", str(cluster), "--cpu", "--out",
              str(cluster if where == "cluster" else tmp_path / where))
    assert res.exit_code == 2 and len(res.stderr.splitlines()) == 1, res.output
    assert fake_measure == [] and not list(tmp_path.rglob("*.tmp"))


# ----------------------------------------------------------------------------- calibrate --out


def test_calibrate_out_dash_puts_only_the_yaml_on_stdout(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    res = run("calibrate", "--runs", str(runs), "--out", "-", "-q")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("format: ap-solve-calibration")
    assert "calibration from" not in res.stdout and "calibration from 2 runs" in res.stderr
