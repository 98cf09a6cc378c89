"""End-to-end: the real daemon process on loopback, driven over gRPC, from start-up to exit.

The daemon runs through the tests' launcher (helpers/daemon_main.py: `nvllm serve`'s daemon and
arguments). Start-up refusals and the dry run; then the queue bound, the drain on SIGTERM, the
second-signal exit and systemd's notify protocol, each on a daemon of its own (they need other settings,
or end the process). Requests are held in flight by holding the engine loop still (`stall` until
`resume`), never by timing.
"""

from __future__ import annotations

import asyncio
import signal
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from helpers.daemon_util import (
    BASE_CONFIG,
    ROOT,
    DaemonProcess,
    NotifySocket,
    collect,
    health,
    pings_while_stalled,
    read_rest,
    request,
    wait_for,
)
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc


# -- start-up ----------------------------------------------------------------------------------------
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

