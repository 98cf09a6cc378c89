"""Where a constrained answer's grammar starts when the model thinks first (server.reasoning_parser set):
after the model writes its end-of-thinking token, so the mask never constrains the <think> part.

vLLM's rule for whether thinking is still to come: scanning the prompt back, an end-of-thinking token met
before a start one means the template already closed it (Qwen3's enable_thinking false writes an empty
<think></think> block), so the grammar applies from the first token; otherwise it waits for the end token.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvllm.text.tokenizer import Tokenizer

# The tags a thinking model wraps its thoughts in; the server's reasoning parser reads answers by them too.
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def think_token_ids(tokenizer: Tokenizer) -> tuple[int, int] | None:
    """(start, end) ids when the vocabulary has both tags as single tokens (Qwen3, DeepSeek-R1); else None."""
    start, end = tokenizer.token_to_id(THINK_OPEN), tokenizer.token_to_id(THINK_CLOSE)
    return None if start is None or end is None else (start, end)


def prompt_ends_thinking(prompt_ids: Sequence[int], think: tuple[int, int]) -> bool:
    """Whether the prompt's last think tag is an end one (the answer then starts after the thinking)."""
    start, end = think
    for token in reversed(prompt_ids):
        if token == end:
            return True
        if token == start:
            return False
    return False
