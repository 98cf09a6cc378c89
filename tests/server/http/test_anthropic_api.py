"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) in process, driven by the official
anthropic client over the ASGI transport: a greedy answer equal to /v1/chat/completions' for the same chat,
whole and streamed (the events in Anthropic's order), a stop sequence, a forced tool call and the
conversation carried on with its result (tiny-qwen3 with a tool template), count_tokens against the usage,
thinking blocks with a reasoning parser, the key, and refusals in Anthropic's error shape naming the field."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import anthropic
import httpx2 as httpx
import jsonschema
import pytest

from helpers.http_app import Client, serve
from helpers.thinking_template import EMPTY_THINK, make_thinking_qwen3
from helpers.tool_call_cases import DAY_PARAMS, make_qwen_tools
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.http.anthropic_request import read_messages
from nvllm.server.http.anthropic_response import MessageBuilder
from nvllm.server.http.errors import ApiError
from nvllm.server.reading import Served
from nvllm.server.state import DaemonState

if TYPE_CHECKING:
    from anthropic.types import MessageParam, ThinkingConfigDisabledParam, ToolChoiceToolParam, ToolParam

MODEL = "tiny-llama"          # the name helpers/http_app.py's serve gives every model
KEY = "sk-test-0123456789"
USER: list[MessageParam] = [{"role": "user", "content": "Name a colour."}]
GREEDY = {"temperature": 0}   # this client sends sampling fields as extras
# An enum keeps a greedy call on random weights short: it finishes well within max_tokens.
ZONE_PARAMS: dict[str, Any] = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                               "required": ["zone"], "additionalProperties": False}
TOOLS: list[ToolParam] = [{"name": "get_time", "input_schema": ZONE_PARAMS},
                          {"name": "get_day", "input_schema": DAY_PARAMS}]


def client_of(http: Client, key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url="http://nvllm", api_key=key, http_client=http, max_retries=0)


def sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event; the name must be the data's type."""
    out, name = [], ""
    for line in response.text.splitlines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name, (name, data)
            out.append((name, data))
    return out


def input_total(usage: Any) -> int:
    """A message's prompt tokens: Anthropic counts those the cache held apart."""
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=128, max_num_seqs=8).engine


@pytest.fixture(scope="module")
def tool_engine(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    return LLM(make_qwen_tools(tiny_models, tmp_path_factory), num_blocks=128, max_num_seqs=4).engine


@pytest.fixture(scope="module")
def thinking_engine(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    return LLM(make_thinking_qwen3(tiny_models, tmp_path_factory), num_blocks=64, max_num_seqs=4).engine


def test_a_text_answer_equals_chat_completions_and_counts_its_tokens(engine: LLMEngine,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        client = client_of(http)
        chat = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "Be brief."}, *USER], "max_tokens": 10, **GREEDY})
        message = await client.messages.create(model=MODEL, system="Be brief.", messages=USER, max_tokens=10,
                                               metadata={"user_id": "u-42"}, extra_body=GREEDY)
        blocks = await client.messages.create(
            model=MODEL, system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            messages=[{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}], max_tokens=10,
            service_tier="auto", extra_body=GREEDY)
        count = await client.messages.count_tokens(model=MODEL, system="Be brief.", messages=USER)
        return {"chat": chat.json(), "message": message, "blocks": blocks, "count": count}

    with caplog.at_level(logging.INFO):
        got = serve(engine, body)
    chat, message = got["chat"], got["message"]
    want = chat["choices"][0]["message"]["content"]
    assert want and message.content[0].type == "text" and message.content[0].text == want
    assert len(message.content) == 1 and message.role == "assistant" and message.model == MODEL
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    assert message.stop_sequence is None
    assert message.usage.output_tokens == chat["usage"]["completion_tokens"]
    # The prefix cache held the prompt the chat request left: Anthropic counts it apart.
    assert input_total(message.usage) == chat["usage"]["prompt_tokens"]
    assert message.usage.cache_read_input_tokens
    assert got["blocks"].content == message.content
    assert got["count"].input_tokens == chat["usage"]["prompt_tokens"]
    assert "user 'u-42'" in caplog.text


