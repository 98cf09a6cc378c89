"""Stress 4, faults: kill -9 under load, an exception inside one engine step, a stalled engine under
load (the systemd watchdog), memory pressure under load; against the real daemon on loopback.

Faults are injected with SIGKILL itself and through the tests' launcher (daemon_main.py): SIGUSR2
(the next forward pass raises), SIGUSR1 (the engine loop is held still until the next SIGUSR1) and
its memory file (the memory watchdog's reading).
"""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from helpers.daemon_main import FAULT_MESSAGE
from helpers.daemon_util import (
    BASE_CONFIG,
    PLENTY,
    DaemonProcess,
    NotifySocket,
    assert_sound,
    check,
    config_with,
    health,
    joined,
    offline_result,
    pings_while_stalled,
    request,
    run_bounded,
    wait_for,
)
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.stress, pytest.mark.slow]




async def finish(call) -> tuple[grpc.StatusCode, str, list[pb.GenerateResponse], float]:
    """Read a call to its end with call.read() (so it may follow reads of its head): (code, details,
    the messages read here, when it ended)."""
    got = []
    try:
        while (r := await call.read()) is not grpc.aio.EOF:
            got.append(r)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or "", got, time.monotonic()
    return grpc.StatusCode.OK, "", got, time.monotonic()


