"""OpenAI's Responses API (POST /v1/responses, stateless) in process, driven by the official openai client over
the app's ASGI transport: a greedy answer equals the same conversation's chat completion; its stream's events
come in order, parse in the client and add up to it; a function call and the conversation carried on with its
output; text.format json_schema; reasoning items with a reasoning parser; every refusal naming the field in
the Responses API's spelling, store true and previous_response_id saying the server keeps no state; and the
reader's mapping of input items, tools and truncation onto the shared chat request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import openai
import pytest

from helpers.http_app import Client, error_of, serve
from helpers.thinking_template import make_thinking_qwen3
from helpers.tool_call_cases import QWEN_TOOLS_TEMPLATE, TIME_PARAMS, make_qwen_tools
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.outputs import RequestOutput
from nvllm.sampling_params import InvalidParameter
from nvllm.server.http.errors import ApiError
from nvllm.server.http.responses_request import parse_responses
from nvllm.server.http.responses_response import ResponsesAnswer
from nvllm.server.state import DaemonState

MODEL = "tiny-llama"      # the name helpers.http_app.serve gives every model it serves
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
INPUT = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}]
TOOLS = [{"type": "function", "name": "get_time", "description": "The time in a zone", "parameters": TIME_PARAMS,
          "strict": True}]
GET_TIME = {"type": "function", "name": "get_time"}
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["colour", "count"], "additionalProperties": False}
MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
                  "response.output_text.done", "response.content_part.done", "response.output_item.done"]
REASONING_EVENTS = ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                    "response.reasoning_text.done", "response.content_part.done", "response.output_item.done"]
CALL_EVENTS = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=128, max_num_seqs=4).engine


@pytest.fixture(scope="module")
def tools_engine(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    """tiny-qwen3 with a Qwen-style tool template (helpers/tool_call_cases.py)."""
    return LLM(make_qwen_tools(tiny_models, tmp_path_factory), num_blocks=128, max_num_seqs=4,
               max_model_len=512).engine


def openai_client(client: Client) -> openai.AsyncOpenAI:
    """The official client over the app's in-process transport."""
    return openai.AsyncOpenAI(base_url="http://nvllm/v1", api_key="unused", http_client=client, max_retries=0)


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    """The raw events of a streamed response: each `event:` line names the type its data carries."""
    assert r.status_code == 200, r.text
    out, name = [], None
    for line in r.text.splitlines():
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name
            out.append(data)
    return out


def kinds(events: list[Any]) -> list[str]:
    """Event types with each run of deltas as one."""
    out: list[str] = []
    for e in events:
        t = e["type"] if isinstance(e, dict) else e.type
        if not (t.endswith(".delta") and out and out[-1] == t):
            out.append(t)
    return out


# ------------------------------------------------------------------------------------------ text, whole and streamed


