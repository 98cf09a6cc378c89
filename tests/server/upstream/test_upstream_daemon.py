"""End-to-end: a board daemon with [[upstreams]] in front of a second real nvllm daemon (the upstream), and a
stand-in server that misbehaves on purpose. The board serves tiny-llama with an 48-token context and a queue
of 0 (every admission refused busy), and reads a made /sys (power) so that it can be made hot. Requests it
would refuse go upstream and come back marked (header, usage.answered_by, gRPC metadata) and counted in
/metrics; an upstream that is down, slow or answers garbage gives the board's own refusal, within its timeout."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health, health_when
from helpers.sysfs_tree import board, set_temp
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

LOCAL_CONTEXT = 48
SLOW_TIMEOUT_S = 1.0
HEADER = "x-nvllm-answered-by"
LONG_PROMPT = "the quick brown fox jumps over the lazy dog " * 12     # well past 48 tokens, within 256


# -- the stand-in upstream: answers by the model the body names --------------------------------------------
class _StandIn(BaseHTTPRequestHandler):
    stop = threading.Event()
    gone = threading.Event()     # an m-endless reader went away
    keys: list[str | None] = []  # the Authorization header of every request

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.keys.append(self.headers.get("authorization"))
        model = body.get("model")
        if model == "m-slow":           # accepts, reads, never answers
            self.stop.wait(30)
            return
        if model == "m-500":
            self._send(500, "application/json", b'{"error": {"message": "boom"}}')
        elif model == "m-garbage":
            self._send(200, "text/event-stream" if body.get("stream") else "application/json",
                       b"data: this is not json\n\n" if body.get("stream") else b"<html>not json</html>")
        elif model == "m-endless":     # a chunk every 0.1 s until the reader goes away
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"id": "x", "object": "chat.completion.chunk", "model": model,
                     "choices": [{"index": 0, "delta": {"content": "more"}, "finish_reason": None}]}
            try:
                for _ in range(300):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                self.gone.set()
        elif model == "m-drip":         # one chunk, a pause, another: the board must not wait for the second
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i, pause in ((0, 0.6), (1, 0.0)):     # the pause within the stand-in's timeout_s
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": {"content": f"part{i}"}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(pause)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        else:
            self._send(404, "application/json", b'{"error": {"message": "no"}}')

    def _send(self, status: int, kind: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass         # a reader the test left on purpose


@pytest.fixture(scope="module")
def standin() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _StandIn)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _StandIn.stop.set()
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the daemons --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def upstream(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """A second nvllm: tiny-llama with its whole context, "bigger", which the board does not serve, and
    "roomless", which the board serves but cannot load beside its pinned tiny-llama."""
    qwen = tiny_models["tiny-qwen2"]
    config = BASE_CONFIG + f'\n[[models]]\npath = "{qwen}"\nname = "bigger"\n' \
        f'\n[[models]]\npath = "{qwen}"\nname = "roomless"\n'
    d = DaemonProcess(tmp_path_factory.mktemp("upstream"), tiny_models["tiny-llama"], config,
                      http_listen="127.0.0.1:0")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return board(tmp_path_factory.mktemp("sys"), {"cpu-thermal": 50_000})


@pytest.fixture(scope="module")
def board_daemon(tiny: Path, tiny_models: dict[str, Path], upstream: DaemonProcess, standin: str,
                 sysfs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = sysfs["cpu-thermal"].parents[2]
    # a budget that holds tiny-llama (pinned) but not "roomless" beside it: their bytes as the upstream holds them
    assert httpx.post(upstream.http_url + "/v1/completions", json={"model": "roomless", "prompt": "x",
                                                                   "max_tokens": 1}, timeout=60).status_code == 200
    held = {m.name: m.bytes for m in health(upstream.address).models}
    budget_gb = (held["tiny-llama"] + held["roomless"] // 2) / (1 << 30)
    key = tmp_path_factory.mktemp("key") / "upstream.key"
    key.write_text("not-checked-by-the-upstream\n")
    config = config_with(BASE_CONFIG, max_waiting=0, scheduler__max_model_len=LOCAL_CONTEXT) + f"""
[model]
pinned = true

[power]
sysfs_root = "{root}"
interval_s = 0.2

[[models]]
path = "{tiny_models["tiny-qwen2"]}"
name = "roomless"

[[upstreams]]
name = "big"
base_url = "{upstream.http_url}/v1"
api_key_file = "{key}"
models = ["tiny-llama", "bigger", "roomless"]
forward_when = ["not_served", "too_long", "busy", "no_room", "hot"]