def test_the_stream_sends_anthropics_events_and_adds_up_to_the_message(engine: LLMEngine) -> None:
    request = {"model": MODEL, "messages": USER, "max_tokens": 8, **GREEDY}

    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        client = client_of(http)
        whole = await client.messages.create(model=MODEL, messages=USER, max_tokens=8, extra_body=GREEDY)
        raw = await http.post("/v1/messages", json={**request, "stream": True})
        async with client.messages.stream(model=MODEL, messages=USER, max_tokens=8, extra_body=GREEDY) as stream:
            texts = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        return {"whole": whole, "raw": raw, "texts": texts, "final": final}

    got = serve(engine, body)
    whole, raw = got["whole"], got["raw"]
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    names = [name for name, _ in events]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == ["message_start", "ping", "content_block_start", *["content_block_delta"] * deltas,
                     "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert input_total(anthropic.types.Usage(**start["usage"])) == input_total(whole.usage)
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for name, d in events if name == "content_block_delta")
    assert text == whole.content[0].text
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens
    # The client's stream helper puts the same message together.
    final = got["final"]
    assert "".join(got["texts"]) == whole.content[0].text
    shown = {"type", "text"}
    assert [b.model_dump(include=shown) for b in final.content] == [whole.content[0].model_dump(include=shown)]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(engine: LLMEngine) -> None:
    async def body(http: Client, state: DaemonState) -> list[Any]:
        client = client_of(http)
        free = await client.messages.create(model=MODEL, messages=USER, max_tokens=12, extra_body=GREEDY)
        text = free.model_dump()["content"][0]["text"]
        found = re.search(r"[A-Za-z]{2}", text[1:])     # letters: no half character of a split UTF-8 sequence
        assert found, f"no stop sequence to pick in {text!r}"
        stop = found[0]
        stopped = await client.messages.create(model=MODEL, messages=USER, max_tokens=12, stop_sequences=[stop],
                                               extra_body=GREEDY)
        raw = await http.post("/v1/messages", json={"messages": USER, "max_tokens": 12, "stop_sequences": [stop],
                                                    "stream": True, **GREEDY})
        return [text, stop, stopped, raw]

    text, stop, stopped, raw = serve(engine, body)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[:text.index(stop)]
    assert sse(raw)[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_a_forced_tool_call_and_its_result_carry_the_conversation_on(tool_engine: LLMEngine) -> None:
    ask: list[MessageParam] = [{"role": "user", "content": "What is the time in UTC?"}]
    forced: ToolChoiceToolParam = {"type": "tool", "name": "get_time"}

    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        client = client_of(http)
        call = await client.messages.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice=forced,
                                            max_tokens=60, extra_body=GREEDY)
        async with client.messages.stream(model=MODEL, messages=ask, tools=TOOLS, max_tokens=60, extra_body=GREEDY,
                                          tool_choice={"type": "any", "disable_parallel_tool_use": True}) as s:
            streamed = await s.get_final_message()
        count = await client.messages.count_tokens(model=MODEL, messages=ask, tools=TOOLS, tool_choice=forced)
        blocks = call.model_dump()["content"]      # handed back as the client got them
        use_id = blocks[-1]["id"]
        on: list[MessageParam] = [*ask, {"role": "assistant", "content": blocks},
                                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id,
                                                                "content": [{"type": "text", "text": "12:00"}]}]}]
        result = await client.messages.create(model=MODEL, messages=on, tools=TOOLS[:1], max_tokens=4,
                                              tool_choice={"type": "none"}, extra_body=GREEDY)
        failed = await http.post("/v1/messages", json={"messages": [*on[:2], {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use_id, "content": "timeout", "is_error": True}]}],
            "tools": TOOLS[:1], "max_tokens": 4, "tool_choice": {"type": "none"}})
        return {"call": call, "streamed": streamed, "count": count, "result": result, "failed": failed}

    got = serve(tool_engine, body)
    for message in (got["call"], got["streamed"]):
        assert message.stop_reason == "tool_use", message
        (use,) = [b for b in message.content if b.type == "tool_use"]
        assert use.id.startswith("toolu_") and use.name in ("get_time", "get_day")
        jsonschema.validate(use.input, ZONE_PARAMS if use.name == "get_time" else DAY_PARAMS)
    assert got["call"].content[-1].name == "get_time"
    assert got["count"].input_tokens == input_total(got["call"].usage)
    result = got["result"]
    assert result.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in result.content)
    assert got["failed"].status_code == 200, got["failed"].text


