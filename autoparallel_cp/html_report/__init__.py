"""`--html FILE`: one self-contained page (plotly.js inlined, no network needed to view it):
`page.py` lays out the sections (plans table, breakdown bars, stage memory, timeline, near-ties
and sensitivity, what-if curves), `figures.py` draws the figures."""

from autoparallel_cp.html_report.page import plans_report, require_plotly, whatif_report

__all__ = ["plans_report", "require_plotly", "whatif_report"]
