"""End-to-end: the real daemon with its HTTP API on, driven by the official openai client.

Chat and completions, streamed and not, n > 1, seeds, stop, logprobs, usage; refusals as the client's
exception types (BadRequestError naming the parameter, AuthenticationError, NotFoundError,
RateLimitError with Retry-After); greedy output over HTTP equal to the gRPC API's and LLM.generate's;
a client that leaves mid-stream gives its pages back at once; the drain; the listener's security rule.
"""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import (
    BASE_CONFIG,
    ROOT,
    DaemonProcess,
    config_with,
    health,
    health_when,
    joined,
    offline_result,
    pages_all_back,
    request,
    wait_for,
)
from nvllm import SamplingParams
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

KEY = "sk-nvllm-test-key-0123456789"
MESSAGES = [{"role": "user", "content": "Say hello"}]


def key_config(tmp: Path, **changes) -> str:
    tmp.mkdir(parents=True, exist_ok=True)
    key_file = tmp / "api_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    return config_with(BASE_CONFIG, http__api_key_file=str(key_file), **changes)


@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("http-daemon")
    d = DaemonProcess(tmp, tiny, key_config(tmp), http_listen="127.0.0.1:0")
    yield d
    d.stop()


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=daemon.http_url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def grpc_generate(daemon: DaemonProcess, req: pb.GenerateRequest) -> tuple[str, list[int]]:
    with grpc.insecure_channel(daemon.address) as ch:
        return joined(list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=60)))


def settled(daemon: DaemonProcess) -> pb.HealthResponse:
    return health_when(daemon.address, pages_all_back, "every page free or cached", timeout=30)


# -- generation --------------------------------------------------------------------------------
def test_greedy_chat_over_http_equals_grpc_and_the_offline_engine(daemon, client, offline) -> None:
    params: dict[str, Any] = dict(temperature=0, max_tokens=16, ignore_eos=True)
    want = offline.chat(MESSAGES, SamplingParams(**params))[0]
    req = pb.GenerateRequest(sampling_params=pb.SamplingParams(**params))
    req.chat.messages.add(**MESSAGES[0])
    assert grpc_generate(daemon, req)[0] == want.text

    got = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=16,
                                         extra_body={"ignore_eos": True})
    assert got.choices[0].message.content == want.text
    assert got.choices[0].message.role == "assistant" and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 16 and got.usage.prompt_tokens == want.prompt_tokens

    stream = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=16,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].usage.completion_tokens == 16 and not chunks[-1].choices
    assert len(chunks) > 3
    settled(daemon)


def test_greedy_completion_over_http_equals_grpc_and_the_offline_engine(daemon, client, offline) -> None:
    params = dict(temperature=0, max_tokens=16, ignore_eos=True)
    want = offline_result(offline, "The quick brown fox", **params)
    assert grpc_generate(daemon, request("The quick brown fox", **params)) == (want.text, want.token_ids)
    got = client.completions.create(model="tiny-llama", prompt="The quick brown fox", temperature=0,
                                    max_tokens=16, extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text and got.object == "text_completion"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-llama", prompt="The quick brown fox", temperature=0, max_tokens=16, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == want.text
    ids = client.completions.create(model="tiny-llama", prompt=offline.engine.tokenizer.encode("The quick brown fox"),
                                    temperature=0, max_tokens=16, extra_body={"ignore_eos": True})
    assert ids.choices[0].text == want.text


def test_n_seeds_stop_and_logprobs(daemon, client, offline) -> None:
    kw = dict(model="tiny-llama", messages=MESSAGES, n=3, seed=11, temperature=1.0, max_tokens=10,
              extra_body={"ignore_eos": True})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices] and len(set(texts)) > 1
    assert [c.index for c in a.choices] == [0, 1, 2] and a.usage.completion_tokens == 30
    alone = offline.chat(MESSAGES, SamplingParams(seed=12, temperature=1.0, max_tokens=10, ignore_eos=True))[0]
    assert texts[1] == alone.text                       # choice i draws with seed + i

    full = client.completions.create(model="tiny-llama", prompt="Once upon", temperature=0, max_tokens=12,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[4:6]
    cut = client.completions.create(model="tiny-llama", prompt="Once upon", temperature=0, max_tokens=12,
                                    stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]

    lp = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, temperature=0, max_tokens=5,
                                        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = lp.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 for t in content)
    assert "".join(t.token for t in content) == lp.choices[0].message.content
    settled(daemon)


