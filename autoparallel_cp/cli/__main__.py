"""`python -m autoparallel_cp.cli`: the same as `ap-solve`."""

from autoparallel_cp.cli import main

main()
