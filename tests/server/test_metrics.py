"""Prometheus metrics: every metric moves when what it counts happens, and /metrics parses.

The engine's metrics (pool, prefix cache, preemptions, queue, steps, admission) are read from the real
engine run by a real AsyncEngine and DaemonState in process; the front doors' (latencies, tokens,
finish reasons, refusals by API, the memory reading, draining) from the live daemon, driven over gRPC
and HTTP and scraped on its metrics-only listener and on the HTTP API's /metrics. Everything is read
with prometheus_client's own parser.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1._async import HealthServicer
from prometheus_client.parser import text_string_to_metric_families

from helpers.daemon_util import BASE_CONFIG, PLENTY, DaemonProcess, collect, config_with, request, wait_for
from nvllm import LLM, SamplingParams
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.listen import ListenError
from nvllm.server.metrics import ADMISSION_STATES, Metrics
from nvllm.server.metrics_listener import MetricsListener
from nvllm.server.state import DaemonState
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

MODEL = "tiny-llama"
METRICS_ONLY = config_with(BASE_CONFIG, metrics__listen="127.0.0.1:0")
# config_with matches keys across sections, so the second listen is written out.
BOTH_LISTENERS = METRICS_ONLY + '[http]\nlisten = "127.0.0.1:0"\n'
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str, model: str = MODEL) -> Samples:
    """Every sample of an exposition, keyed by (name, labels other than model_name); each of nvllm's
    and vLLM's series must carry model_name."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(("vllm:", "nvllm:")):
                assert s.labels.get("model_name") == model, s
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[s.name, labels] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def local(metrics: Metrics) -> Samples:
    body, content_type = metrics.exposition()
    assert content_type.startswith("text/plain")
    return parse(body.decode())


def new_state(name: str = MODEL) -> DaemonState:
    return DaemonState(name, HealthServicer(), max_waiting=64, max_num_seqs=32, max_message_bytes=1 << 20)


async def run_requests(ae: AsyncEngine, batch: list, params: SamplingParams) -> list:
    """Every prompt through the async engine at once."""
    streams = [ae.add(ae.prepare(f"r{i}", p, params)) for i, p in enumerate(batch)]

    async def drain(stream):
        return [out async for out in stream]
    return await asyncio.gather(*(drain(s) for s in streams))


def prompts(n: int, length: int) -> list[dict[str, Any]]:
    return [{"prompt_token_ids": [(7 * i + 3 * j) % 400 + 3 for j in range(length)]} for i in range(n)]


