"""Tool calls and structured output end to end (issue 17, items 4 and 5): requests to the OpenAI app over the
real engine, in process. A tiny Qwen3 with a tool-taking template for every tool_choice, "auto" included (random
weights: the format path, forced by a grammar), and a tokenizer with <tool_call> as one token; SmolLM2, which has
no tool template: its 400s naming the field, a named and a required tool choice (every call's arguments valid
under the schema, checked with jsonschema) and response_format json_schema; then the daemon over HTTP, driven by
the official client."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import pytest

from helpers.tool_call_cases import (
    NAMED,
    QWEN_TOOLS_TEMPLATE,
    SCHEMAS,
    SHORT_TOOLS,
    TOOLS,
    WEATHER_PARAMS,
    make_qwen_tools,
    tool_plan,
)

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

WEATHER_USER: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen_tools(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-qwen3 with the Qwen-style tool template (helpers/tool_call_cases.py)."""
    return make_qwen_tools(tiny_models, tmp_path_factory)


@pytest.fixture(scope="module")
def qwen_tokens(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama with the tool template and, as real Qwen2.5/Qwen3 tokenizers have them, <tool_call> and
    </tool_call> as added tokens that are not special (text to the detokenizer); two embedding rows more."""
    import numpy as np
    from safetensors.numpy import load_file, save_file
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as Backend

    folder = tmp_path_factory.mktemp("qwen-tokens") / "tiny-tool-tokens"
    shutil.copytree(tiny_models["tiny-llama"], folder)
    backend = Backend.from_file(str(folder / "tokenizer.json"))
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    backend.save(str(folder / "tokenizer.json"))
    for name, changes in (("tokenizer_config.json", {"chat_template": QWEN_TOOLS_TEMPLATE}),
                          ("config.json", {"vocab_size": 514, "max_position_embeddings": 1024})):
        cfg = json.loads((folder / name).read_text())
        cfg.update(changes)
        (folder / name).write_text(json.dumps(cfg))
    weights = load_file(str(folder / "model.safetensors"))
    rows = np.random.default_rng(0).normal(0, 0.1, (2, 64)).astype(np.float32)
    for key in ("lm_head.weight", "model.embed_tokens.weight"):
        weights[key] = np.concatenate([weights[key], rows])
    save_file(weights, str(folder / "model.safetensors"))
    return folder


# ------------------------------------------------------------------------------------------ the real engine, in process


def serve_app(folder: Path, model_name: str, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """POST each body to the HTTP app over a started engine for the model; the responses, in order."""
    import asyncio

    import httpx2 as httpx
    from grpc_health.v1._async import HealthServicer

    from nvllm import LLM
    from nvllm.engine.async_engine import AsyncEngine
    from nvllm.server.http.app import OpenAIApi
    from nvllm.server.state import DaemonState

    engine = LLM(folder, num_blocks=128, max_num_seqs=4, max_model_len=1024).engine

    async def main() -> list[Any]:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState(model_name, HealthServicer(), 64, 4, 1 << 20)
        await state.set_ready(ae, None)
        api = OpenAIApi(state, None, 1 << 20, metrics=state.metrics)
        transport = httpx.ASGITransport(app=api.app(), client=("127.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://nvllm", timeout=120) as client:
                return [await client.post(path, json=body) for path, body in requests]
        finally:
            ae.shutdown()
    out = asyncio.run(main())
    bm = engine.block_manager
    assert len(bm.free_ids) + bm.num_cached_blocks == bm.num_blocks
    return out


def sse(response: Any) -> list[dict[str, Any]]:
    datas = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert datas and datas[-1] == "[DONE]", response.text[-300:]
    return [json.loads(d) for d in datas[:-1]]


def assemble(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]], str | None]:
    """(content, calls, finish_reason) as a client puts a streamed choice together."""
    content, finish = "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.get("id") or ""
                slot["name"] += (tc.get("function") or {}).get("name") or ""
                slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


def check_calls(calls: list[dict[str, Any]], names: set[str]) -> None:
    assert calls
    for call in calls:
        fn = call["function"] if "function" in call else call
        assert fn["name"] in names
        jsonschema.validate(json.loads(fn["arguments"]), SCHEMAS[fn["name"]])
        assert call["id"].startswith("call_")


class TestQwenTemplateModel:
    """tiny-qwen3 (random weights) with a tool-taking template: the <tool_call> path end to end."""

    def test_tool_choices_end_to_end(self, qwen_tools: Path):
        user = [{"role": "user", "content": "What is the time in UTC?"}]
        base = {"messages": user, "tools": SHORT_TOOLS, "temperature": 1.0, "max_tokens": 100}
        named = {"type": "function", "function": {"name": "get_time"}}
        bodies = [{**base, "tool_choice": named, "seed": s} for s in range(3)]
        bodies += [{**base, "tool_choice": "required", "seed": 10, "parallel_tool_calls": False}]
        bodies += [{**base, "tool_choice": named, "seed": 20, "stream": True}]
        bodies += [{**base, "tool_choice": "auto", "seed": s} for s in range(30, 33)]
        bodies += [{**base, "tool_choice": "auto", "seed": 40, "stream": True}]
        turns = user + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
        bodies += [{**base, "messages": turns, "tool_choice": "none", "max_tokens": 8}]
        requests = [("/v1/chat/completions", b) for b in bodies]
        requests.append(("/v1/completions", {"prompt": "The answer is", "max_tokens": 10, "seed": 1,
                                             "structured_outputs": {"regex": "[0-9]{3}"}}))
        requests.append(("/v1/chat/completions", {**base, "tool_choice": named, "seed": 50, "n": 2, "stream": True}))
        rs = serve_app(qwen_tools, "tiny-qwen3", requests)
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        for r in rs[:4]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            check_calls(choice["message"]["tool_calls"], {"get_time"} if r is not rs[3] else set(SCHEMAS))
            assert choice["message"]["content"] is None
        assert len(rs[3].json()["choices"][0]["message"]["tool_calls"]) == 1
        content, calls, finish = assemble(sse(rs[4]))
        assert finish == "tool_calls" and content == "" and len(calls) == 1
        check_calls(calls, {"get_time"})
        # auto: text, or calls whose arguments hold (the weights are random: either may come).
        for r in rs[5:8]:
            (choice,) = r.json()["choices"]
            if choice["message"]["tool_calls"]:
                check_calls(choice["message"]["tool_calls"], set(SCHEMAS))
                assert choice["finish_reason"] == "tool_calls"
            else:
                assert choice["finish_reason"] in ("stop", "length")
        content, calls, finish = assemble(sse(rs[8]))
        if calls:
            check_calls(calls, set(SCHEMAS))
        # A conversation carried on after a call: "none" answers in text, the tools still in the prompt.
        message = rs[9].json()["choices"][0]["message"]
        assert "tool_calls" not in message and isinstance(message["content"], str)
        assert rs[9].json()["usage"]["prompt_tokens"] > rs[0].json()["usage"]["prompt_tokens"]
        # /v1/completions takes the structured_outputs extra too.
        assert re.fullmatch("[0-9]{3}", rs[10].json()["choices"][0]["text"])
        # n choices each get their own calls (and ids).
        chunks = sse(rs[11])
        both = [assemble([{**c, "choices": [x for x in c["choices"] if x["index"] == i]} for c in chunks])
                for i in range(2)]
        assert [finish for _, _, finish in both] == ["tool_calls"] * 2
        for _, calls, _ in both:
            check_calls(calls, {"get_time"})
        assert both[0][1][0]["id"] != both[1][1][0]["id"]


class TestToolTokens:
    def test_tool_call_tags_as_single_tokens(self, qwen_tokens: Path):
        """A Qwen-like tokenizer writes <tool_call> as one token: forced and auto calls still work."""
        user = [{"role": "user", "content": "time?"}]
        base = {"messages": user, "tools": SHORT_TOOLS, "temperature": 1.0, "max_tokens": 100}
        named = {"type": "function", "function": {"name": "get_time"}}
        bodies = [{**base, "tool_choice": named, "seed": 1}, {**base, "tool_choice": "required", "seed": 2},
                  {**base, "tool_choice": named, "seed": 3, "stream": True},
                  {**base, "tool_choice": "auto", "seed": 4}]
        rs = serve_app(qwen_tokens, "tiny-tool-tokens", [("/v1/chat/completions", b) for b in bodies])
        assert [r.status_code for r in rs] == [200] * 4, [r.text[:300] for r in rs]
        for r in rs[:2]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            check_calls(choice["message"]["tool_calls"], set(SCHEMAS))
        content, calls, finish = assemble(sse(rs[2]))
        assert finish == "tool_calls" and len(calls) == 1
        check_calls(calls, {"get_time"})

    def test_the_single_tag_token_is_allowed(self, qwen_tokens: Path):
        """The model may write <tool_call> as the one token it was trained on, in auto and forced calls."""
        from nvllm import LLM

        engine = LLM(qwen_tokens, num_blocks=64, max_num_seqs=2, max_model_len=512).engine
        tag = engine.tokenizer.encode("<tool_call>", add_special_tokens=False)
        assert tag == [512]
        for choice in ("auto", "required"):
            matcher = engine.structured.matcher(tool_plan(SHORT_TOOLS, choice, None, QWEN_TOOLS_TEMPLATE).constraint)
            if choice == "auto":
                assert matcher.consume_tokens(engine.tokenizer.encode("Hi. ", add_special_tokens=False))
            bits = engine.structured.fill([matcher])
            assert (int(bits[0, 512 // 32]) >> (512 % 32)) & 1, choice


class TestSmolLM2Quick:
    def test_400s_name_the_field_and_forced_calls_hold(self, smollm2: Path):
        """The quick lane's look at the default model: every refusal, one named call, one streamed required."""
        user = [{"role": "user", "content": "Hi"}]
        bad_schema = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
        bodies = [
            {"messages": user, "tools": TOOLS, "tool_choice": "auto"},
            {"messages": user, "tools": TOOLS},
            {"messages": user, "max_tokens": 4,
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}}},
            {"messages": user, "max_tokens": 4, "structured_outputs": {"regex": "(unclosed"}},
            {"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": bad_schema}}],
             "tool_choice": "required", "max_tokens": 4},
            {"messages": user, "tools": TOOLS, "tool_choice": "required",
             "response_format": {"type": "json_object"}},
            {"messages": user, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            {"messages": WEATHER_USER, "tools": TOOLS, "tool_choice": NAMED, "temperature": 1.0, "seed": 1,
             "max_tokens": 200},
            {"messages": WEATHER_USER, "tools": TOOLS, "tool_choice": "required", "temperature": 1.0, "seed": 2,
             "max_tokens": 200, "stream": True},
        ]
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        params = [r.json()["error"]["param"] if r.status_code == 400 else r.status_code for r in rs]
        assert params == ["tool_choice", "tool_choice", "response_format.json_schema.schema",
                          "structured_outputs.regex", "tools", "response_format", "tool_choice.function.name",
                          200, 200]
        assert "tool_choice" in rs[0].json()["error"]["message"]
        assert "nonsense" in rs[2].json()["error"]["message"]     # the reason the schema does not compile
        assert rs[4].json()["error"]["message"].startswith("tools: a function's parameters schema cannot be used")
        assert "nonsense" in rs[4].json()["error"]["message"]
        (choice,) = rs[-2].json()["choices"]
        assert choice["finish_reason"] == "tool_calls"
        check_calls(choice["message"]["tool_calls"], {"get_weather"})
        content, calls, finish = assemble(sse(rs[-1]))
        assert finish == "tool_calls" and content == ""
        check_calls(calls, set(SCHEMAS))


