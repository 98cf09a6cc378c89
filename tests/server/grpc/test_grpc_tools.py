"""Tool calls over gRPC as over HTTP: the drone's tool (helpers/drone_command.py) offered to the tiny Qwen3 with a
tool-taking template (helpers/tool_call_cases.py), sent to both APIs over one engine in process (serve_both).
Greedy, a forced call comes back the same through both (name and arguments text), valid under the schema, its
streamed gRPC deltas adding up to it, with FINISH_REASON_TOOL_CALLS; a second turn carrying the call and its
result renders the same prompt through both; what cannot be read is INVALID_ARGUMENT naming the proto's field;
and a chat longer than the context is refused or loses its oldest turns, as context_overflow asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import grpc
import httpx2 as httpx
import jsonschema
import pytest

from helpers.drone_command import DRONE_COMMAND, DRONE_MESSAGES
from helpers.http_app import serve_both
from helpers.tool_call_cases import make_qwen_tools
from nvllm import LLM
from nvllm.server.state import DaemonState
from nvllm.v1 import nvllm_pb2 as pb

NAME = "command_drone"
# The drone's own command (helpers/drone_command.py): a forced call's numbers are held to the JSON digit
# budget (engine/structured/digit_budget.py), so the random weights' coordinates end.
PARAMS: dict[str, Any] = DRONE_COMMAND
TOOL = {"type": "function", "function": {"name": NAME, "parameters": PARAMS}}
NAMED = {"type": "function", "function": {"name": NAME}}
MAX_TOKENS = 400
CONTEXT = 1536
# The same tool choices in both APIs' shapes.
CHOICES = [(NAMED, pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION, function_name=NAME)),
           ("required", pb.ToolChoice(mode=pb.ToolChoice.MODE_REQUIRED))]


@pytest.fixture(scope="module")
def qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the tool template and room for the drone's schema in its prompt (random weights: any
    context length serves)."""
    folder = make_qwen_tools(tiny_models, tmp_path_factory)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    return folder


def run(folder: Path, body: Any) -> Any:
    llm = LLM(folder, num_blocks=256, max_num_seqs=4, max_model_len=CONTEXT)
    return serve_both(llm.engine, body, "tiny-qwen3")


def to_proto(messages: list[dict[str, Any]]) -> pb.ChatMessages:
    """OpenAI chat messages as nvllm.v1's."""
    out = pb.ChatMessages()
    for m in messages:
        calls = [pb.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                 for c in m.get("tool_calls") or []]
        out.messages.add(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                         tool_call_id=m.get("tool_call_id", ""))
    return out


def grpc_request(messages: list[dict[str, Any]], choice: pb.ToolChoice | None, **sampling: Any) -> pb.GenerateRequest:
    req = pb.GenerateRequest(chat=to_proto(messages), tools=[pb.Tool(name=NAME, parameters=json.dumps(PARAMS))],
                             sampling_params=pb.SamplingParams(**{"temperature": 0, "max_tokens": MAX_TOKENS,
                                                                  **sampling}))
    if choice is not None:
        req.tool_choice.CopyFrom(choice)
    return req


def http_body(messages: list[dict[str, Any]], choice: Any, **extra: Any) -> dict[str, Any]:
    body = {"messages": messages, "tools": [TOOL], "temperature": 0, "max_tokens": MAX_TOKENS, **extra}
    if choice is not None:
        body["tool_choice"] = choice
    return body


async def grpc_call(stub: Any, req: pb.GenerateRequest) -> list[pb.GenerateResponse] | grpc.aio.AioRpcError:
    try:
        return [r async for r in stub.Generate(req)]
    except grpc.aio.AioRpcError as e:
        return e


def assemble(responses: Any) -> tuple[str, list[dict[str, str]]]:
    """(text, calls) as a client puts a gRPC stream together; each call's id and name come once, first."""
    assert isinstance(responses, list), responses
    text = ""
    calls: dict[int, dict[str, str]] = {}
    for r in responses:
        text += r.text
        for d in r.tool_calls:
            if d.index not in calls:
                assert d.id.startswith("call_") and d.name, d
                calls[d.index] = {"id": d.id, "name": d.name, "arguments": ""}
            else:
                assert not d.id and not d.name, d
            calls[d.index]["arguments"] += d.arguments
    assert sorted(calls) == list(range(len(calls)))
    return text, [calls[i] for i in sorted(calls)]


