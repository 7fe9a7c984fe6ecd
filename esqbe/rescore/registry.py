"""The rescorer registry: `@register(name, params)` adds a rescorer with its declared parameters (`Param`: type,
default, bounds, whether HTTP may set it); the query pipeline, config checks and the server look them up here."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ParameterError
from .batches import RescoreContext, Rescorer

_REGISTRY: dict[str, Callable[..., Rescorer]] = {}


@dataclass(frozen=True)
class Param:
    """One declared rescorer parameter: what the CLI (`--param`), a config (`rescorer_params`,
    `facet_settings`) and HTTP (`rescorer_params`) accept for it, checked by one function
    (`check_params`) so that the bounds are the same everywhere.

    `low`/`high`: inclusive bounds of a number; `choices`: the allowed values of a str;
    `http`: whether a client of `esqbe serve` may set it (`words` names a directory: it may not,
    it picks one of the server's named word vectors instead)."""

    name: str
    type: type  # float | int | bool | str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    http: bool = True


_PARAMS: dict[str, tuple[Param, ...]] = {}


def register(name: str, params: Sequence[Param] = ()):
    """Register a rescorer factory `factory(context, **params) -> Rescorer` under `name`, with the
    parameters it takes (each factory gets only declared, checked and coerced values)."""

    def deco(factory):
        _REGISTRY[name] = factory
        _PARAMS[name] = tuple(params)
        return factory

    return deco


def available_rescorers() -> list[str]:
    return ["none", *sorted(_REGISTRY)]


def rescorer_params(name: str) -> tuple[Param, ...]:
    """The parameters rescorer `name` declares (none for `none`)."""
    if name in (None, "none"):
        return ()
    try:
        return _PARAMS[name]
    except KeyError:
        raise ParameterError(f"unknown rescorer {name!r}; choose one of {', '.join(available_rescorers())}") from None


def check_param(rescorer: str, param: Param, value):
    """`value` (a bool, a number or text from a command line or a config file) as `param.type`, within its bounds."""
    where = f"{rescorer}: {param.name}"
    if param.type is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ParameterError(f"{where} must be true or false (got {value!r})")
    if param.type is str:
        if not isinstance(value, str):
            raise ParameterError(f"{where} must be text (got {value!r})")
        if param.choices is not None and value not in param.choices:
            raise ParameterError(f"{where} must be one of {', '.join(param.choices)} (got {value!r})")
        return value
    if isinstance(value, (bool, np.bool_)):
        raise ParameterError(f"{where} must be a number (got {value!r})")
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ParameterError(f"{where} must be a number (got {value!r})") from None
    if not np.isfinite(out) or (param.low is not None and param.low > 0 >= out):
        raise ParameterError(f"{where} must be a positive number (got {value!r})")
    if param.type is int:
        if out != int(out):
            raise ParameterError(f"{where} must be a whole number (got {value!r})")
        out = int(out)
    if (param.low is not None and out < param.low) or (param.high is not None and out > param.high):
        raise ParameterError(f"{where} must be between {param.low:g} and {param.high:g} (got {value!r})")
    return out


def check_params(name: str, params: dict | None, *, http: bool = False) -> dict:
    """`params` for rescorer `name`, checked against its declaration and coerced to their types: an
    unknown parameter (or, with `http`, one a client may not set) is an error naming the accepted ones."""
    declared = {p.name: p for p in rescorer_params(name) if p.http or not http}
    params = dict(params or {})
    unknown = sorted(set(params) - set(declared))
    if unknown:
        if not declared:
            raise ParameterError(f"{name} takes no parameters (got {', '.join(unknown)})")
        raise ParameterError(f"{name} got unknown parameter(s) {', '.join(unknown)}; it takes {', '.join(declared)}")
    return {key: check_param(name, declared[key], value) for key, value in params.items()}


def make_rescorer(name: str, context: RescoreContext | None = None, **params) -> Rescorer | None:
    """The rescorer called `name` with its parameters (checked by `check_params`); `none` keeps the first-stage order."""
    if name in (None, "none"):
        return None
    clean = check_params(name, params)
    return _REGISTRY[name](context or RescoreContext(), **clean)
