"""Ollama's /api/generate in process, driven by the official ollama client: raw equal to /v1/completions and
templated equal to /v1/chat/completions at temperature 0, whole and streamed; system as the chat's system
message; the fields nvllm cannot honour refused naming them (template, suffix, context, images); and the
empty request that loads the model ("load") or with keep_alive 0 unloads it ("unload"), on both endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import ollama
import pytest

from helpers.ollama_app import MODEL, ndjson, serve_loading, serve_ollama
from helpers.thinking_template import make_thinking_qwen3
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.state import DaemonState

GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=128, max_num_seqs=8).engine


def test_raw_equals_completions_and_templated_equals_chat(engine: LLMEngine) -> None:
    text = "The drone lands at"
    chat = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> dict[str, Any]:
        return {
            "completion": (await http.post("/v1/completions", json={"prompt": text, "temperature": 0,
                                                                    "max_tokens": 8})).json(),
            "chat": (await http.post("/v1/chat/completions", json={"messages": chat, "temperature": 0,
                                                                   "max_tokens": 8})).json(),
            "raw": await oc.generate(model=MODEL, prompt=text, raw=True, options=GREEDY),
            "raw_parts": [p async for p in await oc.generate(model=MODEL, prompt=text, raw=True, options=GREEDY,
                                                             stream=True)],
            "templated": await oc.generate(model=MODEL, prompt=text, system="Answer briefly.", options=GREEDY),
            "lines": ndjson(await http.post("/api/generate", json={"model": MODEL, "prompt": text, "raw": True,
                                                                   "options": GREEDY})),
        }

    got = serve_ollama(engine, body)
    completion, chat_answer = got["completion"], got["chat"]
    raw: ollama.GenerateResponse = got["raw"]
    assert raw.response == completion["choices"][0]["text"] and raw.done_reason == "length"
    assert raw.prompt_eval_count == completion["usage"]["prompt_tokens"] and raw.eval_count == 8
    parts: list[ollama.GenerateResponse] = got["raw_parts"]
    assert "".join(p.response or "" for p in parts) == raw.response and parts[-1].done
    assert not any(p.done for p in parts[:-1]) and parts[-1].eval_count == 8
    templated: ollama.GenerateResponse = got["templated"]
    assert templated.response == chat_answer["choices"][0]["message"]["content"]
    assert templated.prompt_eval_count == chat_answer["usage"]["prompt_tokens"]
    lines = got["lines"]
    assert all("response" in line and "message" not in line for line in lines)
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "length" and lines[-1]["eval_count"] == 8


def test_what_nvllm_cannot_honour_is_refused_naming_it(engine: LLMEngine) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"prompt": "hi", "template": "{{ .Prompt }}"}, "template"),
        ({"prompt": "hi", "suffix": "end"}, "suffix"),
        ({"prompt": "hi", "context": [1, 2, 3]}, "context"),
        ({"prompt": "hi", "images": ["aGk="]}, "images"),
        ({"prompt": "hi", "raw": True, "system": "be brief"}, "system"),
        ({"prompt": "hi", "width": 64}, "width"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "hi " * 400, "raw": True}, "prompt"),       # past tiny-llama's 256-token context
    ]

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> list[Any]:
        return [await http.post("/api/generate", json={"model": MODEL, **case}) for case, _ in cases]

    for response, (_, named) in zip(serve_ollama(engine, body), cases):
        assert response.status_code == 400, (named, response.text)
        assert set(response.json()) == {"error"} and response.json()["error"].startswith(named), response.text
    # template left empty asks for the model's own: taken
    assert serve_ollama(engine, lambda oc, http, st: oc.generate(
        model=MODEL, prompt="hi", template="", options=GREEDY)).done


def test_an_empty_request_loads_the_model_and_keep_alive_0_unloads_it(engine: LLMEngine) -> None:
    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> list[Any]:
        assert state.models is not None
        slot = state.models.slots[MODEL]
        seen: list[Any] = [slot.phase]
        seen += [await oc.generate(model=MODEL), slot.phase, slot.keep_alive_s]
        seen += [await oc.generate(model=MODEL, keep_alive=0), slot.phase]
        seen += [await oc.chat(model=MODEL, messages=[], keep_alive="10m"), slot.phase, slot.keep_alive_s]
        seen += [await oc.chat(model=MODEL, keep_alive=0), slot.phase]
        answer = await oc.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options=GREEDY)
        seen += [answer, slot.phase]
        return seen

    seen, events = serve_loading(engine, body)
    assert seen[0] == "unloaded"
    load, phase, keep = seen[1:4]
    assert load.done and load.done_reason == "load" and load.response == "" and phase == "loaded" and keep == 300
    unload, phase = seen[4:6]
    assert unload.done and unload.done_reason == "unload" and phase == "unloaded"
    load, phase, keep = seen[6:9]
    assert load.done_reason == "load" and load.message.role == "assistant" and load.message.content == ""
    assert phase == "loaded" and keep == 600
    unload, phase = seen[9:11]
    assert unload.done_reason == "unload" and phase == "unloaded"
    answer, phase = seen[11:13]
    assert answer.done_reason == "length" and answer.load_duration > 0 and phase == "loaded"
    assert events == ["load", "unload", "load", "unload", "load", "unload"]


def test_think_on_generate_puts_the_thinking_apart(tiny_models: dict[str, Path],
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    engine = LLM(make_thinking_qwen3(tiny_models, tmp_path_factory), num_blocks=64, max_num_seqs=4).engine

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> Any:
        return (await oc.generate(model=MODEL, prompt="Name a colour.", think=True, options=GREEDY),
                await oc.generate(model=MODEL, prompt="Name a colour.", think=False, options=GREEDY),
                [p async for p in await oc.generate(model=MODEL, prompt="Name a colour.", think=True, stream=True,
                                                    options=GREEDY)])

    on, off, parts = serve_ollama(engine, body, reasoning_parser="qwen3")
    assert on.thinking and not on.response and off.response and not off.thinking
    assert "".join(p.thinking or "" for p in parts) == on.thinking
