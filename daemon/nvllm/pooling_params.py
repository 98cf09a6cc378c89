"""PoolingParams: what a pooling request (an embedding, or a reranker's score of a query and a document) may
ask, validated once. Names follow vLLM's and OpenAI's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.sampling_params import InvalidParameter


def _positive_int(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameter(field, value, "a positive integer")
    return value


@dataclass(frozen=True)
class PoolingParams:
    # The embedding's length, cut from the model's own (Matryoshka): only for models trained for it.
    dimensions: int | None = None
    # An input longer than this many tokens is cut to it (text: its first tokens, the tokenizer's special
    # tokens kept; token ids: the last ones, as vLLM cuts them); without it, one longer than the model
    # takes is refused.
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        _positive_int("dimensions", self.dimensions)
        _positive_int("truncate_prompt_tokens", self.truncate_prompt_tokens)
