"""The OpenAI-compatible HTTP API in process: the Starlette app over the real engine (a tiny model), driven
through an ASGI transport. Mapping, response shapes, streaming, n > 1, every refusal's status and the
parameter it names, the key, /health and /metrics. The live daemon and the openai client are
tests/server/http/test_http_daemon.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.http_app import MAX_BODY, MAX_NUM_SEQS, Client, error_of, events, post, serve
from nvllm import LLM, SamplingParams
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.http.app import OpenAIApi
from nvllm.server.state import DaemonState

NUM_BLOCKS = 128
KEY = b"sk-test-0123456789"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def offline(tiny_models: dict[str, Path]) -> LLM:
    return LLM(tiny_models["tiny-llama"], num_blocks=NUM_BLOCKS, max_num_seqs=MAX_NUM_SEQS)


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=NUM_BLOCKS, max_num_seqs=MAX_NUM_SEQS).engine


def test_chat_greedy_equals_the_offline_engine(engine: LLMEngine, offline: LLM) -> None:
    want = offline.generate({"messages": CHAT}, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    r = serve(engine, post("/v1/chat/completions", {"model": "tiny-llama", "messages": CHAT, "temperature": 0,
                                                    "max_completion_tokens": 12, "ignore_eos": True}))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny-llama"
    assert body["id"].startswith("chatcmpl-") and r.headers["x-request-id"] in body["id"]
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": want.text}
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    usage = body["usage"]
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12


def test_logit_bias_reaches_the_sampler(engine: LLMEngine, offline: LLM) -> None:
    """+100 on one token makes greedy decoding take it every time; -100 on the unbiased answer's first token
    changes it. Keys arrive as strings, as OpenAI's JSON sends them."""
    free = offline.generate({"messages": CHAT}, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    forced, banned = 7, free.token_ids[0]

    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
                                                             "ignore_eos": True, "logit_bias": {str(forced): 100}}),
                await client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4, "temperature": 0,
                                                                  "ignore_eos": True,
                                                                  "logit_bias": {str(banned): -100}})]
    up, down = serve(engine, body)
    assert up.status_code == 200 and down.status_code == 200, (up.text, down.text)
    assert up.json()["choices"][0]["text"] == engine.tokenizer.decode([forced] * 4)
    assert down.json()["choices"][0]["message"]["content"] != free.text


