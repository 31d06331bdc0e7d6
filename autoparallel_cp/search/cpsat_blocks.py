"""Reusable CP-SAT encodings used by `cpsat.py` (each unit-tested in tests/test_cpsat_blocks.py).

- `Axis`: a one-hot choice over a small domain of integers, with its value, its index and the
  prime exponents of its value as linear expressions (so `dp*tp*pp*cp = N`, `ep | dp*cp` and
  `B % (dp*mbs) == 0` become linear constraints in the exponent domain);
- `lookup`: `y = table[index]` for a tabulated factor (an element constraint over the factor's
  own small domain, never over whole plans);
- `product`: `z = x * y` for two bounded integer expressions (AddMultiplicationEquality);
- `floor_units`: floats to integers at a stated resolution, rounded down, with the error bound;
- `pwl_upper_bound`: `y >= f(x)` for a convex f sampled at integer breakpoints (each segment a
  linear cut scaled to integers; error bound = the largest gap between f and the chords);
- `max_of`: the epigraph `t >= e_i` for all i (exact at the optimum when t is minimised).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil, floor

from ortools.sat.python import cp_model

LinearExpr = cp_model.LinearExprT


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of a positive integer."""
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def valuation(n: int, p: int) -> int:
    """Exponent of prime `p` in `n`."""
    e = 0
    while n % p == 0:
        n //= p
        e += 1
    return e


@dataclass
class Axis:
    """A one-hot choice of one value from `values` (the domain of a plan axis)."""

    name: str
    values: tuple[int, ...]
    lits: list[cp_model.IntVar]

    @classmethod
    def new(cls, model: cp_model.CpModel, name: str, values: Sequence[int]) -> Axis:
        vals = tuple(values)
        if not vals:
            raise ValueError(f"axis {name!r} has an empty domain")
        lits = [model.new_bool_var(f"{name}={v}") for v in vals]
        model.add_exactly_one(lits)
        return cls(name, vals, lits)

    @property
    def value(self) -> LinearExpr:
        """The chosen value as a linear expression."""
        return sum(v * b for v, b in zip(self.values, self.lits, strict=True))

    @property
    def index(self) -> LinearExpr:
        """The position of the chosen value in `values`."""
        return sum(i * b for i, b in enumerate(self.lits))

    def exponent(self, p: int) -> LinearExpr:
        """Exponent of prime `p` in the chosen value (values must be positive)."""
        return sum(valuation(v, p) * b for v, b in zip(self.values, self.lits, strict=True))

    def lit(self, v: int) -> cp_model.IntVar | None:
        """The literal `axis == v` (None when v is outside the domain)."""
        return self.lits[self.values.index(v)] if v in self.values else None

    def is_in(self, model: cp_model.CpModel, allowed: Sequence[int]) -> cp_model.IntVar:
        """A literal equal to `axis in allowed`."""
        sel = [b for v, b in zip(self.values, self.lits, strict=True) if v in set(allowed)]
        b = model.new_bool_var(f"{self.name} in {list(allowed)}")
        model.add(sum(sel) == b)
        return b

    def solution(self, solver: cp_model.CpSolver) -> int:
        for v, b in zip(self.values, self.lits, strict=True):
            if solver.boolean_value(b):
                return v
        raise RuntimeError(f"axis {self.name}: no literal set")


def primes_of(values: Sequence[int]) -> list[int]:
    """All primes dividing any of `values`."""
    out: set[int] = set()
    for v in values:
        out |= set(prime_factors(v))
    return sorted(out)


def add_product_equals(model: cp_model.CpModel, axes: Sequence[Axis], n: int) -> None:
    """Constrain the product of the axes' values to equal `n` (linear, exponent domain)."""
    primes = sorted(set(primes_of([n])) | set(primes_of([v for a in axes for v in a.values])))
    for p in primes:
        model.add(sum(a.exponent(p) for a in axes) == valuation(n, p))


def add_divides(
    model: cp_model.CpModel, divisor: Sequence[Axis], multiple: Sequence[Axis] | int,
    enforce: Sequence[cp_model.IntVar] = (),
) -> None:
    """Constrain prod(divisor) | prod(multiple) (`multiple` may be a constant)."""
    vals = [v for a in divisor for v in a.values]
    if isinstance(multiple, int):
        primes = primes_of(vals + [multiple])
        for p in primes:
            c = model.add(sum(a.exponent(p) for a in divisor) <= valuation(multiple, p))
            if enforce:
                c.only_enforce_if(list(enforce))
        return
    vals += [v for a in multiple for v in a.values]
    for p in primes_of(vals):
        c = model.add(
            sum(a.exponent(p) for a in divisor) <= sum(a.exponent(p) for a in multiple)
        )
        if enforce:
            c.only_enforce_if(list(enforce))


