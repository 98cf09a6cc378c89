"""End-to-end: the real daemon's HTTP API driven by the official anthropic client (/v1/messages, streamed
and not, count_tokens, the key in x-api-key) and the openai client's responses.create (streamed and not):
greedy, each equal to the offline engine's answer to the same conversation, every page back after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health_when, pages_all_back
from nvllm import SamplingParams

KEY = "sk-nvllm-test-key-0123456789"
SYSTEM = "You are the drone's assistant."
MESSAGES = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    tmp = tmp_path_factory.mktemp("dialects-daemon")
    key_file = tmp / "api_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    d = DaemonProcess(tmp, tiny, config_with(BASE_CONFIG, http__api_key_file=str(key_file)),
                      http_listen="127.0.0.1:0")
    yield d
    d.stop()


def test_messages_over_the_daemon_equal_the_offline_answer(daemon: DaemonProcess, offline) -> None:
    want = offline.chat([{"role": "system", "content": SYSTEM}, *MESSAGES],
                        SamplingParams(temperature=0, max_tokens=12))[0]
    with anthropic.Anthropic(base_url=daemon.http_url, api_key=KEY, max_retries=0, timeout=60) as claude:
        extra = {"temperature": 0}
        got = claude.messages.create(model="tiny-llama", system=SYSTEM, messages=MESSAGES,  # type: ignore[arg-type]
                                     max_tokens=12, extra_body=extra)
        assert got.content[0].type == "text" and got.content[0].text == want.text
        assert got.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[str(want.finish_reason)]
        assert got.usage.output_tokens == want.completion_tokens
        with claude.messages.stream(model="tiny-llama", system=SYSTEM, messages=MESSAGES,  # type: ignore[arg-type]
                                    max_tokens=12, extra_body=extra) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed == want.text and final.stop_reason == got.stop_reason
        counted = claude.messages.count_tokens(model="tiny-llama", system=SYSTEM, messages=MESSAGES)  # type: ignore[arg-type]
        assert counted.input_tokens == want.prompt_tokens
    with anthropic.Anthropic(base_url=daemon.http_url, api_key="wrong", max_retries=0) as bad, \
            pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny-llama", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    health_when(daemon.address, pages_all_back, "every page free or cached", timeout=30)


def test_responses_over_the_daemon_equal_the_offline_answer(daemon: DaemonProcess, offline) -> None:
    want = offline.chat([{"role": "system", "content": SYSTEM}, *MESSAGES],
                        SamplingParams(temperature=0, max_tokens=12))[0]
    with openai.OpenAI(base_url=daemon.http_url + "/v1", api_key=KEY, max_retries=0, timeout=60) as client:
        got = client.responses.create(model="tiny-llama", instructions=SYSTEM, input="Say hello", temperature=0,
                                      max_output_tokens=12)
        status = {"length": "incomplete", "stop": "completed"}[str(want.finish_reason)]
        assert got.output_text == want.text and got.status == status
        assert got.usage is not None and got.usage.input_tokens == want.prompt_tokens
        events = list(client.responses.create(model="tiny-llama", instructions=SYSTEM, input="Say hello",
                                              temperature=0, max_output_tokens=12, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == want.text
        assert events[0].type == "response.created" and events[-1].type == f"response.{status}"
        with pytest.raises(openai.BadRequestError, match="keeps no state"):
            client.responses.create(model="tiny-llama", input="Hi", previous_response_id="resp_1")
    health_when(daemon.address, pages_all_back, "every page free or cached", timeout=30)
