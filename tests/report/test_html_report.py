"""`--html FILE`: one self-contained page, checked by structure (sections, tables, figures,
nothing loaded from the network) and, where Debian's Chromium is installed, rendered headless
to a screenshot that must show the bars and the timeline."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from autoparallel_cp.cli import main
from autoparallel_cp.errors import UserError

pytest.importorskip("plotly")

README_JOB = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--seq-len",
              "8192", "--global-batch", "512"]
SMALL = ["--model", "gpt3-1.3b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
         "--global-batch", "32"]
CHROMIUM = "/usr/bin/chromium"
#: The compute colour of the bars and the timeline (html_report.TIME_PARTS), as RGB.
COMPUTE_RGB = (0x4C, 0x78, 0xA8)


def run(*args: str) -> Any:
    kw = ({"mix_stderr": False}
          if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters else {})
    return CliRunner(**kw).invoke(main, list(args), catch_exceptions=False)


class Page(HTMLParser):
    """Sections, table rows, plotly figures and every URL a tag would load."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.rows = 0
        self.figures = 0
        self.scripts = 0
        self.loads: list[str] = []
        self._in_tbody = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id") or "")
        if tag == "tbody":
            self._in_tbody = True
        if tag == "tr" and self._in_tbody:
            self.rows += 1
        if tag == "div" and "plotly-graph-div" in (a.get("class") or ""):
            self.figures += 1
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if a.get(key):
                self.loads.append(f"{tag} {key}={a[key]}")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_tbody = False


def parse(path: Path) -> Page:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert '<script src="http' not in text and "<script src='http" not in text
    page = Page()
    page.feed(text)
    assert page.loads == []  # nothing fetched: plotly.js is inline, no stylesheet links
    return page


def test_solve_page_has_every_section(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = run("solve", *SMALL, "--top-k", "3", "--time-limit", "10", "--html", str(out), "-q")
    assert r.exit_code == 0, r.output
    page = parse(out)
    assert page.sections == ["plans", "time", "memory", "stages", "timeline", "advice"]
    assert page.rows == 3
    assert page.figures == 4  # time bars, memory bars, stage memory, timeline
    assert " rec.</td>" in out.read_text(encoding="utf-8")  # the recommended plan's row


def test_evaluate_and_explain_pages(tmp_path: Path) -> None:
    for cmd in ("evaluate", "explain"):
        out = tmp_path / f"{cmd}.html"
        r = run(cmd, *SMALL, "-p", "tp=2,pp=2,mbs=1,zero=1", "--html", str(out), "-q")
        assert r.exit_code == 0, r.output
        page = parse(out)
        assert page.sections[:5] == ["plans", "time", "memory", "stages", "timeline"]
        assert page.rows == 1
    assert "Best" not in (tmp_path / "evaluate.html").read_text()[:2000]
    assert "sensitivity" in (tmp_path / "explain.html").read_text()


def test_whatif_page_has_the_curves(tmp_path: Path) -> None:
    out = tmp_path / "sweep.html"
    r = run("whatif", "-m", "gpt3-1.3b", "-c", "dgx-h100", "--gpus", "8,16", "--seq-len",
            "2048", "--global-batch", "32", "--fix", "pp=1,cp=1", "--time-limit", "5", "-j", "1",
            "--html", str(out), "-q")
    assert r.exit_code == 0, r.output
    page = parse(out)
    assert page.sections == ["points", "whatif", "advice"]
    assert page.rows == 2
    assert page.figures == 1


def test_missing_plotly_is_a_clear_user_error(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    import builtins

    from autoparallel_cp.html_report import require_plotly

    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "plotly" or name.startswith("plotly."):
            raise ImportError("no plotly")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(UserError, match=r"autoparallel-cp\[html\]"):
        require_plotly()
    out = tmp_path / "r.html"
    r = run("evaluate", *SMALL, "-p", "tp=2,mbs=1", "--html", str(out))
    assert r.exit_code == 2
    assert "autoparallel-cp[html]" in r.stderr and "Traceback" not in r.output
    assert not out.exists()


def screenshot(page: Path, png: Path, tmp: Path, size: str = "1400,2400") -> None:
    """Render `page` with headless Chromium (no network, a throw-away profile)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp / 'profile'}", f"--screenshot={png}",
           f"--window-size={size}", "--virtual-time-budget=5000", page.resolve().as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=180,
                   env={**os.environ, "HOME": str(tmp)})


@pytest.mark.skipif(not os.path.exists(CHROMIUM) or shutil.which(CHROMIUM) is None,
                    reason="Chromium is not installed (apt-get install chromium)")
def test_readme_report_renders_in_chromium(tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "report.html"
    r = run("solve", *README_JOB, "--time-limit", "10", "--html", str(out), "-q")
    assert r.exit_code == 0, r.output
    png = tmp_path / "report.png"
    screenshot(out, png, tmp_path)
    img = Image.open(png).convert("RGB")
    assert img.size == (1400, 2400)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not blank, not one colour
    # the bars and the timeline were drawn (plotly.js ran): many pixels of the compute colour
    near = sum(n for n, c in colours
               if all(abs(a - b) <= 6 for a, b in zip(c, COMPUTE_RGB, strict=True)))
    assert near > 20_000, near
    # and in the lower half of the page too (the stage memory and the timeline)
    lower = img.crop((0, 1200, 1400, 2400)).getcolors(maxcolors=1 << 20) or []
    assert sum(n for n, c in lower
               if all(abs(a - b) <= 6 for a, b in zip(c, COMPUTE_RGB, strict=True))) > 5_000


def test_a_long_timeline_is_drawn_one_bar_per_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoparallel_cp import api
    from autoparallel_cp.cost.timeline import timeline
    from autoparallel_cp.html_report import figures as html_report

    job = api.make_job("gpt3-1.3b", "dgx-h100", gpus=16, seq_len=2048, global_batch=64)
    ev = api.evaluate(job, "tp=1,pp=4,vpp=2,mbs=1,zero=1")
    tl = timeline(job, ev.plan)
    full, note = html_report.drawn_slices(tl)
    assert note == "" and len(full) == len(tl.slices)
    passes = 4 * ev.plan.num_microbatches * 2 * 2
    monkeypatch.setattr(html_report, "MAX_SLICES", 100)
    drawn, note = html_report.drawn_slices(tl)
    assert "one bar" in note and "slowest" not in note
    bars = [s for s in drawn if s.op is not None]
    assert len(bars) == passes
    # one bar per pass spans its pieces: the slowest stage's bars are its m passes' time
    slow = sum(s.dur_s for s in bars if s.stage == tl.slowest_stage)
    assert slow == pytest.approx(ev.plan.num_microbatches
                                 * ev.stage_time_s[tl.slowest_stage], rel=1e-9)
    monkeypatch.setattr(html_report, "MAX_PASSES", passes - 1)
    drawn, note = html_report.drawn_slices(tl)
    assert f"slowest stage ({tl.slowest_stage}) only" in note
    assert {s.stage for s in drawn} == {tl.slowest_stage}
    assert "every slice" in html_report.timeline_caption(tl)
