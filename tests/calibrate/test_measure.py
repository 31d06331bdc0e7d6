"""The measurement kit on the CPU (gloo, tiny sizes): its rows round-trip through calibrate.
Skipped when torch (the optional `[measure]` extra) is not installed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from autoparallel_cp.calibrate.fit import fit  # noqa: E402
from autoparallel_cp.calibrate.measure import Settings, run  # noqa: E402
from autoparallel_cp.calibrate.runs import load_runs  # noqa: E402
from autoparallel_cp.cli import main  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.serial  # two gloo ranks on a port picked free just before: no other test beside
def test_measure_rows_round_trip_through_calibrate(tmp_path: Path) -> None:
    out = tmp_path / "micro.csv"
    s = Settings(cluster="dgx-h100", gpu="H100-SXM5-80GB", hidden=64, tokens=128,
                 sizes=(65536, 1 << 20), reps=2, warmup=1, cpu=True, train_steps=2,
                 train_seq=64)
    run(s, str(out), world=2, port=_free_port())
    runs, micro = load_runs(out)
    # the training row: 2-rank data parallelism of the small decoder, its spec beside the CSV
    assert len(runs) == 1
    assert runs[0].plan.dp == 2 and runs[0].job.num_gpus == 2 and runs[0].step_s > 0
    assert runs[0].job.model.num_layers == 2 and runs[0].job.recipe.name == "pytorch-amp"
    kinds = {m.kind for m in micro}
    assert {"gemm", "all_reduce", "all_gather"} <= kinds
    assert all(float(m.fields["time_s"]) > 0 for m in micro)
    assert {m.fields["gpus"] for m in micro if m.kind != "gemm"} == {"2"}
    res = fit(runs, micro)
    assert "micro_mape_pct" in res.before and "step_mape_pct" in res.after
    calib = tmp_path / "c.yaml"
    r = CliRunner().invoke(main, ["calibrate", "--runs", str(out), "--out", str(calib), "-q"])
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(calib.read_text())["format"] == "ap-solve-calibration"


@pytest.mark.serial  # a gloo process group on a port picked free just before
def test_single_process_rows_fit_the_compute_knob(tmp_path: Path) -> None:
    """One process: GEMM rows only (a one-process collective moves no data), each naming the
    device it ran on; calibrate fits the compute knob from them."""
    out = tmp_path / "one.csv"
    s = Settings(cluster="dgx-h100", gpu="H100-SXM5-80GB", hidden=1024, tokens=1024,
                 sizes=(65536,), reps=2, warmup=1, cpu=True)
    run(s, str(out), world=1, port=_free_port())
    runs, micro = load_runs(out)
    assert not runs and {m.kind for m in micro} == {"gemm"}
    assert all(m.fields["device"].startswith("cpu:") for m in micro)
    res = fit(runs, micro)
    k = next(k for k in res.knobs if k.name == "compute:H100-SXM5-80GB")
    assert k.std is not None and k.value < 1.0  # a CPU is slower than an H100


def _measure(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["measure", "--cluster", "dgx-h100", "--out",
                                  str(tmp_path / "m.csv"), *args], env=env)
    return r.exit_code, r.output


def test_without_a_gpu_measure_needs_cpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: measure runs on it")
    code, out = _measure(tmp_path)
    assert code == 2 and "no GPU" in out and "--cpu" in out and "Traceback" not in out, out
    assert not (tmp_path / "m.csv").exists()


def test_bad_launch_settings_exit_2(tmp_path: Path) -> None:
    code, out = _measure(tmp_path, "--cpu", env={"RANK": "0", "WORLD_SIZE": "abc"})
    assert code == 2 and "WORLD_SIZE" in out and "Traceback" not in out, out
    code, out = _measure(tmp_path, "--cpu", "--sizes", "1000000000000")
    assert code == 2 and "--sizes" in out and "8 GiB" in out, out
    code, out = _measure(tmp_path, "--cpu", "--hidden", "65536", "--tokens", "1048576")
    assert code == 2 and "GiB" in out, out
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = _measure(tmp_path, "--cpu", "--world-size", "2", "--port", str(port))
    assert code == 2 and f"port {port}" in out and "Traceback" not in out, out
    assert not (tmp_path / "m.csv").exists()
