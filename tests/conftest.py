"""Suite-wide settings for runs under pytest-xdist (the README's `-n 2`).

Each xdist worker is one process per core, so the BLAS (OpenBLAS, used by scipy's fits in
tests/calibrate) is held to one thread per worker: with its default of one thread per core, two
workers ran four busy threads on two cores and the calibration tests took 4-5x as long. Set
before numpy is imported (this file loads before any test module); a run without xdist keeps
the library's default.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
