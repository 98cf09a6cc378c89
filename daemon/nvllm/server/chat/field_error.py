"""A chat request's field refused, in no API's shape: each front door maps it to its own (OpenAI's or
Anthropic's 400, the Responses API's, gRPC's INVALID_ARGUMENT), naming the field in its own spelling."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class FieldError(Exception):
    """`field` is the path of the refused field as the shared readers know it (OpenAI chat's spelling);
    `code` a machine-readable reason where one helps (unknown_parameter, unsupported_parameter)."""

    def __init__(self, field: str | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.code = code


def bad_field(field: str | None, message: str, code: str | None = None) -> FieldError:
    return FieldError(field, message, code)


def show(value: Any, quote: Callable[[Any], str] = json.dumps) -> str:
    """A refused value as a message quotes it: a scalar as JSON spells it (or as `quote` does: the Responses
    API's messages use Python's repr), anything else by its type's name; at most 48 characters and "..."."""
    text = quote(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 48 else text[:48] + "..."
