"""Structured output on the OpenAI API: response_format and vLLM's structured_outputs extra, mapped onto
the engine's constraint (SamplingParams.structured).

  response_format {"type": "text"}                          no constraint
  response_format {"type": "json_object"}                   any JSON object
  response_format {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
                                                            JSON valid under the schema
  structured_outputs {"json": schema}                       the same (the schema as an object or its text)
  structured_outputs {"json_object": true}                  any JSON object
  structured_outputs {"regex": "..."}                       text matching the regex
  structured_outputs {"choice": ["a", "b"]}                 exactly one of the strings
  structured_outputs {"grammar": "..."}                     a Lark (llguidance) or GBNF grammar

The Responses API's text.format {"type": "json_schema", "name", "schema", ...} is the same json_schema object
(json_schema_constraint), read by server/http/responses_request.py.

Shapes are checked here (400 naming the field); whether a schema, regex or grammar compiles is the
engine's check, and its refusal comes back as 400 naming the field it came in (`Constraint.param`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import StructuredSpec
from nvllm.server.chat.field_error import bad_field, show

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for json_schema.name
# structured_outputs keys that pick the constraint, and the request field each is reported as.
_KINDS = {"json": "json_schema", "json_object": "json_object", "regex": "regex", "choice": "choice",
          "grammar": "grammar"}
# structured_outputs options that change nothing here: JSON is always compact, and there is no fallback.
_IGNORED = {"disable_fallback", "disable_any_whitespace", "disable_additional_properties"}


@dataclass(frozen=True)
class Constraint:
    spec: StructuredSpec
    param: str          # the request field it came from, named when the engine refuses it


def parse_constraint(body: dict[str, Any]) -> Constraint | None:
    """The constraint a request's response_format or structured_outputs asks for (None: free text)."""
    rf = _response_format(body.get("response_format"))
    so = _structured_outputs(body.get("structured_outputs"))
    if rf is not None and so is not None:
        raise bad_field("structured_outputs", "structured_outputs and a response_format other than text "
                                                "ask for two constraints: give one")
    return rf or so


def _response_format(rf: Any) -> Constraint | None:
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad_field("response_format", "response_format must be an object like {\"type\": \"json_object\"}")
    kind = rf.get("type")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
    if kind not in allowed:
        raise bad_field("response_format.type", "response_format.type must be 'text', 'json_object' or "
                                                  f"'json_schema', got {show(kind)}")
    extra = sorted(set(rf) - allowed[kind])
    if extra:
        raise bad_field(f"response_format.{extra[0]}"[:80], f"response_format.{extra[0][:64]} is not "
                                                               f"supported with type {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(StructuredSpec("json_object"), "response_format")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise bad_field("response_format.json_schema", "response_format.json_schema must be an object "
                                                         "with a name and a schema")
    return json_schema_constraint(js, "response_format.json_schema")


def json_schema_constraint(js: dict[str, Any], at: str, more_keys: frozenset[str] = frozenset()) -> Constraint:
    """A json_schema object ({"name", "schema", "strict", "description"}) as a constraint. `at` is where it
    sits in the request (chat's response_format.json_schema, the Responses API's text.format, which holds
    its "type" too: `more_keys`); refusals name the field under it."""
    extra = sorted(set(js) - {"name", "schema", "strict", "description"} - more_keys)
    if extra:
        raise bad_field(f"{at}.{extra[0]}"[:80], f"{at}.{extra[0][:64]} is not supported")
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_field(f"{at}.name", f"{at}.name must be 1 to 64 letters, digits, '_' or '-', got {show(name)}")
    if js.get("strict") is not None and not isinstance(js["strict"], bool):
        raise bad_field(f"{at}.strict", f"{at}.strict must be true or false")
    if js.get("description") is not None and not isinstance(js["description"], str):
        raise bad_field(f"{at}.description", f"{at}.description must be a string")
    schema = js.get("schema")
    param = f"{at}.schema"
    if schema is None:
        return Constraint(StructuredSpec("json_object"), param)   # no schema: any JSON object
    if not isinstance(schema, dict):
        raise bad_field(param, f"{param} must be a JSON Schema object, got {show(schema)}")
    # strict or not, the answer follows the schema: the constraint is all nvllm has to keep it.
    return Constraint(StructuredSpec("json_schema", _schema_text(schema, param)), param)


def _structured_outputs(so: Any) -> Constraint | None:
    if so is None:
        return None
    if not isinstance(so, dict):
        raise bad_field("structured_outputs", "structured_outputs must be an object like {\"json\": {...}}, "
                                                "{\"regex\": ...}, {\"choice\": [...]} or {\"grammar\": ...}")
    unknown = sorted(set(so) - set(_KINDS) - _IGNORED)
    if unknown:
        raise bad_field(f"structured_outputs.{unknown[0]}"[:80],
                          f"structured_outputs.{unknown[0][:64]} is not supported by nvllm")
    for key in sorted(_IGNORED & set(so)):
        if so[key] is not None and not isinstance(so[key], bool):
            raise bad_field(f"structured_outputs.{key}", f"structured_outputs.{key} must be true or false")
    given = [k for k in _KINDS if so.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad_field("structured_outputs", "structured_outputs must set exactly one of json, json_object, "
                                                f"regex, choice, grammar (got {len(given)})")
    key = given[0]
    value, param = so[key], f"structured_outputs.{key}"
    if key == "json_object":
        if value is not True:
            raise bad_field(param, f"{param} must be true")
        return Constraint(StructuredSpec("json_object"), param)
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise bad_field(param, f"{param} must be a JSON Schema (an object or its JSON text): {e}") from None
        if not isinstance(value, dict):
            raise bad_field(param, f"{param} must be a JSON Schema object, got {show(value)}")
        return Constraint(StructuredSpec("json_schema", _schema_text(value, param)), param)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_field(param, f"{param} must be a non-empty array of non-empty strings")
        return Constraint(StructuredSpec("choice", tuple(value)), param)
    if not isinstance(value, str) or not value:
        raise bad_field(param, f"{param} must be a non-empty string")
    return Constraint(StructuredSpec(_KINDS[key], value), param)


def _schema_text(schema: dict[str, Any], param: str) -> str:
    try:
        return json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise bad_field(param, f"{param} must be JSON: {e}") from None

