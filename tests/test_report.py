"""Reports: CSV / JSON writers (atomic), tables and breakdown text from PLAN dictionaries."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from autoparallel_cp import outputs, report
from autoparallel_cp.errors import UserError

GIB = 1024**3


def _plan_dict(step: float = 10.0, bubble: float = 1.0, fits: bool = True,
               peak_gib: float = 60.0, pp: int = 4) -> dict[str, Any]:
    """A PLAN dictionary in the INTERFACE.md shape (formatting input, not a cost estimate)."""
    compute = step - bubble - 1.5
    return {
        "plan": {"dp": 8, "tp": 8, "pp": pp, "vpp": 1, "cp": 1, "ep": 1, "sp": 1, "zero": 1,
                 "mbs": 1, "num_microbatches": 64, "recompute": "selective"},
        "fits": fits,
        "memory": {"params_bytes": 10 * GIB, "grads_bytes": 20 * GIB,
                   "optimizer_bytes": 5 * GIB, "activations_bytes": 20 * GIB,
                   "other_bytes": 5 * GIB, "peak_bytes": peak_gib * GIB,
                   "capacity_bytes": 80 * GIB},
        "time": {"step_s": step, "compute_s": compute, "bubble_s": bubble, "tp_comm_s": 1.0,
                 "cp_comm_s": 0.0, "ep_comm_s": 0.0, "pp_comm_s": 0.1, "dp_comm_s": 0.3,
                 "optimizer_s": 0.1},
        "throughput": {"tokens_per_s": 4.2e5, "tokens_per_s_per_gpu": 1640.0, "mfu": 0.41},
    }


def test_csv_has_one_row_per_plan_with_interface_columns() -> None:
    plans = [_plan_dict(10.0), _plan_dict(11.0, bubble=2.0)]
    rows = list(csv.DictReader(io.StringIO(outputs.plans_csv(plans))))
    assert [r["rank"] for r in rows] == ["1", "2"]
    for col in ("dp", "tp", "pp", "peak_bytes", "peak_gib", "step_s", "tokens_per_s_per_gpu",
                "mfu", "rank", "recompute"):
        assert col in rows[0]
    assert float(rows[0]["peak_gib"]) == pytest.approx(60.0)
    assert float(rows[1]["step_s"]) == 11.0


def test_result_json_has_exactly_the_interface_keys() -> None:
    doc = json.loads(outputs.result_json("optimal", 1.5, 1234, [_plan_dict()]))
    assert set(doc) == {"status", "solve_time_s", "space_size", "plans"}
    assert doc["plans"][0]["plan"]["tp"] == 8


def test_write_atomic_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old contents\n")
    outputs.write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(os.listdir(tmp_path)) == ["out.csv"]


def test_failing_write_leaves_target_untouched_and_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plans.json"
    target.write_text("previous\n")

    def boom(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", boom)
    with pytest.raises(UserError, match="plans.json"):
        outputs.write_atomic(target, "x" * 100_000)
    assert target.read_text() == "previous\n"
    assert sorted(os.listdir(tmp_path)) == ["plans.json"]


def test_failing_write_of_new_file_creates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(src: str, dst: str) -> None:
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(outputs.os, "replace", boom)
    with pytest.raises(UserError):
        outputs.write_atomic(tmp_path / "new.csv", "a,b\n1,2\n")
    assert os.listdir(tmp_path) == []


def test_write_into_missing_folder_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no-such-dir"):
        outputs.write_atomic(tmp_path / "no-such-dir" / "x.csv", "a\n")


def test_dash_writes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    outputs.write_atomic("-", "hello\n")
    assert capsys.readouterr().out == "hello\n"


def _render(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_plans_table_shows_memory_time_and_why_plans_lose() -> None:
    text = _render(report.plans_table([_plan_dict(10.0), _plan_dict(11.0, bubble=2.0)],
                                      compare=True, highlight=1))
    assert "60.0/80.0" in text
    assert "10.00 s" in text and "41.0%" in text
    assert "compute 75%, bubble 10%" in text  # what dominates the time
    assert "+10.0%: bubble +1.00 s" in text  # why #2 loses


def test_breakdown_and_explain_report() -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    d = _plan_dict(10.0, bubble=2.5, fits=False, peak_gib=90.0)
    report.print_plan_report(console, d, title="Explanation", num_layers=80, explain=True)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "DOES NOT FIT" in text
    assert "does not fit: needs 90.0 GiB > 80.0 GiB" in text
    assert "bubble-bound" in text
    assert "vpp=2" in text  # 80 layers % (4*1*2) == 0, so interleaving is suggested


def test_limits_and_formatting_helpers() -> None:
    assert report.limits(_plan_dict(10.0, bubble=0.2, peak_gib=40.0))[0].startswith(
        "compute-bound")
    assert report.fmt_time(0.0123) == "12.3 ms"
    assert report.fmt_count(1_234_567) == "1.23M"
    assert report.plan_label(_plan_dict()["plan"]) == "dp8 tp8 pp4 sp z1 mbs1 rc:selective"


def test_band_shows_both_ends_of_an_uncentred_interval() -> None:
    # The Megatron dense table of cost/uncertainty.py: q10 -0.1439, q90 +0.0719 (ln ratio):
    # the measured run is likelier below the prediction, and the band says so.
    value = 1181.0
    iv = [value * math.exp(-0.1439), value * math.exp(0.0719)]
    assert report.band(value, iv) == " -13%/+7%"
    assert report.band(1000.0, [900.0, 1100.0]) == " -10%/+10%"
    assert report.band(1000.0, [1020.0, 1200.0]) == " +2%/+20%"  # a calibrated shift
    assert report.band(1000.0, None) == ""
    assert report.band(None, [1.0, 2.0]) == ""


def test_plan_label_names_a_set_schedule_and_offload() -> None:
    plan = {**_plan_dict()["plan"], "schedule": "gpipe", "optimizer_offload": 0.5}
    assert report.plan_label(plan).endswith("rc:selective gpipe optimizer_offload=0.5")
    assert "gpipe" not in report.plan_label(_plan_dict()["plan"])