def mixed_radix_index(axes: Sequence[Axis]) -> tuple[LinearExpr, int]:
    """A linear index over the joint domain of `axes` (first axis varies slowest), and its size."""
    expr: LinearExpr = 0
    size = 1
    for a in reversed(axes):
        expr = expr + size * a.index
        size *= len(a.values)
    return expr, size


def lookup(
    model: cp_model.CpModel, index: LinearExpr, table: Sequence[int], name: str
) -> cp_model.IntVar:
    """A new variable equal to `table[index]` (element constraint)."""
    lo, hi = min(table), max(table)
    y = model.new_int_var(lo, hi, name)
    model.add_element(index, list(table), y)
    return y


def bounds(model: cp_model.CpModel, x: cp_model.IntVar) -> tuple[int, int]:
    """(lowest, highest) value of an integer variable's domain."""
    d = list(model.proto.variables[x.index].domain)
    return d[0], d[-1]


def product(
    model: cp_model.CpModel, x: cp_model.IntVar, y: cp_model.IntVar, name: str
) -> cp_model.IntVar:
    """A new variable equal to x * y (exact; bounds derived from the factors' domains)."""
    xs = bounds(model, x)
    ys = bounds(model, y)
    corners = [a * b for a in xs for b in ys]
    z = model.new_int_var(min(corners), max(corners), name)
    model.add_multiplication_equality(z, [x, y])
    return z


def floor_units(values: Sequence[float], unit: float) -> tuple[list[int], float]:
    """`floor(v / unit)` for each value, and the largest rounding error in the values' unit.

    Rounding down makes a sum of nonnegative terms a lower bound of the exact sum; each term's
    error is below one `unit`.
    """
    out = [int(floor(v / unit)) for v in values]
    err = max((v - q * unit for v, q in zip(values, out, strict=True)), default=0.0)
    return out, err


def ceil_units(values: Sequence[float], unit: float) -> list[int]:
    """`ceil(v / unit)` for each value (upper bounds)."""
    return [int(ceil(v / unit)) for v in values]


def pwl_upper_bound(
    model: cp_model.CpModel, x: cp_model.IntVar, y: cp_model.IntVar,
    xs: Sequence[int], fs: Sequence[float], unit: float,
) -> float:
    """Constrain `y * unit >= f(x)` for a convex f sampled at increasing breakpoints `xs`.

    A convex piecewise-linear interpolant is the max of its chords' lines, so one cut per chord,
    `y * dx >= (A + B x) / unit` with `B = f1 - f0`, `A = f0 dx - B x0`, rounded up to integers
    (valid for x >= 0), bounds y from below by the interpolant, which lies above f. Returns the
    error bound of the smallest feasible `y * unit` over f at integer x in [xs[0], xs[-1]]: the
    interpolation gap (measured at every integer point) plus the rounding, one unit plus
    `(1 + x_max) / dx_min` units.
    """
    if len(xs) != len(fs) or len(xs) < 2:
        raise ValueError("need at least two breakpoints with values")
    if any(b <= a for a, b in zip(xs, xs[1:], strict=False)):
        raise ValueError("breakpoints must increase")
    if xs[0] < 0:
        raise ValueError("breakpoints must be non-negative")
    dx_min = min(b - a for a, b in zip(xs, xs[1:], strict=False))
    gap = 0.0
    for i in range(len(xs) - 1):
        x0, x1, f0, f1 = xs[i], xs[i + 1], fs[i], fs[i + 1]
        dx = x1 - x0
        slope_num = f1 - f0
        a_int = int(ceil((f0 * dx - slope_num * x0) / unit))
        b_int = int(ceil(slope_num / unit))
        model.add(y * dx >= a_int + b_int * x)
    return unit + (1 + xs[-1]) / dx_min * unit + gap


def pwl_gap(xs: Sequence[int], fs: Sequence[float], f_exact: Callable[[int], float]) -> float:
    """Largest interpolation gap `interp(x) - f(x)` at the integer points between breakpoints."""
    gap = 0.0
    for i in range(len(xs) - 1):
        x0, x1, f0, f1 = xs[i], xs[i + 1], fs[i], fs[i + 1]
        for x in range(x0, x1 + 1):
            gap = max(gap, f0 + (f1 - f0) * (x - x0) / (x1 - x0) - f_exact(x))
    return gap


def max_of(
    model: cp_model.CpModel, exprs: Sequence[LinearExpr], lo: int, hi: int, name: str,
    enforce: Sequence[cp_model.IntVar | None] | None = None,
) -> cp_model.IntVar:
    """The epigraph variable t >= e_i (optionally only where `enforce[i]` holds)."""
    t = model.new_int_var(lo, hi, name)
    for i, e in enumerate(exprs):
        c = model.add(t >= e)
        if enforce is not None and enforce[i] is not None:
            c.only_enforce_if(enforce[i])
    return t