def test_content_parts_and_developer_role_render_like_strings(engine: LLMEngine, offline: LLM) -> None:
    want = offline.generate({"messages": CHAT}, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    parts = [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]
    r = serve(engine, post("/v1/chat/completions", {"messages": parts, "temperature": 0, "max_tokens": 6,
                                                    "ignore_eos": True}))
    assert r.json()["choices"][0]["message"]["content"] == want.text


def test_completions_prompt_shapes(engine: LLMEngine, offline: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    texts = ["The quick brown fox", "Once upon a time"]
    want = offline.generate(texts, params)
    ids = offline.engine.tokenizer.encode(texts[0])

    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        common = {"temperature": 0, "max_tokens": 5, "ignore_eos": True}
        return [await client.post("/v1/completions", json={"prompt": p, **common})
                for p in (texts[0], texts, ids, [ids, ids])]
    one, two, tokens, two_tokens = serve(engine, body)
    assert [c["text"] for c in one.json()["choices"]] == [want[0].text]
    assert [c["text"] for c in two.json()["choices"]] == [w.text for w in want]
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
    assert two.json()["usage"]["completion_tokens"] == 10
    assert [c["text"] for c in tokens.json()["choices"]] == [want[0].text]
    assert [c["text"] for c in two_tokens.json()["choices"]] == [want[0].text] * 2
    assert tokens.json()["usage"]["prompt_tokens"] == len(ids)


def test_completions_default_to_16_tokens_and_echo(engine: LLMEngine) -> None:
    r = serve(engine, post("/v1/completions", {"prompt": "Hello there", "echo": True, "ignore_eos": True}))
    (choice,) = r.json()["choices"]
    assert choice["text"].startswith("Hello there")
    assert r.json()["usage"]["completion_tokens"] == 16


def test_n_choices_with_a_seed_are_distinct_and_reproducible(engine: LLMEngine, offline: LLM) -> None:
    payload = {"prompt": "The quick brown fox", "n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 8,
               "ignore_eos": True}

    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.post("/v1/completions", json=payload) for _ in range(2)]
    first, second = serve(engine, body)
    texts = [c["text"] for c in first.json()["choices"]]
    assert texts == [c["text"] for c in second.json()["choices"]]
    assert [c["index"] for c in first.json()["choices"]] == [0, 1, 2]
    assert len(set(texts)) > 1
    # choice i draws with seed + i, as a lone seeded request does
    for i, text in enumerate(texts):
        alone = offline.generate("The quick brown fox", SamplingParams(seed=7 + i, temperature=1.0, max_tokens=8,
                                                                       ignore_eos=True))[0]
        assert text == alone.text
    usage = first.json()["usage"]
    assert usage["completion_tokens"] == 24
    assert usage["prompt_tokens"] == len(offline.engine.tokenizer.encode("The quick brown fox"))


def test_stop_string_and_stop_reason(engine: LLMEngine, offline: LLM) -> None:
    full = offline.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop = full.text[3:5]
    r = serve(engine, post("/v1/completions", {"prompt": "The quick brown fox", "temperature": 0, "max_tokens": 12,
                                               "ignore_eos": True, "stop": stop}))
    (choice,) = r.json()["choices"]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == full.text[:full.text.index(stop)]


def test_chat_stream_chunks_usage_and_done(engine: LLMEngine, offline: LLM) -> None:
    want = offline.generate({"messages": CHAT}, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    r = serve(engine, post("/v1/chat/completions", {"messages": CHAT, "temperature": 0, "max_tokens": 10,
                                                    "ignore_eos": True, "stream": True,
                                                    "stream_options": {"include_usage": True}}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = events(r)
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == want.text
    finals = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["finish_reason"] for f in finals] == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completion_stream_with_n_merges_choices(engine: LLMEngine) -> None:
    r = serve(engine, post("/v1/completions", {"prompt": "Hi", "n": 2, "seed": 1, "max_tokens": 6,
                                               "ignore_eos": True, "stream": True}))
    chunks = events(r)
    assert all("usage" not in c for c in chunks)
    by_index: dict[int, str] = {0: "", 1: ""}
    for c in chunks:
        (choice,) = c["choices"]
        by_index[choice["index"]] += choice["text"]
    whole = serve(engine, post("/v1/completions", {"prompt": "Hi", "n": 2, "seed": 1, "max_tokens": 6,
                                                   "ignore_eos": True}))
    assert [by_index[0], by_index[1]] == [c["text"] for c in whole.json()["choices"]]


def test_logprobs_chat_and_completions(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        chat = await client.post("/v1/chat/completions", json={
            "messages": CHAT, "temperature": 0, "max_tokens": 4, "ignore_eos": True, "logprobs": True,
            "top_logprobs": 3})
        comp = await client.post("/v1/completions", json={
            "prompt": "The quick", "temperature": 0, "max_tokens": 4, "ignore_eos": True, "logprobs": 2})
        return [chat, comp]
    chat, comp = serve(engine, body)
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["bytes"] == list(entry["token"].encode())
        # greedy: the chosen token is the most likely one
        assert entry["logprob"] == pytest.approx(max(t["logprob"] for t in entry["top_logprobs"]))
    assert "".join(e["token"] for e in content) == chat.json()["choices"][0]["message"]["content"]
    lp = comp.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    # a dict keyed by the token text: two tokens that decode alike (a partial character) make one entry
    assert lp["text_offset"][0] == 0 and all(1 <= len(t) <= 2 for t in lp["top_logprobs"])


def test_models_and_health(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.get("/v1/models"), await client.get("/health")]
    models, health = serve(engine, body)
    assert models.json()["data"][0]["id"] == "tiny-llama"
    assert health.status_code == 200 and health.json()["state"] == "serving"


def test_starting_is_503(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.get("/health"),
                await client.post("/v1/completions", json={"prompt": "Hi"})]
    health, gen = serve(engine, body, ready=False)
    assert health.status_code == 503 and health.json()["state"] == "starting"
    err = error_of(gen, 503)
    assert "starting" in err["message"] and gen.headers["retry-after"]


def test_metrics_parse(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> httpx.Response:
        await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        await client.post("/v1/completions", json={"prompt": "Hi", "bogus": 1})
        return await client.get("/metrics")
    r = serve(engine, body)
    assert r.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families, r.text[:500]
    samples = [s for f in families.values() for s in f.samples]
    assert any(s.labels.get("api") == "http" for s in samples)


# -- refusals ---------------------------------------------------------------------------------------
BAD = [
    # (path, payload, status, param)
    ("/v1/completions", {"prompt": "Hi", "bogus": 1}, 400, "bogus"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"five": 10}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": [5]}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "Hi", "suffix": "x"}, 400, "suffix"),
    ("/v1/completions", {"prompt": "Hi", "best_of": 3}, 400, "best_of"),
    ("/v1/completions", {"prompt": "Hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "Hi", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "Hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "Hi", "top_k": 1.5}, 400, "top_k"),
    ("/v1/completions", {"prompt": "Hi", "seed": -1}, 400, "seed"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 100000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "Hi", "n": MAX_NUM_SEQS + 1}, 400, "n"),
    ("/v1/completions", {"prompt": ["a"] * 5, "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["a"] * 40}, 400, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stop": 5}, 400, "stop"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 1, "echo": True}, 400, "echo"),
    ("/v1/completions", {"prompt": [1, 2], "echo": True}, 400, "echo"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [10 ** 9]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "Hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "Hi", "model": "gpt-4"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "bogus": 1}]}, 400,
     "messages[0].bogus"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 30}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "xml"}}, 400,
     "response_format.type"),
    ("/v1/chat/completions", {"messages": CHAT, "echo": True}, 400, "echo"),
]


