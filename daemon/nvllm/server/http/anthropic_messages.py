"""Anthropic's conversation -> the engine's messages (OpenAI chat's shape): `system` and `messages` with
their content blocks, for /v1/messages and /v1/messages/count_tokens (anthropic_request.py reads the rest).

  system (a string or text blocks)        the first message, role "system"
  user text blocks                        a user message (text blocks joined by newlines, as the engine
                                          joins text parts)
  user tool_result blocks                 a "tool" message each: tool_call_id, the tool's name where an
                                          earlier tool_use gives it, and its content as text ("Error: "
                                          before it when is_error, so the model sees that it failed)
  assistant text blocks                   the assistant message's content
  assistant tool_use blocks               its tool_calls, the input as JSON text
  assistant thinking, redacted_thinking   dropped: templates do not show earlier turns' thinking

Blocks nvllm cannot read (image, document, search results, server tools) are refused naming them
(`messages[0].content[1].type`); so is a final assistant message, which Anthropic continues (prefill) and
a chat template cannot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from nvllm.server.http.body import ARRAY, BOOL, OBJECT, STRING, need, only_keys
from nvllm.server.http.errors import bad_request

ROLES = ("user", "assistant")
# Keys each block may carry besides its own: a prompt-cache marker asks for what the prefix cache does anyway.
_ANY_BLOCK = {"type", "cache_control"}
_BLOCK_KEYS = {
    "text": {"text", "citations"},
    "tool_use": {"id", "name", "input", "caller", "toolset_name"},
    "tool_result": {"tool_use_id", "content", "is_error", "toolset_name"},
    "thinking": {"thinking", "signature"},
    "redacted_thinking": {"data"},
}
_USER_BLOCKS, _ASSISTANT_BLOCKS = ("text", "tool_result"), ("text", "tool_use", "thinking", "redacted_thinking")


@dataclass
class Conversation:
    """The engine's messages, and for each the Anthropic field it came from (to name it in a refusal)."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    def add(self, message: dict[str, Any], origin: str) -> None:
        self.messages.append(message)
        self.origins.append(origin)


def read_conversation(system: Any, messages: Any) -> Conversation:
    conv = Conversation()
    if system is not None:
        text = system if isinstance(system, str) else _texts(system, "system")
        conv.add({"role": "system", "content": text}, "system")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty array of messages")
    names: dict[str, str] = {}          # tool_use id -> the tool's name, for the tool messages
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        need(at, m, OBJECT)
        only_keys(at, m, {"role", "content"})
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"{at}.role", f"{at}.role must be 'user' or 'assistant', got {str(role)[:32]!r} "
                                            "(the system prompt goes in the top-level system field)")
        content = m.get("content")
        if isinstance(content, str):
            conv.add({"role": role, "content": content}, at)
        elif role == "user":
            _user(conv, need(f"{at}.content", content, ARRAY), at, names)
        else:
            _assistant(conv, need(f"{at}.content", content, ARRAY), at, names)
    if messages[-1].get("role") == "assistant":
        at = f"messages[{len(messages) - 1}].role"
        raise bad_request(at, f"{at}: a final assistant message (prefill, continuing the assistant's answer) "
                              "is not supported by nvllm; end with a user message", code="unsupported_parameter")
    return conv


def _block(block: Any, at: str, allowed: tuple[str, ...]) -> str:
    """A content block's type, its keys checked."""
    need(at, block, OBJECT)
    kind = block.get("type")
    if kind not in allowed:
        where = f"{at}.type"
        raise bad_request(where, f"{where} {str(kind)[:40]!r} is not supported by nvllm here (it takes "
                                 f"{', '.join(allowed)} blocks)", code="unsupported_parameter")
    only_keys(at, block, _ANY_BLOCK | _BLOCK_KEYS[kind])
    cache = block.get("cache_control")
    if cache is not None:
        need(f"{at}.cache_control", cache, OBJECT)
    if kind == "text":
        need(f"{at}.text", block.get("text"), STRING)
    return str(kind)


def _texts(blocks: Any, at: str) -> str:
    """Text blocks (a system prompt, a tool result) as one text."""
    need(at, blocks, ARRAY)
    texts = []
    for j, b in enumerate(blocks):
        _block(b, f"{at}[{j}]", ("text",))
        texts.append(b["text"])
    return "\n".join(texts)


def _user(conv: Conversation, blocks: list[Any], at: str, names: dict[str, str]) -> None:
    texts: list[str] = []
    for j, b in enumerate(blocks):
        where = f"{at}.content[{j}]"
        if _block(b, where, _USER_BLOCKS) == "text":
            texts.append(b["text"])
            continue
        if texts:      # text before a result: its own user message, in order
            conv.add({"role": "user", "content": "\n".join(texts)}, at)
            texts = []
        call_id = need(f"{where}.tool_use_id", b.get("tool_use_id"), STRING)
        content = b.get("content")
        text = "" if content is None else content if isinstance(content, str) else _texts(content, f"{where}.content")
        if b.get("is_error") is not None and need(f"{where}.is_error", b["is_error"], BOOL):
            text = "Error: " + text
        message = {"role": "tool", "tool_call_id": call_id, "content": text}
        if call_id in names:
            message["name"] = names[call_id]
        conv.add(message, at)
    if texts or not blocks:
        conv.add({"role": "user", "content": "\n".join(texts)}, at)


def _assistant(conv: Conversation, blocks: list[Any], at: str, names: dict[str, str]) -> None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        where = f"{at}.content[{j}]"
        kind = _block(b, where, _ASSISTANT_BLOCKS)
        if kind == "text":
            texts.append(b["text"])
        elif kind == "tool_use":
            call_id = need(f"{where}.id", b.get("id"), STRING)
            name = need(f"{where}.name", b.get("name"), STRING)
            arguments = need(f"{where}.input", b.get("input"), OBJECT)
            names[call_id] = name
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    conv.add(message, at)
