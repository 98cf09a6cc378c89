"""JSON numbers carry at most a double's digits (issue 25, part 4): the budget read off a schema, and the
compiled matcher's masks over SmolLM2's tokenizer (one token per digit, so each digit is one step).

A text "passes" when each of its tokens is in the mask at its step: a refused digit is one the model
could never have sampled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.drone_command import DRONE_COMMAND
from nvllm.engine.structured.compiler import StructuredCompiler
from nvllm.engine.structured.digit_budget import DigitBudget, budget_for
from nvllm.engine.structured.matcher_pair import MatcherPair
from nvllm.sampling_params import InvalidParameter, StructuredSpec
from nvllm.server.chat.tool_grammar import Tool, tagged_constraint
from nvllm.text.tokenizer import Tokenizer


# -- the budget a schema gets ---------------------------------------------------------------------
@pytest.mark.parametrize("schema, budget", [
    (None, DigitBudget(17, 8, 3)),                                            # any JSON object
    ({"type": "number"}, DigitBudget(17, 8, 3)),
    ({"type": "number", "multipleOf": 1e-10}, DigitBudget(17, 10, 3)),
    ({"type": "number", "minimum": 0.000001, "maximum": 0.5}, DigitBudget(17, 8, 3)),
    ({"type": "integer", "maximum": 2**63 - 1}, DigitBudget(19, 8, 3)),
    ({"type": "integer", "minimum": 1e18}, DigitBudget(19, 8, 3)),           # written out: 19 digits
    ({"type": "number", "maximum": 1e308}, DigitBudget(19, 8, 3)),           # int64's digits at most
    ({"properties": {"k": {"const": 0.123456789012}}}, DigitBudget(17, 12, 3)),
    ({"enum": [1, {"a": [0.5, 1e-9]}]}, DigitBudget(17, 9, 3)),
    ({"properties": {"minimum": {"type": "string"}}, "minimum": True}, DigitBudget(17, 8, 3)),  # not bounds
])
def test_the_budget_is_a_doubles_unless_the_schemas_numbers_need_more(schema, budget) -> None:
    assert budget_for(None if schema is None else json.dumps(schema)) == budget


def test_numbers_past_any_sensible_budget_get_none() -> None:
    assert budget_for(json.dumps({"type": "number", "multipleOf": 1e-50})) is None
    assert budget_for("{not json") is None   # llguidance names the error; the budget stays out of it


def test_a_schema_nested_past_pythons_parser_is_refused_naming_the_field(smollm2: Path) -> None:
    """json.loads gives up 2000 deep (llguidance would not): a clear refusal, not a RecursionError."""
    deep = '{"items":' * 2000 + '{"type":"number"}' + "}" * 2000
    assert budget_for(deep) is None
    tok = Tokenizer.from_dir(smollm2)
    with pytest.raises(InvalidParameter) as e:
        StructuredCompiler(tok, tok.vocab_size, [0]).matcher(StructuredSpec("json_schema", deep))
    assert e.value.field == "structured.json_schema" and "nested" in str(e.value)


# -- the compiled matcher ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiler(smollm2: Path) -> StructuredCompiler:
    tok = Tokenizer.from_dir(smollm2)
    return StructuredCompiler(tok, tok.vocab_size, [tok.eos_token_id or 0])


def passes(c: StructuredCompiler, spec: StructuredSpec, text: str, *, whole: bool = False) -> bool:
    """Each token of text is allowed at its step (and, whole, the matcher accepts the end)."""
    m = c.matcher(spec)
    for token in c.tokenizer.encode(text, add_special_tokens=False):
        allowed = np.unpackbits(c.fill([m]).view(np.uint8), bitorder="little")
        if not allowed[token]:
            return False
        assert m.consume_token(token)
    return m.is_accepting() if whole else True


def schema(s: dict[str, Any]) -> StructuredSpec:
    return StructuredSpec("json_schema", json.dumps(s))


NUMBER, INTEGER = schema({"type": "number"}), schema({"type": "integer"})


@pytest.mark.smollm2
class TestMasks:
    @pytest.mark.parametrize("text, ok", [
        ("12345678901234567", True), ("123456789012345678", False),          # 17 significant digits
        ("1234567890.1234567", True), ("1234567890.12345678", False),
        ("1.12345678", True), ("1.123456789", False),                        # 8 after the point
        ("-0.00000001", True), ("0.000000001", False),
        ("1.5e308", True), ("-2E-300", True), ("1e+999", True), ("1.5e3081", False),   # 3 exponent digits
    ])
    def test_a_number_carries_a_doubles_digits(self, compiler: StructuredCompiler, text: str, ok: bool) -> None:
        assert passes(compiler, NUMBER, text) is ok

    def test_integers_are_bounded_too_unless_their_bounds_need_more(self, compiler: StructuredCompiler) -> None:
        assert passes(compiler, INTEGER, "-12345678901234567", whole=True)
        assert not passes(compiler, INTEGER, "123456789012345678")
        wide = schema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1})
        assert passes(compiler, wide, "9223372036854775807", whole=True)

    def test_multiple_of_asks_for_more_fraction_digits(self, compiler: StructuredCompiler) -> None:
        fine = schema({"type": "number", "multipleOf": 1e-10})
        assert passes(compiler, fine, "3.1415926535", whole=True)
        assert not passes(compiler, fine, "3.14159265358")

    def test_strings_keep_max_length_and_their_digits_are_text(self, compiler: StructuredCompiler) -> None:
        short = schema({"type": "string", "minLength": 2, "maxLength": 5})
        assert passes(compiler, short, '"abcde"', whole=True)
        assert not passes(compiler, short, '"abcdef')
        assert not passes(compiler, short, '"a"')                            # llguidance holds minLength
        assert passes(compiler, schema({"type": "string"}), '"1234567890123456789012345"', whole=True)

    def test_the_drone_command(self, compiler: StructuredCompiler) -> None:
        spec = schema(DRONE_COMMAND)
        good = ('{"action":"goto","lat":54.6872,"lon":25.2797,"alt_m":40,"speed_mps":12.5,'
                '"reason":"deliver 2 parcels to 14 Main St"}')
        assert passes(compiler, spec, good, whole=True)
        assert not passes(compiler, spec, '{"action":"goto","lat":54.6872,"lon":25.177459977')
        assert not passes(compiler, spec, good.replace("deliver 2", "x" * 81))   # maxLength 80

    def test_a_bound_that_needs_more_digits_falls_back_to_the_schema(self, compiler: StructuredCompiler) -> None:
        # Above 0: after 0.00000000 only a digit may follow, which the budget has no room for.
        spec = schema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})
        assert passes(compiler, spec, "0.000000001", whole=True)
        m = compiler.matcher(spec)
        assert isinstance(m, MatcherPair) and m.consume_tokens(
            compiler.tokenizer.encode("0.000000001", add_special_tokens=False))
        assert m.digits is None and m.is_accepting()                          # the budget stepped aside

    def test_the_schemas_own_x_guidance_still_wins(self, compiler: StructuredCompiler) -> None:
        spaced = schema({"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
                         "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                         "required": ["a", "b"], "additionalProperties": False})
        assert passes(compiler, spaced, '{"a": 1.5, "b": 2}', whole=True)
        assert not passes(compiler, spaced, '{"a":1.5')
        assert not passes(compiler, spaced, '{"a": 1.123456789')

    def test_regex_and_grammars_are_as_written(self, compiler: StructuredCompiler) -> None:
        digits = "1234567890" * 3
        assert passes(compiler, StructuredSpec("regex", "[0-9]{30}"), digits, whole=True)
        assert passes(compiler, StructuredSpec("grammar", "start: /[0-9]{30}/\n"), digits, whole=True)
        assert not isinstance(compiler.matcher(StructuredSpec("regex", "[0-9]+")), MatcherPair)

    def test_any_json_object_is_budgeted_too(self, compiler: StructuredCompiler) -> None:
        assert passes(compiler, StructuredSpec("json_object"), '{"a":1.12345678}', whole=True)
        assert not passes(compiler, StructuredSpec("json_object"), '{"a":1.123456789')


@pytest.mark.smollm2
def test_a_forced_tool_call_holds_its_numbers_to_the_budget(compiler: StructuredCompiler) -> None:
    """A forced tagged call (Qwen's <tool_call>) is tags and JSON alone: its numbers get the JSON budget, so a
    weak model cannot write a coordinate's digits until max_tokens; with free text around the calls ("auto")
    the grammar stands as written."""
    tools = [Tool("command_drone", DRONE_COMMAND)]
    forced = tagged_constraint(tools, parallel=False, forced=True)
    assert forced.digits_schema is not None
    call = ('<tool_call>\n{"name": "command_drone", "arguments": {"action": "goto", "lat": 54.6872, "lon": 25.2797, '
            '"alt_m": 40, "speed_mps": 12.5, "reason": "deliver"}}\n</tool_call>')
    assert passes(compiler, forced, call, whole=True)
    long_lat = '<tool_call>\n{"name": "command_drone", "arguments": {"action": "goto", "lat": 54.687212345'
    assert not passes(compiler, forced, long_lat)
    assert passes(compiler, StructuredSpec("grammar", forced.value), long_lat)     # without the budget it passes
    assert tagged_constraint(tools, parallel=False, forced=False).digits_schema is None
