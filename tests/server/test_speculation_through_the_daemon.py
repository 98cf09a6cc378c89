"""Speculative decoding through the daemon: with [speculative] method = "ngram", a repeating prompt's
greedy answer over gRPC and over HTTP is the offline engine's without speculation, token for token; a
request that opts out (disable_speculation) gets it too; /metrics carries vLLM's proposal counters and
the acceptance rate by method; a bad disable_speculation is refused naming the field. The same with
method = "draft", the served model drafting for itself."""
from __future__ import annotations

import grpc
import httpx2 as httpx
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, NUM_BLOCKS, DaemonProcess, config_with
from nvllm import LLM, SamplingParams
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

IDS = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [5, 6, 7]
TOKENS = 40
# Every proposal verified (adaptive off), so that the counters move whatever this machine's step costs are.
SPECULATING = config_with(BASE_CONFIG, speculative__method="ngram", speculative__num_tokens=3,
                          speculative__adaptive=False)


def grpc_tokens(address: str, **sampling) -> list[int]:
    req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=IDS), sampling_params=pb.SamplingParams(
        temperature=0, max_tokens=TOKENS, ignore_eos=True, **sampling))
    with grpc.insecure_channel(address) as channel:
        return [t for r in pb_grpc.GeneratorStub(channel).Generate(req, timeout=60) for t in r.token_ids]


def metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def unspeculated(model):
    """The offline engine's greedy answer to IDS, without speculation."""
    return LLM(model, num_blocks=NUM_BLOCKS).generate(
        [{"prompt_token_ids": IDS}], SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True))[0]


def assert_http_answer(url: str, want) -> None:
    r = httpx.post(url + "/v1/completions", timeout=60, json={
        "prompt": IDS, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == want.text and r.json()["usage"]["completion_tokens"] == TOKENS


def test_speculating_daemon_answers_as_the_engine_without_it_over_both_apis(tiny, tmp_path) -> None:
    want = unspeculated(tiny)
    daemon = DaemonProcess(tmp_path, tiny, config=SPECULATING, http_listen="127.0.0.1:0")
    try:
        assert grpc_tokens(daemon.address) == want.token_ids
        assert grpc_tokens(daemon.address, disable_speculation=True) == want.token_ids
        assert_http_answer(daemon.http_url, want)

        m = metrics(daemon.http_url)
        drafts = m[("vllm:spec_decode_num_draft_tokens_total", ())]
        accepted = m[("vllm:spec_decode_num_accepted_tokens_total", ())]
        assert m[("vllm:spec_decode_num_drafts_total", ())] > 0 and drafts >= accepted > 0
        per_pos = [m[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
                   for i in range(3)]
        assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
        assert m[("nvllm:spec_decode_acceptance_rate", (("method", "ngram"),))] == accepted / drafts

        for bad in ("yes", 1, [True]):
            r = httpx.post(daemon.http_url + "/v1/completions", timeout=30,
                           json={"prompt": "Hi", "max_tokens": 2, "disable_speculation": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "disable_speculation", r.text
    finally:
        assert daemon.stop() == 0, daemon.log()


def test_a_daemon_that_does_not_speculate_reports_no_proposal_counters(tiny, tmp_path) -> None:
    daemon = DaemonProcess(tmp_path, tiny, http_listen="127.0.0.1:0")
    try:
        grpc_tokens(daemon.address)
        assert not [k for k in metrics(daemon.http_url) if k[0].startswith(("vllm:spec_", "nvllm:spec_"))]
    finally:
        assert daemon.stop() == 0, daemon.log()


def test_a_daemon_with_a_draft_model_answers_as_the_engine_without_it(tiny, tmp_path) -> None:
    want = unspeculated(tiny)
    config = config_with(BASE_CONFIG, speculative__method="draft", speculative__draft_model=str(tiny),
                         speculative__num_tokens=3, speculative__adaptive=False)
    daemon = DaemonProcess(tmp_path, tiny, config=config, http_listen="127.0.0.1:0")
    try:
        assert grpc_tokens(daemon.address) == want.token_ids
        assert_http_answer(daemon.http_url, want)
        m = metrics(daemon.http_url)
        drafts = m[("vllm:spec_decode_num_draft_tokens_total", ())]
        assert drafts > 0 and m[("vllm:spec_decode_num_accepted_tokens_total", ())] == drafts   # itself: all
        assert m[("nvllm:spec_decode_acceptance_rate", (("method", "draft"),))] == 1.0
    finally:
        assert daemon.stop() == 0, daemon.log()