def test_refusals_come_in_anthropics_shape_naming_the_field(engine: LLMEngine) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}},
         "tools[0].name"),
        ({"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [{"name": "f", "input_schema": 3}], "tool_choice": {"type": "any"}}, "tools[0].input_schema"),
        ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
        ({"extra_body": {"service_tier": "priority"}}, "service_tier"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}, "messages[0].content[1].type"),
        ({"messages": [*USER, {"role": "assistant", "content": "Red"}]}, "messages[1].role"),
        ({"stop_sequences": ["a"], "extra_body": {"stop_sequences": "a"}}, "stop_sequences"),
        ({"max_tokens": 10_000}, "max_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"extra_body": {"context_overflow": "shrug"}}, "context_overflow"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
         "output_config.format.schema"),
    ]

    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        client = client_of(http)
        errors = []
        for kw, _ in bad:
            kw = {"model": MODEL, "messages": USER, "max_tokens": 8, **kw}
            with pytest.raises(anthropic.BadRequestError) as e:
                await client.messages.create(**kw)
            errors.append(e.value)
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(model="claude-nonesuch", messages=USER, max_tokens=8)
        with pytest.raises(anthropic.BadRequestError) as counted:
            await client.messages.count_tokens(model=MODEL, messages=USER, extra_body={"max_tokens": 8})
        no_max = await http.post("/v1/messages", json={"messages": USER})
        return {"errors": errors, "missing": missing.value, "counted": counted.value, "no_max": no_max}

    got = serve(engine, body)
    for (_, field), e in zip(bad, got["errors"]):
        assert e.status_code == 400
        assert isinstance(e.body, dict) and set(e.body) == {"type", "error"} and e.body["type"] == "error", e.body
        assert set(e.body["error"]) == {"type", "message"} and e.body["error"]["type"] == "invalid_request_error"
        assert e.body["error"]["message"].startswith(field), (field, e.body)
    assert isinstance(got["missing"].body, dict) and got["missing"].body["error"]["type"] == "not_found_error"
    assert isinstance(got["counted"].body, dict) and "max_tokens" in got["counted"].body["error"]["message"]
    no_max = got["no_max"]
    assert no_max.status_code == 400 and no_max.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens is required: the most tokens the answer may have"}}


def test_the_key_goes_in_x_api_key(engine: LLMEngine) -> None:
    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        with pytest.raises(anthropic.AuthenticationError) as wrong:
            await client_of(http, "sk-wrong").messages.create(model=MODEL, messages=USER, max_tokens=2)
        with pytest.raises(anthropic.AuthenticationError) as wrong_count:
            await client_of(http, "sk-wrong").messages.count_tokens(model=MODEL, messages=USER)
        right = client_of(http, KEY)
        return {"wrong": wrong.value, "wrong_count": wrong_count.value,
                "message": await right.messages.create(model=MODEL, messages=USER, max_tokens=2),
                "count": await right.messages.count_tokens(model=MODEL, messages=USER)}

    got = serve(engine, body, key=KEY.encode())
    for e in (got["wrong"], got["wrong_count"]):
        assert e.status_code == 401
        assert e.body == {"type": "error", "error": {"type": "authentication_error", "message": "incorrect API key"}}
    assert got["message"].usage.output_tokens == 2 and got["count"].input_tokens > 0