# -- the engine's metrics, in process ---------------------------------------------------------------
class TestEngineMetrics:
    def test_queue_pool_steps_and_preemption_move(self, tiny: Path) -> None:
        # 24 pages of 16 tokens for 12 requests growing to 60 tokens each: the pool runs out and the
        # newest requests are preempted (as in test_engine.py).
        llm = LLM(tiny, num_blocks=24, max_num_seqs=32, enable_prefix_caching=False)
        state = new_state()
        seen: dict[str, Samples] = {}

        def on_step(seconds: float, tokens: int) -> None:
            state.metrics.observe_step(seconds, tokens)
            # Read on the engine thread after the first step: from the event loop, a loaded machine can let
            # the engine finish every request before the first output is looked at.
            seen.setdefault("busy", local(state.metrics))

        async def main() -> None:
            ae = AsyncEngine(llm.engine, on_step=on_step)
            ae.start()
            await state.set_ready(ae, None)
            seen["idle"] = local(state.metrics)
            await run_requests(ae, prompts(12, 20), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
            seen["after"] = local(state.metrics)
            ae.shutdown()
            seen["stopped"] = local(state.metrics)

        asyncio.run(main())
        idle, busy, after, stopped = seen["idle"], seen["busy"], seen["after"], seen["stopped"]
        assert value(idle, "vllm:num_requests_running") == 0 and value(idle, "vllm:kv_cache_usage_perc") == 0
        # Total and backed (16 pages, one 256-token sequence, at once, the rest after); only backed ones are free.
        backed, total = (value(idle, "nvllm:kv_cache_pool_pages", size=k) for k in ("backed", "total"))
        assert total == 24 and 16 <= backed == value(idle, "nvllm:kv_cache_pages", state="free") <= 24
        # the tiny Llama's folder is float32: so is its pool (cache.dtype auto)
        assert value(idle, "vllm:cache_config_info", block_size="16", cache_dtype="f32", num_gpu_blocks="24") == 1
        assert value(idle, "nvllm:kv_cache_page_bytes") == 2 * 2 * 16 * 2 * 16 * 4   # layers, K/V, tokens, heads, hd
        # After the first step the batch holds pages and runs.
        assert value(busy, "vllm:num_requests_running") > 0
        assert 0 < value(busy, "vllm:kv_cache_usage_perc") <= 1
        assert value(busy, "nvllm:kv_cache_pages", state="used") > 0
        assert value(after, "vllm:num_preemptions_total") > 0
        assert value(idle, "vllm:num_preemptions_total") == 0
        steps = value(after, "nvllm:engine_step_seconds_count")
        assert steps >= 40 and value(after, "nvllm:engine_step_seconds_sum") > 0
        assert value(after, "vllm:iteration_tokens_total_count") == steps
        assert value(after, "vllm:iteration_tokens_total_sum") >= 12 * (20 + 40 - 1)
        assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0
        assert value(after, "nvllm:generation_tokens_per_second") > 0
        assert value(after, "nvllm:admission_open") == 1
        assert value(stopped, "nvllm:admission_open") == 0
        assert value(stopped, "nvllm:admission_state", state="engine_stopped") == 1
        s = llm.stats()   # the engine's own counters behind them
        assert s["step_seconds_total"] == pytest.approx(value(after, "nvllm:engine_step_seconds_sum"))
        assert s["preemptions"] == value(after, "vllm:num_preemptions_total")

    def test_a_failing_step_observer_does_not_stop_the_engine(self, tiny: Path) -> None:
        llm = LLM(tiny, num_blocks=64)
        calls: list[float] = []

        def broken(seconds: float, tokens: int) -> None:
            calls.append(seconds)
            raise RuntimeError("observer fault")

        async def main() -> list:
            ae = AsyncEngine(llm.engine, on_step=broken)
            ae.start()
            try:
                return await run_requests(ae, prompts(2, 8), SamplingParams(max_tokens=5, ignore_eos=True))
            finally:
                ae.shutdown()

        outs = asyncio.run(main())
        assert [o[-1].finish_reason for o in outs] == ["length", "length"] and len(calls) >= 5

    def test_waiting_counts_requests_not_yet_seated(self, tiny: Path) -> None:
        llm = LLM(tiny, num_blocks=64, max_num_seqs=2)
        state = new_state()
        seen: list[float] = []

        async def main() -> None:
            ae = AsyncEngine(llm.engine)
            ae.start()
            await state.set_ready(ae, None)
            # Two seats for six long requests: four wait (the snapshot counts adds not yet taken, too).
            pending = [ae.prepare(f"w{i}", p, SamplingParams(max_tokens=200, ignore_eos=True))
                       for i, p in enumerate(prompts(6, 8))]
            streams = [ae.add(p) for p in pending]
            seen.append(value(local(state.metrics), "vllm:num_requests_waiting"))
            for s in streams:
                s.close()    # aborts them
            deadline = asyncio.get_running_loop().time() + 10
            while ae.num_streams and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            seen.append(value(local(state.metrics), "vllm:num_requests_waiting"))
            ae.shutdown()

        asyncio.run(main())
        assert seen[0] >= 4 and seen[1] == 0

    def test_prefix_cache_queries_and_hits_move(self, tiny: Path) -> None:
        llm = LLM(tiny, num_blocks=64, max_num_seqs=4)
        state = new_state()
        seen: list[Samples] = []
        shared = prompts(1, 64)

        async def main() -> None:
            ae = AsyncEngine(llm.engine)
            ae.start()
            await state.set_ready(ae, None)
            for _ in range(2):   # the second run finds the first one's 4 full blocks cached
                await run_requests(ae, shared, SamplingParams(temperature=0, max_tokens=2))
                seen.append(local(state.metrics))
            ae.shutdown()

        asyncio.run(main())
        first, second = seen
        assert value(first, "vllm:prefix_cache_queries_total") == 64
        assert value(first, "vllm:prefix_cache_hits_total") == 0
        assert value(second, "vllm:prefix_cache_queries_total") == 128
        assert value(second, "vllm:prefix_cache_hits_total") == 48    # 3 full blocks; the last is recomputed
        assert value(second, "nvllm:prefix_cache_hit_rate") == pytest.approx(48 / 128)
        assert value(second, "nvllm:kv_cache_pages", state="cached") > 0

    def test_starting_state_has_no_engine_series(self) -> None:
        samples = local(new_state().metrics)
        assert value(samples, "nvllm:admission_open") == 0
        assert {s: value(samples, "nvllm:admission_state", state=s) for s in ADMISSION_STATES} == \
            {s: float(s == "starting") for s in ADMISSION_STATES}
        assert not any(name == "vllm:num_requests_running" for name, _ in samples)
        assert value(samples, "process_resident_memory_bytes") > 0


# -- the tracker and the exposition, without a daemon -------------------------------------------
class TestTracker:
    def test_refusals_and_apis_are_checked(self) -> None:
        m = Metrics(MODEL)
        with pytest.raises(ValueError, match="api must be one of grpc, http"):
            m.request("rest")
        track = m.request("http")
        with pytest.raises(ValueError, match="reason must be one of invalid, busy, unavailable"):
            track.refused("full")
        track.refused("busy")
        track.refused("invalid")             # counted once
        track.close()                        # never admitted: no finish reason
        s = local(m)
        assert value(s, "nvllm:requests_refused_total", api="http", reason="busy") == 1
        assert value(s, "nvllm:requests_refused_total", api="http", reason="invalid") == 0
        assert sum(value(s, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length", "abort")) == 0

    def test_the_listener_serves_text_format_whatever_is_asked(self) -> None:
        # Prometheus 3 asks for OpenMetrics first; prometheus_client would then write vllm_* samples
        # under vllm:* headers. The text format keeps the names dashboards query.
        m = Metrics(MODEL)
        m.observe_step(0.02, 7)
        listener = MetricsListener("127.0.0.1:0", m.exposition)
        address = listener.start()
        try:
            accept = "application/openmetrics-text;version=1.0.0;q=0.6,text/plain;version=0.0.4;q=0.3"
            req = urllib.request.Request(f"http://{address}/metrics", headers={"Accept": accept})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
                body = r.read().decode()
            assert value(parse(body), "nvllm:engine_step_seconds_count") == 1
            assert value(parse(body), "vllm:iteration_tokens_total_sum") == 7
            assert "nvllm_engine_step" not in body and "vllm_iteration" not in body
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{address}/elsewhere", timeout=10)
            assert e.value.code == 404
        finally:
            listener.stop()
            listener.stop()
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{address}/metrics", timeout=10)

    def test_listener_errors_name_the_setting(self) -> None:
        m = Metrics(MODEL)
        with pytest.raises(ListenError, match=r"metrics.listen must be host:port") as bad:
            MetricsListener("9400", m.exposition)
        assert bad.value.code == 2
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(ListenError, match="metrics.listen") as busy:
                MetricsListener(f"127.0.0.1:{port}", m.exposition).start()
            assert busy.value.code == 1


# -- the front door's metrics, on the live daemon --------------------------------------------------
class MetricsDaemon(DaemonProcess):
    """A DaemonProcess with the addresses its log gives for the metrics-only listener and the HTTP API."""

    metrics_address = ""
    http_address = ""


def logged_address(pattern: str, line: str) -> str:
    m = re.search(pattern, line)
    assert m is not None, line
    return m.group(1)


@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsDaemon]:
    """The daemon with its metrics-only listener and the HTTP API both on (each serves /metrics)."""
    d = MetricsDaemon(tmp_path_factory.mktemp("metrics"), tiny,
                      config=BOTH_LISTENERS)
    d.metrics_address = logged_address(r"metrics on http://(\S+)/metrics", d.wait_line("metrics on http://"))
    d.http_address = logged_address(r"HTTP API \(OpenAI-compatible\) on http://(\S+)", d.wait_line("HTTP API"))
    yield d
    d.stop()


def scrape(d: MetricsDaemon, address: str | None = None) -> Samples:
    """The daemon's metrics, from its metrics-only listener (or the HTTP API at `address`)."""
    with urllib.request.urlopen(f"http://{address or d.metrics_address}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return parse(r.read().decode(), model=MODEL)


def grpc_requests(d: DaemonProcess, *reqs: pb.GenerateRequest) -> list[list[pb.GenerateResponse]]:
    async def go():
        async with grpc.aio.insecure_channel(d.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            return [await collect(stub, r) for r in reqs]
    return asyncio.run(go())


class TestDaemonMetrics:
    def test_requests_tokens_latencies_and_finish_reasons_move(self, daemon: MetricsDaemon) -> None:
        before = scrape(daemon)
        [length] = grpc_requests(daemon, request("The quick brown fox", temperature=0, max_tokens=8, ignore_eos=True))
        ids = [t for r in length for t in r.token_ids]
        [stop] = grpc_requests(daemon, request("The quick brown fox", temperature=0, max_tokens=8,
                                               stop_token_ids=[ids[3]]))
        assert stop[-1].finish_reason == pb.FINISH_REASON_STOP
        after = scrape(daemon)

        def moved(name: str, **labels: str) -> float:
            return value(after, name, **labels) - value(before, name, **labels)

        n_stop = len([t for r in stop for t in r.token_ids])
        prompt = length[-1].usage.prompt_tokens
        assert moved("nvllm:requests_total", api="grpc") == 2
        assert moved("nvllm:requests_total", api="http") == 0
        assert moved("vllm:request_success_total", finished_reason="length") == 1
        assert moved("vllm:request_success_total", finished_reason="stop") == 1
        assert moved("vllm:prompt_tokens_total") == 2 * prompt
        assert moved("vllm:generation_tokens_total") == 8 + n_stop
        assert moved("vllm:time_to_first_token_seconds_count") == 2
        assert moved("vllm:time_to_first_token_seconds_sum") > 0
        names = ("vllm:request_queue_time", "vllm:request_prefill_time", "nvllm:request_first_decode")
        assert [moved(f"{n}_seconds_count") for n in names] == [2, 2, 2]   # the first token's parts, then decode
        q, p, f = (moved(f"{n}_seconds_sum") for n in names)
        assert 0 < p <= q + p < moved("vllm:time_to_first_token_seconds_sum") and f > 0
        assert moved("vllm:inter_token_latency_seconds_count") == (8 - 1) + (n_stop - 1)
        assert moved("vllm:e2e_request_latency_seconds_count") == 2
        assert moved("vllm:e2e_request_latency_seconds_sum") >= moved("vllm:time_to_first_token_seconds_sum")
        assert moved("vllm:request_prompt_tokens_sum") == 2 * prompt
        assert moved("vllm:request_generation_tokens_sum") == 8 + n_stop
        assert moved("nvllm:engine_step_seconds_count") >= 8 + n_stop
        assert value(after, "process_resident_memory_bytes") > 0

    def test_a_client_that_leaves_counts_as_abort(self, daemon: MetricsDaemon) -> None:
        before = scrape(daemon)

        async def leave_after_first() -> None:
            async with grpc.aio.insecure_channel(daemon.address) as ch:
                call = pb_grpc.GeneratorStub(ch).Generate(request(max_tokens=200, ignore_eos=True), timeout=60)
                await call.read()
                call.cancel()

        asyncio.run(leave_after_first())

        def aborted():
            s = scrape(daemon)
            return s if value(s, "vllm:request_success_total", finished_reason="abort") > \
                value(before, "vllm:request_success_total", finished_reason="abort") else None
        after = wait_for(aborted, "the abort to be counted")
        assert value(after, "vllm:e2e_request_latency_seconds_count") == \
            value(before, "vllm:e2e_request_latency_seconds_count") + 1
        assert value(after, "vllm:time_to_first_token_seconds_count") == \
            value(before, "vllm:time_to_first_token_seconds_count") + 1

    def test_invalid_requests_count_as_refused(self, daemon: MetricsDaemon) -> None:
        before = scrape(daemon)
        with pytest.raises(grpc.RpcError) as e:
            grpc_requests(daemon, request("hi", temperature=-1.0))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        after = scrape(daemon)
        assert value(after, "nvllm:requests_refused_total", api="grpc", reason="invalid") == \
            value(before, "nvllm:requests_refused_total", api="grpc", reason="invalid") + 1
        assert value(after, "nvllm:requests_total", api="grpc") == value(before, "nvllm:requests_total", api="grpc")

    def test_memory_reading_and_admission_follow_the_watchdog(self, daemon: MetricsDaemon) -> None:
        low = 256 << 20
        assert value(scrape(daemon), "nvllm:memory_low_watermark_bytes") == low
        assert value(scrape(daemon), "nvllm:memory_high_watermark_bytes") == 512 << 20
        daemon.set_available(3 << 30)
        wait_for(lambda: value(scrape(daemon), "nvllm:memory_available_bytes") == 3 << 30, "the new reading")
        before = scrape(daemon)
        assert value(before, "nvllm:admission_open") == 1
        daemon.set_available(low - 1)
        try:
            pressed = wait_for(lambda: (s := scrape(daemon)) and value(s, "nvllm:admission_open") == 0 and s,
                               "admission to close")
            assert value(pressed, "nvllm:memory_available_bytes") == low - 1
            assert value(pressed, "nvllm:admission_state", state="memory_pressure") == 1
            assert value(pressed, "nvllm:admission_state", state="serving") == 0
            with pytest.raises(grpc.RpcError) as e:
                grpc_requests(daemon, request(max_tokens=4))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert value(scrape(daemon), "nvllm:requests_refused_total", api="grpc", reason="busy") == \
                value(before, "nvllm:requests_refused_total", api="grpc", reason="busy") + 1
        finally:
            daemon.set_available(int(PLENTY))
        wait_for(lambda: value(scrape(daemon), "nvllm:admission_open") == 1, "admission to reopen")

    def test_draining_shows_in_admission_state(self, tiny: Path, tmp_path: Path) -> None:
        d = MetricsDaemon(tmp_path, tiny, config=METRICS_ONLY)
        try:
            d.metrics_address = logged_address(r"metrics on http://(\S+)/metrics", d.wait_line("metrics on"))
            d.stall()        # a request stays in flight, so the drain waits for it
            with grpc.insecure_channel(d.address) as ch:
                call = pb_grpc.GeneratorStub(ch).Generate(request(max_tokens=4, ignore_eos=True), timeout=60)
                wait_for(lambda: value(scrape(d), "vllm:num_requests_waiting") == 1, "the request to queue")
                d.proc.send_signal(signal.SIGTERM)
                wait_for(lambda: value(scrape(d), "nvllm:admission_state", state="draining") == 1, "draining")
                assert value(scrape(d), "nvllm:admission_open") == 0
                d.resume()
                assert list(call)[-1].finish_reason == pb.FINISH_REASON_LENGTH
            assert d.wait() == 0
        finally:
            d.stop()

    def test_the_http_api_serves_the_same_metrics_and_counts_its_requests(self, daemon: MetricsDaemon) -> None:
        http = daemon.http_address

        def moved_by(call) -> Samples:
            before = scrape(daemon, http)
            call()
            after = scrape(daemon, http)
            return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

        def complete() -> None:
            body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0}).encode()
            req = urllib.request.Request(f"http://{http}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.load(r)["choices"][0]["finish_reason"] in ("stop", "length")

        moved = moved_by(complete)
        assert value(moved, "nvllm:requests_total", api="http") == 1
        assert value(moved, "nvllm:requests_total", api="grpc") == 0
        assert value(moved, "vllm:e2e_request_latency_seconds_count") == 1
        assert value(moved, "vllm:time_to_first_token_seconds_count") == 1

        def bad() -> None:
            req = urllib.request.Request(f"http://{http}/v1/completions", data=b'{"prompt": 5}',
                                         headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=60)
            assert e.value.code == 400

        assert value(moved_by(bad), "nvllm:requests_refused_total", api="http", reason="invalid") == 1
        # One registry behind both listeners.
        assert set(scrape(daemon, http)) == set(scrape(daemon))
