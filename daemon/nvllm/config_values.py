"""What a setting's value may be, and the check of one value against its field (config.py's dataclasses).

Each field's annotation is its type and its metadata (at_least, above, between, one_of, NON_EMPTY) its
allowed values; `checked` coerces a value to the type (an int for a float field becomes a float) and
refuses one outside them with a one-line ConfigError naming the key, the value and what it needs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

RANGE = "range"          # the metadata key of a field's allowed values


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class Range:
    """The values a setting allows beyond its type: bounds (inclusive unless lo_open), or choices."""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[Any, ...] = ()
    non_empty: bool = False
    text: str = ""           # the wording for the message, where the generated one would be unclear
    duration: bool = False   # a duration's text ("5m", "30s", "1h30m", "250ms", seconds, "-1")

    def admits(self, value: Any) -> bool:
        if self.duration:
            return duration_seconds(value) is not None or (value == "" and not self.non_empty)
        if self.choices:
            return value in self.choices
        if self.non_empty and len(value) == 0:
            return False
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        return self.hi is None or value <= self.hi

    def describe(self, type_text: str) -> str:
        if self.text:
            return self.text
        if self.choices:
            return "one of " + _or_list([show(c) for c in self.choices])
        if self.non_empty:
            type_text = "a non-empty " + type_text.split(" ", 1)[-1]
        if self.hi is None:
            if self.lo is None:
                return type_text
            return f"{type_text} {'>' if self.lo_open else '>='} {_number(self.lo)}"
        if self.lo is None:
            return f"{type_text} <= {_number(self.hi)}"
        return f"{type_text} in {'(' if self.lo_open else '['}{_number(self.lo)}, {_number(self.hi)}]"


def at_least(lo: float) -> dict[str, Range]:
    return {RANGE: Range(lo=lo)}


def above(lo: float) -> dict[str, Range]:
    return {RANGE: Range(lo=lo, lo_open=True)}


def between(lo: float, hi: float, lo_open: bool = False, text: str = "") -> dict[str, Range]:
    return {RANGE: Range(lo=lo, hi=hi, lo_open=lo_open, text=text)}


def one_of(*choices: Any) -> dict[str, Range]:
    return {RANGE: Range(choices=choices)}


NON_EMPTY = {RANGE: Range(non_empty=True)}
_DURATION_TEXT = 'a duration such as "5m", "30s" or "1h", a number of seconds, "0" or "-1"'
DURATION = {RANGE: Range(duration=True, non_empty=True, text=_DURATION_TEXT)}
DURATION_OR_EMPTY = {RANGE: Range(duration=True, text=_DURATION_TEXT + ", or empty")}
NEVER = -1.0     # a negative duration: for good
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float | None:
    """The seconds a duration's text means (NEVER for a negative one), None if it is none: "5m", "30s",
    "1h30m", "250ms", "90" or "2.5" (seconds), "0", "-1" or any negative duration."""
    text = text.strip()
    negative = text.startswith("-")
    body = text[1:] if negative else text
    if re.fullmatch(r"\d+(?:\.\d+)?", body):
        seconds = float(body)
    else:
        parts = _DURATION_PART.findall(body)
        if not parts or "".join(n + u for n, u in parts) != body:
            return None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    return NEVER if negative else seconds


# -- checking one value against its field ----------------------------------------------------------
_NO = object()           # "not of that type"; None itself is a value an optional field accepts
_UNION_TYPES = (Union, types.UnionType)
SHOW_MAX = 80            # a long value is cut in the message, which stays one short line


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def show(value: Any) -> str:
    """The value as TOML would spell it (true, "text", [1, 2]), on one line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k} = {show(v)}" for k, v in value.items()) + "}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(show(v) for v in value) + "]"
    else:
        text = " ".join(str(value).split())
    return text if len(text) <= SHOW_MAX else text[:SHOW_MAX - 3] + "..."


def _coerce(hint: Any, value: Any) -> Any:
    """value as the annotation wants it (an int for a float field becomes a float), or _NO."""
    origin = typing.get_origin(hint)
    if origin in _UNION_TYPES:
        for arg in typing.get_args(hint):
            got = _coerce(arg, value)
            if got is not _NO:
                return got
        return _NO
    if hint is type(None):
        return value if value is None else _NO
    if origin is list:   # list[str]: a TOML array, each item of the item type
        if not isinstance(value, list):
            return _NO
        items = [_coerce(typing.get_args(hint)[0], v) for v in value]
        return _NO if any(v is _NO for v in items) else items
    if hint is bool:
        return value if isinstance(value, bool) else _NO
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO
    if hint is float:   # TOML writes inf and nan; neither is a usable setting
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else _NO
    if isinstance(hint, type):
        return value if isinstance(value, hint) else _NO
    return value if origin is not None and isinstance(value, origin) else _NO


def _describe_type(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in _UNION_TYPES:
        return _or_list([_describe_type(a) for a in typing.get_args(hint) if a is not type(None)])
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if typing.get_origin(hint) is list:
        return f"a list of {_describe_type(typing.get_args(hint)[0]).split(' ', 1)[-1]}s"
    return names.get(hint, f"a {getattr(hint, '__name__', hint)}")


def _expected(hint: Any, f: dataclasses.Field) -> str:
    rng = f.metadata.get(RANGE)
    text = _describe_type(hint) if rng is None else rng.describe(_describe_type(hint))
    optional = typing.get_origin(hint) in _UNION_TYPES and type(None) in typing.get_args(hint)
    return text + " (or left out)" if optional else text


def checked(name: str, value: Any, hint: Any, f: dataclasses.Field, source: str) -> Any:
    """value, coerced to the field's type, or ConfigError naming the key, the value and what it needs."""
    got = _coerce(hint, value)
    rng = f.metadata.get(RANGE)
    if got is _NO or (got is not None and rng is not None and not rng.admits(got)):
        raise ConfigError(f"{source}{name} must be {_expected(hint, f)}, got {show(value)}")
    return got
