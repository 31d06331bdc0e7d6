"""Calibration to measured runs: reading RUNS.csv (`runs`), the fit (`fit`), microbenchmark rows
(`micro`), the versioned calibration file (`files`), the measurement kit (`measure`, needs
torch). Layer 3 of docs/design.md: imports spec and cost only.
"""

from __future__ import annotations
