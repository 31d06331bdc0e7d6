"""Validate spec dicts into pydantic models, turning errors into one-line `InputError`s that
name the field (with a typo suggestion for unknown fields)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from autoparallel_cp.errors import InputError
from autoparallel_cp.spec import ClusterSpec, ModelSpec

_S = TypeVar("_S", bound=BaseModel)

_FIELD_IN_MSG = re.compile(r"^(?:Value error, )?([a-z_][a-z0-9_.]*) ")


def _known_fields(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model that `loc` points into, for typo suggestions."""
    model: Any = cls
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return []
        ann = info.annotation
        inner = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type)]
        sub = next((a for a in inner if issubclass(a, BaseModel)), None)
        if sub is None:
            return []
        model = sub
    return list(getattr(model, "model_fields", {}))


def _field_of(err: Mapping[str, Any], cls: type[BaseModel]) -> str | None:
    loc = [str(x) for x in err.get("loc", ())]
    msg = str(err.get("msg", ""))
    m = _FIELD_IN_MSG.match(msg)
    known = _known_fields(cls, (*err.get("loc", ()), ""))
    if m and (m.group(1) in known or "." in m.group(1)):
        # a cross-field rule: the message starts with the offending field's name
        name = m.group(1)
        if loc and loc[-1] != name:
            return ".".join([*loc, name])
        return ".".join(loc) if loc else name
    return ".".join(loc) if loc else None


def validation_error(exc: ValidationError, cls: type[BaseModel], source: str) -> InputError:
    """Turn a pydantic ValidationError into one clear InputError line."""
    # an unknown field (typo) often explains a "missing" one: report it first
    errs = sorted(exc.errors(), key=lambda e: e.get("type") != "extra_forbidden")
    err = errs[0]
    field = _field_of(err, cls)
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        known = _known_fields(cls, tuple(err.get("loc", ())))
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, known, n=1)
        msg = "unknown field" + (f" (did you mean {close[0]!r}?)" if close else "")
        if known and not close:
            msg += "; known fields: " + ", ".join(known)
    elif err.get("type") == "missing":
        msg = "required field is missing"
    elif "input" in err and err.get("type") not in ("value_error", "assertion_error"):
        msg += f" (got {err['input']!r})"
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more error{'s' if len(errs) > 2 else ''})"
    return InputError(msg, source=source, field=field)


def validate_spec(cls: type[_S], data: Any, source: str) -> _S:
    if not isinstance(data, Mapping):
        raise InputError(
            f"expected a mapping of fields at the top level, got {type(data).__name__}",
            source=source,
        )
    try:
        return cls.model_validate(dict(data))
    except ValidationError as exc:
        raise validation_error(exc, cls, source) from None


def validate_model(data: Any, source: str) -> ModelSpec:
    """Validate a dict of `ModelSpec` fields; errors are one-line `InputError`s."""
    return validate_spec(ModelSpec, data, source)


def validate_cluster(data: Any, source: str) -> ClusterSpec:
    """Validate a dict of `ClusterSpec` fields; errors are one-line `InputError`s."""
    return validate_spec(ClusterSpec, data, source)
