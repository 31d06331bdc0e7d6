"""The harness is imported as the top-level package `harness`, as the scripts in benchmarks/
import it (their folder is on sys.path when they run)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
