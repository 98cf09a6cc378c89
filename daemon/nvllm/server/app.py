"""`nvllm serve`: settings, logging, the model, the page pool, the engine thread, the gRPC server,
systemd notifications and the graceful drain, wired together.

Start-up order: bind the listener first (a taken port fails in a second, not after the model
load; Health answers STARTING meanwhile), load the weights, size the page pool from the memory
then available (engine/factory.py, engine/memory.py), allocate and touch it, start the engine thread and the memory
watchdog, then READY=1 and the line "nvllm serving MODEL on ADDR" on stdout.

Shutdown: the first SIGTERM/SIGINT stops admission at once (readiness NOT_SERVING, new calls
UNAVAILABLE "draining"), lets running requests finish for up to server.drain_grace_s, ends the rest
with finish_reason ABORT, and exits 0. A second signal exits at once (status 1).

Daemon takes its memory reader (the watchdog's source of "available bytes") and any extra signal
handlers as arguments; `main` passes neither, so the daemon reads real memory and answers only
SIGTERM/SIGINT. The tests' launcher (tests/daemon_main.py) passes its own.

Security defaults: the listener is loopback (127.0.0.1:50051) or a unix socket created with mode
server.unix_socket_mode (never wider, even for an instant: the umask is tightened while it is
made); any other TCP address without TLS is logged as a warning. server.tls_cert/tls_key turn TLS
on; server.tls_client_ca requires client certificates signed by that CA (mutual TLS), and is
refused at start-up without tls_cert/tls_key rather than silently ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from nvllm.config import ConfigError, Settings, load_settings
from nvllm.engine import factory
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.listen import ListenError, bind
from nvllm.server.logs import setup_logging, stream_is_journal
from nvllm.engine.memory import RUNTIME_OVERHEAD_BYTES, GiB, MiB, MemoryReading, available_memory, format_bytes
from nvllm.server.watchdog import MemoryWatchdog
from nvllm.server.service import SERVICE_NAME, DaemonState, GeneratorService, Phase, add_generator_to_server
from nvllm.server.systemd import Notifier, WatchdogPinger
from nvllm.v1 import nvllm_pb2

log = logging.getLogger("nvllm.server.app")

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2   # as server/listen.py
STATUS_EVERY_S = 5.0
# Past the transport cap gRPC itself refuses a message (RESOURCE_EXHAUSTED); between
# server.max_message_bytes and the cap the servicer refuses it with INVALID_ARGUMENT naming the field.
TRANSPORT_CAP_FACTOR = 2
STOP_GRACE_S = 5.0     # for handlers to write their last message once the engine has stopped


def served_name(settings: Settings) -> str:
    return settings.model.served_name or settings.model_path().resolve().name


def dry_run(settings: Settings, memory_gb: float | None = None) -> int:
    """Print what serving would allocate, without allocating it.

    On this machine (memory_gb None) the model is loaded, so the files are checked and the reading is
    the one serving would take. For another board nothing is loaded: the weights' size comes from
    config.json, and the memory available after they load is memory_gb GiB less the weights. Give the
    memory the board has free when nvllm starts (MemAvailable with its other programs running); its
    whole size gives an upper bound.
    """
    t0 = time.monotonic()
    try:
        if memory_gb is None:
            loaded = factory.load_model(settings)
            info = loaded.info
            plan = factory.plan_pool(settings, info, available_memory())
        else:
            info = factory.read_model_info(settings)
            reading = MemoryReading(max(0, int(memory_gb * GiB) - info.weight_bytes),
                                    f"planned: {memory_gb:g} GiB available less the weights")
            plan = factory.plan_pool(settings, info, reading)
    except factory.EngineBuildError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    sz, max_len = plan.sizing, plan.max_model_len
    per_seq = math.ceil(max_len / sz.block_size)
    resident = info.weight_bytes + sz.pool_bytes + RUNTIME_OVERHEAD_BYTES
    print(f"model: {served_name(settings)} ({info.path}), {info.architecture}, "
          f"{info.num_layers} layers, {info.num_params / 1e6:.1f} M parameters")
    print(f"weights: {format_bytes(info.weight_bytes)} ({info.weight_bytes} bytes held in memory)")
    print(sz.log_line())
    print(f"pool: {format_bytes(sz.pool_bytes)} ({sz.pool_bytes} bytes) in {sz.num_blocks} pages of "
          f"{sz.block_size} tokens")
    print(f"context: {sz.num_tokens} tokens fit; max_model_len {max_len} -> "
          f"{sz.num_blocks // per_seq} sequences of full length at once")
    print(f"resident after start-up: at most {format_bytes(resident)} (weights + pool + "
          f"{format_bytes(RUNTIME_OVERHEAD_BYTES)} for the runtime: Python, NumPy, gRPC, tokenizer)")
    if memory_gb is None:
        print(f"startup: weights and tokenizer loaded in {loaded.load_s:.2f} s "
              f"({time.monotonic() - t0:.2f} s with sizing; serving also allocates and touches the pool)")
    else:
        print(f"startup: not measured (planned for {memory_gb:g} GiB available; nothing was loaded)")
    return EXIT_OK


# -- the daemon -----------------------------------------------------------------------------
class Daemon:
    def __init__(self, settings: Settings, memory_reader: Callable[[], MemoryReading] = available_memory,
                 signal_handlers: Mapping[int, Callable[[Daemon], None]] | None = None) -> None:
        """memory_reader feeds the memory watchdog; each of signal_handlers (signal number ->
        handler(daemon)) is registered on the event loop besides SIGTERM/SIGINT."""
        self.settings = settings
        self.memory_reader = memory_reader
        self.signal_handlers = dict(signal_handlers or {})
        self.model_name = served_name(settings)
        self.notifier = Notifier()
        self.health = HealthServicer()
        s = settings
        self.state = DaemonState(self.model_name, self.health, s.scheduler.max_waiting,
                                 s.scheduler.max_num_seqs, s.server.max_message_bytes,
                                 s.server.max_streams_per_client)
        self.engine: AsyncEngine | None = None
        self.watchdog: MemoryWatchdog | None = None
        self.pinger: WatchdogPinger | None = None
        self.stop_requested: asyncio.Event | None = None
        self.num_signals = 0

    def _grpc_server(self) -> grpc.aio.Server:
        cap = self.settings.server.max_message_bytes
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0),
                     ("grpc.max_receive_message_length", TRANSPORT_CAP_FACTOR * cap),
                     ("grpc.max_send_message_length", cap)])
        add_generator_to_server(GeneratorService(self.state), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (nvllm_pb2.DESCRIPTOR.services_by_name["Generator"].full_name,
                 health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        return server

    def _on_signal(self, signum: int) -> None:
        self.num_signals += 1
        name = signal.Signals(signum).name
        if self.num_signals > 1:
            log.warning("%s again: exiting at once", name)
            self.notifier.stopping("exiting at once")
            sys.stdout.flush()
            os._exit(EXIT_FAILURE)
        if self.state.phase is Phase.STARTING:   # nothing admitted yet: no drain to wait for
            log.info("%s during start-up: exiting", name)
            self.notifier.stopping("stopped during start-up")
            sys.stdout.flush()
            os._exit(EXIT_OK)
        log.info("%s: draining (a second signal exits at once)", name)
        assert self.stop_requested is not None
        self.stop_requested.set()

    def status_line(self) -> str:
        st = self.state
        if self.engine is None:
            return f"{self.model_name}: {st.phase.value}"
        s = self.engine.stats()
        free = s["pages_free"] + s["pages_cached"]
        admit = st.not_admitting_reason()
        how = ("draining" if st.phase is Phase.DRAINING else
               f"not admitting: {admit}" if admit else "admitting")
        return (f"{self.model_name}: {s['running']} running, {s['waiting']} waiting, "
                f"{free}/{s['pages_total']} pages free, {s['tokens_per_s']:.1f} tokens/s, {how}")

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            self.notifier.status(self.status_line())

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        for sig, handler in self.signal_handlers.items():
            loop.add_signal_handler(sig, handler, self)
        s = self.settings
        self.notifier.status(f"{self.model_name}: starting")
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        server = self._grpc_server()
        address = bind(server, s)
        try:
            return await self._serve(server, address)
        except BaseException:
            await server.stop(0)
            if self.engine is not None:
                self.engine.stop_thread(5.0)
            raise

    async def _serve(self, server: grpc.aio.Server, address: str) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        await server.start()
        log.info("listening on %s (Health answers STARTING while the model loads)", address)

        log.info("loading %s from %s", self.model_name, s.model_path())
        loaded = await loop.run_in_executor(None, factory.load_model, s)
        log.info("model loaded in %.2f s: %s, weights %s", loaded.load_s, loaded.info.architecture,
                 format_bytes(loaded.info.weight_bytes))
        plan = factory.plan_pool(s, loaded.info, self.memory_reader())
        log.info("%s", plan.sizing.log_line())
        engine = await loop.run_in_executor(None, factory.create_engine, s, loaded, plan)
        log.info("compute: %s, %d BLAS threads", factory.compute_description(), engine.blas_threads)

        interval = self.notifier.watchdog_interval()
        self.engine = AsyncEngine(engine, heartbeat_s=min(1.0, interval / 4) if interval else 1.0)
        self.engine.start(loop)
        self.pinger = WatchdogPinger.from_env(self.notifier, lambda: self.engine.progress)
        self.watchdog = MemoryWatchdog(
            self.memory_reader, s.watchdog.low_mb * MiB, s.watchdog.high_mb * MiB, s.watchdog.interval_s,
            on_change=lambda ok, why: loop.call_soon_threadsafe(self.state.on_admission_change, ok, why))
        self.watchdog.start()
        await self.state.set_ready(self.engine, self.watchdog)

        log.info("ready in %.2f s since process start", self.state.startup_s)
        self.notifier.ready(self.status_line())
        print(f"nvllm serving {self.model_name} on {address}", flush=True)
        if self.pinger is not None:
            self.pinger.start()
        status_task = asyncio.create_task(self._status_loop())

        await self.stop_requested.wait()
        await self.drain(server)
        status_task.cancel()
        return EXIT_OK

    async def drain(self, server: grpc.aio.Server) -> None:
        assert self.engine is not None
        await self.state.begin_drain()
        n = self.engine.num_streams
        grace = self.settings.server.drain_grace_s
        self.notifier.stopping(f"{self.model_name}: draining {n} requests (grace {grace:g} s)")
        log.info("draining: %d requests in flight, grace %.1f s", n, grace)
        deadline = time.monotonic() + grace
        while self.engine.num_streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = self.engine.num_streams
        if left:
            log.warning("drain grace %.1f s elapsed: aborting %d requests", grace, left)
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop_thread)
        self.engine.abort_leftovers()
        await server.stop(STOP_GRACE_S)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.pinger is not None:
            self.pinger.stop()
        log.info("stopped")
        self.notifier.close()


# -- entry point ----------------------------------------------------------------------------
def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {
        "model": {"path": args.model, "quantization": getattr(args, "quantization", None)},
        "server": {"listen": args.listen},
        "cache": {"num_blocks": args.num_blocks},
        "scheduler": {"max_model_len": args.max_model_len},
    }
    return load_settings(args.config, overrides)


def main(args: argparse.Namespace, **injected: Any) -> int:
    """`nvllm serve`; `injected` goes to Daemon (the tests' launcher passes its memory reader and
    signal handlers), nvllm itself passes nothing."""
    try:
        settings = settings_from_args(args)
    except ConfigError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(settings.log_level)
    memory_gb = getattr(args, "memory_gb", None)
    if memory_gb is not None and (not args.dry_run or memory_gb <= 0):
        print("nvllm serve: --memory-gb N plans for N GiB of available memory: give it with --dry-run, N > 0",
              file=sys.stderr)
        return EXIT_CONFIG
    if args.dry_run:
        return dry_run(settings, memory_gb)
    daemon = Daemon(settings, **injected)
    try:
        return asyncio.run(daemon.run())
    except (factory.EngineBuildError, ListenError) as e:
        log.error("%s", e)
        if not stream_is_journal(sys.stderr):   # under systemd the log line is enough
            print(f"nvllm serve: {e}", file=sys.stderr)
        return getattr(e, "code", EXIT_CONFIG)
