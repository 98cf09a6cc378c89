"""cache.pinned_prompts: each JSON file read, checked and turned into the tokens of its full pages, which
the engine computes at start and holds for good (engine/warm/warmup.py).

A file holds one prompt as a request gives it: {"prompt": text}, {"prompt_token_ids": [...]} or
{"messages": [...]}. Messages are rendered as a chat request would be and cut where two requests that
add different user messages part: so the tokens are exactly those a later chat request with these
messages (a system prompt, typically) begins with, whatever the template adds after them or the
tokenizer merges across the boundary. Only full pages are pinned; the tail is computed per request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvllm.engine.prompt import prompt_ids
from nvllm.sampling_params import InvalidParameter
from nvllm.text.tokenizer import Tokenizer

log = logging.getLogger("nvllm.engine.pinned")

MAX_FILE_BYTES = 4 << 20        # a prompt file past this is refused before it is read
KEYS = ("prompt", "prompt_token_ids", "messages")
# Two user messages that part at their first character: where their renderings part, the request's own
# text begins.
_PROBES = ("A", "7")


class PinnedPromptError(ValueError):
    """A pinned prompt file that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True)
class PinnedPrompt:
    path: str
    token_ids: tuple[int, ...]      # the full pages' tokens
    num_prompt_tokens: int          # the prompt's tokens, the partial last page included

    @property
    def name(self) -> str:
        return Path(self.path).name


def read_pinned_prompts(paths: list[str], tokenizer: Tokenizer, vocab: int, max_model_len: int,
                        block_size: int) -> list[PinnedPrompt]:
    """The prompts of cache.pinned_prompts, in order; PinnedPromptError at the first bad file."""
    out = []
    for path in paths:
        ids = _read(path, tokenizer, vocab, max_model_len)
        full = len(ids) // block_size * block_size
        if not full:
            log.warning("pinned prompt %s: %d tokens, less than one page of %d: nothing to pin", path,
                        len(ids), block_size)
        out.append(PinnedPrompt(path, tuple(ids[:full]), len(ids)))
    return out


def _read(path: str, tokenizer: Tokenizer, vocab: int, max_model_len: int) -> list[int]:
    def fail(reason: str) -> PinnedPromptError:
        return PinnedPromptError(f"cache.pinned_prompts: {path}: {reason}")

    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise fail(f"{p.stat().st_size} bytes, more than a prompt file may hold ({MAX_FILE_BYTES})")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise fail("no such file") from None
    except UnicodeDecodeError as e:
        raise fail(f"not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise fail(e.strerror or str(e)) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise fail(f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in KEYS:
        keys = list(obj) if isinstance(obj, dict) else type(obj).__name__
        raise fail(f'need an object with one key, "prompt", "prompt_token_ids" or "messages"; got {keys}')
    try:
        if "messages" in obj:
            ids = _chat_prefix(tokenizer, obj["messages"])
            _, checked = prompt_ids(tokenizer, vocab, {"prompt_token_ids": ids})
        else:
            _, checked = prompt_ids(tokenizer, vocab, obj)
    except InvalidParameter as e:
        raise fail(str(e)) from None
    except (ValueError, TypeError, KeyError) as e:
        raise fail(f"messages: {e}") from None
    if not checked:
        raise fail("an empty prompt")
    if len(checked) >= max_model_len:
        raise fail(f"{len(checked)} tokens, too long for max_model_len {max_model_len}")
    return checked


def _chat_prefix(tokenizer: Tokenizer, messages: Any) -> list[int]:
    """The tokens every chat request that continues `messages` with a user message begins with."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("need a non-empty list of messages")
    try:
        a, b = (tokenizer.encode_chat([*messages, {"role": "user", "content": p}]) for p in _PROBES)
    except ValueError:
        # A template that refuses a user message next (one ending on a user turn): the messages alone.
        return tokenizer.encode_chat(messages, add_generation_prompt=False)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