def test_models_health_and_metrics(daemon, client) -> None:
    assert [m.id for m in client.models.list()] == ["tiny-llama"]
    h = httpx.get(daemon.http_url + "/health")
    assert h.status_code == 200 and h.json()["state"] == "serving"
    assert 0 < h.json()["pages_backed"] <= h.json()["pages_total"]   # the pool's size: total and backed
    m = httpx.get(daemon.http_url + "/metrics")
    assert m.status_code == 200
    names = {f.name for f in text_string_to_metric_families(m.text)}
    assert any(n.startswith("vllm:") for n in names), sorted(names)[:20]


# -- refusals ----------------------------------------------------------------------------------
def test_errors_arrive_as_the_clients_exception_types(daemon, client) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny-llama", messages=MESSAGES, temperature=-1)
    assert bad.value.param == "temperature" and bad.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(model="tiny-llama", messages=MESSAGES, audio={"voice": "alloy"})
    assert unsupported.value.param == "audio"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert missing.value.param == "model"
    with openai.OpenAI(base_url=daemon.http_url + "/v1", api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()
        with pytest.raises(openai.AuthenticationError):
            # a plain dict for a message, as every test here sends (openai types it as a TypedDict union)
            stranger.chat.completions.create(model="tiny-llama", messages=MESSAGES)  # type: ignore[arg-type]


def test_memory_pressure_is_a_rate_limit_error_with_retry_after(daemon, client) -> None:
    daemon.set_available(100 << 20)
    try:
        wait_for(lambda: httpx.get(daemon.http_url + "/health").status_code == 503, "not admitting")
        h = httpx.get(daemon.http_url + "/health").json()
        assert h["state"] == "not_admitting" and "available memory" in h["reason"]
        with pytest.raises(openai.RateLimitError) as limited:
            client.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2)
        assert int(limited.value.response.headers["retry-after"]) >= 1
        assert "not admitting" in limited.value.message
    finally:
        daemon.set_available(64 << 30)
    wait_for(lambda: httpx.get(daemon.http_url + "/health").status_code == 200, "admitting again")


def test_a_client_that_leaves_mid_stream_gives_its_pages_back(daemon, client) -> None:
    start = len(daemon.lines)
    stream = client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=200,
                                            stream=True, extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"
    daemon.stall()                          # hold it in flight: it cannot finish on its own meanwhile
    try:
        assert health(daemon.address).running + health(daemon.address).waiting == 1
        stream.close()                      # the client goes away
        daemon.wait_line("cancelled (the client went away)", start)
    finally:
        daemon.resume()
    h = settled(daemon)
    assert h.running == 0


def test_a_non_streaming_client_that_leaves_aborts_too(daemon) -> None:
    start = len(daemon.lines)
    daemon.stall()
    try:
        body = b'{"prompt": "Hi", "max_tokens": 200, "ignore_eos": true}'
        with socket.create_connection((daemon.http_url.split("//")[1].split(":")[0],
                                       int(daemon.http_url.rsplit(":", 1)[1]))) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body)
            wait_for(lambda: health(daemon.address).waiting + health(daemon.address).running == 1, "queued")
        daemon.resume()
        daemon.wait_line("cancelled (the client went away)", start)
    finally:
        if daemon.held:
            daemon.resume()
    settled(daemon)


# -- the drain, and the listener's rules --------------------------------------------------------
def test_drain_finishes_http_streams_and_refuses_new_requests(tiny: Path, tmp_path: Path) -> None:
    d = DaemonProcess(tmp_path, tiny, BASE_CONFIG, http_listen="127.0.0.1:0")
    try:
        with openai.OpenAI(base_url=d.http_url + "/v1", api_key="none", max_retries=0, timeout=60) as c:
            streams = [c.completions.create(model="tiny-llama", prompt=f"drain {i}", max_tokens=30, stream=True,
                                            extra_body={"ignore_eos": True}) for i in range(3)]
            heads = [next(iter(s)) for s in streams]
            d.stall()
            d.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: httpx.get(d.http_url + "/health").status_code == 503, "draining")
            assert httpx.get(d.http_url + "/health").json()["state"] == "draining"
            with pytest.raises(openai.InternalServerError) as refused:      # 503
                c.completions.create(model="tiny-llama", prompt="too late", max_tokens=2)
            assert refused.value.status_code == 503 and "draining" in refused.value.message
            d.resume()
            texts = ["".join(ch.choices[0].text for ch in s) for s in streams]
        assert len(heads) == 3 and all(texts)
        assert d.wait() == 0, d.log()
    finally:
        d.stop()


