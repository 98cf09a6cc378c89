"""Prompts that stay warm, through the real daemon: started with cache.pinned_prompts and cache.persist_dir,
queried, drained (SIGTERM), restarted; the first query after the restart reports at least the pinned
prompt's full pages as cached, on the gRPC API and on the HTTP API, with the tokens of the cold run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from helpers.daemon_util import BASE_CONFIG, DaemonProcess, config_with, health, wait_for
from helpers.warm_cache import SYSTEM, write_prompt
from nvllm.engine.warm.pinned_prompts import read_pinned_prompts
from nvllm.engine.warm.prefix_store import FILE_NAME
from nvllm.text.tokenizer import Tokenizer
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

BLOCK = 16
QUESTIONS = ("What is the battery level?", "How high are we flying?")


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def grpc_chat(address: str, question: str) -> tuple[list[int], pb.Usage]:
    chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages(question)]
    req = pb.GenerateRequest(chat=pb.ChatMessages(messages=chat))
    req.sampling_params.CopyFrom(pb.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    with grpc.insecure_channel(address) as ch:
        out = list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=60))
    return [t for r in out for t in r.token_ids], out[-1].usage


def http_chat(url: str, question: str) -> dict[str, Any]:
    body = {"model": "tiny-llama", "messages": messages(question), "temperature": 0, "max_tokens": 8,
            "ignore_eos": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def warm(tmp: Path, model: Path, config: str, http: bool = True) -> DaemonProcess:
    """A daemon whose warm-up is over: the file read (or found absent) and the prompt pinned."""
    d = DaemonProcess(tmp, model, config, http_listen="127.0.0.1:0" if http else None)
    d.wait_line("pinned prompt ")
    d.wait_line("prefix cache")
    return d


@pytest.fixture(scope="module")
def setup(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("warm-restart")
    prompt = write_prompt(tmp / "system.json", {"messages": [{"role": "system", "content": SYSTEM}]})
    store = tmp / "store"
    config = config_with(BASE_CONFIG, cache__pinned_prompts=[prompt], cache__persist_dir=str(store))
    pinned = read_pinned_prompts([prompt], Tokenizer.from_dir(tiny), 10**6, 4096, BLOCK)[0]
    first = warm(tmp / "first", tiny, config)
    try:
        cold = {q: grpc_chat(first.address, q)[0] for q in QUESTIONS}
    finally:
        rc = first.stop()
    assert rc == 0, first.log()
    first.wait_line("prefix cache: ")
    written = [line for line in first.lines if "written to" in line]
    assert written and str(store / FILE_NAME) in written[0], first.log()
    yield {"tmp": tmp, "config": config, "cold": cold, "pinned_tokens": len(pinned.token_ids), "store": store}


def test_the_drain_wrote_the_cache_atomically(setup):
    names = sorted(p.name for p in setup["store"].iterdir())
    assert names == [FILE_NAME]
    assert setup["pinned_tokens"] >= 3 * BLOCK


def test_after_a_restart_the_first_queries_are_served_from_the_cache(tiny, setup):
    d = warm(setup["tmp"] / "second", tiny, setup["config"])
    try:
        assert any("pages read back" in line for line in d.lines), d.log()
        assert any("all from the persisted cache" in line for line in d.lines), d.log()
        ids, usage = grpc_chat(d.address, QUESTIONS[0])
        assert usage.cached_tokens >= setup["pinned_tokens"]
        assert ids == setup["cold"][QUESTIONS[0]]
        body = http_chat(d.http_url, QUESTIONS[1])
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= setup["pinned_tokens"]
        # The pinned pages are held: after the requests, all but them are free or cached.
        pinned_pages = setup["pinned_tokens"] // BLOCK
        h = wait_for(lambda: (lambda h: h if h.running == 0 and h.pages_free + h.pages_cached ==
                              h.pages_total - pinned_pages else None)(health(d.address)), "pages back")
        assert h.pages_total - h.pages_free - h.pages_cached == pinned_pages
    finally:
        assert d.stop() == 0, d.log()


def test_readiness_does_not_wait_and_a_damaged_file_is_one_line(tiny, setup):
    path = setup["store"] / FILE_NAME
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    d = DaemonProcess(setup["tmp"] / "third", tiny, setup["config"])
    try:
        line = d.wait_line(" ignored: ")
        assert "digest mismatch" in line
        d.wait_line("pinned prompt ")
        ids, usage = grpc_chat(d.address, QUESTIONS[0])
        assert ids == setup["cold"][QUESTIONS[0]] and usage.cached_tokens >= setup["pinned_tokens"]
    finally:
        assert d.stop() == 0, d.log()