def test_bad_requests_are_refused_naming_the_parameter(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [await client.post(path, json=payload) for path, payload, _, _ in BAD]
    for (_path, payload, status, param), r in zip(BAD, serve(engine, body)):
        err = error_of(r, status)
        assert err["param"] == param, (payload, err)
        assert param.split("[")[0].split(".")[0] in err["message"], (payload, err)
        assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


def test_neutral_values_of_unsupported_parameters_pass(engine: LLMEngine) -> None:
    r = serve(engine, post("/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 2, "logit_bias": {}, "tools": [], "response_format": {"type": "text"},
        "store": False, "user": "alice", "stop": None, "seed": None}))
    assert r.status_code == 200, r.text


def test_body_json_size_path_method(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        return [
            await client.post("/v1/completions", content=b"{not json"),
            await client.post("/v1/completions", content=b"[1, 2]"),
            await client.post("/v1/completions", content=b'{"prompt": "x", "temperature": NaN}'),
            await client.post("/v1/completions", content=b'{"prompt": "' + b"a" * MAX_BODY + b'"}'),
            await client.post("/v1/nothing", json={}),
            await client.get("/v1/completions"),
        ]
    bad_json, not_object, nan, big, no_path, method = serve(engine, body)
    assert "not valid JSON" in error_of(bad_json, 400)["message"]
    assert "JSON object" in error_of(not_object, 400)["message"]
    assert error_of(nan, 400)["message"]
    assert "http.max_body_bytes" in error_of(big, 413)["message"]
    assert error_of(no_path, 404)["type"] == "not_found_error"
    error_of(method, 405)


def test_api_key(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        payload = {"prompt": "Hi", "max_tokens": 2}
        return [
            await client.post("/v1/completions", json=payload),
            await client.post("/v1/completions", json=payload, headers={"Authorization": "Bearer wrong"}),
            await client.post("/v1/completions", json=payload, headers={"Authorization": "Basic " + KEY.decode()}),
            await client.get("/v1/models"),
            await client.post("/v1/completions", json=payload, headers={"Authorization": "Bearer " + KEY.decode()}),
            await client.get("/health"),
        ]
    missing, wrong, scheme, models, good, health = serve(engine, body, key=KEY)
    for r in (missing, wrong, scheme, models):
        assert error_of(r, 401)["type"] == "authentication_error"
    assert good.status_code == 200 and health.status_code == 200


def test_per_client_stream_cap_and_full_queue_are_429(engine: LLMEngine) -> None:
    async def body(client: Client, state: DaemonState) -> list[httpx.Response]:
        state.open_stream("127.0.0.1")        # this client already holds its one stream
        capped = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        state.close_stream("127.0.0.1")
        state.max_waiting = 0                 # any queue is too long
        full = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        return [capped, full]
    capped, full = serve(engine, body, max_streams_per_client=1)
    assert "max_streams_per_client" in error_of(capped, 429)["message"]
    assert capped.headers["retry-after"]
    assert "queue full" in error_of(full, 429)["message"]


def test_a_disconnect_while_waiting_for_a_whole_response_aborts(engine: LLMEngine) -> None:
    """A non-streaming request whose client goes away is aborted, not run to its end."""
    async def body(client: Client, state: DaemonState) -> dict[str, Any]:
        ae = state.engine
        assert ae is not None
        task = asyncio.ensure_future(client.post("/v1/completions", json={
            "prompt": "Hi", "max_tokens": 200, "ignore_eos": True}))
        for _ in range(1000):
            if ae.stats()["running"]:
                break
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):
            if not ae.num_streams:
                break
            await asyncio.sleep(0.005)
        return ae.stats()
    stats = serve(engine, body)
    assert stats["running"] == 0


def test_a_stream_whose_client_is_gone_at_once_releases_everything(engine: LLMEngine) -> None:
    """Raw ASGI: the client disconnects right after its body, before the event stream may even start.
    Its engine request is aborted and its per-client count given back all the same."""
    async def body(client: Client, state: DaemonState) -> tuple[dict[str, int], int]:
        ae = state.engine
        assert ae is not None
        api = OpenAIApi(state, None, MAX_BODY, metrics=state.metrics)
        app = api.app()
        payload = json.dumps({"prompt": "Hi", "max_tokens": 200, "ignore_eos": True, "stream": True}).encode()
        messages = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            return {"type": "http.disconnect"}
        sent: list[MutableMapping[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("10.0.0.9", 1234), "server": ("nvllm", 80)}
        for _ in range(20):
            await app(scope, receive, send)
            messages.append({"type": "http.request", "body": payload, "more_body": False})
        for _ in range(500):
            if not ae.num_streams:
                break
            await asyncio.sleep(0.01)
        return dict(state.streams_by_client), ae.num_streams
    open_streams, in_flight = serve(engine, body)
    assert open_streams == {} and in_flight == 0
