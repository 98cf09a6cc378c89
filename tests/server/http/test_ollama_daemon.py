"""End-to-end: the real daemon's /api/chat and /api/generate driven by the official ollama client (the key as a
bearer token): greedy answers equal to the offline engine's, whole and streamed; the empty request that
unloads the model with keep_alive 0 and loads it again; every page back after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health_when, pages_all_back
from nvllm import SamplingParams

KEY = "sk-nvllm-test-key-0123456789"
MESSAGES = [{"role": "system", "content": "You are the drone's assistant."}, {"role": "user", "content": "Say hello"}]
GREEDY = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("ollama-daemon")
    key_file = tmp / "api_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    d = DaemonProcess(tmp, tiny, config_with(BASE_CONFIG, http__api_key_file=str(key_file)),
                      http_listen="127.0.0.1:0")
    yield d
    d.stop()


def model_state(client: ollama.Client) -> str:
    health = client._client.get("/health").json()
    return str(next(m["state"] for m in health["models"] if m["name"] == "tiny-llama"))


def test_chat_and_generate_over_the_daemon_equal_the_offline_answers(daemon: DaemonProcess, offline) -> None:
    want = offline.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12))[0]
    raw = offline.generate(["The drone"], SamplingParams(temperature=0, max_tokens=12))[0]
    client = ollama.Client(host=daemon.http_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    got = client.chat(model="tiny-llama", messages=MESSAGES, options=GREEDY)
    assert got.message.content == want.text and got.eval_count == want.completion_tokens
    assert got.prompt_eval_count == want.prompt_tokens
    assert got.done_reason == {"length": "length", "stop": "stop"}[str(want.finish_reason)]
    streamed = list(client.chat(model="tiny-llama", messages=MESSAGES, options=GREEDY, stream=True))
    assert "".join(p.message.content or "" for p in streamed) == want.text and streamed[-1].done
    generated = client.generate(model="tiny-llama", prompt="The drone", raw=True, options=GREEDY)
    assert generated.response == raw.text
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.http_url, timeout=60).chat(model="tiny-llama", messages=MESSAGES)
    assert e.value.status_code == 401
    health_when(daemon.address, pages_all_back, "every page free or cached", timeout=30)


def test_keep_alive_0_unloads_and_the_next_request_loads_again(daemon: DaemonProcess) -> None:
    client = ollama.Client(host=daemon.http_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert client.generate(model="tiny-llama", keep_alive=0).done_reason == "unload"
    assert model_state(client) == "unloaded"
    assert client.chat(model="tiny-llama", messages=[], keep_alive="5m").done_reason == "load"
    assert model_state(client) == "loaded"
    assert client.chat(model="tiny-llama", messages=MESSAGES, options=GREEDY).done
