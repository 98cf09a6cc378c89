"""A chat answer's thinking read apart from its content (vLLM's --reasoning-parser), whole or streamed.

Both parsers read text the engine has already detokenized, so this is string work (the server never sees
tokens). Their rules, as vLLM's parsers of the same names have them:

- deepseek_r1: everything up to the first </think> is reasoning, the rest content. A leading <think> is
  dropped (DeepSeek-R1-0528 writes it; R1's template already wrote it into the prompt). An answer that
  never closes its thinking (cut short by max_tokens) is reasoning alone.
- qwen3: the same, except that a request whose chat_template_kwargs say enable_thinking false gets no
  thinking (Qwen3's template writes an empty <think></think> block into the prompt then), so all it
  writes is content.

Neither tag ever reaches either part; a tag split across stream chunks is held back until it is whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nvllm.engine.structured.thinking import THINK_CLOSE, THINK_OPEN

PARSERS = ("qwen3", "deepseek_r1")

_START, _REASONING, _CONTENT = "start", "reasoning", "content"


def reasoning_stream(parser: str, thinks: bool, template_kwargs: Mapping[str, Any] | None) -> ReasoningStream | None:
    """A chat answer's reader (None without a parser): thinks is the engine's word on whether the answer may
    think at all (a constrained one whose grammar masks from its first token may not: its text is all content)."""
    if not parser:
        return None
    return ReasoningStream(parser, thinks and thinking_requested(parser, template_kwargs))


def thinking_requested(parser: str, template_kwargs: Mapping[str, Any] | None) -> bool:
    """Whether the answer begins with thinking: Qwen3 honours enable_thinking (default true)."""
    if parser == "qwen3" and template_kwargs is not None:
        return template_kwargs.get("enable_thinking", True) is not False
    return True


class ReasoningStream:
    """One answer's text, fed as it comes, split into (reasoning, content) deltas."""

    def __init__(self, parser: str, thinking: bool = True) -> None:
        if parser not in PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; one of {', '.join(PARSERS)}")
        self.state = _START if thinking else _CONTENT
        self.held = ""          # text that may be the start of the tag looked for

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) that text makes final; final flushes whatever is held back."""
        buf, self.held = self.held + text, ""
        reasoning = ""
        if self.state == _START:
            lead = buf.lstrip()
            if lead.startswith(THINK_OPEN):
                buf = lead[len(THINK_OPEN):]
                self.state = _REASONING
            elif THINK_OPEN.startswith(lead) and not final:
                self.held = buf         # blank so far, or the opening tag's start: wait for more
                return "", ""
            else:
                self.state = _REASONING  # no opening tag: the template wrote it
        if self.state == _REASONING:
            end = buf.find(THINK_CLOSE)
            if end < 0:
                keep = 0 if final else _partial_tag(buf, THINK_CLOSE)
                reasoning, self.held = buf[:len(buf) - keep], buf[len(buf) - keep:]
                return reasoning, ""
            reasoning, buf = buf[:end], buf[end + len(THINK_CLOSE):]
            self.state = _CONTENT
        return reasoning, buf


def split_reasoning(parser: str, text: str, thinking: bool = True) -> tuple[str, str]:
    """A whole answer's (reasoning, content): what the stream gives, fed at once."""
    return ReasoningStream(parser, thinking).feed(text, final=True)


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag (0 when none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
