"""What-if sweeps: grid construction, rows (days, cost), table, CSV/JSON, plot, CLI."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from autoparallel_cp import api, whatif
from autoparallel_cp.errors import UserError


def test_points_are_the_cartesian_product() -> None:
    pts = whatif.build_points(model="gpt3-1.3b", clusters=["dgx-h100", "dgx-a100"],
                              gpus=[8, 16], seq_lens=[2048], global_batches=[64, 128])
    assert len(pts) == 2 * 2 * 1 * 2
    assert {p.coords["cluster"] for p in pts} == {"dgx-h100", "dgx-a100"}
    assert {p.job.num_gpus for p in pts} == {8, 16}
    assert {p.job.global_batch for p in pts} == {64, 128}


def test_inter_node_bandwidth_override_applies_to_every_group() -> None:
    pts = whatif.build_points(model="gpt3-1.3b", clusters=["mixed-h100-a100"],
                              inter_node_gbps=[12.5], seq_lens=[2048], global_batches=[64],
                              nodes=[4])
    (p,) = pts
    assert p.coords["inter_node_gbps"] == 12.5
    assert all(g.inter_node.bandwidth_gbps == 12.5 for g in p.job.cluster.node_groups)


def test_bad_sweep_values_are_user_errors() -> None:
    with pytest.raises(UserError):
        whatif.build_points(model="gpt3-1.3b", clusters=["dgx-h100"], gpus=[12])
    with pytest.raises(UserError):
        whatif.build_points(model="gpt3-1.3b", clusters=["dgx-h100"], gpus=[8], nodes=[1])
    with pytest.raises(UserError):
        whatif.build_points(model="gpt3-1.3b", clusters=["no-such-cluster"], gpus=[8])


def test_cluster_price_per_hour() -> None:
    c = api.load_cluster("dgx-h100").take_gpus(16)
    price = api.cluster_price_per_hour(c)
    g = c.node_groups[0]
    if g.price_per_gpu_hour is None:
        assert price is None
    else:
        assert price == pytest.approx(16 * g.price_per_gpu_hour)


def _rows(tokens: float | None) -> list[dict[str, Any]]:
    """Rows from the exact cost model (evaluate), as the sweep builds them from solver output."""
    pts = whatif.build_points(model="gpt3-1.3b", clusters=["dgx-h100", "dgx-a100"],
                              gpus=[8, 16], seq_lens=[2048], global_batches=[64])
    rows = []
    for p in pts:
        ev = api.evaluate(p.job, "tp=2,mbs=1,zero=1").to_json()
        rows.append(whatif._row(p, {"status": "optimal", "best": ev}, tokens))
    return rows


def test_rows_days_and_cost_follow_from_throughput() -> None:
    rows = _rows(tokens=1e11)
    for r in rows:
        assert r["days"] == pytest.approx(1e11 / r["tokens_per_s"] / 86400)
        if r["usd_per_hour"] is not None:
            assert r["cost_usd"] == pytest.approx(r["days"] * 24 * r["usd_per_hour"])
        else:
            assert r["cost_usd"] is None
    assert whatif.swept(rows) == ["cluster", "gpus"]


def test_rows_csv_json_and_summary() -> None:
    rows = _rows(tokens=1e11)
    parsed = list(csv.DictReader(io.StringIO(whatif.rows_csv(rows))))
    assert len(parsed) == len(rows)
    assert parsed[0]["plan"].startswith("dp=")
    doc = json.loads(whatif.rows_json(rows))
    assert len(doc["points"]) == len(rows)
    lines = whatif.summary_lines(rows, tokens=1e11)
    assert lines and lines[0].startswith("fastest")


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "sweep.png"
    whatif.plot(_rows(tokens=1e11), str(path), tokens=1e11)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.png"]


def test_missing_matplotlib_is_a_clear_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(UserError, match=r"autoparallel-cp\[plot\]"):
        whatif.require_matplotlib()


def test_sweep_solves_each_point(tmp_path: Path) -> None:
    pts = whatif.build_points(model="gpt3-1.3b", clusters=["dgx-h100"], gpus=[8, 16],
                              seq_lens=[2048], global_batches=[64])
    rows = whatif.run_sweep(pts, fix="pp=1,cp=1,vpp=1", time_limit=10, jobs=2, tokens=1e10)
    assert [r["gpus"] for r in rows] == [8, 16]
    for r in rows:
        assert r["status"] in ("optimal", "feasible")
        assert r["tokens_per_s"] > 0 and r["plan"]["dp"] * r["plan"]["tp"] * r["plan"]["pp"] \
            * r["plan"]["cp"] == r["gpus"]


def test_whatif_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from autoparallel_cp.cli import main

    out_csv = tmp_path / "w.csv"
    res = CliRunner().invoke(main, [
        "whatif", "--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8,16",
        "--seq-len", "2048", "--global-batch", "64", "--tokens", "1e10", "--time-limit", "10",
        "--fix", "pp=1,cp=1,vpp=1",
        "--jobs", "1", "--csv", str(out_csv), "--quiet"])
    assert res.exit_code == 0, res.output
    assert len(list(csv.DictReader(io.StringIO(out_csv.read_text())))) == 2
    res = CliRunner().invoke(main, ["whatif", "--model", "gpt3-1.3b", "--cluster", "dgx-h100",
                                    "--gpus", "8,x"])
    assert res.exit_code == 2
