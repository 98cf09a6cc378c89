"""OpenAI tool calls read back out of the model's text, whole or streamed, in the style the request's
ToolPlan says (tool_plan.py).

Each call comes back as OpenAI's {"id": "call_...", "type": "function", "function": {"name", "arguments"}}
where arguments is the JSON text the model wrote; streamed, a call's first delta carries index, id, type
and name, the following ones pieces of its arguments.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from nvllm.server.chat.partial_json import PartialCall, scan_calls, scan_object, skip_ws
from nvllm.server.chat.tool_grammar import TAG_CLOSE, TAG_OPEN
from nvllm.server.chat.tool_plan import ToolPlan


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class ToolCall:
    name: str
    arguments: str          # the JSON text of the arguments, as the model wrote it
    id: str = field(default_factory=new_call_id)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def read_tool_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a finished answer. Text that is no complete call stays content (an answer cut
    short by max_tokens comes back as text, with no half call)."""
    if plan.style == "json":
        calls = _json_calls(text)
        return (None, calls) if calls else (text or None, [])
    if plan.style != "tagged":
        return text, []
    content: list[str] = []
    calls = []
    pos = 0
    while True:
        start = text.find(TAG_OPEN, pos)
        if start < 0:
            break
        end = text.find(TAG_CLOSE, start)
        call = None if end < 0 else _tagged_call(text[start + len(TAG_OPEN):end])
        if call is None:
            break
        content.append(text[pos:start].rstrip())   # the blank before a call is no content
        calls.append(call)
        pos = end + len(TAG_CLOSE)
    content.append(text[pos:].rstrip() if calls else text[pos:])
    return "".join(content) or None, calls


def _json_calls(text: str) -> list[ToolCall]:
    try:
        value = json.loads(text)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        call = _call_from_text(json.dumps(item, ensure_ascii=False)) if isinstance(item, dict) else None
        if call is None:
            return []
        calls.append(call)
    # Keep the model's own argument text, so a streamed answer and a whole one agree.
    scanned = scan_calls(text)
    if len(scanned) == len(calls) and all(s.done for s in scanned):
        for call, s in zip(calls, scanned):
            call.arguments = s.arguments
    return calls


def _tagged_call(body: str) -> ToolCall | None:
    return _call_from_text(body.strip())


def _call_from_text(text: str) -> ToolCall | None:
    """A call from the JSON text of {"name": ..., "arguments": {...}}; None if it is not one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    scanned = scan_calls(text)
    if len(scanned) == 1 and scanned[0].done and scanned[0].args_key:
        return ToolCall(obj["name"], scanned[0].arguments)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """Turns a streamed answer's text deltas into OpenAI chat deltas: {"content": ...} for text and
    {"tool_calls": [{"index", "id", "type", "function": {"name", "arguments"}}]} for calls. The pieces add
    up to what read_tool_calls gives for the whole text (content and each call's arguments)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self._sent = 0                             # characters of text sent or passed over as content
        self._calls: list[tuple[str, int]] = []   # (id, argument characters sent) per started call

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    def feed(self, delta: str, final: bool = False) -> list[dict[str, Any]]:
        """The deltas for new text; final=True with the last piece flushes held-back content."""
        self.text += delta
        if self.plan.style == "json":
            out = self._call_deltas(scan_calls(self.text))
            if final and not self._calls and self.text:
                out.append({"content": self.text})   # no call at all (cut short): the text, as read_tool_calls
            return out
        if self.plan.style != "tagged":
            return [{"content": delta}] if delta else []
        return self._tagged(final)

    def _tagged(self, final: bool) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        text, pos = self.text, 0
        parts: list[PartialCall] = []
        while True:
            start = text.find(TAG_OPEN, pos)
            if start < 0:
                break
            self._send(out, pos, pos + len(text[pos:start].rstrip()))
            self._sent = max(self._sent, start)
            body_start = start + len(TAG_OPEN)
            end = text.find(TAG_CLOSE, body_start)
            body = text[body_start:] if end < 0 else text[body_start:end]
            first = skip_ws(body, 0)
            part = scan_object(body, first)[0] if first < len(body) and body[first] == "{" else PartialCall()
            parts.append(part)
            if end < 0:
                return out + self._call_deltas(parts)
            if not part.done or part.name is None:
                break        # not a call after all: read_tool_calls leaves it as text too
            pos = end + len(TAG_CLOSE)
        out += self._call_deltas([p for p in parts if p.done and p.name is not None])
        hi = len(text)
        if not final:
            # Hold back what could be the start of a <tool_call>, and trailing blanks (dropped before a call).
            for k in range(min(len(TAG_OPEN) - 1, hi - pos), 0, -1):
                if TAG_OPEN.startswith(text[hi - k:]):
                    hi -= k
                    break
            hi = pos + len(text[pos:hi].rstrip())
        elif self._calls:
            hi = pos + len(text[pos:].rstrip())
        self._send(out, pos, hi)
        return out

    def _send(self, out: list[dict[str, Any]], lo: int, hi: int) -> None:
        lo = max(lo, self._sent)
        if hi > lo:
            out.append({"content": self.text[lo:hi]})
            self._sent = hi

    def _call_deltas(self, parts: list[PartialCall]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for index, part in enumerate(parts):
            if part.name is None:
                break        # calls are sent in order, each once its name is known
            if index == len(self._calls):
                call_id = new_call_id()
                self._calls.append((call_id, 0))
                out.append({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                            "function": {"name": part.name, "arguments": ""}}]})
            call_id, sent = self._calls[index]
            if len(part.arguments) > sent:
                out.append({"tool_calls": [{"index": index,
                                            "function": {"arguments": part.arguments[sent:]}}]})
                self._calls[index] = (call_id, len(part.arguments))
        return out


def finish_reason(reason: str | None, num_calls: int) -> str | None:
    """OpenAI's finish_reason: "tool_calls" when the answer ended with calls, else the engine's."""
    return "tool_calls" if num_calls and reason == "stop" else reason
