"""Typed option declarations shared by the profile loader, the engines and the reference.

One table of options (name, kind, default, help) is the single source of truth: the loader
validates against it, engines declare their own extra options the same way, and the CLI's
help text and docs/reference/ (docs/generate.py) come from it, so documentation and
validation cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from gpufio.core.errors import BadInput
from gpufio.core.units import parse_size, parse_time_ns

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise BadInput(f"{what}: expected true or false, got {value!r}")


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise BadInput(f"{what}: expected a whole number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            pass
    raise BadInput(f"{what}: expected a whole number, got {value!r}")


def _as_str(value: Any, what: str) -> str:
    if isinstance(value, str) and value:
        return value
    raise BadInput(f"{what}: expected a non-empty string, got {value!r}")


def _as_str_list(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    raise BadInput(f"{what}: expected a list of strings, got {value!r}")


def _as_int_list(value: Any, what: str) -> tuple[int, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if isinstance(value, list):
        return tuple(_as_int(v, what) for v in value)
    raise BadInput(f"{what}: expected a list of whole numbers, got {value!r}")


def _as_percentiles(value: Any, what: str) -> tuple[float, ...]:
    if isinstance(value, str):
        value = [v for v in value.replace(":", ",").split(",") if v]
    if not isinstance(value, list) or not value:
        raise BadInput(f"{what}: expected a list of percentiles, got {value!r}")
    out = []
    for v in value:
        try:
            p = float(v) if not isinstance(v, bool) else -1.0
        except ValueError:
            p = -1.0
        if not 0 < p <= 100:
            raise BadInput(f"{what}: {v!r} is not a percentile above 0 and at most 100")
        out.append(p)
    return tuple(sorted(set(out)))


def _as_gpu_targets(value: Any, what: str) -> Any:
    """"all", "nearest", or {gpu index: [targets]} (a TOML table, its keys the indexes), the
    table as a tuple of (gpu, targets) pairs so that a Job stays hashable and frozen."""
    if value in ("all", "nearest"):
        return value
    if isinstance(value, dict) and value:
        pairs = []
        for key, targets in value.items():
            try:
                gpu = int(key)
            except (TypeError, ValueError):
                raise BadInput(f"{what}: {key!r} is not a GPU index") from None
            pairs.append((gpu, _as_str_list(targets, f"{what} (GPU {gpu})")))
        return tuple(sorted(pairs))
    raise BadInput(f"{what}: expected \"all\", \"nearest\" or a table of GPU index = "
                   f"[targets], got {value!r}")


def _as_size_or_share(value: Any, what: str) -> int | float | None:
    """A size in bytes (an int), "N%": a share of something the key's owner knows (a float
    above 0 and at most 1), or "none": no value, where a profile set one."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 < share <= 1:
            raise BadInput(f"{what}: {value!r} is not a share above 0% and at most 100%")
        return share
    size = parse_size(value, what)
    if size < 1:
        raise BadInput(f"{what}: must be greater than 0, got {value!r}")
    return size


_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "bool": _as_bool,
    "int": _as_int,
    "str": _as_str,
    "size": parse_size,
    "size_or_share": _as_size_or_share,
    "time": parse_time_ns,
    "strlist": _as_str_list,
    "intlist": _as_int_list,
    "percentiles": _as_percentiles,
    "gpu_targets": _as_gpu_targets,
}


@dataclass(frozen=True)
class Option:
    """One profile key: how to read it, its default, the smallest value that makes sense."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    aliases: tuple[tuple[str, str], ...] = ()

    def convert(self, value: Any, where: str) -> Any:
        """The typed value, or BadInput naming ``where`` (file, job) and this key."""
        what = f"{where}key '{self.name}'"
        result = _CONVERTERS[self.kind](value, what)
        result = dict(self.aliases).get(result, result) if self.aliases else result
        if self.choices and result not in self.choices:
            raise BadInput(f"{what}: {result!r} is not one of {', '.join(self.choices)}")
        if self.minimum is not None and result < self.minimum:
            bound = ("greater than 0" if self.minimum == 1 else
                     f"at least {self.minimum // 1_000_000} ms" if self.kind == "time" else
                     f"at least {self.minimum}")
            raise BadInput(f"{what}: must be {bound}, got {value!r}")
        return result


# the Python type each kind of option converts to
_TYPES: dict[str, type] = {"bool": bool, "int": int, "str": str, "size": int,
                           "size_or_share": object, "time": int,
                           "strlist": tuple, "intlist": tuple, "percentiles": tuple,
                           "gpu_targets": object}


def settings_class(name: str, options: tuple[Option, ...], module: str,
                   qualname: str | None = None) -> type:
    """A frozen dataclass with one typed field per option (its default the option's; None
    where the owner picks): what an engine or a workload reads its options through, built
    once from the same table the loader checks. ``module`` and ``qualname`` (default:
    ``name``) say where it is defined, so a job carrying its settings pickles to a spawned
    worker."""
    fields = [(o.name, _TYPES[o.kind] if o.default is not None else _TYPES[o.kind] | None,
               dataclasses.field(default=o.default)) for o in options]
    cls = dataclasses.make_dataclass(name, fields, frozen=True)
    cls.__module__, cls.__qualname__ = module, qualname or name
    return cls
