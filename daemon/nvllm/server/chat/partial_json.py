"""Scanning the JSON of tool calls that may still be growing: enough to stream a call's name and the raw
text of its arguments as the model writes them (tool_calls.py reads the calls from these scans)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class PartialCall:
    """What is known so far of one {"name": ..., "arguments": ...} object."""
    name: str | None = None      # once its string is complete
    arguments: str = ""          # the raw arguments text so far
    args_key: bool = False       # the arguments key has been seen
    done: bool = False           # the object is closed


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """Index just past the JSON string starting at text[i] == '"'; None if it is not closed yet."""
    i += 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """Index just past the JSON value starting at text[i]; None if it is not complete yet."""
    if i >= len(text):
        return None
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None   # a number may still grow


def scan_object(text: str, i: int) -> tuple[PartialCall, int | None]:
    """The call object starting at text[i] == '{', read as far as it goes: (what is known, end or None)."""
    part = PartialCall()
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return part, None
        if text[i] == "}":
            part.done = True
            return part, i + 1
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            return part, None
        key_end = _string_end(text, i)
        if key_end is None:
            return part, None
        key = json.loads(text[i:key_end])
        i = skip_ws(text, key_end)
        if i >= len(text) or text[i] != ":":
            return part, None
        i = skip_ws(text, i + 1)
        if i >= len(text):
            if key in ("arguments", "parameters"):
                part.args_key = True
            return part, None
        end = _value_end(text, i)
        if key == "name" and end is not None and text[i] == '"':
            part.name = json.loads(text[i:end])
        elif key in ("arguments", "parameters"):
            part.args_key = True
            part.arguments = text[i:] if end is None else text[i:end]
        if end is None:
            return part, None
        i = end


def scan_calls(text: str) -> list[PartialCall]:
    """The calls of a "json"-style answer so far: one object, or a list of objects."""
    i = skip_ws(text, 0)
    if i >= len(text):
        return []
    if text[i] == "{":
        return [scan_object(text, i)[0]]
    if text[i] != "[":
        return []
    out: list[PartialCall] = []
    i += 1
    while True:
        i = skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
            continue
        if i >= len(text) or text[i] != "{":
            return out
        part, end = scan_object(text, i)
        out.append(part)
        if end is None:
            return out
        i = end
