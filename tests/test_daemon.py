"""End-to-end: the real daemon process on loopback, driven over gRPC.

The daemon runs through the tests' launcher (daemon_main.py: `nvllm serve`'s daemon and arguments).
One daemon on the tiny Llama serves most tests; the queue bound, the drain on SIGTERM and the
second-signal exit each get their own (they need other settings, or end the process). Memory
pressure is injected through the launcher's memory file; requests are held in flight by holding the
engine loop still (`stall` until `resume`), never by timing.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

from daemon_util import (BASE_CONFIG, MAX_MESSAGE_BYTES, NUM_BLOCKS, PLENTY, ROOT, DaemonProcess, NotifySocket,
                         check, collect, health, health_when, joined, offline_result, pages_all_back,
                         pings_while_stalled, read_rest, request, wait_for)


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
        for i, responses in enumerate(results):
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
    "unknown model": (pb.GenerateRequest(model="gpt-9", prompt="hi"), "model"),
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
        assert h.pages_total == NUM_BLOCKS
        assert h.uptime_s >= h.startup_s > 0
        assert h.available_memory_bytes == int(PLENTY)

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


class TestStartup:
    def test_pool_too_small_stops_startup_with_exit_code_2(self, tiny: Path) -> None:
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny),
                            "--listen", "127.0.0.1:0", "--num-blocks", "2", "--max-model-len", "256"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert "raise cache.num_blocks to 16" in r.stderr

    def test_dry_run_prints_the_sizing_and_exits(self, tiny: Path) -> None:
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny), "--dry-run",
                            "--num-blocks", "64"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "KV page pool: 64 blocks x 16 tokens = 1024 tokens" in r.stdout
        assert "weights:" in r.stdout and "startup:" in r.stdout


# -- daemons of their own -----------------------------------------------------------------------
def test_queue_bound_refuses_the_excess(tiny: Path, tmp_path: Path) -> None:
    config = BASE_CONFIG.replace("max_num_seqs = 16", "max_num_seqs = 1").replace("max_waiting = 64", "max_waiting = 2")
    d = DaemonProcess(tmp_path, tiny, config)
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                first = stub.Generate(request("first", max_tokens=30, ignore_eos=True))
                head = await first.read()                       # running: it holds the one seat
                d.stall()                                       # nothing moves until resume()
                queued = [asyncio.ensure_future(collect(stub, request(f"queued {i}", max_tokens=8, ignore_eos=True)))
                          for i in range(2)]
                while (await stub.Health(pb.HealthRequest())).waiting < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await collect(stub, request("one too many", max_tokens=8))
                d.resume()
                rest = await read_rest(first)
                return e.value, [head] + rest, await asyncio.gather(*queued)

        err, first, queued = asyncio.run(go())
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.details() == "queue full: 2 waiting, limit 2"
        assert first[-1].usage.completion_tokens == 30
        assert [q[-1].usage.completion_tokens for q in queued] == [8, 8]
    finally:
        d.stop()


def test_sigterm_drains_running_streams_and_exits_0(tiny: Path, tmp_path: Path) -> None:
    sock = tmp_path / "nvllm.sock"
    d = DaemonProcess(tmp_path, tiny, BASE_CONFIG, listen=f"unix:{sock}")
    assert d.address == f"unix:{sock}"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o660
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                calls = [stub.Generate(request(f"drain {i}", max_tokens=40, ignore_eos=True)) for i in range(8)]
                heads = [await c.read() for c in calls]          # all 8 running
                d.stall()                                        # hold them in flight
                d.proc.send_signal(signal.SIGTERM)
                while (await stub.Health(pb.HealthRequest())).state != pb.HealthResponse.STATE_DRAINING:
                    await asyncio.sleep(0.01)
                ready = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service="nvllm.v1.Generator"))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await collect(stub, request("too late", max_tokens=4))
                d.resume()
                tails = [await read_rest(c) for c in calls]
                return ready.status, refused.value, [[h] + t for h, t in zip(heads, tails)]

        ready, refused, streams = asyncio.run(go())
        assert ready == health_pb2.HealthCheckResponse.NOT_SERVING
        assert refused.code() == grpc.StatusCode.UNAVAILABLE and "draining" in refused.details()
        assert len(streams) == 8
        for s in streams:
            assert s[-1].finish_reason == pb.FINISH_REASON_LENGTH and s[-1].usage.completion_tokens == 40
        assert d.wait() == 0, d.log()
    finally:
        d.stop()


def test_drain_grace_aborts_what_is_left_and_a_second_signal_exits_at_once(tiny: Path, tmp_path: Path) -> None:
    config = BASE_CONFIG.replace("drain_grace_s = 30.0", "drain_grace_s = 0.5")
    d = DaemonProcess(tmp_path / "a", tiny, config)
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                call = pb_grpc.GeneratorStub(ch).Generate(request("long", max_tokens=200, ignore_eos=True))
                head = await call.read()
                d.stall()                                        # held past the 0.5 s grace
                start = len(d.lines)
                d.proc.send_signal(signal.SIGTERM)
                d.wait_line("drain grace 0.5 s elapsed", start)
                d.resume()                                       # the engine thread can stop now
                return [head] + await read_rest(call)

        responses = asyncio.run(go())
        assert responses[-1].finish_reason == pb.FINISH_REASON_ABORT
        assert responses[-1].usage.completion_tokens < 200
        assert d.wait() == 0, d.log()
        assert "aborting 1 requests" in d.log()
    finally:
        d.stop()

    d = DaemonProcess(tmp_path / "b", tiny, BASE_CONFIG)
    try:
        with grpc.insecure_channel(d.address) as ch:
            call = pb_grpc.GeneratorStub(ch).Generate(request("long", max_tokens=200, ignore_eos=True))
            next(call)
            d.stall()                                            # the drain cannot end by itself
            start = len(d.lines)
            d.proc.send_signal(signal.SIGTERM)
            d.wait_line("draining", start)
            d.proc.send_signal(signal.SIGTERM)
            assert d.wait(timeout=5) == 1
            call.cancel()
    finally:
        d.stop()


def test_systemd_notify_ready_watchdog_and_stopping(tiny: Path, tmp_path: Path) -> None:
    """READY=1 once the port answers; WATCHDOG=1 while the engine loops, none while it is held still;
    STOPPING=1 on SIGTERM. Against a real unix datagram socket as NOTIFY_SOCKET."""
    notify = NotifySocket(tmp_path / "notify.sock")
    # WatchdogSec=1 s: pings every 0.5 s, the engine heartbeat every 0.25 s.
    d = DaemonProcess(tmp_path / "d", tiny, extra_env=notify.env(1.0))
    try:
        wait_for(lambda: notify.has("READY=1"), "READY=1")
        ready = [m for _, m in notify.got if "READY=1" in m.split("\n")]
        assert len(ready) == 1 and "STATUS=tiny-llama: 0 running" in ready[0]
        assert health(d.address).state == pb.HealthResponse.STATE_SERVING   # bound before READY
        wait_for(lambda: len(notify.ping_times()) >= 2, "watchdog pings while idle")
        assert pings_while_stalled(d, notify, window_s=1.0) == []        # two ticks held: no ping
        assert d.stop() == 0, d.log()
        wait_for(lambda: notify.has("STOPPING=1"), "STOPPING=1")    # sent before the exit, read by a thread
    finally:
        d.stop()
        notify.close()


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
        want = LLM(smollm2, num_blocks=64, max_model_len=1024).chat(messages, SamplingParams(temperature=0, max_tokens=16))[0]
        assert joined(responses) == (want.text, want.token_ids)
        assert "Paris" in want.text
    finally:
        d.stop()