def test_a_forced_call_is_the_same_over_grpc_and_http(qwen_tools: Path):
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        got = []
        for http_choice, grpc_choice in CHOICES:
            http = (await client.post("/v1/chat/completions", json=http_body(DRONE_MESSAGES, http_choice))).json()
            got.append((http, await grpc_call(stub, grpc_request(DRONE_MESSAGES, grpc_choice))))
        return got

    for http, responses in run(qwen_tools, body):
        assert "choices" in http, http
        (choice,) = http["choices"]
        assert choice["finish_reason"] == "tool_calls", choice
        (want,) = choice["message"]["tool_calls"]
        text, calls = assemble(responses)
        assert text == ""
        assert [(c["name"], c["arguments"]) for c in calls] == [(NAME, want["function"]["arguments"])]
        jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS)
        assert len(responses) > 2 and sum(bool(r.tool_calls) for r in responses) > 1   # streamed in pieces
        last = responses[-1]
        assert last.finish_reason == pb.FINISH_REASON_TOOL_CALLS
        assert all(r.finish_reason == pb.FINISH_REASON_UNSPECIFIED for r in responses[:-1])
        assert last.usage.prompt_tokens == http["usage"]["prompt_tokens"]
        assert last.usage.completion_tokens == http["usage"]["completion_tokens"]
        assert last.usage.dropped_prompt_tokens == 0


def test_auto_reads_the_same_answer_as_http(qwen_tools: Path):
    """tool_choice unset is auto: text or calls (random weights), the same through both at one seed."""
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        got = []
        for seed in range(3):
            http = (await client.post("/v1/chat/completions", json=http_body(
                DRONE_MESSAGES, None, temperature=1.0, seed=seed, max_tokens=60))).json()
            got.append((http, await grpc_call(stub, grpc_request(DRONE_MESSAGES, None, temperature=1.0, seed=seed,
                                                                 max_tokens=60))))
        return got

    for http, responses in run(qwen_tools, body):
        (choice,) = http["choices"]
        text, calls = assemble(responses)
        assert text == (choice["message"]["content"] or "")
        want = choice["message"].get("tool_calls") or []
        assert [(c["name"], c["arguments"]) for c in calls] == [(w["function"]["name"], w["function"]["arguments"])
                                                                for w in want]
        assert pb.FinishReason.Name(responses[-1].finish_reason) == "FINISH_REASON_" + choice["finish_reason"].upper()


def test_a_second_turn_renders_the_same_prompt_as_http(qwen_tools: Path):
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> tuple[Any, Any, Any]:
        first = (await client.post("/v1/chat/completions", json=http_body(DRONE_MESSAGES, NAMED))).json()
        (call,) = first["choices"][0]["message"]["tool_calls"]
        turns: list[dict[str, Any]] = [*DRONE_MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
                                       {"role": "tool", "tool_call_id": call["id"],
                                        "content": '{"ok": true, "eta_s": 42}'}]
        http = (await client.post("/v1/chat/completions", json=http_body(turns, "none", max_tokens=8))).json()
        none = pb.ToolChoice(mode=pb.ToolChoice.MODE_NONE)
        return first, http, await grpc_call(stub, grpc_request(turns, none, max_tokens=8))

    first, http, responses = run(qwen_tools, body)
    assert isinstance(responses, list), responses
    assert http["usage"]["prompt_tokens"] > first["usage"]["prompt_tokens"]
    assert responses[-1].usage.prompt_tokens == http["usage"]["prompt_tokens"]
    assert "".join(r.text for r in responses) == http["choices"][0]["message"]["content"]   # greedy: the same
    assert not any(r.tool_calls for r in responses)
    assert responses[-1].finish_reason != pb.FINISH_REASON_TOOL_CALLS