def test_text_whole_and_streamed_equal_the_chat_completion(engine: LLMEngine) -> None:
    common: dict[str, Any] = {"model": MODEL, "instructions": "Be brief.", "input": INPUT, "temperature": 0,
                              "max_output_tokens": 12}

    async def body(client: Client, state: DaemonState) -> dict[str, Any]:
        oc = openai_client(client)
        chat = (await client.post("/v1/chat/completions", json={"messages": CHAT, "temperature": 0,
                                                                 "max_tokens": 12})).json()
        whole = await oc.responses.create(**common)
        events = [e async for e in await oc.responses.create(**common, stream=True)]
        raw = sse(await client.post("/v1/responses", json={**common, "stream": True}))
        async with oc.responses.stream(**common) as stream:   # the client's helper checks the items' identities
            helper = [e async for e in stream]
        developer = await oc.responses.create(**{**common, "instructions": None, "input": [
            {"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]})
        return {"chat": chat, "whole": whole, "events": events, "raw": raw, "helper": helper, "dev": developer}
    got = serve(engine, body)
    choice, whole = got["chat"]["choices"][0], got["whole"]
    text = choice["message"]["content"]
    assert whole.output_text == text and got["dev"].output_text == text
    assert whole.id.startswith("resp_") and whole.object == "response" and whole.model == MODEL
    assert whole.status == ("incomplete" if choice["finish_reason"] == "length" else "completed")
    if whole.status == "incomplete":
        assert whole.incomplete_details is not None and whole.incomplete_details.reason == "max_output_tokens"
    (item,) = whole.output
    assert item.type == "message" and item.id.startswith("msg_") and item.role == "assistant"
    assert whole.usage is not None and whole.usage.input_tokens == got["chat"]["usage"]["prompt_tokens"]
    assert whole.usage.output_tokens == got["chat"]["usage"]["completion_tokens"]
    assert whole.store is False and whole.instructions == "Be brief." and whole.max_output_tokens == 12
    assert whole.temperature == 0 and whole.truncation == "disabled" and whole.error is None
    # The stream: every event parsed by the client, numbered from 0, in order, deltas adding up to the text.
    events = got["events"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    end = f"response.{whole.status}"
    assert kinds(events) == ["response.created", "response.in_progress", *MESSAGE_EVENTS, end]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert events[-1].response.output_text == text and events[-1].response.usage.output_tokens == \
        whole.usage.output_tokens
    assert kinds(got["raw"]) == kinds(events) == kinds(got["helper"])
    assert got["helper"][-1].response.output_text == text


# ------------------------------------------------------------------------------------------ function calls


def test_function_call_round_trip(tools_engine: LLMEngine) -> None:
    user = [{"role": "user", "content": "What is the time in UTC?"}]
    common: dict[str, Any] = {"model": MODEL, "input": user, "tools": TOOLS, "temperature": 0,
                              "max_output_tokens": 100}

    async def body(client: Client, state: DaemonState) -> dict[str, Any]:
        oc = openai_client(client)
        got: dict[str, Any] = {"named": await oc.responses.create(**{**common, "tool_choice": GET_TIME})}
        got["events"] = [e async for e in await oc.responses.create(**common, tool_choice="required", stream=True)]
        call = next(item for item in got["named"].output if item.type == "function_call")
        turns = [*user, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                         "arguments": call.arguments},
                 {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}]
        got["next"] = await oc.responses.create(**{**common, "input": turns, "max_output_tokens": 8},
                                                tool_choice="none")
        chat = [*user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "12:00"}]
        got["chat"] = (await client.post("/v1/chat/completions", json={
            "messages": chat, "tools": [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                                        for t in TOOLS], "tool_choice": "none", "max_tokens": 8,
            "temperature": 0})).json()
        return got
    got = serve(tools_engine, body)
    named = got["named"]
    assert named.status == "completed", named
    (call,) = named.output
    assert call.type == "function_call" and call.name == "get_time" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), TIME_PARAMS)
    assert named.output_text == "" and named.tool_choice.type == "function"
    events = got["events"]
    assert kinds(events) == ["response.created", "response.in_progress", *CALL_EVENTS, "response.completed"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == done.arguments
    jsonschema.validate(json.loads(done.arguments), TIME_PARAMS)
    # Carried on statelessly: the call and its output make the prompt the chat API makes of the same turns.
    after = got["next"]
    assert after.usage is not None and after.usage.input_tokens == got["chat"]["usage"]["prompt_tokens"]
    assert after.output_text == got["chat"]["choices"][0]["message"]["content"]
    assert all(item.type == "message" for item in after.output)


# ------------------------------------------------------------------------------------------ structured output


def test_text_format_json_schema(engine: LLMEngine) -> None:
    fmt: dict[str, Any] = {"type": "json_schema", "name": "pick", "schema": SCHEMA, "strict": True}
    common: dict[str, Any] = {"model": MODEL, "input": "Pick a colour and a count, as JSON.",
                              "max_output_tokens": 60, "temperature": 0}
    json_object: dict[str, Any] = {"format": {"type": "json_object"}}

    async def body(client: Client, state: DaemonState) -> list[Any]:
        oc = openai_client(client)
        async with oc.responses.stream(**{**common, "text": {"format": fmt}}) as stream:
            final = await stream.get_final_response()      # only a completed response has one
        return [final, await oc.responses.create(**{**common, "text": {"format": fmt}}),
                await oc.responses.create(**{**common, "text": json_object}),
                await client.post("/v1/responses", json={**common, "text": {"format": {
                    **fmt, "schema": {"type": "nonsense"}}}})]
    final, schema_answer, object_answer, bad = serve(engine, body)
    assert schema_answer.status == "completed" and final.output_text == schema_answer.output_text
    jsonschema.validate(json.loads(schema_answer.output_text), SCHEMA)
    assert schema_answer.text is not None and schema_answer.text.format is not None
    assert schema_answer.text.format.type == "json_schema"
    if object_answer.status == "completed":
        assert isinstance(json.loads(object_answer.output_text), dict)
    err = error_of(bad, 400)
    assert err["param"] == "text.format.schema" and "nonsense" in err["message"]


# ------------------------------------------------------------------------------------------ reasoning


def test_reasoning_items_with_a_reasoning_parser(tiny_models: dict[str, Path],
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random weights write no think tags: with the qwen3 parser the answer is all reasoning (the template opened
    the thinking), with effort "none" (Qwen3's enable_thinking false) all text; without a parser all text."""
    engine = LLM(make_thinking_qwen3(tiny_models, tmp_path_factory), num_blocks=64, max_num_seqs=4,
                 max_model_len=256).engine
    common: dict[str, Any] = {"model": MODEL, "input": "Name a colour.", "max_output_tokens": 6, "temperature": 0}

    async def body(client: Client, state: DaemonState) -> dict[str, Any]:
        oc = openai_client(client)
        got = {"plain": await oc.responses.create(**common)}
        state.reasoning_parser = "qwen3"
        got["parsed"] = await oc.responses.create(**common, reasoning={"effort": "high", "summary": "auto"})
        got["events"] = [e async for e in await oc.responses.create(**common, stream=True)]
        got["off"] = await oc.responses.create(**common, reasoning={"effort": "none"})
        return got
    got = serve(engine, body)
    (plain,) = got["plain"].output
    assert plain.type == "message"
    (thought,) = got["parsed"].output
    assert thought.type == "reasoning" and thought.id.startswith("rs_") and thought.summary == []
    assert thought.content is not None and thought.content[0].type == "reasoning_text"
    assert thought.content[0].text == got["plain"].output_text and got["parsed"].output_text == ""
    assert got["parsed"].reasoning is not None and got["parsed"].reasoning.effort == "high"
    events = got["events"]
    assert kinds(events) == ["response.created", "response.in_progress", *REASONING_EVENTS, "response.incomplete"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought.content[0].text
    assert [item.type for item in got["off"].output] == ["message"]


# ------------------------------------------------------------------------------------------ refusals


BAD: list[tuple[dict[str, Any], str]] = [
    ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "no spaces"}], "tool_choice": "required"}, "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}], "tool_choice": "required"},
     "tools[0].parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"tools": TOOLS}, "tool_choice"),               # auto needs a tool-call format tiny-llama's template lacks
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 250}, "max_output_tokens"),
    ({"input": "word " * 400}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "12:00"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "text.format.name"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({"temperature": -1}, "temperature"),
    ({"background": True}, "background"),
]


def test_refusals_name_the_field(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> dict[str, Any]:
        oc = openai_client(client)
        got: dict[str, Any] = {"bad": [await client.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                                                 "max_output_tokens": 4, **b})
                                       for b, _ in BAD]}
        for name, extra in (("store", {"store": True}), ("previous", {"previous_response_id": "resp_1"})):
            with pytest.raises(openai.BadRequestError) as e:
                await oc.responses.create(model=MODEL, input="Hi", **extra)
            got[name] = e.value
        with pytest.raises(openai.NotFoundError):
            await oc.responses.create(model="gpt-4o", input="Hi")
        got["ok"] = await oc.responses.create(model=MODEL, input="Hi", store=False, include=[], max_output_tokens=2,
                                              metadata={"k": "v"}, user="u")
        return got
    got = serve(engine, body)
    assert [error_of(r, 400)["param"] for r in got["bad"]] == [param for _, param in BAD]
    messages = [r.json()["error"]["message"] for r in got["bad"]]
    for message, (_, param) in zip(messages, BAD):
        assert param in message and "function." not in message, message
    assert "max_tokens" not in messages[9] and "truncation 'auto'" in messages[10]     # the context's limits
    assert got["bad"][0].json()["error"]["code"] == "unknown_parameter"
    for name, param in (("store", "store"), ("previous", "previous_response_id")):
        err = got[name].body
        assert isinstance(err, dict) and err["param"] == param and "keeps no state" in err["message"]
    ok = got["ok"]
    assert ok.store is False and ok.metadata == {"k": "v"} and ok.user == "u"


