"""A chat answer read back out of the engine's text, for every front door: its reasoning (where the
daemon has a reasoning parser), its text and its tool calls (where the request has tools), whole or as a
stream of deltas, and why it finished. Each front door shapes these into its own JSON or proto; the
readers underneath are reasoning.py's and tool_calls.py's, the same the OpenAI chat API uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nvllm.server.chat.reasoning import reasoning_stream
from nvllm.server.chat.tool_calls import ToolCall, ToolCallStream, finish_reason, read_tool_calls
from nvllm.server.chat.tool_plan import ToolPlan

REASONING, TEXT, CALL, ARGUMENTS = "reasoning", "text", "call", "arguments"


@dataclass
class Delta:
    """One piece of an answer: REASONING or TEXT with its text; CALL opening tool call `index` (its id and
    name); ARGUMENTS adding text to call `index`'s arguments (JSON, whole once the call is done)."""
    kind: str
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""


@dataclass
class Answer:
    """A finished answer, whole."""
    reasoning: str = ""
    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """"tool_calls" when the answer ended with calls, else the engine's ("stop", "length", "abort")."""
        return finish_reason(engine_reason, len(self.calls))


class AnswerStream:
    """Reads one choice's text as the engine makes it; feed() gives the deltas, final=True with the last."""

    def __init__(self, plan: ToolPlan | None, reasoning_parser: str = "", thinks: bool = True,
                 template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.plan = plan if plan is not None and plan.style is not None else None
        self.reasoning = reasoning_stream(reasoning_parser, thinks, template_kwargs)
        self.tools = ToolCallStream(self.plan) if self.plan is not None else None
        self.text = ""                      # the answer's text after its reasoning, for read_answer

    @property
    def num_calls(self) -> int:
        return self.tools.num_calls if self.tools is not None else 0

    def feed(self, text: str, final: bool = False) -> list[Delta]:
        out: list[Delta] = []
        if self.reasoning is not None:
            thought, text = self.reasoning.feed(text, final)
            if thought:
                out.append(Delta(REASONING, thought))
        self.text += text
        if self.tools is None:
            if text:
                out.append(Delta(TEXT, text))
            return out
        for d in self.tools.feed(text, final):
            if "content" in d:
                out.append(Delta(TEXT, d["content"]))
                continue
            for call in d["tool_calls"]:
                fn = call["function"]
                if "id" in call:
                    out.append(Delta(CALL, index=call["index"], call_id=call["id"], name=fn["name"]))
                if fn.get("arguments"):
                    out.append(Delta(ARGUMENTS, fn["arguments"], index=call["index"]))
        return out

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """"tool_calls" when the answer ended with calls, else the engine's ("stop", "length", "abort")."""
        return finish_reason(engine_reason, self.num_calls)


def read_answer(text: str, plan: ToolPlan | None, reasoning_parser: str = "", thinks: bool = True,
                template_kwargs: Mapping[str, Any] | None = None) -> Answer:
    """A whole answer's parts: what a stream of it would add up to."""
    reasoning = reasoning_stream(reasoning_parser, thinks, template_kwargs)
    thought = ""
    if reasoning is not None:
        thought, text = reasoning.feed(text, final=True)
    if plan is None or plan.style is None:
        return Answer(thought, text)
    content, calls = read_tool_calls(text, plan)
    return Answer(thought, content or "", calls)
