"""Hostile calibration files (issue 32): the spec loaders' guards, known keys only, bounded
numbers; "calibrated" names only what applies to the job; `calibrate --out -`; a partial
recompute count beyond a stage's layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoparallel_cp.api import make_job
from autoparallel_cp.calibrate.files import load_calibration
from autoparallel_cp.cli import main
from autoparallel_cp.cli.calibration_options import calibration_scope
from autoparallel_cp.errors import InputError
from autoparallel_cp.spec.calibration import Calibration

HEAD = "format: ap-solve-calibration\nversion: 1\n"
EVAL = ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
        "--global-batch", "64", "--plan", "tp=8,mbs=1"]


def _run(path: Path | str, *extra: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, [*EVAL, "--calibration", str(path), *extra])
    return r.exit_code, r.output


@pytest.mark.parametrize(("text", "field", "words"), [
    (HEAD + "intervals: {time: [-1000, 1000]}\n", "intervals.time", "factor of 10"),
    (HEAD + "uncertainty: {net_intra: 1.0e300}\n", "uncertainty", "outside"),
    (HEAD + "uncertainty: {net_intra: .nan}\n", "uncertainty.net_intra", "finite"),
    (HEAD + "knobs: {net_intra: .inf}\n", "knobs.net_intra", "finite"),
    (HEAD + "knobs: {net_intra: true}\n", "knobs.net_intra", "number"),
    (HEAD + "knobs: {net_intr: 0.9}\n", "knobs.net_intr", "did you mean 'net_intra'"),
    (HEAD + "knob: {net_intra: 0.9}\n", "knob", "did you mean 'knobs'"),
    (HEAD + "intervals: {tim: [-0.1, 0.1]}\n", "intervals.tim", "did you mean 'time'"),
    (HEAD + "uncertainty: {compute:A100-SXM4-80GB: 0.1}\n", "uncertainty.compute:A100",
     "unknown key"),
    (HEAD + "knobs: {memory_reserve_gib: -8}\n", "knobs.memory_reserve_gib", "outside"),
    ("format: ap-solve-calibration\nversion: &a [1, 1]\n" + "x: " + "[*a, " * 60, "",
     "YAML"),
])
def test_bad_files_exit_2_naming_the_field(tmp_path: Path, text: str, field: str,
                                           words: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    code, out = _run(p)
    assert code == 2, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
    assert str(p) in out and field in out and words in out, out


def test_alias_bomb_deep_nesting_and_dev_zero(tmp_path: Path) -> None:
    bomb = [HEAD.replace("version: 1\n", ""), 'a0: &a0 ["lol","lol","lol","lol","lol"]\n']
    for i in range(1, 10):
        bomb.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n")
    bomb.append("version: *a9\n")
    cases = {"bomb.yaml": "".join(bomb),
             "deep.yaml": HEAD + "report: " + "[" * 100_000 + "]" * 100_000 + "\n"}
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        code, out = _run(p)
        assert code == 2 and "Traceback" not in out and str(p) in out, out
    code, out = _run("/dev/zero")
    assert code == 2 and "/dev/zero" in out and "Traceback" not in out, out


def test_reserve_is_never_negative() -> None:
    with pytest.raises(ValueError, match="memory_reserve_gib"):
        Calibration(memory_reserve_gib=-8.0)


def test_calibrated_names_only_what_applies(tmp_path: Path) -> None:
    """A knob for a GPU the job does not use is named as not applied, and a file that
    changes nothing for the job does not print "calibrated"."""
    job = make_job("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch=64)
    cal = Calibration(compute={"A100-SXM4-80GB": 0.8, "H100-SXM5-80GB": 0.9}, net_inter=0.7,
                      per_step_s=0.2)
    applied, skipped = calibration_scope(job.calibrated(cal))
    assert applied == ["compute H100-SXM5-80GB x0.9", "+0.2 s per step"], applied
    assert any("A100" in s for s in skipped) and any("net_inter" in s for s in skipped)
    p = tmp_path / "c.yaml"
    p.write_text(HEAD + "knobs: {compute: {A100-SXM4-80GB: 0.8}}\n", encoding="utf-8")
    r = CliRunner().invoke(main, ["solve", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                  "--gpus", "8", "--global-batch", "64", "--time-limit", "20",
                                  "--top-k", "2", "--calibration", str(p)])
    assert r.exit_code == 0, r.output
    assert "calibrated (" not in r.output and "changes nothing" in r.output, r.output
    assert "A100-SXM4-80GB" in r.output


def test_out_dash_keeps_stdout_yaml_only(tmp_path: Path) -> None:
    from test_runs_and_cli import _runs_from_model

    runs = _runs_from_model(tmp_path)
    r = CliRunner().invoke(main, ["calibrate", "--runs", str(runs), "--out", "-", "--model",
                                  "llama3-8b", "--cluster", "dgx-h100", "-q"])
    assert r.exit_code == 0, r.output
    import yaml

    doc = yaml.safe_load(r.stdout)
    assert doc["format"] == "ap-solve-calibration"
    assert "residuals before" in r.stderr and "residuals before" not in r.stdout


def test_recompute_layers_beyond_a_stage_is_refused() -> None:
    r = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                  "--gpus", "16", "--global-batch", "64", "--plan",
                                  "tp=8,pp=2,mbs=1,recompute=full,recompute_layers=100"])
    assert r.exit_code == 2 and "recompute_layers=100" in r.output, r.output
    assert "16 layers" in r.output and "Traceback" not in r.output
    ok = CliRunner().invoke(main, ["evaluate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                   "--gpus", "16", "--global-batch", "64", "--json", "-",
                                   "--plan", "tp=8,pp=2,mbs=1,recompute=full,recompute_layers=16"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["plan"]["recompute"] == "full"


def test_load_reads_what_calibrate_writes(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(HEAD + "created: '2026-01-01T00:00:00Z'\nknobs: {compute: {H100-SXM5-80GB: "
                 "0.9}, net_intra: 0.8}\nintervals: {time: [-0.05, 0.05]}\nuncertainty: "
                 "{compute:H100-SXM5-80GB: 0.02, net_intra: 0.05}\nreport: {notes: []}\n",
                 encoding="utf-8")
    cal = load_calibration(p)
    assert cal.compute == {"H100-SXM5-80GB": 0.9} and cal.net_intra == 0.8
    assert cal.std["net_intra"] == 0.05
    with pytest.raises(InputError):
        load_calibration(tmp_path / "missing.yaml")


def test_ascii_terminal_gets_the_table(tmp_path: Path) -> None:
    """PYTHONIOENCODING=ascii: the table in ASCII stand-ins, exit 0 (no UnicodeEncodeError
    after the file was written)."""
    import os
    import subprocess
    import sys

    from test_runs_and_cli import _runs_from_model

    runs = _runs_from_model(tmp_path)
    exe = Path(sys.executable).with_name("ap-solve")
    r = subprocess.run([str(exe), "calibrate", "--runs", str(runs), "--out",
                        str(tmp_path / "c.yaml"), "--model", "llama3-8b", "--cluster",
                        "dgx-h100", "-q"], capture_output=True, text=True, check=False,
                       env=os.environ | {"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "+/- 1 sd" in r.stdout and "Traceback" not in r.stderr
