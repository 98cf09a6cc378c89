"""Ollama's /api/chat in process, driven by the official ollama client (pinned: its pydantic models are what the
server's shapes are held to): a greedy answer equal to /v1/chat/completions' for the same chat, whole and
streamed as newline-delimited JSON (the counts and nanosecond durations on the last line), a conversation with
tool calls and their results rendered as /v1 renders OpenAI's, a tool call read back as Ollama writes it,
format as a JSON Schema whose answer validates, think with a reasoning parser, images refused, and a failure
in the stream ending in an error line."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jsonschema
import ollama
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from helpers.http_app import serve
from helpers.ollama_app import MODEL, ndjson, serve_ollama
from helpers.thinking_template import make_thinking_qwen3
from helpers.tool_call_cases import TIME_PARAMS, make_qwen_tools
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput
from nvllm.server.chat.tool_plan import plan_tools
from nvllm.server.http.delivery import ndjson_stream
from nvllm.server.http.ollama_request import OllamaRequest
from nvllm.server.http.ollama_response import OllamaAnswer, created_at
from nvllm.server.state import DaemonState

USER = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0, "num_predict": 8}
RFC3339_NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$")
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": TIME_PARAMS}}]


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=128, max_num_seqs=8).engine


@pytest.fixture(scope="module")
def tool_engine(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    return LLM(make_qwen_tools(tiny_models, tmp_path_factory), num_blocks=128, max_num_seqs=4).engine


def test_a_greedy_answer_equals_chat_completions_whole_and_streamed(engine: LLMEngine) -> None:
    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> dict[str, Any]:
        v1 = await http.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, "max_tokens": 8})
        whole = await oc.chat(model=MODEL, messages=USER, options=GREEDY)
        parts = [p async for p in await oc.chat(model=MODEL, messages=USER, options=GREEDY, stream=True)]
        raw = await http.post("/api/chat", json={"model": MODEL, "messages": USER, "options": GREEDY})
        return {"v1": v1.json(), "whole": whole, "parts": parts, "raw": raw}

    got = serve_ollama(engine, body)
    choice, usage = got["v1"]["choices"][0], got["v1"]["usage"]
    whole: ollama.ChatResponse = got["whole"]
    assert whole.message.role == "assistant" and whole.message.content == choice["message"]["content"]
    assert whole.done and whole.done_reason == "length" and choice["finish_reason"] == "length"
    assert whole.model == MODEL and RFC3339_NANO.match(whole.created_at or ""), whole.created_at
    assert whole.prompt_eval_count == usage["prompt_tokens"] and whole.eval_count == usage["completion_tokens"] == 8
    assert whole.total_duration and whole.eval_duration is not None and whole.prompt_eval_duration
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration
    assert whole.load_duration is not None and whole.total_duration >= whole.load_duration
    parts: list[ollama.ChatResponse] = got["parts"]
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].message.content == "" and parts[-1].eval_count == 8
    lines = ndjson(got["raw"])     # stream is Ollama's default
    assert len(lines) == len(parts) and lines[-1]["done"] is True
    assert set(lines[-1]) == {"model", "created_at", "message", "done", "done_reason", "total_duration",
                              "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                              "eval_duration"}
    assert set(lines[0]) == {"model", "created_at", "message", "done"}


def test_a_conversation_with_tool_calls_renders_as_openais(tool_engine: LLMEngine) -> None:
    """Ollama's calls (arguments an object, no ids) and tool results by tool_name make the prompt OpenAI's
    equivalent makes: the same prompt tokens and the same greedy answer."""
    ollama_chat: list[dict[str, Any]] = [{"role": "user", "content": "Time in UTC?"},
                   {"role": "assistant", "content": "", "thinking": "the user wants the time",
                    "tool_calls": [{"function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
                   {"role": "tool", "tool_name": "get_time", "content": "12:00"}]
    openai_chat = [{"role": "user", "content": "Time in UTC?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call_1_0", "type": "function",
                        "function": {"name": "get_time", "arguments": json.dumps({"zone": "UTC"})}}]},
                   {"role": "tool", "tool_call_id": "call_1_0", "name": "get_time", "content": "12:00"}]

    # the tools as the client sends them (its Tool model keeps only some schema keywords: no maxLength here)
    sent = [ollama.Tool.model_validate(t).model_dump(exclude_none=True) for t in TOOLS]

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        v1 = await http.post("/v1/chat/completions", json={"messages": openai_chat, "tools": sent, "temperature": 0,
                                                           "max_tokens": 6, "tool_choice": "auto"})
        return v1.json(), await oc.chat(model=MODEL, messages=ollama_chat, tools=TOOLS, options={**GREEDY,
                                                                                                 "num_predict": 6})

    v1, got = serve_ollama(tool_engine, body)
    assert got.prompt_eval_count == v1["usage"]["prompt_tokens"]
    assert got.message.content == (v1["choices"][0]["message"]["content"] or "")
    assert got.eval_count == v1["usage"]["completion_tokens"]


def test_a_tool_call_comes_back_as_ollama_writes_it_whole_and_streamed() -> None:
    """The shared reader's call, shaped as Ollama's: arguments an object, the call whole in one line of the
    stream once written; the official client's models parse both."""
    plan = plan_tools(TOOLS, None, None, "<tool_call></tool_call>")
    text = 'Let me look.<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    pieces = [text[:5], text[5:20], text[20:47], text[47:]]

    def answer() -> OllamaAnswer:
        req = OllamaRequest("chat", MODEL, {"messages": USER}, None, plan)    # type: ignore[arg-type]
        return OllamaAnswer(req, "r1")

    def out(piece: str, last: bool) -> RequestOutput:
        return RequestOutput("r1", piece, [1], None, last, "stop" if last else None, None, 5, 9, 0)

    whole = answer()
    for i, p in enumerate(pieces):
        whole.add(0, out(p, i == len(pieces) - 1))
    message = ollama.ChatResponse(**whole.response()).message
    assert message.content == "Let me look."
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0].function
    assert call.name == "get_time" and call.arguments == {"zone": "UTC"}
    assert whole.response()["done_reason"] == "stop"

    streamed = answer()
    lines = [json.loads(e["data"]) for i, p in enumerate(pieces) for e in streamed.events(0, out(p, i == 3))]
    lines += [json.loads(e["data"]) for e in streamed.closing()]
    parsed = [ollama.ChatResponse(**line) for line in lines]
    assert "".join(p.message.content or "" for p in parsed) == "Let me look."
    calls = [c for p in parsed for c in (p.message.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("get_time", {"zone": "UTC"})]
    assert parsed[-1].done and not any(p.done for p in parsed[:-1])


def test_format_as_a_json_schema_gives_an_answer_that_validates(engine: LLMEngine) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        return (await oc.chat(model=MODEL, messages=USER, format=schema, options={"temperature": 0}),
                await oc.chat(model=MODEL, messages=USER, format="json", options={"temperature": 0,
                                                                                   "num_predict": 40}))

    schema_answer, json_answer = serve_ollama(engine, body)
    jsonschema.validate(json.loads(schema_answer.message.content or ""), schema)
    assert schema_answer.done_reason == "stop"
    if json_answer.done_reason == "stop":
        assert isinstance(json.loads(json_answer.message.content or ""), dict)


def test_think_puts_the_thinking_apart(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """tiny-qwen3 with Qwen3's enable_thinking and the qwen3 parser: random weights write no tags, so an answer
    that thinks is all thinking (message.thinking), one with think false all content."""
    engine = LLM(make_thinking_qwen3(tiny_models, tmp_path_factory), num_blocks=64, max_num_seqs=4).engine

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        v1 = await http.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, "max_tokens": 6})
        on = await oc.chat(model=MODEL, messages=USER, think=True, options={**GREEDY, "num_predict": 6})
        level = await oc.chat(model=MODEL, messages=USER, think="high", options={**GREEDY, "num_predict": 6})
        off = await oc.chat(model=MODEL, messages=USER, think=False, options={**GREEDY, "num_predict": 6})
        parts = [p async for p in await oc.chat(model=MODEL, messages=USER, think=True, stream=True,
                                                options={**GREEDY, "num_predict": 6})]
        return v1.json(), on, level, off, parts

    v1, on, level, off, parts = serve_ollama(engine, body, reasoning_parser="qwen3")
    reasoning = v1["choices"][0]["message"]["reasoning_content"]
    assert reasoning and on.message.thinking == reasoning and not on.message.content
    assert level.message.thinking == reasoning
    assert off.message.content and not off.message.thinking
    assert "".join(p.message.thinking or "" for p in parts) == reasoning


