"""A request's prompt as token ids: text tokenized, chat messages rendered with the model's template
(with OpenAI's tools), ids checked against the vocabulary. The one place a request becomes tokens, and
where token ids become text again for the tokenize and detokenize endpoints (`tokenize`, `detokenize`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.text.tokenizer import Tokenizer

# What a request may give as its prompt: text, token ids, or {"prompt": text},
# {"prompt_token_ids": [...]}, {"messages": [...]} (rendered here with the model's chat template).
Prompt = str | list[int] | Mapping[str, Any]
_CHAT_KEYS = frozenset({"messages", "tools", "chat_template_kwargs"})
_NO_LIMIT = 1 << 30   # encode_within's limit where nothing is to be cut


def prompt_ids(tokenizer: Tokenizer, vocab: int, prompt: Prompt, add_special_tokens: bool = True,
               add_generation_prompt: bool = True) -> tuple[str, list[int]]:
    """(the field the prompt came in, its token ids); ids must lie in [0, vocab). add_special_tokens: text
    gets the tokenizer's own (BOS and the like; a chat template writes its own, so chat never does);
    add_generation_prompt: a chat ends with the assistant's turn opened."""
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    elif isinstance(prompt, (list, tuple)):
        prompt = {"prompt_token_ids": prompt}
    # Chat messages may come with OpenAI's tools, which the template renders (or the system message describes),
    # and with chat_template_kwargs, extra variables for the template.
    tools = kwargs = None
    if isinstance(prompt, Mapping) and "messages" in prompt and set(prompt) <= _CHAT_KEYS:
        tools, kwargs = prompt.get("tools"), prompt.get("chat_template_kwargs")
        prompt = {"messages": prompt["messages"]}
    if not isinstance(prompt, Mapping) or len(prompt) != 1 or \
            next(iter(prompt)) not in ("prompt", "prompt_token_ids", "messages"):
        raise InvalidParameter("prompt", prompt, 'text, token ids, or one of {"prompt": ...}, '
                               '{"prompt_token_ids": [...]} or {"messages": [...]} (with "tools": [...] '
                               'and "chat_template_kwargs": {...})')
    field, value = next(iter(prompt.items()))
    if field == "prompt":
        if not isinstance(value, str):
            raise InvalidParameter(field, value, "a string")
        return field, tokenizer.encode(value, add_special_tokens) if value else []
    if field == "messages":
        try:
            return field, tokenizer.encode_chat(value, add_generation_prompt, tools=tools, template_kwargs=kwargs)
        except ValueError as e:
            text = str(e)
            for name, given in (("tools", tools), ("chat_template_kwargs", kwargs)):
                if text.startswith(name):
                    raise InvalidParameter(name, given, text, message=text) from None
            raise InvalidParameter(field, value, text, message=text if text.startswith(field)
                                   else f"{field}: {text}") from None
    ids = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            raise InvalidParameter(field, t, f"token ids in [0, {vocab})")
        ids.append(int(t))
    return field, ids


class ContextOverflow(InvalidParameter):
    """A generation request longer than the model's max_model_len: its prompt, or its prompt and max_tokens
    (never the request's own context_limit). A bigger server may answer it (server/upstream/)."""


def _overflow(bound: str, field: str, value: Any, reason: str, shown: str | None = None) -> InvalidParameter:
    """The refusal of a request past bound: a ContextOverflow where the bound is the model's own."""
    kind = ContextOverflow if bound == "max_model_len" else InvalidParameter
    return kind(field, value, reason, shown=shown)


def generation_ids(tokenizer: Tokenizer, vocab: int, prompt: Prompt, params: SamplingParams,
                   max_model_len: int) -> tuple[list[int], int]:
    """(a generation request's prompt ids fitted to the context, how many a chat's drop_oldest dropped).
    A chat with context_overflow "drop_oldest" that leaves too little room (max_tokens, else one token) loses
    whole turns from the oldest on; then truncate_prompt_tokens keeps the last tokens; what is still too long
    is refused naming both lengths. params.max_tokens unset becomes what the context leaves. The context is
    max_model_len, or the request's own context_limit where that is smaller (Ollama's num_ctx): every bound
    here is then its."""
    field, ids = prompt_ids(tokenizer, vocab, prompt)
    limit, bound = max_model_len, "max_model_len"
    if params.context_limit is not None and params.context_limit < max_model_len:
        limit, bound = params.context_limit, "context_limit"
    if not ids:
        raise InvalidParameter(field, "", "non-empty")
    if field != "prompt_token_ids" and max(ids) >= vocab:   # a tokenizer larger than the model's vocabulary
        raise InvalidParameter(field, f"token id {max(ids)}",
                               f"text whose tokens the model has (this tokenizer gave an id past its "
                               f"{vocab}-token vocabulary)")
    dropped = 0
    room = limit - (params.max_tokens or 1)
    if field == "messages" and params.context_overflow == "drop_oldest" and len(ids) > room:
        assert isinstance(prompt, Mapping)
        whole = len(ids)
        ids = _drop_oldest(tokenizer, vocab, prompt, whole, max(room, 0), limit, bound)
        dropped = whole - len(ids)
    ids = ids[-params.truncate_prompt_tokens:] if params.truncate_prompt_tokens else ids   # vLLM's: the last
    n = len(ids)
    hint = "; context_overflow 'drop_oldest' drops the oldest turns" \
        if field == "messages" and params.context_overflow != "drop_oldest" else ""
    if n >= limit:
        raise _overflow(bound, field, f"{n} tokens", f"shorter than {bound} {limit} tokens "
                                                     f"(over by {n - limit + 1}{hint})")
    if params.max_tokens is None:
        params.max_tokens = limit - n
    elif n + params.max_tokens > limit:
        raise _overflow(bound, "max_tokens", params.max_tokens,
                        f"at most {limit - n} for a prompt of {n} tokens (prompt + max_tokens "
                        f"exceeds {bound} {limit} by {n + params.max_tokens - limit}"
                        f"{hint})")
    return ids, dropped


