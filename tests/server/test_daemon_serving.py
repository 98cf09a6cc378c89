"""End-to-end: the real daemon process on loopback, driven over gRPC, serving.

The daemon runs through the tests' launcher (helpers/daemon_main.py: `nvllm serve`'s daemon and
arguments). One daemon on the tiny Llama serves the generation, refusal and probe tests here (the default
model's test runs its own); test_daemon_lifecycle.py has the ones that need other settings or end the
process. Memory pressure is injected through the launcher's memory file; requests are held in flight by
holding the engine loop still (`stall` until `resume`), never by timing.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from helpers.daemon_util import (
    MAX_MESSAGE_BYTES,
    NUM_BLOCKS,
    PLENTY,
    ROOT,
    DaemonProcess,
    check,
    collect,
    health,
    health_when,
    joined,
    offline_result,
    pages_all_back,
    request,
    wait_for,
)
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory):
    d = DaemonProcess(tmp_path_factory.mktemp("daemon"), tiny)
    yield d
    d.stop()



# -- generation ------------------------------------------------------------------------------
class TestGenerate:
    def test_stream_equals_the_offline_engine_for_the_same_seed(self, daemon: DaemonProcess, offline) -> None:
        params = dict(temperature=0.8, top_p=0.9, seed=1234, max_tokens=24, ignore_eos=True)

        async def go():
            async with grpc.aio.insecure_channel(daemon.address) as ch:
                return await collect(pb_grpc.GeneratorStub(ch), request("The quick brown fox", **params))

        responses = asyncio.run(go())
        want = offline_result(offline, "The quick brown fox", **params)
        text, ids = joined(responses)
        assert ids == want.token_ids and text == want.text
        assert len(responses) > 1                        # streamed as deltas, not one message
        assert all(r.finish_reason == pb.FINISH_REASON_UNSPECIFIED for r in responses[:-1])
        last = responses[-1]
        assert last.finish_reason == pb.FINISH_REASON_LENGTH
        assert last.usage.completion_tokens == 24 and last.usage.prompt_tokens == want.prompt_tokens
        assert last.HasField("time_to_first_token_ms") and last.time_to_first_token_ms > 0
        assert len({r.request_id for r in responses}) == 1 and responses[0].request_id

    def test_chat_and_logprobs_match_the_offline_engine(self, daemon: DaemonProcess, offline) -> None:
        from nvllm import SamplingParams
        messages = [{"role": "user", "content": "Say hello"}]
        req = pb.GenerateRequest(request_id="chat-1", sampling_params=pb.SamplingParams(
            temperature=0, max_tokens=12, logprobs=2, ignore_eos=True))
        for m in messages:
            req.chat.messages.add(**m)
        with grpc.insecure_channel(daemon.address) as ch:
            responses = list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=30))
        want = offline.chat(messages, SamplingParams(temperature=0, max_tokens=12, logprobs=2, ignore_eos=True))[0]
        text, ids = joined(responses)
        assert (text, ids) == (want.text, want.token_ids)
        assert {r.request_id for r in responses} == {"chat-1"}
        lps = [lp for r in responses for lp in r.logprobs]
        assert [lp.token_id for lp in lps] == ids
        assert all(len(lp.top) == 2 and lp.top[0].token for lp in lps)
        assert all(lp.top[0].token_id == lp.token_id for lp in lps)    # greedy: the top one was chosen

    def test_32_concurrent_streams_all_complete(self, daemon: DaemonProcess, offline) -> None:
        async def go():
            async with grpc.aio.insecure_channel(daemon.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                return await asyncio.gather(*[
                    collect(stub, request(f"stream number {i}", seed=i, temperature=1.0, max_tokens=12,
                                          ignore_eos=True)) for i in range(32)])

        results = asyncio.run(go())
        assert len(results) == 32
        for responses in results:
            assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert responses[-1].usage.completion_tokens == 12
        for i in (0, 17, 31):   # batching with 31 others changed nothing
            want = offline_result(offline, f"stream number {i}", seed=i, temperature=1.0, max_tokens=12,
                                  ignore_eos=True)
            assert joined(results[i]) == (want.text, want.token_ids)
        health_when(daemon.address, pages_all_back, "pages to return")

    def test_cancelled_stream_returns_its_pages(self, daemon: DaemonProcess) -> None:
        async def go():
            async with grpc.aio.insecure_channel(daemon.address) as ch:
                call = pb_grpc.GeneratorStub(ch).Generate(request("cancel me", max_tokens=240, ignore_eos=True))
                first = await call.read()
                assert first.token_ids
                during = await pb_grpc.GeneratorStub(ch).Health(pb.HealthRequest())
                call.cancel()
                return during

        during = asyncio.run(go())
        assert during.running + during.waiting >= 1 or during.pages_free + during.pages_cached < during.pages_total
        h = health_when(daemon.address, pages_all_back, "pages to return")
        assert h.pages_free + h.pages_cached == h.pages_total == NUM_BLOCKS

    def test_deadline_aborts_the_request(self, daemon: DaemonProcess) -> None:
        daemon.stall()    # the engine holds still: the request cannot finish by its deadline
        try:
            with grpc.insecure_channel(daemon.address) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    list(pb_grpc.GeneratorStub(ch).Generate(request("too slow", max_tokens=8), timeout=0.5))
        finally:
            daemon.resume()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        health_when(daemon.address, pages_all_back, "the aborted request to leave", timeout=15)
        assert "request aborted" in daemon.log()


# -- refusals ----------------------------------------------------------------------------------
def _no_input() -> pb.GenerateRequest:
    return pb.GenerateRequest(sampling_params=pb.SamplingParams(max_tokens=4))


def _chat_without_role() -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    req.chat.messages.add(role="", content="hi")
    return req


BAD_REQUESTS = {
    "empty prompt": (request(""), "prompt"),
    "no input": (_no_input(), "input"),
    "max_tokens 0": (request(max_tokens=0), "sampling_params.max_tokens"),
    "max_tokens beyond the model": (request(max_tokens=100_000), "sampling_params.max_tokens"),
    "prompt + max_tokens beyond the model": (request(max_tokens=250), "sampling_params.max_tokens"),
    "temperature NaN": (request(temperature=math.nan), "sampling_params.temperature"),
    "temperature negative": (request(temperature=-0.5), "sampling_params.temperature"),
    "top_p 0": (request(top_p=0.0), "sampling_params.top_p"),
    "top_p above 1": (request(top_p=1.5), "sampling_params.top_p"),
    "logprobs above 20": (request(logprobs=21), "sampling_params.logprobs"),
    "too many stop strings": (request(stop=["a", "b", "c", "d", "e"]), "sampling_params.stop"),
    "prompt over max_model_len": (request("hello " * 300, max_tokens=4), "prompt"),
    "message over the size limit": (request("x" * (MAX_MESSAGE_BYTES + 100)), "prompt"),
    "token id out of the vocabulary": (pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=[1, -5])),
                                       "prompt_token_ids"),
    "chat message without a role": (_chat_without_role(), "chat.messages[0].role"),
}


class TestRefusals:
    def test_each_bad_request_is_invalid_argument_naming_the_field_while_others_run(
            self, daemon: DaemonProcess, offline) -> None:
        good = [dict(seed=100 + i, temperature=0.9, max_tokens=40, ignore_eos=True) for i in range(4)]

        async def bad(stub, req):
            try:
                await collect(stub, req, timeout=30)
            except grpc.aio.AioRpcError as e:
                return e.code(), e.details()
            return None, "accepted"

        async def go():
            async with grpc.aio.insecure_channel(daemon.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                running = [asyncio.ensure_future(collect(stub, request("keep going", **p))) for p in good]
                await asyncio.sleep(0)
                refused = await asyncio.gather(*[bad(stub, req) for req, _ in BAD_REQUESTS.values()])
                return refused, await asyncio.gather(*running)

        refused, completed = asyncio.run(go())
        for (name, (_, field)), (code, details) in zip(BAD_REQUESTS.items(), refused):
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {code} {details}"
            assert details.startswith(field), f"{name}: {details!r} does not start with {field!r}"
        for p, responses in zip(good, completed):
            want = offline_result(offline, "keep going", **p)
            assert joined(responses) == (want.text, want.token_ids)
            assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH

    def test_an_unknown_model_is_not_found_naming_the_choices(self, daemon: DaemonProcess) -> None:
        with grpc.insecure_channel(daemon.address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                list(pb_grpc.GeneratorStub(ch).Generate(pb.GenerateRequest(model="gpt-9", prompt="hi"), timeout=10))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert e.value.details() == "the model 'gpt-9' does not exist; this daemon serves 'tiny-llama'"

    def test_messages_say_what_is_allowed(self, daemon: DaemonProcess) -> None:
        with grpc.insecure_channel(daemon.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(request(top_p=1.5), timeout=10))
        assert e.value.details() == "sampling_params.top_p must be a number in (0, 1], got 1.5"

    def test_a_message_past_the_transport_cap_is_refused_by_grpc(self, daemon: DaemonProcess) -> None:
        # Up to twice server.max_message_bytes the servicer names the field (above); beyond, gRPC
        # refuses the message before it is decoded, with its own RESOURCE_EXHAUSTED.
        with grpc.insecure_channel(daemon.address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                list(pb_grpc.GeneratorStub(ch).Generate(request("x" * (3 * MAX_MESSAGE_BYTES)), timeout=10))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    def test_memory_pressure_refuses_then_recovers(self, daemon: DaemonProcess) -> None:
        low, high = 256 << 20, 512 << 20
        assert check(daemon.address, "nvllm.v1.Generator") == health_pb2.HealthCheckResponse.SERVING
        try:
            daemon.set_available(100 << 20)
            h = health_when(daemon.address, lambda h: h.state == h.STATE_NOT_ADMITTING, "NOT_ADMITTING")
            assert "below the low watermark" in h.not_admitting_reason
            assert h.available_memory_bytes == 100 << 20
            assert (h.watchdog_low_bytes, h.watchdog_high_bytes) == (low, high)
            wait_for(lambda: check(daemon.address, "nvllm.v1.Generator") == health_pb2.HealthCheckResponse.NOT_SERVING,
                     "readiness NOT_SERVING")
            assert check(daemon.address, "") == health_pb2.HealthCheckResponse.SERVING   # alive all along
            with grpc.insecure_channel(daemon.address) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    list(pb_grpc.GeneratorStub(ch).Generate(request(max_tokens=4), timeout=10))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "available memory 100 MiB" in e.value.details()
            # Between the watermarks admission stays closed (hysteresis) ...
            daemon.set_available(400 << 20)
            h = health_when(daemon.address, lambda h: h.available_memory_bytes == 400 << 20, "the 400 MiB reading")
            assert h.state == pb.HealthResponse.STATE_NOT_ADMITTING
        finally:
            # ... and above the high one it opens again.
            daemon.set_available(int(PLENTY))
        wait_for(lambda: health(daemon.address).state == pb.HealthResponse.STATE_SERVING, "SERVING again")
        wait_for(lambda: check(daemon.address, "nvllm.v1.Generator") == health_pb2.HealthCheckResponse.SERVING,
                 "readiness SERVING")
        with grpc.insecure_channel(daemon.address) as ch:
            responses = list(pb_grpc.GeneratorStub(ch).Generate(request(max_tokens=4), timeout=10))
        assert responses[-1].usage.completion_tokens == 4


# -- probes and tooling --------------------------------------------------------------------------
class TestProbes:
    def test_health_reports_the_figures(self, daemon: DaemonProcess) -> None:
        h = health(daemon.address)
        assert h.state == pb.HealthResponse.STATE_SERVING and not h.not_admitting_reason
        assert h.model == "tiny-llama" and h.version
        assert h.pages_total == NUM_BLOCKS and 16 <= h.pages_backed <= NUM_BLOCKS   # 16: one max_model_len sequence
        assert health_when(daemon.address, lambda h: h.pages_backed == NUM_BLOCKS, "the whole pool backed")
        assert h.kv_cache_dtype == "f32" and h.page_bytes == 2 * 2 * 16 * 2 * 16 * 4   # the tiny Llama's f32 pool
        assert h.uptime_s >= h.startup_s > 0
        assert h.available_memory_bytes == int(PLENTY)

    def test_the_start_up_log_says_how_many_matmul_threads_compute(self, daemon: DaemonProcess) -> None:
        # the engine's count (it once logged model.threads' 0: the default engine is not the state's yet)
        from nvllm.model.kernels import threads

        line = daemon.wait_line(" matmul thread")
        assert f", {threads.default()} matmul thread" in line and "model.threads = 0: " in line

    def test_standard_health_service(self, daemon: DaemonProcess) -> None:
        assert check(daemon.address, "") == health_pb2.HealthCheckResponse.SERVING
        assert check(daemon.address, "nvllm.v1.Generator") == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            check(daemon.address, "no.such.Service")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND

    def test_reflection_lists_the_services(self, daemon: DaemonProcess) -> None:
        with grpc.insecure_channel(daemon.address) as ch:
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            replies = list(stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
        names = {s.name for s in replies[0].list_services_response.service}
        assert {"nvllm.v1.Generator", "grpc.health.v1.Health"} <= names

    def test_cli_query_and_health(self, daemon: DaemonProcess, offline) -> None:
        # The clients must not pull in the engine: no numpy in the process.
        code = ("import sys, nvllm.cli as c; rc = c.main(sys.argv[1:]); "
                "assert 'numpy' not in sys.modules, 'numpy imported'; sys.exit(rc)")
        run = lambda *a: subprocess.run([sys.executable, "-c", code, *a], cwd=ROOT, capture_output=True,  # noqa: E731
                                        text=True, timeout=60)
        q = run("query", "--target", daemon.address, "--json", "--max-tokens", "10", "--seed", "3",
                "The quick brown fox")
        assert q.returncode == 0, q.stderr
        got = json.loads(q.stdout)
        want = offline_result(offline, "The quick brown fox", temperature=0, max_tokens=10, seed=3)
        assert (got["text"], got["token_ids"]) == (want.text, want.token_ids)
        assert got["finish_reason"] in ("length", "stop")
        assert got["usage"]["completion_tokens"] == len(want.token_ids)
        assert got["time_to_first_token_ms"] > 0

        q = run("query", "--target", daemon.address, "--max-tokens", "10", "The quick brown fox")
        assert q.returncode == 0 and q.stdout == want.text + "\n"

        h = run("health", "--target", daemon.address, "--json")
        assert h.returncode == 0, h.stderr
        assert json.loads(h.stdout)["state"] == "SERVING"

        bad = run("query", "--target", daemon.address, "--top-p", "0", "hi")
        assert bad.returncode == 1 and "INVALID_ARGUMENT: sampling_params.top_p" in bad.stderr

        gone = run("health", "--target", "127.0.0.1:1", "--connect-timeout", "0.5")
        assert gone.returncode == 2 and "no nvllm daemon answers" in gone.stderr

    def test_a_second_daemon_on_the_same_port_refuses_to_start(self, daemon: DaemonProcess, tiny: Path) -> None:
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny),
                            "--listen", daemon.address, "--num-blocks", "16"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        assert f"cannot listen on {daemon.address}" in r.stderr


# -- the default model, on a daemon of its own -----------------------------------------------------
@pytest.mark.smollm2
def test_default_model_answers_like_the_offline_engine(smollm2: Path, tmp_path: Path) -> None:
    from nvllm import LLM, SamplingParams
    d = DaemonProcess(tmp_path, smollm2, num_blocks=64, extra_args=("--max-model-len", "1024"))
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        req = pb.GenerateRequest(sampling_params=pb.SamplingParams(temperature=0, max_tokens=16))
        req.chat.messages.add(**messages[0])
        with grpc.insecure_channel(d.address) as ch:
            responses = list(pb_grpc.GeneratorStub(ch).Generate(req, timeout=120))
        want = LLM(smollm2, num_blocks=64, max_model_len=1024).chat(
            messages, SamplingParams(temperature=0, max_tokens=16))[0]
        assert joined(responses) == (want.text, want.token_ids)
        assert "Paris" in want.text
    finally:
        d.stop()