def test_refusals_come_in_ollamas_shape_naming_the_field(engine: LLMEngine) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "messages[0].images"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
        ({"messages": USER, "format": "yaml"}, 400, "format"),
        ({"messages": USER, "format": {"type": "object", "properties": 3}}, 400, "format"),   # the engine's refusal
        ({"messages": USER, "think": True}, 400, "think"),                  # no reasoning parser here
        ({"messages": USER, "tools": TOOLS}, 400, "tools"),                 # no call format nvllm knows
        ({"messages": USER, "keep_alive": "soon"}, 400, "keep_alive"),
        ({"messages": USER, "color": 1}, 400, "color"),
        ({"messages": USER, "shift": True}, 400, "shift"),
        ({"model": "nope", "messages": USER}, 404, 'model "nope" not found, try pulling it first'),
    ]

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> list[Any]:
        out: list[Any] = [await http.post("/api/chat", json={"model": MODEL, **case}) for case, _, _ in cases]
        try:
            await oc.chat(model=MODEL, messages=[{"role": "user", "content": "hi", "images": [b"\x89PNG"]}])
        except ollama.ResponseError as e:
            out.append(e)
        return out

    *responses, client_error = serve_ollama(engine, body)
    for response, (_, status, named) in zip(responses, cases):
        assert response.status_code == status, (named, response.text)
        assert set(response.json()) == {"error"} and named in response.json()["error"], (named, response.text)
    assert isinstance(client_error, ollama.ResponseError) and client_error.status_code == 400
    assert "messages[0].images" in client_error.error and "images are not supported" in client_error.error