def test_http_off_loopback_needs_tls_or_a_key(tiny: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny), "--listen", "127.0.0.1:0",
                        "--http-listen", "0.0.0.0:0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "without TLS or an API key" in r.stderr


def test_a_taken_http_port_fails_at_once(tiny: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny), "--listen",
                            "127.0.0.1:0", "--http-listen", f"127.0.0.1:{port}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"127.0.0.1:{port}" in r.stderr, r.stderr


def test_https_serves_with_tls_and_the_key(tiny: Path, tmp_path: Path) -> None:
    """http.tls_cert/tls_key serve HTTPS: a client trusting the certificate is served, plain HTTP is not;
    with a key as well, the key is still required."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=60)
    config = config_with(key_config(tmp_path), http__tls_cert=str(tmp_path / "cert.pem"),
                         http__tls_key=str(tmp_path / "key.pem"))
    d = DaemonProcess(tmp_path / "d", tiny, config, http_listen="127.0.0.1:0")
    trust = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    try:
        assert d.http_url.startswith("https://")
        with openai.OpenAI(base_url=d.http_url + "/v1", api_key=KEY, max_retries=0,
                           http_client=httpx.Client(verify=trust)) as c:
            got = c.completions.create(model="tiny-llama", prompt="Hi", max_tokens=3)
            assert got.usage is not None and got.usage.completion_tokens >= 1
        with pytest.raises(httpx.HTTPError):
            httpx.get(d.http_url.replace("https://", "http://") + "/health", timeout=5)
        with pytest.raises(httpx.HTTPError):
            httpx.get(d.http_url + "/health", timeout=5)          # not trusted without the certificate
        assert httpx.get(d.http_url + "/health", verify=trust).status_code == 200
    finally:
        d.stop()


def test_http_with_a_bad_key_file_refuses_to_start(tiny: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty_key"
    empty.write_text("\n")
    (tmp_path / "nvllm.toml").write_text(f'[http]\napi_key_file = "{empty}"\n')
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny), "--listen", "127.0.0.1:0",
                        "--config", str(tmp_path / "nvllm.toml"), "--http-listen", "127.0.0.1:0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "http.api_key_file" in r.stderr and "empty" in r.stderr, r.stderr


def test_install_sh_turns_the_http_api_on_with_a_fresh_key(tmp_path: Path) -> None:
    from helpers.deploy_files import INSTALL, fake_venv, ok, run
    from nvllm.config import load_settings
    from nvllm.server.http.auth import read_api_key
    from nvllm.server.http.listener import check_security

    root = tmp_path / "root"
    fake_venv(root / "opt/nvllm/venv")
    out = ok(run(INSTALL, root, NVLLM_SKIP_PIP="1", NVLLM_SKIP_PULL="1", NVLLM_HTTP_LISTEN="0.0.0.0:8000")).stdout
    assert "HTTP API on 0.0.0.0:8000" in out
    key_file = root / "etc/nvllm/api_key"
    assert key_file.stat().st_mode & 0o777 == 0o640
    key = read_api_key(str(key_file))
    assert len(key) == 64 and int(key, 16) >= 0
    settings = load_settings(root / "etc/nvllm/nvllm.toml")
    assert settings.http.listen == "0.0.0.0:8000" and settings.http.api_key_file == "/etc/nvllm/api_key"
    assert settings.server.listen == "127.0.0.1:50051"            # the gRPC listener is untouched
    check_security(settings.http)                                 # off loopback, but with a key: allowed
    # An upgrade keeps the key and the config.
    ok(run(INSTALL, root, NVLLM_SKIP_PIP="1", NVLLM_SKIP_PULL="1", NVLLM_HTTP_LISTEN="127.0.0.1:9"))
    assert read_api_key(str(key_file)) == key
    assert load_settings(root / "etc/nvllm/nvllm.toml").http.listen == "0.0.0.0:8000"
    fake_venv(tmp_path / "other/opt/nvllm/venv")
    bad = run(INSTALL, tmp_path / "other", NVLLM_SKIP_PIP="1", NVLLM_SKIP_PULL="1", NVLLM_HTTP_LISTEN="x; rm -rf /")
    assert bad.returncode != 0 and "NVLLM_HTTP_LISTEN" in bad.stderr
