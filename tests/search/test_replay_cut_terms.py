"""search/cpsat_replay.py `ReplayCuts.add` leaves the ranks a path does not visit out of its
constraint's sum: the model (its proto, byte for byte) is the one of the full sum over every
rank, 0·t_r included, on rank times that are variables, affine expressions and constants,
with zero coefficients (a share floored to 0), paths of one rank and an empty path."""

from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from autoparallel_cp.search.cpsat_replay import Counts, ReplayCuts


def _model(coef: tuple[int, int, int], paths: list[Counts], full: bool) -> str:
    m = cp_model.CpModel()
    p = len(paths[0])
    xs = [m.new_int_var(0, 1000, f"x{r}") for r in range(p)]
    times: list[Any] = [x if r % 3 == 0 else (3 * x + 7 if r % 3 == 1 else 2 * x - xs[0])
                        for r, x in enumerate(xs)]
    times[-1] = 5  # a constant
    span = m.new_int_var(0, 10**12, "span")
    cuts = ReplayCuts(m, span, times, coef, "zbv", p, 8, (0.3, 0.4, 0.3))
    for c in paths:
        if full:  # the sum before: every rank, 0·t_r included
            m.add(span >= sum(sum(n * k for n, k in zip(row, coef, strict=True)) * t
                              for row, t in zip(c, times, strict=True)))
        else:
            cuts.add(c)
    return str(m.Proto())


def test_the_cut_is_the_full_sum() -> None:
    p = 6
    own = [tuple((16, 16, 16) if j == r else (0, 0, 0) for j in range(p)) for r in range(p)]
    mixed = [tuple((r, (r * 7) % 5, (r * 3) % 4) for r in range(p)),
             tuple((0, 0, 0) for _ in range(p)),
             tuple((1, 0, 0) if r == 2 else (0, 0, 2) if r == 4 else (0, 0, 0)
                   for r in range(p))]
    for coef in [(19660, 26214, 19660), (0, 5, 3), (0, 0, 0), (7, 0, 0)]:
        paths = [*own, *mixed]
        assert _model(coef, paths, False) == _model(coef, paths, True)
    assert _model((1, 1, 1), own, False) != _model((1, 1, 2), own, True)  # it can tell
