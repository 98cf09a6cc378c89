"""chat_template_kwargs and the reasoning parser through the HTTP app and the gRPC service, in process, over a
tiny Qwen3 whose template honours enable_thinking (helpers/thinking_template.py): the prompt with and without
Qwen3's empty think block, the answer read as reasoning and content (random weights write no tags, so a
thinking answer is all reasoning and one with thinking off all content), streamed and whole, and the refusals
naming chat_template_kwargs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from helpers.http_app import serve_both
from helpers.thinking_template import EMPTY_THINK, USER, make_think_tokens, make_thinking_qwen3
from nvllm import LLM
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.server.state import DaemonState
from nvllm.v1 import nvllm_pb2 as pb

OFF = {"enable_thinking": False}
BASE = {"messages": USER, "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def thinking_qwen3(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_thinking_qwen3(tiny_models, tmp_path_factory)


def run(folder: Path, body: Any, reasoning_parser: str = "") -> Any:
    """body(http client, grpc stub, state) against both APIs over one started engine."""
    settings = load_settings(overrides={"model": {"path": str(folder)}, "cache": {"num_blocks": 64},
                                        "scheduler": {"max_num_seqs": 4, "max_model_len": 256},
                                        "server": {"reasoning_parser": reasoning_parser}})
    llm = LLM.from_engine(build_engine(settings))
    empty_think = len(llm.tokenizer.encode(EMPTY_THINK, add_special_tokens=False))

    return empty_think, serve_both(llm.engine, body, "tiny-qwen3", reasoning_parser=reasoning_parser)


def sse(r: httpx.Response) -> tuple[str, str]:
    """(reasoning, content) as a client puts a streamed choice together."""
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in map(json.loads, datas[:-1]) if c["choices"]]
    return ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas))


def chat(**kw: Any) -> pb.GenerateRequest:
    kw.setdefault("sampling_params", pb.SamplingParams(max_tokens=6, temperature=0))
    chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in USER]
    return pb.GenerateRequest(chat=pb.ChatMessages(messages=chat), **kw)


async def grpc_call(stub: Any, req: pb.GenerateRequest) -> list[pb.GenerateResponse] | grpc.aio.AioRpcError:
    try:
        return [r async for r in stub.Generate(req)]
    except grpc.aio.AioRpcError as e:
        return e


def test_thinking_switch_and_reasoning_over_http_and_grpc(thinking_qwen3: Path):
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> dict[str, Any]:
        post = client.post
        got: dict[str, Any] = {}
        got["plain"] = (await post("/v1/chat/completions", json=BASE)).json()
        got["off"] = (await post("/v1/chat/completions", json={**BASE, "chat_template_kwargs": OFF})).json()
        got["grpc_plain"] = await grpc_call(stub, chat())
        got["grpc_off"] = await grpc_call(stub, chat(chat_template_kwargs=json.dumps(OFF)))
        state.reasoning_parser = "qwen3"
        got["parsed"] = (await post("/v1/chat/completions", json=BASE)).json()
        got["parsed_off"] = (await post("/v1/chat/completions", json={**BASE, "chat_template_kwargs": OFF})).json()
        got["parsed_stream"] = sse(await post("/v1/chat/completions", json={**BASE, "stream": True}))
        got["parsed_off_stream"] = sse(await post("/v1/chat/completions",
                                                  json={**BASE, "stream": True, "chat_template_kwargs": OFF}))
        got["grpc_parsed"] = await grpc_call(stub, chat())
        got["grpc_parsed_off"] = await grpc_call(stub, chat(chat_template_kwargs=json.dumps(OFF)))
        return got

    empty_think, got = run(thinking_qwen3, body)
    plain, off = got["plain"], got["off"]
    # The empty think block is in the prompt exactly when enable_thinking is false, over both APIs.
    assert off["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + empty_think
    assert got["grpc_plain"][-1].usage.prompt_tokens == plain["usage"]["prompt_tokens"]
    assert got["grpc_off"][-1].usage.prompt_tokens == off["usage"]["prompt_tokens"]
    # No parser: the message as it was, no reasoning fields.
    text, text_off = plain["choices"][0]["message"]["content"], off["choices"][0]["message"]["content"]
    assert text and "reasoning_content" not in plain["choices"][0]["message"]
    assert all(not r.reasoning_text for r in got["grpc_plain"])
    assert "".join(r.text for r in got["grpc_plain"]) == text
    # qwen3: no </think> written, so a thinking answer is all reasoning; with thinking off, all content.
    assert got["parsed"]["choices"][0]["message"] == {"role": "assistant", "content": None, "reasoning_content": text}
    assert got["parsed_off"]["choices"][0]["message"] == {"role": "assistant", "content": text_off,
                                                          "reasoning_content": None}
    assert got["parsed_stream"] == (text, "") and got["parsed_off_stream"] == ("", text_off)
    assert "".join(r.reasoning_text for r in got["grpc_parsed"]) == text
    assert not "".join(r.text for r in got["grpc_parsed"])
    assert "".join(r.text for r in got["grpc_parsed_off"]) == text_off
    assert not "".join(r.reasoning_text for r in got["grpc_parsed_off"])


def test_bad_chat_template_kwargs_are_refused_naming_the_field(thinking_qwen3: Path):
    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        bad: list[Any] = [[1], "enable_thinking", {"messages": []}, {"add_generation_prompt": True}]
        http = [await client.post("/v1/chat/completions", json={**BASE, "chat_template_kwargs": v}) for v in bad]
        http.append(await client.post("/v1/completions", json={"prompt": "hi", "chat_template_kwargs": OFF}))
        grpc_errors = [await grpc_call(stub, chat(chat_template_kwargs=v))
                       for v in ("[1]", "{not json", '{"tools": 1}')]
        grpc_errors.append(await grpc_call(stub, pb.GenerateRequest(prompt="hi", chat_template_kwargs="{}")))
        return [http, grpc_errors]

    _, (http, grpc_errors) = run(thinking_qwen3, body)
    assert [r.status_code for r in http] == [400] * 5
    errors = [r.json()["error"] for r in http]
    assert [e["param"] for e in errors] == ["chat_template_kwargs"] * 5
    assert errors[0]["message"] == "chat_template_kwargs must be an object, got an array"
    assert errors[1]["message"] == "chat_template_kwargs must be an object, got a string"
    assert errors[2]["message"].startswith("chat_template_kwargs.messages would override the chat template's own")
    assert errors[3]["message"].startswith("chat_template_kwargs.add_generation_prompt would override")
    assert "unknown parameter" in errors[4]["message"]
    assert all(isinstance(e, grpc.aio.AioRpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT
               for e in grpc_errors), grpc_errors
    details = [e.details() for e in grpc_errors]
    assert details[0] == "chat_template_kwargs must be a JSON object, got list"
    assert details[1].startswith("chat_template_kwargs is not valid JSON")
    assert details[2].startswith("chat_template_kwargs.tools would override the chat template's own variable")
    assert details[3].startswith("chat_template_kwargs needs chat input")


COLOUR: dict[str, Any] = {"type": "json_schema",
                          "json_schema": {"name": "colour", "schema": {"enum": ["red", "green", "blue"]}}}


def test_response_format_applies_after_the_thinking(tiny_models: dict[str, Path],
                                                     tmp_path_factory: pytest.TempPathFactory):
    """</think> as one token: the schema masks only the answer, which comes back as content, the thinking apart."""
    folder = make_think_tokens(tiny_models, tmp_path_factory)

    async def body(client: httpx.AsyncClient, stub: Any, state: DaemonState) -> list[Any]:
        end = 513                        # </think>, the second token added to tiny-llama's 512
        req = {"messages": USER, "max_tokens": 120, "temperature": 1.0, "seed": 3, "logit_bias": {str(end): 4.0},
               "response_format": COLOUR}
        whole = (await client.post("/v1/chat/completions", json=req)).json()
        streamed = sse(await client.post("/v1/chat/completions", json={**req, "stream": True}))
        closed = (await client.post("/v1/chat/completions", json={**req, "chat_template_kwargs": OFF})).json()
        grpc_rs = await grpc_call(stub, chat(structured=pb.StructuredOutput(json_schema=json.dumps(
            COLOUR["json_schema"]["schema"])), sampling_params=pb.SamplingParams(
            max_tokens=120, temperature=1.0, seed=3, logit_bias={end: 4.0})))
        return [whole, streamed, closed, grpc_rs]

    _, (whole, streamed, closed, grpc_rs) = run(folder, body, "qwen3")
    message = whole["choices"][0]["message"]
    assert json.loads(message["content"]) in ("red", "green", "blue"), message
    assert message["reasoning_content"] and "think>" not in message["reasoning_content"]
    assert streamed == (message["reasoning_content"], message["content"])
    # The template closed the thinking: masked from the first token, all content.
    assert json.loads(closed["choices"][0]["message"]["content"]) in ("red", "green", "blue")
    assert closed["choices"][0]["message"]["reasoning_content"] is None
    assert "".join(r.text for r in grpc_rs) == message["content"]
    assert "".join(r.reasoning_text for r in grpc_rs) == message["reasoning_content"]