# ------------------------------------------------------------------------------------------ SmolLM2, the default model


@pytest.mark.slow
class TestSmolLM2:
    """The default model, which has no tool template: named and required choices still give valid calls."""

    SEEDS = range(6)

    def test_named_and_required_tool_choice_give_valid_calls(self, smollm2: Path):
        base = {"messages": WEATHER_USER, "tools": TOOLS, "temperature": 1.0, "max_tokens": 200}
        bodies = [{**base, "tool_choice": NAMED, "seed": s} for s in self.SEEDS]
        bodies += [{**base, "tool_choice": "required", "seed": s, "parallel_tool_calls": False} for s in self.SEEDS]
        bodies += [{**base, "tool_choice": "required", "seed": 100}]
        bodies += [{**base, "tool_choice": NAMED, "seed": 101, "stream": True}]
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        n = len(self.SEEDS)
        for i, r in enumerate(rs[:-1]):
            assert r.status_code == 200, r.text
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "tool_calls", choice
            calls = choice["message"]["tool_calls"]
            check_calls(calls, {"get_weather"} if i < n else set(SCHEMAS))
            if i < 2 * n:
                assert len(calls) == 1
        content, calls, finish = assemble(sse(rs[-1]))
        assert finish == "tool_calls" and content == "" and len(calls) == 1
        check_calls(calls, {"get_weather"})

    def test_response_format_json_schema(self, smollm2: Path):
        schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20},
                                                    "count": {"type": "integer", "minimum": 0, "maximum": 9}},
                  "required": ["colour", "count"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
        user = [{"role": "user", "content": "Pick a colour and a count, as JSON."}]
        bodies = [{"messages": user, "response_format": rf, "temperature": 1.0, "max_tokens": 60, "seed": s}
                  for s in self.SEEDS]
        bodies.append({"messages": user, "structured_outputs": {"choice": ["red", "green"]}, "seed": 3})
        bodies.append({"messages": user, "response_format": {"type": "json_object"}, "temperature": 0,
                       "max_tokens": 60})
        rs = serve_app(smollm2, "smollm2", [("/v1/chat/completions", b) for b in bodies])
        for r in rs[:len(self.SEEDS)]:
            (choice,) = r.json()["choices"]
            assert choice["finish_reason"] == "stop", choice
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
        assert rs[-2].json()["choices"][0]["message"]["content"] in ("red", "green")
        if rs[-1].json()["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(rs[-1].json()["choices"][0]["message"]["content"]), dict)


# ------------------------------------------------------------------------------------------ the live daemon


@pytest.mark.slow
def test_live_daemon_with_the_openai_client(smollm2: Path, tmp_path: Path):
    """The daemon serving SmolLM2 over HTTP, driven by the official client: a named tool choice over seeds
    (arguments valid under the schema), streamed, and response_format json_schema; auto refused."""
    import openai
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    from helpers.daemon_util import DaemonProcess

    daemon = DaemonProcess(tmp_path, smollm2, http_listen="127.0.0.1:0")
    try:
        client = openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        for seed in range(4):
            r = client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, tool_choice=NAMED,
                                               temperature=1.0, seed=seed, max_tokens=200)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            assert choice.message.tool_calls is not None
            (call,) = choice.message.tool_calls
            assert call.id.startswith("call_") and call.type == "function"
            assert isinstance(call, ChatCompletionMessageFunctionToolCall)
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
        stream = client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, stream=True,
                                                tool_choice="required", parallel_tool_calls=False, seed=7,
                                                max_tokens=200)
        chunks = [c.model_dump() for c in stream]
        content, calls, finish = assemble(chunks)
        assert finish == "tool_calls" and len(calls) == 1 and calls[0]["id"].startswith("call_")
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                  "required": ["city"], "additionalProperties": False}
        for seed in range(3):
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Name a city, as JSON."}], seed=seed,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
                max_tokens=60)
            answer = r.choices[0].message.content
            assert answer is not None
            jsonschema.validate(json.loads(answer), schema)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=WEATHER_USER, tools=TOOLS, tool_choice="auto")
        assert isinstance(e.value.body, dict) and e.value.body["param"] == "tool_choice"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, messages=WEATHER_USER, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
        assert isinstance(e.value.body, dict) and e.value.body["param"] == "response_format.json_schema.schema"
    finally:
        daemon.stop()
