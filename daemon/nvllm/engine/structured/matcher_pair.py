"""A JSON constraint's matcher with its digit budget beside it (engine/structured/digit_budget.py).

The schema's matcher is the constraint: it says what the answer is, when it is complete, what went
wrong. The budget's matcher only narrows the mask: a row's allowed tokens are those both allow, or the
schema's alone where they allow none in common (a bound that asks for more digits than the budget, say),
so the budget can never leave a row with nothing to sample. A token the budget refuses (taken through
that fallback) ends the budget for the rest of the answer; the schema goes on alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # llguidance is imported when a request first asks for structure (compiler.py)
    from llguidance import LLMatcher


class MatcherPair:
    """Quacks as the LLMatcher the engine calls (consume, validate, accepting, stopped, error) over `schema`."""

    def __init__(self, schema: LLMatcher, digits: LLMatcher | None) -> None:
        self.schema = schema
        self.digits = digits

    def consume_token(self, token: int) -> bool:
        if not self.schema.consume_token(token):
            return False
        if self.digits is not None and not self.digits.consume_token(token):
            self.digits = None
        return True

    def consume_tokens(self, tokens: Sequence[int]) -> bool:
        return all(self.consume_token(t) for t in tokens)

    def validate_tokens(self, tokens: list[int]) -> int:
        """How many of tokens, in order, both would take (speculative proposals are cut to that)."""
        n = self.schema.validate_tokens(tokens)
        return n if self.digits is None or not n else min(n, self.digits.validate_tokens(tokens[:n]))

    def is_accepting(self) -> bool:
        return self.schema.is_accepting()

    def is_stopped(self) -> bool:
        return self.schema.is_stopped()

    def is_error(self) -> bool:
        return self.schema.is_error()

    def get_error(self) -> str | None:
        return self.schema.get_error()

    def deep_copy(self) -> MatcherPair:
        return MatcherPair(self.schema.deep_copy(), None if self.digits is None else self.digits.deep_copy())
