"""nvllm query's bounded default: without --max-tokens the request carries DEFAULT_MAX_TOKENS (256), the
answer stops there with a note on stderr (stdout stays the answer), --max-tokens N and 0 (the end of the
context) are honoured, and a prompt that leaves less room than the bound gets what it leaves.

The daemon serves tiny-qwen2, whose 512-token context is longer than the bound (the tiny Llama's 256 is
not), with the tests' launcher (helpers/daemon_main.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers.daemon_util import DaemonProcess
from nvllm import cli
from nvllm.cli.client import build_request
from nvllm.cli.flags import DEFAULT_MAX_TOKENS

CONTEXT = 512   # tiny-qwen2's max_position_embeddings


@pytest.fixture(scope="module")
def daemon(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp("daemon"), tiny_models["tiny-qwen2"])
    yield d
    d.stop()


def request_of(*argv: str):
    return build_request(cli.build_parser().parse_args(["query", *argv]))


def test_the_request_carries_the_default_bound_unless_the_flag_says_otherwise(capsys) -> None:
    assert DEFAULT_MAX_TOKENS == 256   # docs/api.md and the flag's help say 256
    sp = request_of("hi").sampling_params
    assert sp.HasField("max_tokens") and sp.max_tokens == DEFAULT_MAX_TOKENS
    assert request_of("--max-tokens", "1000", "hi").sampling_params.max_tokens == 1000
    assert not request_of("--max-tokens", "0", "hi").sampling_params.HasField("max_tokens")   # the API's unset
    assert request_of("--min-tokens", "300", "hi").sampling_params.max_tokens == 300   # never under --min-tokens
    for command in ("query", "generate"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert f"(default {DEFAULT_MAX_TOKENS}," in " ".join(capsys.readouterr().out.split())


def query(daemon: DaemonProcess, *argv: str) -> tuple[dict, subprocess.CompletedProcess]:
    r = daemon.cli("query", "--json", "--ignore-eos", *argv)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r


def test_the_answer_stops_at_the_default_bound_and_stderr_says_so(daemon: DaemonProcess) -> None:
    got, r = query(daemon, "hello")
    assert (got["finish_reason"], got["usage"]["completion_tokens"]) == ("length", DEFAULT_MAX_TOKENS)
    assert f"stopped at {DEFAULT_MAX_TOKENS} tokens" in r.stderr and "--max-tokens 0" in r.stderr
    plain = daemon.cli("query", "--ignore-eos", "hello")
    assert plain.returncode == 0 and plain.stdout == got["text"] + "\n"   # the note is on stderr alone
    assert f"stopped at {DEFAULT_MAX_TOKENS} tokens" in plain.stderr


def test_an_explicit_max_tokens_is_honoured_past_the_bound(daemon: DaemonProcess) -> None:
    got, r = query(daemon, "--max-tokens", "300", "hello")
    assert (got["finish_reason"], got["usage"]["completion_tokens"]) == ("length", 300)
    assert "stopped at" not in r.stderr
    got, r = query(daemon, "--max-tokens", "0", "hello")
    assert got["usage"]["prompt_tokens"] + got["usage"]["completion_tokens"] == CONTEXT
    assert "stopped at" not in r.stderr


def test_a_prompt_that_leaves_less_room_than_the_bound_gets_what_it_leaves(daemon: DaemonProcess) -> None:
    prompt = "the quick brown fox " * 60
    got, r = query(daemon, prompt)
    n = got["usage"]["prompt_tokens"]
    assert CONTEXT - DEFAULT_MAX_TOKENS < n < CONTEXT, n   # the bound does not fit beside it
    assert (got["finish_reason"], got["usage"]["completion_tokens"]) == ("length", CONTEXT - n)
    assert "stopped at" not in r.stderr
    asked = daemon.cli("query", "--max-tokens", str(DEFAULT_MAX_TOKENS), prompt)   # asked for: held to it
    assert asked.returncode == 1 and "INVALID_ARGUMENT: sampling_params.max_tokens must be at most" in asked.stderr
