"""nvllm -> Ollama's /api/chat and /api/generate: a request's outputs as Ollama's answer, whole (stream false)
or as newline-delimited JSON (the default), and the two Dialects app.py runs (the request is read by
ollama_request.py; errors in Ollama's shape, ollama_errors.py).

The answer is read by server/chat/answer.py, as every front door reads it. Each streamed line is
{"model", "created_at", "message": {"role": "assistant", "content", "thinking"?, "tool_calls"?}, "done": false}
(generate's: "response" and "thinking" in place of "message"), one for each output that adds text or thinking;
a tool call goes out whole, its arguments an object, once the model finished writing it. The last line has
"done": true, done_reason ("stop", or "length" when cut), the counts (prompt_eval_count: the prompt's tokens,
eval_count: the answer's) and the durations in nanoseconds: total_duration from the request's arrival,
load_duration until the model was leased (its load, where it was not loaded), prompt_eval_duration the
prefill (as the engine times it), eval_duration from the first answer token to the last. Whole, one object
holds it all. A stream that fails after its first line ends with {"error": "..."}.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from nvllm.engine.outputs import RequestOutput
from nvllm.server.chat.answer import ARGUMENTS, CALL, REASONING, TEXT, AnswerStream, read_answer
from nvllm.server.http.anthropic_response import tool_input
from nvllm.server.http.dialect import NDJSON, Dialect, Event
from nvllm.server.http.errors import ApiError
from nvllm.server.http.ollama_errors import error_body, ollama_refused
from nvllm.server.http.ollama_request import CHAT, OllamaRequest, read_chat, read_generate
from nvllm.server.http.openai_response import chat_logprobs
from nvllm.server.reading import Served


def created_at(ns: int | None = None) -> str:
    """RFC 3339 with nanoseconds, UTC, as Go writes a time (trailing zeros of the fraction dropped)."""
    ns = time.time_ns() if ns is None else ns
    seconds, frac = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{frac:09d}".rstrip("0")
    return f"{stamp}.{fraction}Z" if fraction else f"{stamp}Z"


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def ollama_call(call_id: str, name: str, arguments: str, index: int) -> dict[str, Any]:
    """A tool call as Ollama writes it: its arguments an object."""
    return {"id": call_id, "function": {"index": index, "name": name, "arguments": tool_input(arguments)}}


class OllamaAnswer:
    """One request's answer, whole or as NDJSON lines, from the engine's outputs (app.py's Answering)."""

    def __init__(self, req: OllamaRequest, request_id: str, reasoning_parser: str = "", thinks: bool = True,
                 arrival: float | None = None) -> None:
        self.req = req
        self.parser, self.thinks = reasoning_parser, thinks
        self.arrival = req.leased_at if arrival is None else arrival
        self.text = ""
        self.logprobs: list[Any] = []
        self.finish: str | None = None
        self.prompt_tokens = self.output_tokens = 0
        self.prefill_s: float | None = None
        self.first: float | None = None           # when the first answer token came
        self.end: float | None = None
        self.answer = AnswerStream(req.tool_plan, reasoning_parser, thinks, req.template_kwargs)
        self.calls: list[list[str]] = []          # streamed calls: [id, name, arguments so far]
        self.sent_calls = 0

    def _count(self, out: RequestOutput) -> None:
        now = time.monotonic()
        if self.first is None and out.token_ids:
            self.first = now
        if out.prefill_s is not None and self.prefill_s is None:
            self.prefill_s = out.prefill_s
        self.prompt_tokens, self.output_tokens = out.prompt_tokens, out.completion_tokens
        if out.finished:
            self.finish, self.end = out.finish_reason, now

    def _head(self) -> dict[str, Any]:
        return {"model": self.req.model, "created_at": created_at()}

    def _message(self, content: str, thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.req.kind == CHAT:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            return {"message": message}
        return {"response": content, **({"thinking": thinking} if thinking else {})}

    def _done(self) -> dict[str, Any]:
        end = self.end if self.end is not None else time.monotonic()
        first = self.first if self.first is not None else end
        prefill = self.prefill_s if self.prefill_s is not None else max(0.0, first - self.req.leased_at)
        return {"done": True, "done_reason": "length" if self.finish == "length" else "stop",
                "total_duration": _ns(end - self.arrival), "load_duration": _ns(self.req.leased_at - self.arrival),
                "prompt_eval_count": self.prompt_tokens, "prompt_eval_duration": _ns(prefill),
                "eval_count": self.output_tokens, "eval_duration": _ns(end - first)}

    # -- the whole answer ----------------------------------------------------------------------------
    def add(self, index: int, out: RequestOutput) -> None:
        self.text += out.text
        if out.logprobs:
            self.logprobs += out.logprobs
        self._count(out)

    def response(self) -> dict[str, Any]:
        answer = read_answer(self.text, self.req.tool_plan, self.parser, self.thinks, self.req.template_kwargs)
        calls = [ollama_call(c.id, c.name, c.arguments, i) for i, c in enumerate(answer.calls)]
        body = {**self._head(), **self._message(answer.text, answer.reasoning, calls), **self._done()}
        if self.req.logprobs:
            body["logprobs"] = chat_logprobs(self.logprobs)["content"]
        return body

    # -- the stream ----------------------------------------------------------------------------------
    def events(self, index: int, out: RequestOutput) -> list[Event]:
        self._count(out)
        text = thinking = ""
        for d in self.answer.feed(out.text, final=out.finished):
            if d.kind == REASONING:
                thinking += d.text
            elif d.kind == TEXT:
                text += d.text
            elif d.kind == CALL:
                self.calls.append([d.call_id, d.name, ""])
            elif d.kind == ARGUMENTS:
                self.calls[d.index][2] += d.text
        # a call is whole once another opened, or the answer ended
        done_calls = len(self.calls) if out.finished else max(self.sent_calls, len(self.calls) - 1)
        calls = [ollama_call(c[0], c[1], c[2], i) for i, c in enumerate(self.calls[self.sent_calls:done_calls],
                                                                          self.sent_calls)]
        self.sent_calls = done_calls
        if not (text or thinking or calls or (self.req.logprobs and out.logprobs)):
            return []
        line = {**self._head(), **self._message(text, thinking, calls), "done": False}
        if self.req.logprobs:
            line["logprobs"] = chat_logprobs(out.logprobs or [])["content"]
        return [_line(line)]

    def closing(self) -> list[Event]:
        return [_line({**self._head(), **self._message(""), **self._done()})]

    def failed(self, e: ApiError) -> Event:
        return _line(error_body(e))

    def token_counts(self) -> tuple[int, int]:
        return self.prompt_tokens, self.output_tokens


def _line(body: dict[str, Any]) -> Event:
    return {"data": json.dumps(body, ensure_ascii=False)}


def chat_dialect(arrival: float | None = None) -> Dialect:
    """/api/chat's Dialect; arrival: when the request came (monotonic), for total_duration and load_duration
    (None: from the lease on)."""
    return Dialect(read_chat, lambda req, rid, st, thinks: _answering(req, rid, st, thinks, arrival),
                   ollama_refused, NDJSON)


def generate_dialect(arrival: float | None = None) -> Dialect:
    return Dialect(read_generate, lambda req, rid, st, thinks: _answering(req, rid, st, thinks, arrival),
                   ollama_refused, NDJSON)


def _answering(req: OllamaRequest, rid: str, st: Served, thinks: bool, arrival: float | None) -> OllamaAnswer:
    return OllamaAnswer(req, rid, st.reasoning_parser, thinks, arrival)


OLLAMA_CHAT = chat_dialect()
OLLAMA_GENERATE = generate_dialect()