def test_truncation_auto_drops_the_oldest_turns(engine: LLMEngine) -> None:
    """A conversation longer than tiny-llama's 256 tokens: refused naming input, or with truncation "auto" answered
    with its oldest turns dropped (the engine's context_overflow "drop_oldest")."""
    turns: list[dict[str, Any]] = []
    for i in range(8):
        turns += [{"role": "user", "content": f"Tell me fact number {i} about the sea, in detail please."},
                  {"role": "assistant", "content": "The sea is wide and deep and full of salt and many fish. " * 2}]
    turns.append({"role": "user", "content": "Name a colour."})
    common: dict[str, Any] = {"model": MODEL, "instructions": "Be brief.", "input": turns, "max_output_tokens": 8,
                              "temperature": 0}

    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.post("/v1/responses", json={**common, "truncation": t}) for t in ("disabled", "auto")] \
            + [await client.post("/v1/responses", json={**common, "truncate_prompt_tokens": 40})]
    refused, answered, cut = serve(engine, body)
    assert error_of(refused, 400)["param"] == "input"
    assert cut.status_code == 200 and cut.json()["usage"]["input_tokens"] == 40     # vLLM's: its last 40 tokens
    assert answered.status_code == 200, answered.text
    usage = answered.json()["usage"]
    assert usage["dropped_prompt_tokens"] > 0 and usage["input_tokens"] + 8 <= 256
    assert answered.json()["truncation"] == "auto"