def test_thinking_comes_back_in_thinking_blocks(thinking_engine: LLMEngine) -> None:
    """tiny-qwen3 with Qwen3's enable_thinking and the qwen3 parser: random weights write no tags, so an
    answer that thinks is all thinking, and one with thinking disabled all text."""
    async def body(http: Client, state: DaemonState) -> dict[str, Any]:
        state.reasoning_parser = "qwen3"
        client = client_of(http)
        chat = await http.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 6, **GREEDY})
        off: ThinkingConfigDisabledParam = {"type": "disabled"}
        got = {"chat": chat.json(),
               "default": await client.messages.create(model=MODEL, messages=USER, max_tokens=6, extra_body=GREEDY),
               "on": await client.messages.create(model=MODEL, messages=USER, max_tokens=6, extra_body=GREEDY,
                                                  thinking={"type": "enabled", "budget_tokens": 4}),
               "off": await client.messages.create(model=MODEL, messages=USER, max_tokens=6, extra_body=GREEDY,
                                                   thinking=off),
               "omitted": await client.messages.create(model=MODEL, messages=USER, max_tokens=6, extra_body=GREEDY,
                                                       thinking={"type": "adaptive", "display": "omitted"}),
               "count_on": await client.messages.count_tokens(model=MODEL, messages=USER),
               "count_off": await client.messages.count_tokens(model=MODEL, messages=USER, thinking=off),
               "raw": await http.post("/v1/messages", json={"messages": USER, "max_tokens": 6, "stream": True,
                                                            **GREEDY})}
        async with client.messages.stream(model=MODEL, messages=USER, max_tokens=6, extra_body=GREEDY) as s:
            got["final"] = await s.get_final_message()
        return got

    got = serve(thinking_engine, body)
    reasoning = got["chat"]["choices"][0]["message"]["reasoning_content"]
    assert reasoning
    for name in ("default", "on", "final"):
        (block,) = got[name].content
        assert block.type == "thinking" and block.thinking == reasoning and block.signature == "", name
    (omitted,) = got["omitted"].content
    assert omitted.type == "thinking" and omitted.thinking == ""
    (text,) = got["off"].content
    assert text.type == "text" and text.text
    empty_think = len(thinking_engine.tokenizer.encode(EMPTY_THINK, add_special_tokens=False))
    assert got["count_off"].input_tokens == got["count_on"].input_tokens + empty_think
    assert input_total(got["off"].usage) == got["count_off"].input_tokens
    events = sse(got["raw"])
    assert events[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert "".join(d["delta"]["thinking"] for n, d in events if n == "content_block_delta") == reasoning


def test_output_config_format_constrains_the_answer(engine: LLMEngine) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
              "required": ["colour"], "additionalProperties": False}

    async def body(http: Client, state: DaemonState) -> Any:
        message = await client_of(http).messages.create(
            model=MODEL, messages=USER, max_tokens=40, extra_body=GREEDY,
            output_config={"format": {"type": "json_schema", "schema": schema}})
        return message.model_dump()

    message = serve(engine, body)
    assert message["stop_reason"] == "end_turn", message
    jsonschema.validate(json.loads(message["content"][0]["text"]), schema)


def test_refusals_before_and_during_a_stream_keep_anthropics_shape(engine: LLMEngine) -> None:
    async def body(http: Client, state: DaemonState) -> Any:
        with pytest.raises(anthropic.APIStatusError) as e:
            await client_of(http).messages.create(model=MODEL, messages=USER, max_tokens=2)
        return e.value

    starting = serve(engine, body, ready=False)
    assert starting.status_code == 503 and starting.response.headers["retry-after"] == "1"
    assert isinstance(starting.body, dict) and starting.body["error"]["type"] == "overloaded_error"
    served = cast(Served, SimpleNamespace(model_name=MODEL, engine=SimpleNamespace(chat_template=None),
                                          max_num_seqs=1, reasoning_parser=""))
    builder = MessageBuilder(read_messages({"messages": USER, "max_tokens": 2}, served), "r1", MODEL)
    event = builder.failed(ApiError(500, "generation failed: boom"))
    assert event["event"] == "error" and json.loads(event["data"]) == {
        "type": "error", "error": {"type": "api_error", "message": "generation failed: boom"}}


def test_a_conversation_too_long_is_refused_or_its_oldest_turns_dropped(engine: LLMEngine) -> None:
    turns: list[MessageParam] = []
    for i in range(12):
        turns += [{"role": "user", "content": f"Tell me about colour number {i} in a few words."},
                  {"role": "assistant", "content": f"Colour number {i} is a fine colour indeed."}]
    turns.append({"role": "user", "content": "Name a colour."})

    async def body(http: Client, state: DaemonState) -> Any:
        client = client_of(http)
        with pytest.raises(anthropic.BadRequestError) as e:
            await client.messages.create(model=MODEL, messages=turns, system="Be brief.", max_tokens=8)
        kept = await client.messages.create(model=MODEL, messages=turns, system="Be brief.", max_tokens=8,
                                            extra_body={"context_overflow": "drop_oldest"})
        return e.value, kept.model_dump()

    refused, kept = serve(engine, body)
    assert isinstance(refused.body, dict) and refused.body["error"]["message"].startswith("messages "), refused.body
    assert "context_overflow 'drop_oldest'" in refused.body["error"]["message"]
    assert kept["usage"]["dropped_prompt_tokens"] > 0
    assert kept["usage"]["input_tokens"] + kept["usage"]["cache_read_input_tokens"] <= 256 - 8
