"""An HTTP request body's JSON checks, shared by every reader of http/: the body parsed (parse_json), a field's
type (need, with the kinds below: a refusal says them), the keys allowed (check_keys) and the model named
(check_model); each refusal a 400 (404 for a model not served) naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nvllm.server.http.errors import ApiError, bad_request

# A field's JSON kind, as need() checks it and a refusal names it.
INT, REAL, BOOL = "an integer", "a number", "true or false"
STRING, OBJECT, ARRAY = "a string", "an object", "an array"


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (no NaN or Infinity); 400 otherwise."""
    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")
    try:
        data = json.loads(body, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad_request(None, f"the request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise bad_request(None, f"the request body must be a JSON object, got {json_type(data)}")
    return data


def json_type(v: Any) -> str:
    """What a JSON value is, as a refusal says it (the parser's types; anything else by its Python name)."""
    return {dict: OBJECT, list: ARRAY, str: STRING, bool: "a boolean", type(None): "null", int: REAL,
            float: REAL}.get(type(v), type(v).__name__)


def need(name: str, value: Any, kind: str) -> Any:
    """value, where it is of kind (one of the kinds above); 400 naming the field otherwise."""
    ok = {INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
          REAL: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          BOOL: lambda v: isinstance(v, bool),
          STRING: lambda v: isinstance(v, str),
          OBJECT: lambda v: isinstance(v, dict), ARRAY: lambda v: isinstance(v, list)}[kind](value)
    if not ok:
        raise bad_request(name, f"{name} must be {kind}, got {json_type(value)}")
    return value


def check_keys(body: dict[str, Any], allowed: set[str],
               neutral: dict[str, Callable[[Any], bool]]) -> None:
    """Every key allowed, or a parameter nvllm does not implement at the value that asks for nothing
    (neutral: that API's table of them, openai_request.NEUTRAL for OpenAI's endpoints); 400 naming the key
    otherwise."""
    for key, value in body.items():
        if key in allowed:
            continue
        if key in neutral:
            if neutral[key](value):
                continue
            raise bad_request(key, f"{key} is not supported by nvllm", code="unsupported_parameter")
        # the key first: an API whose error has no param field (Anthropic's) names it so
        raise bad_request(key[:64], f"{key[:64]}: unknown parameter", code="unknown_parameter")


def only_keys(at: str, obj: dict[str, Any], allowed: set[str]) -> None:
    """An object nested in the body (at: its field's name) holds only the allowed keys; 400 naming the first
    other one otherwise."""
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise bad_request(f"{at}.{unknown[0]}"[:80], f"{at}.{unknown[0][:64]} is not supported",
                          code="unknown_parameter")


def check_model(body: dict[str, Any], model_name: str) -> None:
    """A body's `model`, where given, must be the served model it was read for (empty: the default; 404
    otherwise)."""
    model = body.get("model")
    if model is not None:
        need("model", model, STRING)
        if model and model != model_name:
            raise ApiError(404, f"the model {model[:64]!r} does not exist; this daemon serves {model_name!r}",
                           "model", "model_not_found")


