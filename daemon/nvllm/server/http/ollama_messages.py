"""Ollama's conversation -> the engine's messages (OpenAI chat's shape), for /api/chat (ollama_request.py reads
the rest):

  role system / user / assistant / tool    the same role
  content (a string)                       the content
  assistant tool_calls [{function: {name, arguments: {...}}}]
                                           OpenAI's tool_calls, the arguments as JSON text; each call gets the
                                           id it came with, else one made up (call_<message>_<call>)
  tool messages: tool_name, tool_call_id   name, and tool_call_id (where the client sent none: the id of the
                                           earliest unanswered call of that name, else the earliest
                                           unanswered call, of the calls before it)
  assistant thinking                       dropped: templates do not show earlier turns' thinking

images are refused naming `messages[i].images` (nvllm serves text models), and so is every key Ollama's
messages do not have.
"""

from __future__ import annotations

import json
from typing import Any

from nvllm.server.http.body import ARRAY, OBJECT, STRING, json_type, need, only_keys
from nvllm.server.http.errors import bad_request

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "images", "thinking", "tool_calls", "tool_name", "tool_call_id"}
CALL_KEYS = {"id", "type", "function"}
FUNCTION_KEYS = {"name", "arguments", "index", "description"}


def no_images(images: Any, at: str) -> None:
    """images, where given and not empty, refused: nvllm serves text models."""
    if images is not None and images != []:
        raise bad_request(at, f"{at}: images are not supported by nvllm, which serves text models only",
                          code="unsupported_parameter")


def read_messages(messages: Any) -> list[dict[str, Any]]:
    """The engine's messages of /api/chat's `messages` (a non-empty array: empty is the load request,
    ollama_generation.py's)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty array of messages" if messages is None
                          or isinstance(messages, list) else f"messages must be an array, got {json_type(messages)}")
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []      # (call id, name) of the calls no tool message answered yet
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        need(at, m, OBJECT)
        only_keys(at, m, MESSAGE_KEYS)
        role = m.get("role")
        if role not in ROLES:
            got = json.dumps(role)[:40] if isinstance(role, str) else json_type(role)
            raise bad_request(f"{at}.role", f"{at}.role must be 'system', 'user', 'assistant' or 'tool', got {got}")
        no_images(m.get("images"), f"{at}.images")
        content = m.get("content")
        text = "" if content is None else need(f"{at}.content", content, STRING)
        if m.get("thinking") is not None:
            need(f"{at}.thinking", m["thinking"], STRING)     # an earlier answer's thinking: not shown again
        message: dict[str, Any] = {"role": role, "content": text}
        calls = m.get("tool_calls")
        if calls is not None and calls != []:
            if role != "assistant":
                raise bad_request(f"{at}.tool_calls", f"{at}.tool_calls is only taken on assistant messages")
            message["tool_calls"] = _calls(need(f"{at}.tool_calls", calls, ARRAY), at, i)
            unanswered = [(c["id"], c["function"]["name"]) for c in message["tool_calls"]]
        for key in ("tool_name", "tool_call_id"):
            if m.get(key) is not None:
                need(f"{at}.{key}", m[key], STRING)
                if role != "tool":
                    raise bad_request(f"{at}.{key}", f"{at}.{key} is only taken on tool messages")
        if role == "tool":
            name, call_id = m.get("tool_name"), m.get("tool_call_id")
            if call_id is None and unanswered:
                call_id, _ = next(((c, n) for c, n in unanswered if n == name), unanswered[0])
            if name is None and call_id is not None:
                name = next((n for c, n in unanswered if c == call_id), None)
            unanswered = [(c, n) for c, n in unanswered if c != call_id]
            if call_id is not None:
                message["tool_call_id"] = call_id
            if name is not None:
                message["name"] = name
        out.append(message)
    return out


def _calls(calls: list[Any], at: str, i: int) -> list[dict[str, Any]]:
    out = []
    for j, call in enumerate(calls):
        where = f"{at}.tool_calls[{j}]"
        need(where, call, OBJECT)
        only_keys(where, call, CALL_KEYS)
        fn = need(f"{where}.function", call.get("function"), OBJECT)
        only_keys(f"{where}.function", fn, FUNCTION_KEYS)
        name = need(f"{where}.function.name", fn.get("name"), STRING)
        arguments = fn.get("arguments")
        arguments = {} if arguments is None else need(f"{where}.function.arguments", arguments, OBJECT)
        call_id = call.get("id")
        call_id = f"call_{i}_{j}" if call_id is None or call_id == "" else need(f"{where}.id", call_id, STRING)
        out.append({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return out
