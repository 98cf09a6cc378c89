"""Structured output on the OpenAI API (issue 17, item 5): response_format (text, json_object, json_schema) and
vLLM's structured_outputs extra (choice, json, regex, grammar, json_object) mapped to the engine's constraint,
with the request field each came from; bad shapes are 400s naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.tool_call_cases import TIME_PARAMS, WEATHER_PARAMS, refused
from nvllm.server.chat.response_format import Constraint, parse_constraint


def constraint(body: dict[str, Any]) -> Constraint:
    """parse_constraint of a body that asks for a constraint, so gets one."""
    c = parse_constraint(body)
    assert c is not None, body
    return c


class TestResponseFormat:
    def test_mapping(self):
        assert parse_constraint({}) is None
        assert parse_constraint({"response_format": {"type": "text"}}) is None
        c = constraint({"response_format": {"type": "json_object"}})
        assert c.spec.kind == "json_object" and c.param == "response_format"
        c = constraint({"response_format": {"type": "json_schema", "json_schema": {
            "name": "w", "schema": WEATHER_PARAMS, "strict": True}}})
        assert isinstance(c.spec.value, str)
        assert c.spec.kind == "json_schema" and json.loads(c.spec.value) == WEATHER_PARAMS
        assert c.param == "response_format.json_schema.schema"
        c = constraint({"structured_outputs": {"choice": ["yes", "no"]}})
        assert c.spec.value is not None
        assert c.spec.kind == "choice" and tuple(c.spec.value) == ("yes", "no")
        assert c.param == "structured_outputs.choice"
        c = constraint({"structured_outputs": {"json": json.dumps(TIME_PARAMS)}})
        assert isinstance(c.spec.value, str)
        assert c.spec.kind == "json_schema" and json.loads(c.spec.value) == TIME_PARAMS
        assert constraint({"structured_outputs": {"regex": "[0-9]+"}}).spec.kind == "regex"
        assert constraint({"structured_outputs": {"grammar": 'start: "a"'}}).spec.kind == "grammar"
        assert constraint({"structured_outputs": {"json_object": True}}).spec.kind == "json_object"

    @pytest.mark.parametrize("body, param", [
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
         "response_format.json_schema.name"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
         "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": 1}}},
         "response_format.json_schema.strict"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ])
    def test_bad_shapes_are_400_naming_the_field(self, body, param):
        refused(lambda: parse_constraint(body), param)
