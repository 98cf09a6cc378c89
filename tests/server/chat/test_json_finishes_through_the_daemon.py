"""The drone command (issue 25, part 4) through the real daemon on the default model at temperature 1:
gRPC's structured.json_schema, the HTTP API's response_format json_schema and a tool whose arguments
are the command all reach the same compiler, so each answer is valid JSON that finishes within 160
tokens; a cut answer says "length" on both APIs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import openai
import pytest

from helpers.daemon_util import DaemonProcess, joined
from helpers.drone_command import DRONE_COMMAND, DRONE_MESSAGES
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

BUDGET = 160
# Plain dicts, as clients send them (openai types each as a TypedDict).
MESSAGES: Any = DRONE_MESSAGES
RESPONSE_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "drone_command", "schema": DRONE_COMMAND}}
TOOL: Any = {"type": "function", "function": {"name": "command_drone", "parameters": DRONE_COMMAND}}


@pytest.fixture(scope="module")
def daemon(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("json-daemon"), smollm2, num_blocks=64,
                      extra_args=("--max-model-len", "1024"), http_listen="127.0.0.1:0")
    yield d
    d.stop()


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


def grpc_drone(daemon: DaemonProcess, max_tokens: int) -> list[pb.GenerateResponse]:
    req = pb.GenerateRequest(sampling_params=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=max_tokens))
    for m in DRONE_MESSAGES:
        req.chat.messages.add(**m)
    req.structured.json_schema = json.dumps(DRONE_COMMAND)
    with grpc.insecure_channel(daemon.address) as ch:
        return list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=120))


def http_drone(client: openai.OpenAI, max_tokens: int):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, response_format=RESPONSE_FORMAT,
        temperature=1.0, seed=4, max_tokens=max_tokens)


@pytest.mark.smollm2
def test_grpc_json_schema_finishes(daemon: DaemonProcess) -> None:
    responses = grpc_drone(daemon, BUDGET)
    text, ids = joined(responses)
    jsonschema.validate(json.loads(text), DRONE_COMMAND)
    assert responses[-1].finish_reason == pb.FINISH_REASON_STOP and len(ids) <= BUDGET
    assert grpc_drone(daemon, 6)[-1].finish_reason == pb.FINISH_REASON_LENGTH


@pytest.mark.smollm2
def test_http_response_format_json_schema_finishes(client: openai.OpenAI) -> None:
    got = http_drone(client, BUDGET)
    (choice,) = got.choices
    assert choice.finish_reason == "stop"
    assert got.usage is not None and got.usage.completion_tokens <= BUDGET
    jsonschema.validate(json.loads(choice.message.content or ""), DRONE_COMMAND)
    assert http_drone(client, 6).choices[0].finish_reason == "length"


@pytest.mark.smollm2
def test_a_tools_arguments_finish_too(client: openai.OpenAI) -> None:
    got = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, tools=[TOOL], tool_choice="required",
        temperature=1.0, seed=5, max_tokens=BUDGET)
    (choice,) = got.choices
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    jsonschema.validate(json.loads(call.function.arguments), DRONE_COMMAND)
