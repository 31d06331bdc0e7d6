"""RUNS.csv errors name the row and field; the CLI round trip: calibrate -> CALIB.yaml ->
--calibration on evaluate / solve, with the interval fields of INTERFACE.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from autoparallel_cp.calibrate.files import load_calibration
from autoparallel_cp.calibrate.runs import load_runs
from autoparallel_cp.cli import main
from autoparallel_cp.errors import InputError, UserError

HEADER = "model,cluster,gpus,seq_len,global_batch,recipe,plan,step_s,peak_gib\n"
GOOD = 'llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8,mbs=1",6.1,\n'


def _csv(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    p = tmp_path / "runs.csv"
    p.write_text(header + "".join(rows), encoding="utf-8")
    return p


@pytest.mark.parametrize(("row", "field", "words"), [
    ('nosuch-model,dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,\n', "model", "unknown"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=3",6.1,\n', "plan", "not legal"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",-2,\n', "step_s", "negative"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8,pp=2",6.1,\n', "plan", "16 GPUs"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8,dp=2",6.1,\n', "plan", "16 GPUs"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",,\n', "step_s", "tokens_per_s"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",abc,\n', "step_s", "not a number"),
    ('llama3-8b,dgx-h100,8,4096,64,nosuch-recipe,"tp=8",6.1,\n', "recipe", "unknown"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,-1\n', "peak_gib", "positive"),
])
def test_bad_rows_name_row_and_field(tmp_path: Path, row: str, field: str, words: str) -> None:
    with pytest.raises(InputError) as exc:
        load_runs(_csv(tmp_path, GOOD, row))
    msg = str(exc.value)
    assert "row 2" in msg and f"field '{field}'" in msg and words in msg, msg


def test_options_fill_missing_columns(tmp_path: Path) -> None:
    p = _csv(tmp_path, '8,4096,64,"tp=8,mbs=1",,1500\n',
             header="gpus,seq_len,global_batch,plan,step_s,tokens_per_s_per_gpu\n")
    runs, micro = load_runs(p, model="llama3-8b", cluster="dgx-h100")
    assert not micro and runs[0].job.model.name.startswith("llama3")
    assert runs[0].step_s == pytest.approx(4096 * 64 / (1500 * 8))
    with pytest.raises(InputError, match="field 'model'"):
        load_runs(p)
    empty = tmp_path / "empty.csv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(UserError, match="empty"):
        load_runs(empty)


def test_moe_load_imbalance_column(tmp_path: Path) -> None:
    """A MoE run's stated imbalance rides on its job (the cost it adds is the run's, not a
    knob to fit); empty means balanced; a dense run with one, or rho < 1, names the field."""
    header = "model,cluster,gpus,seq_len,global_batch,plan,step_s,moe_load_imbalance\n"
    p = _csv(tmp_path, 'mixtral-8x7b,dgx-h100,16,4096,64,"tp=2,pp=2,ep=4,mbs=1",3.9,1.5\n',
             'mixtral-8x7b,dgx-h100,16,4096,64,"tp=2,pp=2,ep=4,mbs=1",2.9,\n', header=header)
    runs, _ = load_runs(p)
    assert [r.job.moe_load_imbalance for r in runs] == [1.5, 1.0]
    for row, words in (('llama3-8b,dgx-h100,8,4096,64,"tp=8",6.1,1.2\n', "dense model"),
                       ('mixtral-8x7b,dgx-h100,16,4096,64,"tp=2,pp=2,ep=4",3.9,0.5\n',
                        ">= 1")):
        with pytest.raises(InputError) as exc:
            load_runs(_csv(tmp_path, row, header=header))
        msg = str(exc.value)
        assert "row 1" in msg and "field 'moe_load_imbalance'" in msg and words in msg, msg


def _runs_from_model(tmp_path: Path) -> Path:
    """Runs measured on a cluster 20 % slower than modelled, with a fixed 0.2 s per step."""
    from autoparallel_cp.api import as_plan, evaluate, make_job
    from autoparallel_cp.spec.calibration import Calibration

    cal = Calibration(compute={"H100-SXM5-80GB": 0.8}, per_step_s=0.2)
    rows = []
    for g, plan, gb in [(8, "tp=8,mbs=1", 64), (8, "tp=2,mbs=2", 64), (4, "tp=4,mbs=1", 32),
                        (8, "tp=4,pp=2,mbs=1", 64), (8, "tp=4,mbs=1,zero=1", 32),
                        (8, "tp=2,mbs=1,zero=1", 64), (8, "tp=8,mbs=2", 128)]:
        job = make_job("llama3-8b", "dgx-h100", gpus=g, seq_len=4096, global_batch=gb)
        ev = evaluate(job.calibrated(cal), as_plan(job, plan))
        rows.append(f'{g},4096,{gb},"{plan}",{ev.time.step_s:.6f}\n')
    return _csv(tmp_path, *rows, header="gpus,seq_len,global_batch,plan,step_s\n")


def test_cli_round_trip(tmp_path: Path) -> None:
    runs = _runs_from_model(tmp_path)
    out = tmp_path / "calib.yaml"
    r = CliRunner().invoke(main, ["calibrate", "--runs", str(runs), "--out", str(out),
                                  "--model", "llama3-8b", "--cluster", "dgx-h100", "-q"])
    assert r.exit_code == 0, r.output
    assert "residuals before" in r.output and "residuals after" in r.output
    assert "net_inter" in r.output and "not identified" in r.output
    doc = yaml.safe_load(out.read_text())
    assert doc["format"] == "ap-solve-calibration" and doc["version"] == 1
    cal = load_calibration(out)
    assert cal.compute["H100-SXM5-80GB"] == pytest.approx(0.8, abs=0.03)
    # which knobs moved, how much of each the runs determine, under which model error
    rep = doc["report"]
    assert rep["moved"] == ["compute:H100-SXM5-80GB"]
    by = {k["name"]: k for k in rep["knobs"]}
    gpu = by["compute:H100-SXM5-80GB"]
    assert gpu["moved"] and gpu["determined"] > 0.5
    assert by["net_inter"]["determined"] == 0.0 and not by["net_inter"]["moved"]
    assert 0.0 < rep["model_sigma_time"] < 0.2
    assert "runs determine" in r.output
    # the CLI assumes the model's per-configuration error (calibrate/prior.py, ~9 %): seven
    # runs of one node identify the compute factor, not the 0.2 s per step beside it
    assert doc["report"]["residuals_after"]["step_mape_pct"] < 6.0
    assert doc["report"]["residuals_after"]["step_mape_pct"] < \
        doc["report"]["residuals_before"]["step_mape_pct"] / 3
    args = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--global-batch", "64", "--json", "-"]
    plain = CliRunner().invoke(main, ["evaluate", *args, "--plan", "tp=8,mbs=1"])
    calib = CliRunner().invoke(main, ["evaluate", *args, "--plan", "tp=8,mbs=1",
                                      "--calibration", str(out)])
    assert plain.exit_code == 0 and calib.exit_code == 0, calib.output
    p0, p1 = json.loads(plain.stdout), json.loads(calib.stdout)
    assert p1["time"]["step_s"] > 1.1 * p0["time"]["step_s"]
    for d in (p0, p1):
        lo, hi = d["time"]["step_s_interval"]
        assert lo < d["time"]["step_s"] < hi
        lo, hi = d["throughput"]["tokens_per_s_per_gpu_interval"]
        assert lo < d["throughput"]["tokens_per_s_per_gpu"] < hi
        lo, hi = d["memory"]["peak_bytes_interval"]
        assert lo <= d["memory"]["peak_bytes"] <= hi
    # after calibration the interval comes from the fit residuals: narrower than the table's
    w = [d["time"]["step_s_interval"][1] / d["time"]["step_s_interval"][0] for d in (p0, p1)]
    assert w[1] < w[0]
    s = CliRunner().invoke(main, ["solve", *args[:-2], "--calibration", str(out),
                                  "--time-limit", "20", "--top-k", "2", "--json", "-", "-q"])
    assert s.exit_code == 0, s.output
    plans = json.loads(s.stdout)["plans"]
    assert plans and "step_s_interval" in plans[0]["time"]


@pytest.mark.parametrize(("text", "field"), [
    ("format: nope\n", "format"),
    ("format: ap-solve-calibration\nversion: 9\n", "version"),
    ("format: ap-solve-calibration\nversion: 1\nknobs: {net_inter: 9}\n", "knobs.net_inter"
     if False else "knobs"),
    ("format: ap-solve-calibration\nversion: 1\nknobs: {bogus: 1}\n", "knobs"),
    ("format: ap-solve-calibration\nversion: 1\nintervals: {time: [0.1, 0.2]}\n",
     "intervals.time"),
])
def test_bad_calibration_files_exit_2(tmp_path: Path, text: str, field: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    r = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                  "--gpus", "8", "--plan", "tp=8", "--calibration", str(p)])
    assert r.exit_code == 2
    assert f"field '{field}" in r.output and "Traceback" not in r.output


def test_measure_without_torch_is_a_clear_error(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: test_measure.py covers the kit")
    r = CliRunner().invoke(main, ["measure", "--cluster", "dgx-h100", "--cpu",
                                  "--out", str(tmp_path / "m.csv")])
    assert r.exit_code == 2 and "needs torch" in r.output and "Traceback" not in r.output


# --- hostile RUNS.csv (issue 32): exit 2, one line naming the file, the row and the field ------

def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["calibrate", *args, "-q"])
    return r.exit_code, r.output


@pytest.mark.parametrize(("cells", "field", "words"), [
    ("x" * 300 + ',dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,', "model", "unknown"),
    ('llama3-8b,' + "c" * 300 + ',8,4096,64,megatron-bf16,"tp=8",6.1,', "cluster", "unknown"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,1e-300', "peak_gib", "less than"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,1e300', "peak_gib", "more than"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",1e-300,', "step_s", "less than"),
    ('llama3-8b,dgx-h100,8,4096,64,megatron-bf16,"tp=8",6.1,' + "1" * 200_000, "peak_gib",
     "characters"),
    ('llama3-8b,dgx-h100,8,4096,1e30,megatron-bf16,"tp=8",6.1,', "global_batch", "more than"),
])
def test_hostile_fields_exit_2_naming_row_and_field(tmp_path: Path, cells: str, field: str,
                                                    words: str) -> None:
    p = _csv(tmp_path, GOOD, cells + "\n")
    code, out = _cli("--runs", str(p), "--out", str(tmp_path / "c.yaml"))
    assert code == 2, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert str(p) in out and "row 2" in out and f"field '{field}'" in out and words in out, out
    assert not (tmp_path / "c.yaml").exists()


def test_bom_and_crlf_are_read(tmp_path: Path) -> None:
    """A spreadsheet's "CSV UTF-8": a byte-order mark, CRLF line ends; the model column is
    read, not taken from --model."""
    p = tmp_path / "runs.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEADER + GOOD).replace("\n", "\r\n").encode())
    runs, _ = load_runs(p, model="llama3-70b")
    assert runs[0].job.model.name.startswith("llama3-8b") and runs[0].step_s == 6.1
    assert runs[0].plan.tp == 8


def test_huge_and_special_files_exit_2(tmp_path: Path) -> None:
    code, out = _cli("--runs", "/dev/zero", "--out", str(tmp_path / "c.yaml"))
    assert code == 2 and "/dev/zero" in out and "MiB" in out and "Traceback" not in out, out
    big = tmp_path / "big.csv"
    with big.open("w", encoding="utf-8") as fh:
        fh.write(HEADER + GOOD)
        fh.write("x" * (100 << 20) + "\n")  # one 100 MB line
    code, out = _cli("--runs", str(big), "--out", str(tmp_path / "c.yaml"))
    assert code == 2 and "MiB" in out and "Traceback" not in out, out


def test_misspelt_and_duplicate_columns(tmp_path: Path) -> None:
    p = _csv(tmp_path, GOOD, header=HEADER.replace("peak_gib", "peak_gb"))
    with pytest.raises(InputError, match="did you mean 'peak_gib'"):
        load_runs(p)
    p = _csv(tmp_path, GOOD.rstrip("\n") + ",x\n", header=HEADER.rstrip("\n") + ",plan\n")
    with pytest.raises(InputError, match="twice"):
        load_runs(p)


MICRO = "kind,cluster,gpu,m,k,n,dtype,gpus,gpus_per_node,size_bytes,time_s\n"


@pytest.mark.parametrize(("row", "field", "words"), [
    ("gemm,dgx-h100,H100-SXM5-80GB,1024,1024,1024,bf16,,,,nan", "time_s", "finite"),
    ("gemm,dgx-h100,H100-SXM5-80GB,1024,1024,1024,bf16,,,,inf", "time_s", "finite"),
    ("all_reduce,dgx-h100,,,,,,8,0.5,1048576,0.001", "gpus_per_node", "whole"),
    ("all_reduce,dgx-h100,,,,,,1,1,1048576,0.001", "gpus", ">= 2 processes"),
    ("all_reduce,dgx-h100,,,,,,4,8,1048576,0.001", "gpus_per_node", "more than"),
    ("gemm,dgx-h100,H100-SXM5-80GB,1e12,1024,1024,bf16,,,,0.1", "m", "outside"),
])
def test_bad_micro_rows(tmp_path: Path, row: str, field: str, words: str) -> None:
    p = _csv(tmp_path, "gemm,dgx-h100,H100-SXM5-80GB,1024,1024,1024,bf16,,,,0.001\n", row + "\n",
             header=MICRO)
    code, out = _cli("--runs", str(p), "--out", str(tmp_path / "c.yaml"))
    assert code == 2 and "Traceback" not in out, out
    assert "row 2" in out and f"field '{field}'" in out and words in out, out