def _drop_oldest(tokenizer: Tokenizer, vocab: int, prompt: Mapping[str, Any], n: int, room: int,
                 limit: int, bound: str = "max_model_len") -> list[int]:
    """The chat rendered without its oldest whole turns, as few dropped as fit within room tokens. Kept:
    the leading system messages (so a pinned system prompt's cached pages still match) and the last turn,
    from the last user message on; a turn starts at a user message, so a tool call and its result go
    together. The fewest turns that fit are found by halving (each turn dropped shortens the prompt)."""
    messages = list(prompt["messages"])
    head = 0
    while head < len(messages) and isinstance(messages[head], Mapping) and messages[head].get("role") == "system":
        head += 1
    users = [i for i in range(head, len(messages)) if isinstance(messages[i], Mapping)
             and messages[i].get("role") == "user"]
    last = users[-1] if users else len(messages) - 1
    starts = sorted({head, *[i for i in users if i <= last], last})   # where each droppable chunk begins

    def render(k: int) -> list[int]:   # k chunks dropped
        return prompt_ids(tokenizer, vocab, {**prompt, "messages": messages[:head] + messages[starts[k]:]})[1]

    lo, hi = 1, len(starts) - 1
    best = render(hi) if hi >= 1 else None
    if best is None or len(best) > room:
        kept = len(best) if best is not None else n
        raise _overflow(bound, "messages", f"{n} tokens",
                        f"at most {room} tokens to leave room for the answer within {bound} "
                        f"{limit}; with context_overflow 'drop_oldest' the system messages and "
                        f"the last turn alone make {kept}", shown=f"{n} tokens")
    while lo < hi:
        mid = (lo + hi) // 2
        ids = render(mid)
        if len(ids) <= room:
            hi, best = mid, ids
        else:
            lo = mid + 1
    return best


@dataclass
class Tokenized:
    """A prompt's token ids, and with return_token_strs each id's token as the vocabulary writes it."""
    ids: list[int]
    strs: list[str] | None


def tokenize(tokenizer: Tokenizer, vocab: int, prompt: Prompt, add_special_tokens: bool = True,
             add_generation_prompt: bool = True, return_token_strs: bool = False) -> Tokenized:
    """The ids a generation request with this prompt would start from (an empty text gives none)."""
    _, ids = prompt_ids(tokenizer, vocab, prompt, add_special_tokens, add_generation_prompt)
    strs = [tokenizer.id_to_token(i) or "" for i in ids] if return_token_strs else None
    return Tokenized(ids, strs)


def detokenize(tokenizer: Tokenizer, vocab: int, ids: Sequence[Any]) -> str:
    """The text of token ids, special tokens included (what the ids say, not what an answer shows)."""
    _, checked = prompt_ids(tokenizer, vocab, {"prompt_token_ids": ids})
    return tokenizer.decode(checked, skip_special_tokens=False)


def pooling_ids(tokenizer: Tokenizer, vocab: int, prompt: Prompt, max_tokens: int,
                truncate: int | None = None) -> tuple[str, list[int], list[int] | None]:
    """(the field, token ids, token type ids or None) of a pooling request's input: a prompt as prompt_ids
    takes it (the tokenizer's special tokens added to text), or {"query": text, "document": text}, a pair
    as a cross-encoder reads it. Longer than max_tokens (or than truncate, when given) is refused unless
    truncate asks to cut it: text keeps its first tokens and its special tokens, token ids their last."""
    limit = min(max_tokens, truncate) if truncate else max_tokens
    if isinstance(prompt, Mapping) and set(prompt) == {"query", "document"}:
        q, d = prompt["query"], prompt["document"]
        for name, value in (("query", q), ("document", d)):
            if not isinstance(value, str):
                raise InvalidParameter(name, value, "a string")
        ids, types = tokenizer.encode_within(q, _NO_LIMIT, d)
        if len(ids) > limit:
            if not truncate:
                raise too_long("document", len(ids), max_tokens)
            try:
                ids, types = tokenizer.encode_within(q, limit, d)
            except ValueError as e:
                raise InvalidParameter("query", q, f"shorter: {e}", message=f"query: {e}") from None
        return "document", ids, types
    field, ids = prompt_ids(tokenizer, vocab, prompt)
    if not ids:
        raise InvalidParameter(field, "", "non-empty")
    if len(ids) > limit:
        if not truncate:
            raise too_long(field, len(ids), max_tokens)
        if field == "prompt_token_ids":
            ids = ids[-limit:]
        else:
            text = prompt if isinstance(prompt, str) else prompt["prompt"] if isinstance(prompt, Mapping) else ""
            ids, _ = tokenizer.encode_within(text, limit)
    return field, ids, None


def too_long(field: str, n: int, max_tokens: int, cuttable: bool = True) -> InvalidParameter:
    """An input of n tokens past max_tokens; cuttable: truncate_prompt_tokens could cut it."""
    return InvalidParameter(field, f"{n} tokens", f"at most the model's {max_tokens} tokens (over by "
                            f"{n - max_tokens}{'; truncate_prompt_tokens cuts it' if cuttable else ''})")
