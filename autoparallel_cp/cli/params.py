"""Option types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.ParamType):
    """A finite float in [lo, hi] (`lo_open`: > lo, `hi_open`: < hi): NaN and infinity are
    refused (exit 2), which click's FloatRange lets through (NaN compares false to both ends)."""

    name = "float"

    def __init__(self, lo: float, hi: float, *, lo_open: bool = False,
                 hi_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open, self.hi_open = lo, hi, lo_open, hi_open

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            x = value
        else:
            try:
                x = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if (x < self.lo or (self.lo_open and x == self.lo) or x > self.hi
                or (self.hi_open and x == self.hi)):
            lo = f"> {self.lo:g}" if self.lo_open else f">= {self.lo:g}"
            hi = f"< {self.hi:g}" if self.hi_open else f"<= {self.hi:g}"
            self.fail(f"{x:g} is out of range: must be {lo} and {hi}", param, ctx)
        return x
