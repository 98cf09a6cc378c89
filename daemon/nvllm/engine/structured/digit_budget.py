"""The digits a JSON number may carry under a JSON constraint, as a regex over the whole answer.

llguidance holds a number to its schema (range, multipleOf, integer or not) but not to a length: a bare
"number" matches a hundred digits, and a small model at temperature 1 writes them until max_tokens. The
budget here is what a double holds: 17 significant digits, 8 after the point, 3 in the exponent, more
where the schema's own numbers need them (multipleOf 1e-10: 10 after the point; an integer bound of 19
digits: 19). It is one budget for the whole answer (the largest any number of the schema needs), held by
a second matcher beside the schema's (engine/structured/matcher_pair.py).

The regex reads JSON as a lexer would: strings (whose digits are text, not numbers) pass whole, a number
is bounded and must be followed by a character that cannot continue it, anything else passes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

SIGNIFICANT = 17       # a double's round-trip digits
FRACTION = 8           # after the point, unless the schema's numbers need more
EXPONENT = 3           # a double's exponent is at most 308 (324 for the smallest subnormal)
# An integer is written out whole, and llguidance bounds integers as int64: a bound's digits before the
# point count up to int64's 19 (a larger one, 1e308 say, is a number the answer writes with an exponent).
INTEGER_DIGITS = 19
# Past this a schema's numbers are not ones a budget helps with: no budget then (the regex would grow).
MAX_FRACTION = 40
# Keywords whose numbers the answer's numbers are compared with; const and enum are written as they are.
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_LITERALS = ("const", "enum")


@dataclass(frozen=True)
class DigitBudget:
    significant: int = SIGNIFICANT
    fraction: int = FRACTION
    exponent: int = EXPONENT

    def regex(self) -> str:
        """A regex every JSON text within the budget matches (and every prefix of one extends to a match)."""
        mantissas = [f"0(?:\\.[0-9]{{1,{self.fraction}}})?"]
        for k in range(1, self.significant + 1):   # k digits before the point, the rest after it
            after = min(self.fraction, self.significant - k)
            mantissas.append(f"[1-9][0-9]{{{k - 1}}}" + (f"(?:\\.[0-9]{{1,{after}}})?" if after else ""))
        number = f"-?(?:{'|'.join(mantissas)})(?:[eE][+\\-]?[0-9]{{1,{self.exponent}}})?"
        string = '"(?:[^"\\\\]|\\\\.)*"'
        other = '[^"\\-0-9]'             # outside strings, '-' and digits start numbers only
        follows = '[^"\\-0-9.eE+]'       # what may end a number (a separator, a bracket, whitespace)
        return f"(?:{other}|{string}|{number}{follows})*(?:{number})?"


def budget_for(schema_text: str | None) -> DigitBudget | None:
    """The budget for answers to a JSON Schema (None: any JSON); None when its numbers need more digits
    than a budget should hold, or the text does not parse here (llguidance has its own say on it)."""
    if schema_text is None:
        return DigitBudget()
    try:
        schema = json.loads(schema_text)
    except (ValueError, RecursionError):   # nested deeper than Python's parser goes, which llguidance's may
        return None
    significant, fraction = SIGNIFICANT, FRACTION
    for x in _schema_numbers(schema):
        digits, after = _digits(x)
        significant, fraction = max(significant, digits), max(fraction, after)
    if fraction > MAX_FRACTION:
        return None
    return DigitBudget(significant, fraction)


def _schema_numbers(schema: Any) -> Iterator[float | int]:
    """The numbers of a schema's bounds and multipleOf, and every number in its const and enum values.
    A walk with a stack of its own, so that no nesting is too deep for it."""
    stack: list[tuple[Any, bool]] = [(schema, False)]   # (node, inside a const or enum value)
    while stack:
        node, literal = stack.pop()
        if _is_number(node):
            if literal:
                yield node
        elif isinstance(node, dict):
            for key, value in node.items():
                if not literal and key in _BOUNDS and _is_number(value):
                    yield value
                else:
                    stack.append((value, literal or key in _LITERALS))
        elif isinstance(node, list):
            stack.extend((value, literal) for value in node)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (isinstance(value, int) or math.isfinite(value))


def _digits(x: float | int) -> tuple[int, int]:
    """(digits, digits after the point) to write x without an exponent, as its shortest repr has them."""
    d = Decimal(repr(x)).normalize() if isinstance(x, float) else Decimal(x)
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)   # finite, checked by _is_number
    after = max(0, -exponent)
    before = max(0, len(digits) + exponent)   # digits before the point (trailing zeros of a big one too)
    return min(max(1, before), INTEGER_DIGITS) + after, after