def long_request(i: int, max_tokens: int = 200) -> pb.GenerateRequest:
    return request(f"long stream {i}", max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


# -- kill -9 ---------------------------------------------------------------------------------------
def test_kill_9_under_load_is_unavailable_at_once_and_a_restart_serves(tiny: Path, tmp_path: Path, offline,
                                                                        reliability) -> None:
    first = DaemonProcess(tmp_path / "first", tiny)
    second = None
    port = first.port
    figures = {}
    try:
        async def go():
            nonlocal second
            ch = grpc.aio.insecure_channel(first.address)
            stub = pb_grpc.GeneratorStub(ch)
            running = [stub.Generate(long_request(i), timeout=60) for i in range(16)]
            for c in running:
                await c.read()                                   # 16 streams running ...
            queued = [stub.Generate(long_request(16 + i), timeout=60) for i in range(8)]
            while (await stub.Health(pb.HealthRequest())).waiting < 8:
                await asyncio.sleep(0.01)                        # ... and 8 queued
            killed_at = time.monotonic()
            first.proc.kill()
            ends = await asyncio.wait_for(asyncio.gather(*[finish(c) for c in running + queued]), 50)
            codes = [code for code, *_ in ends]
            assert codes == [grpc.StatusCode.UNAVAILABLE] * 24, [(c, d) for c, d, *_ in ends]
            figures["in_flight_failed_unavailable"] = len(codes)
            figures["slowest_unavailable_ms"] = round(1000 * (max(t for *_, t in ends) - killed_at))
            assert await asyncio.get_running_loop().run_in_executor(None, first.wait) == -9

            # While it is down, a new call fails at once rather than waiting for its deadline.
            t0 = time.monotonic()
            async with grpc.aio.insecure_channel(first.address) as fresh:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await pb_grpc.GeneratorStub(fresh).Generate(request(max_tokens=2), timeout=30).read()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            figures["refused_while_down_ms"] = round(1000 * (time.monotonic() - t0))

            # Restart on the same port: it serves again, to a new channel and to the old one.
            restarted_at = time.monotonic()
            second = await asyncio.get_running_loop().run_in_executor(
                None, lambda: DaemonProcess(tmp_path / "second", tiny, listen=f"127.0.0.1:{port}"))
            answer = [r async for r in stub.Generate(request("back again", max_tokens=8, temperature=0.0),
                                                      timeout=60, wait_for_ready=True)]
            served_at = time.monotonic()
            await ch.close()
            return answer, served_at - killed_at, served_at - restarted_at

        answer, kill_to_served, restart_to_served = run_bounded(go())
        want = offline_result(offline, "back again", max_tokens=8, temperature=0.0)
        assert joined(answer) == (want.text, want.token_ids)
        assert second is not None
        h = assert_sound(second, offline)
        reliability("kill_9", **figures, kill_to_serving_again_s=round(kill_to_served, 2),
                    restart_to_serving_s=round(restart_to_served, 2),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_kill_9_leaves_a_stale_unix_socket_that_a_restart_replaces(tiny: Path, tmp_path: Path, offline) -> None:
    sock = tmp_path / "nvllm.sock"
    d = DaemonProcess(tmp_path / "a", tiny, listen=f"unix:{sock}")
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                call = pb_grpc.GeneratorStub(ch).Generate(long_request(0), timeout=60)
                await call.read()
                d.proc.kill()
                return await asyncio.wait_for(finish(call), 30)
        code, *_ = run_bounded(go())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert d.wait() == -9 and stat.S_ISSOCK(sock.stat().st_mode)     # left behind
    finally:
        d.stop()
    d = DaemonProcess(tmp_path / "b", tiny, listen=f"unix:{sock}")
    try:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        assert_sound(d, offline)
    finally:
        d.stop()


# -- an exception inside one step -------------------------------------------------------------------
def test_an_exception_in_one_step_fails_only_that_steps_requests(tiny: Path, tmp_path: Path, offline,
                                                                 reliability) -> None:
    """Four requests hold the four seats; four more wait. The next step's forward pass raises: the four
    in that step end with INTERNAL, the four waiting ones then run and complete, and so does a new one."""
    config = config_with(BASE_CONFIG, max_num_seqs=4)
    d = DaemonProcess(tmp_path, tiny, config)
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                in_step = [stub.Generate(long_request(i), timeout=60) for i in range(4)]
                heads = [await c.read() for c in in_step]
                d.stall()                                        # hold still while the rest lines up
                waiting = [stub.Generate(long_request(10 + i, 24), timeout=60) for i in range(4)]
                while (await stub.Health(pb.HealthRequest())).waiting < 4:
                    await asyncio.sleep(0.01)
                d.fail_step()                                    # the next step's forward pass raises:
                d.resume()                                       # the step of the 4 holding the seats
                failed = await asyncio.gather(*[finish(c) for c in in_step])
                served = await asyncio.gather(*[finish(c) for c in waiting])
                after = [r async for r in stub.Generate(long_request(99, 12), timeout=60)]
                return heads, failed, served, after

        heads, failed, served, after = run_bounded(go())
        assert all(h.token_ids for h in heads)
        for code, details, *_ in failed:
            assert code == grpc.StatusCode.INTERNAL
            assert details == f"generation failed: RuntimeError: {FAULT_MESSAGE}"
        for i, (code, details, got, _) in enumerate(served):
            assert code == grpc.StatusCode.OK, details
            want = offline_result(offline, f"long stream {10 + i}", max_tokens=24, ignore_eos=True, temperature=0.0)
            assert joined(got) == (want.text, want.token_ids)
        want = offline_result(offline, "long stream 99", max_tokens=12, ignore_eos=True, temperature=0.0)
        assert joined(after) == (want.text, want.token_ids)
        assert "engine step failed; failing its 4 requests" in d.log()
        h = assert_sound(d, offline)
        reliability("step_fault", requests_in_the_failed_step=4, failed_internal=len(failed),
                    other_requests_served=len(served) + 1, daemon_alive=True,
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()


# -- a stalled engine under load --------------------------------------------------------------------
def test_a_stalled_engine_under_load_stops_the_watchdog_pings(tiny: Path, tmp_path: Path, offline,
                                                              reliability) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    # WatchdogSec=1 s: pings every 0.5 s while the engine moves; held, it pings no more.
    d = DaemonProcess(tmp_path / "d", tiny, extra_env=notify.env(1.0))
    try:
        wait_for(lambda: notify.has("READY=1"), "READY=1")

        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                calls = [stub.Generate(long_request(i, 240), timeout=120) for i in range(16)]
                heads = [await c.read() for c in calls]
                busy_from = time.monotonic()
                while not [t for t in notify.ping_times() if t > busy_from]:   # a busy engine pings
                    assert time.monotonic() < busy_from + 30, "no watchdog ping while the engine ran"
                    await asyncio.sleep(0.01)
                busy = len([t for t in notify.ping_times() if t > busy_from])
                quiet = pings_while_stalled(d, notify, window_s=1.5)   # three ticks held: no ping
                rest = await asyncio.gather(*[finish(c) for c in calls])
                return busy, quiet, heads, rest

        pings_busy, quiet, heads, rest = run_bounded(go())
        assert quiet == []
        for i, (head, (code, details, got, _)) in enumerate(zip(heads, rest)):
            assert code == grpc.StatusCode.OK, details
            if i in (0, 15):
                want = offline_result(offline, f"long stream {i}", max_tokens=240, ignore_eos=True, temperature=0.0)
                assert joined([head] + got) == (want.text, want.token_ids)
            assert got[-1].usage.completion_tokens == 240
        h = assert_sound(d, offline)
        reliability("watchdog_stall", streams_in_flight=16, pings_while_busy=pings_busy, checked_within_stall_s=1.5,
                    pings_during_stall=len(quiet), streams_completed=len(rest),
                    leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()
        notify.close()


# -- memory pressure under load ---------------------------------------------------------------------
def test_memory_pressure_mid_load_stops_admission_and_recovers(tiny: Path, tmp_path: Path, offline,
                                                               reliability) -> None:
    d = DaemonProcess(tmp_path, tiny)
    try:
        async def go():
            async with grpc.aio.insecure_channel(d.address) as ch:
                stub = pb_grpc.GeneratorStub(ch)
                calls = [stub.Generate(long_request(i, 100), timeout=120) for i in range(16)]
                heads = [await c.read() for c in calls]
                d.stall()                                        # the 16 stay in flight meanwhile
                d.set_available(100 << 20)
                while (await stub.Health(pb.HealthRequest())).state != pb.HealthResponse.STATE_NOT_ADMITTING:
                    await asyncio.sleep(0.01)
                refused = await asyncio.gather(*[finish(stub.Generate(request(f"new {i}", max_tokens=4), timeout=30))
                                                 for i in range(20)])
                ready = await asyncio.get_running_loop().run_in_executor(None, check, d.address, "nvllm.v1.Generator")
                d.resume()
                d.set_available(int(PLENTY))
                released = time.monotonic()
                attempts = 0
                while True:      # refused until the watchdog reads the new value, then admitted
                    attempts += 1
                    sent = time.monotonic()
                    code, details, got, _ = await finish(stub.Generate(request("admitted again", max_tokens=4,
                                                                               temperature=0.0), timeout=30))
                    if code == grpc.StatusCode.OK:
                        break
                    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
                    await asyncio.sleep(0.01)
                recovered = sent - released          # when the call that got in was sent
                rest = await asyncio.gather(*[finish(c) for c in calls])
                return heads, refused, ready, recovered, attempts, got, rest

        heads, refused, ready, recovered, attempts, got, rest = run_bounded(go())
        for code, details, *_ in refused:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert details.startswith("not admitting new requests: available memory 100 MiB")
        assert ready == health_pb2.HealthCheckResponse.NOT_SERVING
        want = offline_result(offline, "admitted again", max_tokens=4, temperature=0.0)
        assert joined(got) == (want.text, want.token_ids)
        for code, details, tail, _ in rest:                     # admitted before the pressure: unharmed
            assert code == grpc.StatusCode.OK, details
            assert tail[-1].finish_reason == pb.FINISH_REASON_LENGTH and tail[-1].usage.completion_tokens == 100
        assert health(d.address).state == pb.HealthResponse.STATE_SERVING
        h = assert_sound(d, offline)
        reliability("memory_pressure", streams_in_flight=16, refused_under_pressure=len(refused),
                    in_flight_completed=len(rest), admitting_again_within_ms=round(1000 * recovered),
                    attempts_until_admitted=attempts, leaked_pages=h.pages_total - h.pages_free - h.pages_cached)
    finally:
        d.stop()