def test_what_cannot_be_read_is_refused_naming_the_proto_field(qwen_tools: Path):
    user = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")])
    named = pb.ToolChoice(function_name=NAME)
    drone = pb.Tool(name=NAME, parameters=json.dumps(PARAMS))
    cases = [
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=named,
                            structured=pb.StructuredOutput(json_schema=json.dumps(PARAMS))), "structured"),
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_REQUIRED),
                            structured=pb.StructuredOutput(json_object=True)), "structured"),
        (pb.GenerateRequest(chat=user, tools=[pb.Tool(name="no spaces")]), "tools[0].name"),
        (pb.GenerateRequest(chat=user, tools=[drone, pb.Tool(name=NAME)]), "tools[1].name"),
        (pb.GenerateRequest(chat=user, tools=[pb.Tool(name="f", parameters="{not json")]), "tools[0].parameters"),
        (pb.GenerateRequest(chat=user, tools=[pb.Tool(name="f", parameters="[1]")]), "tools[0].parameters"),
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=pb.ToolChoice(function_name="fly")),
         "tool_choice.function_name"),
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_FUNCTION)),
         "tool_choice.function_name"),
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=pb.ToolChoice(
            mode=pb.ToolChoice.MODE_REQUIRED, function_name=NAME)), "tool_choice.function_name"),
        (pb.GenerateRequest(chat=user, tools=[drone], tool_choice=pb.ToolChoice(mode=cast(Any, 9))),
         "tool_choice.mode"),     # an enum value this proto does not have (an open enum carries it)
        (pb.GenerateRequest(chat=user, tool_choice=named), "tool_choice"),
        (pb.GenerateRequest(prompt="Hi", tools=[drone]), "tools"),
        (pb.GenerateRequest(prompt="Hi", sampling_params=pb.SamplingParams(context_overflow="drop_oldest")),
         "sampling_params.context_overflow"),
        (pb.GenerateRequest(chat=user, sampling_params=pb.SamplingParams(context_overflow="newest")),
         "sampling_params.context_overflow"),
        (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(
            role="user", content="Hi", tool_calls=[pb.ToolCall(name=NAME)])])), "chat.messages[0].tool_calls"),
        (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi", name="x")])),
         "chat.messages[0].name"),
        (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(
            role="assistant", tool_calls=[pb.ToolCall(id="c")])])), "chat.messages[0].tool_calls[0].name"),
    ]

    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        return [await grpc_call(stub, req) for req, _ in cases]

    for (_, field), got in zip(cases, run(qwen_tools, body)):
        assert isinstance(got, grpc.aio.AioRpcError), (field, got)
        assert got.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, got.details())
        assert got.details().startswith(field + " "), (field, got.details())
        assert "function." not in got.details(), got.details()      # OpenAI's spelling renamed to the proto's


def test_context_overflow_refuses_or_drops_the_oldest_turns(qwen_tools: Path):
    turns: list[dict[str, Any]] = [{"role": "system", "content": "Fly safe."}]
    for i in range(8):
        turns += [{"role": "user", "content": f"Leg {i}: " + "waypoint north east " * 20},
                  {"role": "assistant", "content": "Noted " * 30}]
    turns.append({"role": "user", "content": "Where next?"})

    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        chat = to_proto(turns)
        sampling = [pb.SamplingParams(max_tokens=4, temperature=0) for _ in range(3)]
        sampling[1].context_overflow, sampling[2].context_overflow = "error", "drop_oldest"
        return [await grpc_call(stub, pb.GenerateRequest(chat=chat, sampling_params=sp)) for sp in sampling]

    plain, error, dropped = run(qwen_tools, body)
    for refused in (plain, error):
        assert isinstance(refused, grpc.aio.AioRpcError) and refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.details().startswith("chat.messages"), refused.details()
    assert isinstance(dropped, list), dropped
    usage = dropped[-1].usage
    assert usage.dropped_prompt_tokens > 0 and usage.prompt_tokens + 4 <= CONTEXT


def test_a_chat_with_tools_while_starting_is_unavailable_on_both_apis(qwen_tools: Path):
    """No template to plan the tools by yet: both APIs say to wait, rather than call the request bad."""
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> Any:
        return (await grpc_call(stub, grpc_request(DRONE_MESSAGES, None)),
                await client.post("/v1/chat/completions", json=http_body(DRONE_MESSAGES, "auto")))

    llm = LLM(qwen_tools, num_blocks=256, max_num_seqs=4, max_model_len=CONTEXT)
    rpc, http = serve_both(llm.engine, body, "tiny-qwen3", ready=False)
    assert isinstance(rpc, grpc.aio.AioRpcError) and rpc.code() == grpc.StatusCode.UNAVAILABLE, rpc
    assert "starting" in rpc.details()
    assert http.status_code == 503 and "starting" in http.json()["error"]["message"]