[[upstreams]]
name = "standin"
base_url = "{standin}"
models = ["m-slow", "m-500", "m-garbage", "m-drip", "m-endless"]
timeout_s = {SLOW_TIMEOUT_S}
api_key = "standin-key"

[[upstreams]]
name = "down"
base_url = "http://127.0.0.1:{closed_port()}"
models = ["m-down"]
timeout_s = 5
"""
    d = DaemonProcess(tmp_path_factory.mktemp("board"), tiny, config, http_listen="127.0.0.1:0",
                      extra_args=("--memory-gb", f"{budget_gb:.6f}"))
    yield d
    d.stop()


def chat(model: str, content: str = "Hello there", **more: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "temperature": 0, **more}


def forwarded(d: DaemonProcess) -> dict[tuple[str, str, str], float]:
    text = httpx.get(d.http_url + "/metrics", timeout=10).text
    return {(s.labels["upstream"], s.labels["reason"], s.labels["outcome"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "nvllm:forwarded_requests_total"}


def same_answer(a: dict, b: dict) -> None:
    assert [c.get("message", c.get("text")) for c in a["choices"]] == \
        [c.get("message", c.get("text")) for c in b["choices"]]
    assert [c["finish_reason"] for c in a["choices"]] == [c["finish_reason"] for c in b["choices"]]
    assert {k: a["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == \
        {k: b["usage"][k] for k in ("prompt_tokens", "completion_tokens")}


# -- forwarded ----------------------------------------------------------------------------------------------
def test_a_model_not_served_here_is_answered_upstream_as_it_answers_itself(board_daemon: DaemonProcess,
                                                                           upstream: DaemonProcess) -> None:
    for path, body in (("/v1/chat/completions", chat("bigger")),
                       ("/v1/completions", {"model": "bigger", "prompt": "Once upon", "max_tokens": 8,
                                            "temperature": 0})):
        direct = httpx.post(upstream.http_url + path, json=body, timeout=60)
        via = httpx.post(board_daemon.http_url + path, json=body, timeout=60)
        assert direct.status_code == via.status_code == 200, via.text
        assert via.headers[HEADER] == "upstream:big" and HEADER not in direct.headers
        assert via.json()["usage"]["answered_by"] == "upstream:big"
        same_answer(via.json(), direct.json())
    assert forwarded(board_daemon)[("big", "not_served", "answered")] >= 2
    assert "forwarded to upstream big (the model is not served here)" in board_daemon.log()


def test_a_prompt_longer_than_the_local_context_is_answered_upstream(board_daemon: DaemonProcess,
                                                                     upstream: DaemonProcess) -> None:
    body = chat("tiny-llama", LONG_PROMPT)
    direct = httpx.post(upstream.http_url + "/v1/chat/completions", json=body, timeout=60)
    via = httpx.post(board_daemon.http_url + "/v1/chat/completions", json=body, timeout=60)
    assert direct.status_code == via.status_code == 200, via.text
    assert via.headers[HEADER] == "upstream:big"
    same_answer(via.json(), direct.json())
    assert via.json()["usage"]["prompt_tokens"] > LOCAL_CONTEXT
    assert forwarded(board_daemon)[("big", "too_long", "answered")] >= 1


def test_a_full_queue_is_answered_upstream(board_daemon: DaemonProcess, upstream: DaemonProcess) -> None:
    via = httpx.post(board_daemon.http_url + "/v1/chat/completions", json=chat("tiny-llama"), timeout=60)
    direct = httpx.post(upstream.http_url + "/v1/chat/completions", json=chat("tiny-llama"), timeout=60)
    assert via.status_code == 200 and via.headers[HEADER] == "upstream:big", via.text
    same_answer(via.json(), direct.json())
    assert forwarded(board_daemon)[("big", "busy", "answered")] >= 1


def test_a_model_the_memory_plan_cannot_load_is_answered_upstream(board_daemon: DaemonProcess) -> None:
    via = httpx.post(board_daemon.http_url + "/v1/chat/completions", json=chat("roomless"), timeout=60)
    assert via.status_code == 200 and via.headers[HEADER] == "upstream:big", via.text
    assert forwarded(board_daemon)[("big", "no_room", "answered")] >= 1
    assert {m.name: m.state for m in health(board_daemon.address).models}["roomless"] != pb.ModelHealth.STATE_LOADED


def test_a_stream_is_passed_through_chunk_by_chunk(board_daemon: DaemonProcess, upstream: DaemonProcess) -> None:
    body = chat("bigger", stream=True, stream_options={"include_usage": True})

    def events(url: str) -> tuple[list[dict], httpx.Headers]:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            return [json.loads(d) for d in data if d != "[DONE]"] + ([{"done": True}] if data[-1] == "[DONE]"
                                                                      else []), r.headers
    direct, _ = events(upstream.http_url)
    via, headers = events(board_daemon.http_url)
    assert headers[HEADER] == "upstream:big"
    assert len(via) == len(direct) and via[-1] == {"done": True}

    def deltas(evs: list[dict]) -> list[object]:
        return [(c["delta"], c["finish_reason"]) for e in evs for c in e.get("choices", ())]
    assert deltas(via) == deltas(direct)
    assert via[-2]["usage"]["answered_by"] == "upstream:big"
    assert {k: v for k, v in via[-2]["usage"].items() if k != "answered_by"} == direct[-2]["usage"]


def test_each_chunk_arrives_as_the_upstream_sends_it(board_daemon: DaemonProcess) -> None:
    t0 = time.monotonic()
    arrived = []
    with httpx.stream("POST", board_daemon.http_url + "/v1/chat/completions", json=chat("m-drip", stream=True),
                      timeout=30) as r:
        assert r.headers[HEADER] == "upstream:standin"
        for line in r.iter_lines():
            if line.startswith("data: "):
                arrived.append((time.monotonic() - t0, line[6:]))
    assert [a[1] for a in arrived][-1] == "[DONE]" and "part0" in arrived[0][1] and "part1" in arrived[1][1]
    assert arrived[1][0] - arrived[0][0] >= 0.45     # the first came before the upstream sent the second
    assert _StandIn.keys[-1] == "Bearer standin-key"   # the upstream's key, not the client's


def test_a_client_that_leaves_a_relayed_stream_closes_the_upstreams_connection(board_daemon: DaemonProcess) -> None:
    _StandIn.gone.clear()
    with httpx.stream("POST", board_daemon.http_url + "/v1/chat/completions", json=chat("m-endless", stream=True),
                      timeout=30) as r:
        assert r.headers[HEADER] == "upstream:standin"
        next(line for line in r.iter_lines() if line.startswith("data: "))
    assert _StandIn.gone.wait(5.0), "the stand-in kept writing to an open connection"
    r = httpx.post(board_daemon.http_url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"}, timeout=30)
    assert r.status_code == 200     # the board still answers (through its upstream: its queue refuses all)


def test_grpc_generate_is_answered_upstream(board_daemon: DaemonProcess, upstream: DaemonProcess) -> None:
    req = pb.GenerateRequest(model="bigger", chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user",
                             content="Hello there")]), sampling_params=pb.SamplingParams(temperature=0, max_tokens=8))

    async def ask(address: str) -> tuple[list[pb.GenerateResponse], dict[str, str]]:
        async with grpc.aio.insecure_channel(address) as ch:
            call = pb_grpc.GeneratorStub(ch).Generate(req, timeout=60)
            out = [r async for r in call]
            return out, dict(await call.initial_metadata())
    direct, _ = asyncio.run(ask(upstream.address))
    via, meta = asyncio.run(ask(board_daemon.address))
    assert meta[HEADER] == "upstream:big"
    assert "".join(r.text for r in via) == "".join(r.text for r in direct)
    assert via[-1].finish_reason == direct[-1].finish_reason
    assert (via[-1].usage.prompt_tokens, via[-1].usage.completion_tokens) == \
        (direct[-1].usage.prompt_tokens, direct[-1].usage.completion_tokens)
    assert forwarded(board_daemon)[("big", "not_served", "answered")] >= 1


def test_a_hot_board_sends_its_requests_upstream(board_daemon: DaemonProcess, sysfs: dict[str, Path]) -> None:
    set_temp(sysfs["cpu-thermal"], 95_000)
    try:
        health_when(board_daemon.address, lambda h: h.thermal_throttled, "throttled", 10.0)
        via = httpx.post(board_daemon.http_url + "/v1/chat/completions", json=chat("tiny-llama"), timeout=60)
        assert via.status_code == 200 and via.headers[HEADER] == "upstream:big"
        assert forwarded(board_daemon)[("big", "hot", "answered")] >= 1
    finally:
        set_temp(sysfs["cpu-thermal"], 50_000)
        health_when(board_daemon.address, lambda h: not h.thermal_throttled, "cool again", 10.0)


# -- faults: the board's own refusal -----------------------------------------------------------------------
def local_refusal(d: DaemonProcess, model: str, stream: bool = False) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(d.http_url + "/v1/chat/completions", json=chat(model, stream=stream), timeout=30)
    return r, time.monotonic() - t0


def assert_not_found(r: httpx.Response, model: str) -> None:
    assert r.status_code == 404 and HEADER not in r.headers, r.text
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and model in err["message"]


def test_an_upstream_that_is_down_gives_the_local_refusal_at_once(board_daemon: DaemonProcess) -> None:
    r, took = local_refusal(board_daemon, "m-down")
    assert_not_found(r, "m-down")
    assert took < 3.0
    assert forwarded(board_daemon)[("down", "not_served", "failed")] >= 1
    assert "upstream down failed" in board_daemon.log()

    async def ask() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(board_daemon.address) as ch:
            call = pb_grpc.GeneratorStub(ch).Generate(pb.GenerateRequest(model="m-down", prompt="hi"), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                [r async for r in call]
            return e.value
    assert asyncio.run(ask()).code() == grpc.StatusCode.NOT_FOUND


def test_an_upstream_that_never_answers_gives_the_local_refusal_within_its_timeout(
        board_daemon: DaemonProcess) -> None:
    for stream in (False, True):
        r, took = local_refusal(board_daemon, "m-slow", stream)
        assert_not_found(r, "m-slow")
        assert SLOW_TIMEOUT_S * 0.9 <= took < SLOW_TIMEOUT_S + 3.0
    assert forwarded(board_daemon)[("standin", "not_served", "failed")] >= 2
    assert "upstream standin timed out" in board_daemon.log()


def test_the_local_refusal_is_the_one_given_without_an_upstream(board_daemon: DaemonProcess) -> None:
    """A model no upstream serves, and one whose upstream is down: the same status and body but the name."""
    alone, _ = local_refusal(board_daemon, "m-nobody")
    failed, _ = local_refusal(board_daemon, "m-down")
    assert failed.status_code == alone.status_code == 404
    assert failed.text.replace("m-down", "m-nobody") == alone.text


def test_an_upstream_that_answers_garbage_gives_the_local_refusal(board_daemon: DaemonProcess) -> None:
    for model, stream in (("m-garbage", False), ("m-garbage", True), ("m-500", False), ("m-500", True)):
        r, _ = local_refusal(board_daemon, model, stream)
        assert_not_found(r, model)
    log = board_daemon.log()
    assert "answered something that is not JSON" in log and "streamed an event that is not a JSON object" in log
    assert "answered HTTP 500" in log
    # the local refusal and the forwarding that failed left nothing held: the board still refuses busy alone
    r = httpx.post(board_daemon.http_url + "/v1/completions", json={"model": "tiny-llama", "prompt": "x"},
                   timeout=30)
    assert r.status_code == 200 and r.headers[HEADER] == "upstream:big"


def test_without_upstreams_nothing_is_forwarded(upstream: DaemonProcess) -> None:
    r = httpx.post(upstream.http_url + "/v1/chat/completions", json=chat("m-down"), timeout=30)
    assert_not_found(r, "m-down")
    assert forwarded(upstream) == {}


# -- llama.cpp's llama-server as the upstream, where the machine has one -------------------------------------
def test_llama_server_as_the_upstream(tiny: Path, smollm2_gguf_if_any: Path | None, tmp_path: Path) -> None:
    binary = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if not binary or not Path(binary).exists():
        pytest.skip("no llama-server (set LLAMA_SERVER to its path)")
    if smollm2_gguf_if_any is None:
        pytest.skip("no GGUF for llama-server to serve (models/smollm2-135m-instruct.gguf)")
    port = closed_port()
    proc = subprocess.Popen([binary, "-m", str(smollm2_gguf_if_any), "--port", str(port), "--host", "127.0.0.1",
                             "-c", "512", "-a", "smol"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        config = BASE_CONFIG + f'\n[[upstreams]]\nname = "llama"\nbase_url = "http://127.0.0.1:{port}"\n' \
            'models = ["smol"]\n'
        d = DaemonProcess(tmp_path / "board", tiny, config, http_listen="127.0.0.1:0")
        try:
            r = httpx.post(d.http_url + "/v1/chat/completions", json=chat("smol"), timeout=60)
            assert r.status_code == 200 and r.headers[HEADER] == "upstream:llama", r.text
            assert r.json()["choices"][0]["message"]["content"]
            with httpx.stream("POST", d.http_url + "/v1/chat/completions", json=chat("smol", stream=True),
                              timeout=60) as s:
                lines = [line for line in s.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and len(lines) > 2
        finally:
            d.stop()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture()
def smollm2_gguf_if_any() -> Path | None:
    from helpers.paths import ROOT
    p = ROOT / "models" / "smollm2-135m-instruct.gguf"
    return p if p.exists() else None
