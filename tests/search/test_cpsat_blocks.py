"""Unit tests of each CP-SAT building block (cpsat_blocks.py)."""

from __future__ import annotations

import itertools

import pytest
from ortools.sat.python import cp_model

from autoparallel_cp.search import cpsat_blocks as cb


class _Collect(cp_model.CpSolverSolutionCallback):
    def __init__(self, exprs: list[cp_model.LinearExprT]) -> None:
        super().__init__()
        self.exprs = exprs
        self.seen: set[tuple[int, ...]] = set()

    def on_solution_callback(self) -> None:
        self.seen.add(tuple(int(self.value(e)) for e in self.exprs))


def _all(model: cp_model.CpModel, exprs: list[cp_model.LinearExprT]) -> set[tuple[int, ...]]:
    solver = cp_model.CpSolver()
    solver.parameters.enumerate_all_solutions = True
    solver.parameters.num_workers = 1
    cb_ = _Collect(exprs)
    solver.solve(model, cb_)
    return cb_.seen


def _minimize(model: cp_model.CpModel, obj: cp_model.LinearExprT) -> cp_model.CpSolver:
    model.minimize(obj)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(model) == cp_model.OPTIMAL
    return solver


def test_prime_helpers() -> None:
    assert cb.prime_factors(360) == {2: 3, 3: 2, 5: 1}
    assert cb.valuation(96, 2) == 5 and cb.valuation(96, 3) == 1
    assert cb.primes_of([12, 35]) == [2, 3, 5, 7]


@pytest.mark.parametrize("n", [24, 16, 36])
def test_product_equals_in_exponent_domain(n: int) -> None:
    m = cp_model.CpModel()
    dom = [d for d in range(1, n + 1) if n % d == 0]
    axes = [cb.Axis.new(m, name, dom) for name in ("a", "b", "c")]
    cb.add_product_equals(m, axes, n)
    got = _all(m, [a.value for a in axes])
    want = {t for t in itertools.product(dom, repeat=3) if t[0] * t[1] * t[2] == n}
    assert got == want


def test_divides_constant_and_axes() -> None:
    m = cp_model.CpModel()
    a = cb.Axis.new(m, "a", [1, 2, 3, 4, 6, 8])
    b = cb.Axis.new(m, "b", [1, 2, 3, 4])
    c = cb.Axis.new(m, "c", [1, 2, 4])
    cb.add_divides(m, [a], [b, c])
    cb.add_divides(m, [b, c], 48)
    got = _all(m, [a.value, b.value, c.value])
    want = {
        (x, y, z) for x in a.values for y in b.values for z in c.values
        if (y * z) % x == 0 and 48 % (y * z) == 0
    }
    assert got == want


def test_divides_enforced_only_when_literal_true() -> None:
    m = cp_model.CpModel()
    a = cb.Axis.new(m, "a", [1, 2, 4])
    b = cb.Axis.new(m, "b", [1, 2])
    e = m.new_bool_var("e")
    cb.add_divides(m, [a], [b], enforce=[e])
    got = _all(m, [a.value, b.value, e])
    assert (4, 1, 0) in got and (4, 1, 1) not in got and (2, 2, 1) in got


def test_lookup_mixed_radix_matches_table() -> None:
    m = cp_model.CpModel()
    a = cb.Axis.new(m, "a", [1, 2, 4])
    b = cb.Axis.new(m, "b", [3, 5])
    idx, size = cb.mixed_radix_index([a, b])
    assert size == 6
    table = [10 * x + y for x in a.values for y in b.values]
    y = cb.lookup(m, idx, table, "y")
    got = _all(m, [a.value, b.value, y])
    assert got == {(x, z, 10 * x + z) for x in a.values for z in b.values}


def test_product_exact() -> None:
    m = cp_model.CpModel()
    x = m.new_int_var(0, 7, "x")
    y = m.new_int_var(2, 5, "y")
    z = cb.product(m, x, y, "z")
    got = _all(m, [x, y, z])
    assert got == {(i, j, i * j) for i in range(8) for j in range(2, 6)}


def test_floor_units_is_lower_bound_with_error() -> None:
    vals = [0.0, 1.23456, 9.999, 3.5]
    q, err = cb.floor_units(vals, 0.01)
    for v, i in zip(vals, q, strict=True):
        assert i * 0.01 <= v + 1e-12 and v - i * 0.01 <= err + 1e-12
    assert err < 0.01
    assert cb.ceil_units([1.001], 0.01) == [101]


@pytest.mark.parametrize("f", [lambda x: 1e3 / (x + 1), lambda x: 0.37 * x * x + 2.0])
def test_pwl_upper_bound_error(f: object) -> None:
    fn = f
    xs = [0, 2, 5, 9, 16]
    fs = [fn(x) for x in xs]  # type: ignore[operator]
    unit = 0.05
    gap = cb.pwl_gap(xs, fs, fn)  # type: ignore[arg-type]
    for xv in range(0, 17):
        m = cp_model.CpModel()
        x = m.new_int_var(xv, xv, "x")
        y = m.new_int_var(0, 10**6, "y")
        bound = cb.pwl_upper_bound(m, x, y, xs, fs, unit)
        s = _minimize(m, y)
        approx = s.value(y) * unit
        exact = fn(xv)  # type: ignore[operator]
        assert approx >= exact - 1e-9  # an upper bound of f
        assert approx - exact <= bound + gap + 1e-9  # within the stated error
        if xv in xs:
            assert approx - exact <= bound + 1e-9


def test_max_of_epigraph_with_enforcement() -> None:
    m = cp_model.CpModel()
    xs = [m.new_int_var(v, v, f"x{v}") for v in (3, 9, 5)]
    on = [m.new_constant(1), m.new_constant(0), m.new_constant(1)]
    t = cb.max_of(m, xs, 0, 100, "t", enforce=on)
    s = _minimize(m, t)
    assert s.value(t) == 5


def test_axis_is_in_and_lit() -> None:
    m = cp_model.CpModel()
    a = cb.Axis.new(m, "a", [1, 2, 4, 8])
    big = a.is_in(m, [4, 8])
    got = _all(m, [a.value, big, a.index])
    assert got == {(1, 0, 0), (2, 0, 1), (4, 1, 2), (8, 1, 3)}
    assert a.lit(3) is None and a.lit(2) is a.lits[1]