# ------------------------------------------------------------------------------------------ the reader


def test_input_items_become_chat_messages() -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"zone": "UTC"}'}
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Time?"},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
              "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
             call, {**call, "call_id": "call_2", "arguments": '{"zone": "CET"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
             {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "13:00"}]}]
    req = parse_responses({"model": MODEL, "instructions": "Answer in English.", "input": items, "tools": TOOLS,
                           "tool_choice": "auto", "truncation": "auto", "max_output_tokens": 5, "top_p": 0.5},
                          MODEL, QWEN_TOOLS_TEMPLATE)
    assert isinstance(req.prompt, dict)
    assert req.prompt["messages"] == [
        {"role": "system", "content": "Answer in English."}, {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}], "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "13:00"}]}]
    assert req.prompt["tools"] == [{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                                     if k != "type"}}]
    assert req.tool_plan is not None and req.tool_plan.choice == "auto" and req.tool_plan.style == "tagged"
    assert req.params.context_overflow == "drop_oldest"     # truncation "auto"
    assert req.params.max_tokens == 5 and req.params.top_p == 0.5
    plain = parse_responses({"input": "Hi", "truncation": "disabled"}, MODEL)
    assert plain.prompt == {"messages": [{"role": "user", "content": "Hi"}]}
    assert plain.params.context_overflow == "error" and plain.echo["truncation"] == "disabled"
    assert parse_responses({"input": "Hi"}, MODEL).params.context_overflow is None    # the server's default
    named = parse_responses({"input": "Hi", "tools": TOOLS, "tool_choice": GET_TIME}, MODEL)
    assert named.tool_plan is not None and named.tool_plan.named == "get_time"


def test_engine_refusals_are_renamed() -> None:
    req = parse_responses({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
                          MODEL)
    cases = [(InvalidParameter("max_tokens", 300, "at most 200 for a prompt of 56 tokens (prompt + max_tokens "
                                                  "exceeds max_model_len 256 by 100)"), "max_output_tokens"),
             (InvalidParameter("messages", "300 tokens", "shorter than max_model_len 256 tokens (over by 45; "
                                                         "context_overflow 'drop_oldest' drops the oldest turns)"),
              "input"),
             (InvalidParameter("structured.json_schema", "{}", "a constraint that compiles (bad)"),
              "text.format.schema"),
             (InvalidParameter("temperature", -1, "a finite number >= 0"), "temperature")]
    for e, param in cases:
        err = req.refusal(e)
        assert err.status == 400 and err.param == param and err.message.startswith(param), err.message
        assert "context_overflow" not in err.message and "max_tokens" not in err.message


def test_stream_items_follow_the_answer() -> None:
    """An "auto" answer of text, a call, more text and another call: each item opens after the last closed, the
    text written after a call (while its arguments might still grow) comes once the call is done; the whole
    answer reads the same calls. A failure ends the stream with response.failed."""
    req = parse_responses({"input": "Time?", "tools": TOOLS, "tool_choice": "auto"}, MODEL, QWEN_TOOLS_TEMPLATE)
    pieces = ["Sure. ", '<tool_call>\n{"name": "get_time", "arguments": {"zone": ', '"UTC"}}\n</tool_call>',
              " Done", '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>']
    streamed, whole = ResponsesAnswer(req, "r1", MODEL), ResponsesAnswer(req, "r2", MODEL)
    events = []
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        out = RequestOutput("r", piece, [1], None, last, "stop" if last else None, None, 7, 30, 0)
        events += [json.loads(e["data"]) for e in streamed.events(0, out)]
        whole.add(0, out)
    events += [json.loads(e["data"]) for e in streamed.closing()]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert kinds(events) == ["response.created", "response.in_progress", *MESSAGE_EVENTS, *CALL_EVENTS,
                             *MESSAGE_EVENTS, *CALL_EVENTS, "response.completed"]
    output = events[-1]["response"]["output"]
    assert [(o["type"], o.get("arguments")) for o in output] == [
        ("message", None), ("function_call", '{"zone": "UTC"}'),
        ("message", None), ("function_call", '{"zone": "CET"}')]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]
    assert events[-1]["response"]["usage"]["output_tokens"] == 30 and events[-1]["response"]["status"] == "completed"
    body = whole.response()
    assert [o.get("arguments") for o in body["output"] if o["type"] == "function_call"] == \
        ['{"zone": "UTC"}', '{"zone": "CET"}']
    assert "".join(c["text"] for o in body["output"] if o["type"] == "message" for c in o["content"]) == "Sure. Done"
    failed = json.loads(ResponsesAnswer(req, "r3", MODEL).failed(ApiError(500, "generation failed: boom"))["data"])
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "generation failed: boom"}