def test_logprobs_come_with_each_token_whole_and_streamed(engine: LLMEngine) -> None:
    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        v1 = await http.post("/v1/chat/completions", json={"messages": USER, "temperature": 0, "max_tokens": 8,
                                                           "logprobs": True, "top_logprobs": 2})
        whole = await oc.chat(model=MODEL, messages=USER, options=GREEDY, logprobs=True, top_logprobs=2)
        parts = [p async for p in await oc.chat(model=MODEL, messages=USER, options=GREEDY, logprobs=True,
                                                top_logprobs=2, stream=True)]
        return v1.json(), whole, parts

    v1, whole, parts = serve_ollama(engine, body)
    expected = v1["choices"][0]["logprobs"]["content"]
    assert whole.logprobs is not None and len(whole.logprobs) == whole.eval_count == 8
    assert [(lp.token, lp.logprob) for lp in whole.logprobs] == [(e["token"], e["logprob"]) for e in expected]
    assert all(len(lp.top_logprobs or []) == 2 for lp in whole.logprobs)
    streamed = [lp for p in parts for lp in (p.logprobs or [])]
    assert [lp.token for lp in streamed] == [lp.token for lp in whole.logprobs]


def test_format_and_tools_together_are_refused_naming_format(tool_engine: LLMEngine) -> None:
    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        return await http.post("/api/chat", json={"model": MODEL, "messages": USER, "tools": TOOLS,
                                                  "format": "json", "stream": False})

    response = serve_ollama(tool_engine, body)
    assert response.status_code == 400 and response.json()["error"].startswith("format cannot be combined with tools")


def test_created_at_is_rfc3339_with_nanoseconds() -> None:
    assert created_at(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456789Z"
    assert created_at(1_700_000_000_120_000_000) == "2023-11-14T22:13:20.12Z"
    assert created_at(1_700_000_000_000_000_000) == "2023-11-14T22:13:20Z"


class FailingSubmission:
    """A submission whose engine gives one output, then fails."""

    def __init__(self) -> None:
        self.closed = False

    async def _outputs(self) -> Any:
        yield 0, RequestOutput("r1", "Blue", [7], None, False, None, None, 5, 1, 0)
        yield 0, RequestOutput("r1", "", [], None, True, "abort", None, 5, 1, 0, error="boom")

    def __aiter__(self) -> Any:
        return self._outputs()

    def close(self) -> None:
        self.closed = True


def test_a_stream_that_fails_after_its_first_line_ends_with_an_error_line() -> None:
    sub = FailingSubmission()
    req = OllamaRequest("chat", MODEL, {"messages": USER}, None)    # type: ignore[arg-type]

    async def route(request: Any) -> Any:
        return ndjson_stream(sub, OllamaAnswer(req, "r1"), "r1", 0.0)  # type: ignore[arg-type]

    async def main() -> tuple[list[Any], Any]:
        app = Starlette(routes=[Route("/api/chat", route, methods=["POST"])])
        oc = ollama.AsyncClient(host="http://nvllm", transport=httpx.ASGITransport(app=app))
        parts: list[Any] = []
        try:
            async for p in await oc.chat(model=MODEL, messages=USER, stream=True):
                parts.append(p)
        except ollama.ResponseError as e:
            return parts, e
        return parts, None

    parts, error = asyncio.run(main())
    assert [p.message.content for p in parts] == ["Blue"]
    assert isinstance(error, ollama.ResponseError) and "generation failed: boom" in error.error
    assert sub.closed


def test_while_starting_the_refusal_is_a_503_to_retry(engine: LLMEngine) -> None:
    async def body(http: Any, state: DaemonState) -> Any:
        return await http.post("/api/chat", json={"model": MODEL, "messages": USER})

    response = serve(engine, body, ready=False)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert set(response.json()) == {"error"} and "starting" in response.json()["error"]
