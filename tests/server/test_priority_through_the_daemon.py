"""Request priority through the daemon, over gRPC (GenerateRequest.priority) and HTTP (the body's
`priority`, vLLM's field): with one seat taken by a long low-priority stream, an urgent request of each
API finishes while that stream still runs, and the stream then ends as the offline engine would have
given it (preempted by recompute, nothing lost). A bad priority is refused naming the field."""
from __future__ import annotations

import threading
import time

import grpc
import httpx2 as httpx

from helpers.daemon_util import NUM_BLOCKS, DaemonProcess
from nvllm import LLM, SamplingParams
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

LOW_IDS = list(range(11, 23))
LOW_TOKENS = 200


def test_urgent_requests_overtake_a_running_stream_over_both_apis(tiny, tmp_path) -> None:
    want = LLM(tiny, num_blocks=NUM_BLOCKS).generate(
        [{"prompt_token_ids": LOW_IDS}], SamplingParams(temperature=0, max_tokens=LOW_TOKENS, ignore_eos=True))[0]
    daemon = DaemonProcess(tmp_path, tiny, extra_args=("--max-num-seqs", "1"), http_listen="127.0.0.1:0")
    try:
        low_tokens: list[int] = []
        low_done: list[float] = []
        started = threading.Event()

        def run_low() -> None:
            req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=LOW_IDS), priority=5,
                                     sampling_params=pb.SamplingParams(temperature=0, max_tokens=LOW_TOKENS,
                                                                       ignore_eos=True))
            with grpc.insecure_channel(daemon.address) as channel:
                for r in pb_grpc.GeneratorStub(channel).Generate(req, timeout=120):
                    low_tokens.extend(r.token_ids)
                    started.set()
            low_done.append(time.monotonic())

        low = threading.Thread(target=run_low)
        low.start()
        assert started.wait(60)
        # both urgent requests at once, while the low stream holds the only seat
        done: dict[str, float] = {}
        grpc_answer: list[pb.GenerateResponse] = []
        http_answer: list[httpx.Response] = []

        def run_grpc() -> None:
            urgent = pb.GenerateRequest(prompt="Status?", priority=-1, sampling_params=pb.SamplingParams(
                temperature=0, max_tokens=4, ignore_eos=True))
            with grpc.insecure_channel(daemon.address) as channel:
                grpc_answer.extend(pb_grpc.GeneratorStub(channel).Generate(urgent, timeout=60))
            done["grpc"] = time.monotonic()

        def run_http() -> None:
            http_answer.append(httpx.post(daemon.http_url + "/v1/completions", timeout=60, json={
                "prompt": "Status?", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "priority": -1}))
            done["http"] = time.monotonic()

        urgent = [threading.Thread(target=f) for f in (run_grpc, run_http)]
        for t in urgent:
            t.start()
        for t in urgent:
            t.join(60)
        low.join(120)
        assert sum(len(a.token_ids) for a in grpc_answer) == 4
        r = http_answer[0]
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert low_done and done["grpc"] < low_done[0] and done["http"] < low_done[0]
        assert low_tokens == want.token_ids

        for bad in ("high", 1.5, 2**40):
            r = httpx.post(daemon.http_url + "/v1/completions", timeout=30,
                           json={"prompt": "Hi", "max_tokens": 2, "priority": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    finally:
        assert daemon.stop() == 0, daemon.log()
