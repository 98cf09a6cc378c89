"""`nvllm serve`: settings, logging, the model, the page pool, the engine thread, the gRPC server,
systemd notifications and the graceful drain, wired together.

Start-up order: bind the listener first (a taken port fails in a second, not after the model
load; Health answers STARTING meanwhile), load the weights, size the page pool from the memory
then available (server/memory.py), allocate and touch it, start the engine thread and the memory
watchdog, then READY=1 and the line "nvllm serving MODEL on ADDR" on stdout.

Shutdown: the first SIGTERM/SIGINT stops admission at once (readiness NOT_SERVING, new calls
UNAVAILABLE "draining"), lets running requests finish for up to server.drain_grace_s, ends the rest
with finish_reason ABORT, and exits 0. A second signal exits at once (status 1).

Test hooks (environment variables; never set them in production):
  NVLLM_FAKE_MEMORY_FILE=PATH   the memory watchdog reads "available bytes" from this file (an
                                integer) instead of psutil/cgroups, so tests can inject pressure.
  NVLLM_TEST_STALL_S=SECONDS    SIGUSR1 makes the engine loop sleep that long without progress, so
                                tests can see the systemd watchdog pings stop.
  NVLLM_TEST_FAIL_STEP=1        SIGUSR2 makes the model's forward pass raise once, in the next engine
                                step, so tests can see that step's requests (only) fail with INTERNAL.

Security defaults: the listener is loopback (127.0.0.1:50051) or a unix socket created with mode
server.unix_socket_mode (never wider, even for an instant: the umask is tightened while it is
made); any other TCP address without TLS is logged as a warning. server.tls_cert/tls_key turn TLS
on; server.tls_client_ca requires client certificates signed by that CA (mutual TLS), and is
refused at start-up without tls_cert/tls_key rather than silently ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import math
import os
import signal
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from nvllm.config import ConfigError, Settings, load_settings
from nvllm.model import kernels
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import EngineConfig, LLMEngine
from nvllm.model.decoder import Model
from nvllm.model.kv_cache import KVCache
from nvllm.model.loader import ModelConfig, ModelLoadError, load_config, read_json
from nvllm.server.logs import setup_logging, stream_is_journal
from nvllm.server.memory import (RUNTIME_OVERHEAD_BYTES, GiB, MiB, MemoryReading, MemoryWatchdog, PoolSizing,
                                 PoolTooSmall, available_memory, format_bytes, size_pool)
from nvllm.server.service import SERVICE_NAME, DaemonState, GeneratorService, Phase, add_generator_to_server
from nvllm.server.systemd import Notifier, WatchdogPinger
from nvllm.tokenizer import Tokenizer
from nvllm.v1 import nvllm_pb2

log = logging.getLogger("nvllm.server.app")

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2
STATUS_EVERY_S = 5.0
# Past the transport cap gRPC itself refuses a message (RESOURCE_EXHAUSTED); between
# server.max_message_bytes and the cap the servicer refuses it with INVALID_ARGUMENT naming the field.
TRANSPORT_CAP_FACTOR = 2
STOP_GRACE_S = 5.0     # for handlers to write their last message once the engine has stopped


class StartupError(Exception):
    """Start-up cannot go on; the message says why and what to change."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


# -- the model and the pool ----------------------------------------------------------------
@dataclass
class Loaded:
    model: Model
    tokenizer: Tokenizer
    defaults: dict[str, Any]
    sizing: PoolSizing
    max_model_len: int
    load_s: float


def served_name(settings: Settings) -> str:
    return settings.model.served_name or settings.model_dir().resolve().name


def load_model(settings: Settings) -> Loaded:
    """Weights, tokenizer and the pool sizing (from the memory available after the weights load)."""
    model_dir = settings.model_dir()
    if not (model_dir / "config.json").is_file():
        raise StartupError(f"no model at {model_dir} (model.path={settings.model.path!r}, "
                           f"model.models_dir={settings.model.models_dir!r}); pull one with "
                           f"`nvllm models pull NAME --dir {settings.model.models_dir}` or pass --model DIR")
    t0 = time.monotonic()
    try:
        model = Model.from_dir(model_dir)
        tokenizer = Tokenizer.from_dir(model_dir)
    except (ModelLoadError, OSError, ValueError) as e:
        raise StartupError(f"cannot load the model at {model_dir}: {e}") from e
    gen = model_dir / "generation_config.json"
    defaults = read_json(gen) if gen.exists() else {}
    load_s = time.monotonic() - t0
    sizing, max_len = plan_pool(settings, model.config, available_memory())
    return Loaded(model, tokenizer, defaults, sizing, max_len, load_s)


def plan_pool(settings: Settings, c: ModelConfig, reading: MemoryReading) -> tuple[PoolSizing, int]:
    """The page pool from one memory reading (taken after the weights are loaded), and max_model_len."""
    cache = settings.cache
    limit = c.max_position_embeddings
    max_len = min(settings.scheduler.max_model_len or limit, limit)
    bytes_per_block = KVCache.bytes_per_block(c.num_layers, cache.block_size, c.num_kv_heads, c.head_dim)
    try:
        sizing = size_pool(bytes_per_block, reading.available_bytes, cache.memory_fraction,
                           cache.reserve_mb * MiB, cache.max_pool_mb * MiB, cache.num_blocks,
                           math.ceil(max_len / cache.block_size), block_size=cache.block_size,
                           source=reading.source, max_model_len=max_len)
    except PoolTooSmall as e:
        raise StartupError(f"page pool too small: {e}") from e
    return sizing, max_len


def build_engine(settings: Settings, loaded: Loaded) -> LLMEngine:
    """Allocate and touch the pool (once, now), then the engine around it."""
    s, sc = settings, settings.scheduler
    t0 = time.monotonic()
    kv = loaded.model.make_kv_cache(loaded.sizing.num_blocks, s.cache.block_size)
    log.info("page pool allocated and touched: %s in %.2f s", format_bytes(kv.nbytes), time.monotonic() - t0)
    config = EngineConfig(block_size=s.cache.block_size, num_blocks=loaded.sizing.num_blocks,
                          max_num_seqs=sc.max_num_seqs, max_num_batched_tokens=sc.max_num_batched_tokens,
                          max_model_len=loaded.max_model_len,
                          enable_prefix_caching=s.cache.enable_prefix_caching,
                          max_stop_strings=s.server.max_stop_strings,
                          max_stop_string_chars=s.server.max_stop_string_chars,
                          blas_threads=s.model.blas_threads)
    return LLMEngine(loaded.model, loaded.tokenizer, config, loaded.defaults, kv)


def memory_reader() -> Callable[[], MemoryReading]:
    """available_memory, or the test hook NVLLM_FAKE_MEMORY_FILE."""
    path = os.environ.get("NVLLM_FAKE_MEMORY_FILE")
    if not path:
        return available_memory
    log.warning("test hook: memory readings come from %s (NVLLM_FAKE_MEMORY_FILE)", path)

    def read() -> MemoryReading:
        return MemoryReading(int(Path(path).read_text().strip()), f"fake ({path})")
    return read


def dry_run(settings: Settings, memory_gb: float | None = None) -> int:
    """Print what serving would allocate, without allocating it.

    On this machine (memory_gb None) the model is loaded, so the files are checked and the reading is
    the one serving would take. For another board nothing is loaded: the weights' size comes from
    config.json, and the memory available after they load is memory_gb GiB less the weights. Give the
    memory the board has free when nvllm starts (MemAvailable with its other programs running); its
    whole size gives an upper bound.
    """
    t0 = time.monotonic()
    model_dir = settings.model_dir()
    try:
        if memory_gb is None:
            loaded = load_model(settings)
            c, sz, max_len = loaded.model.config, loaded.sizing, loaded.max_model_len
            weight_bytes = loaded.model.weights.nbytes
        else:
            if not (model_dir / "config.json").is_file():
                raise StartupError(f"no model at {model_dir} (model.path={settings.model.path!r}); "
                                   f"pass --model DIR (only its config.json is read)")
            try:
                c = load_config(model_dir)
            except (ModelLoadError, OSError) as e:
                raise StartupError(f"cannot read {model_dir / 'config.json'}: {e}") from e
            weight_bytes = c.weight_bytes
            board = int(memory_gb * GiB)
            reading = MemoryReading(max(0, board - weight_bytes),
                                    f"planned: {memory_gb:g} GiB available less the weights")
            sz, max_len = plan_pool(settings, c, reading)
    except StartupError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return e.code
    per_seq = math.ceil(max_len / sz.block_size)
    resident = weight_bytes + sz.pool_bytes + RUNTIME_OVERHEAD_BYTES
    print(f"model: {served_name(settings)} ({model_dir}), {c.architecture}, "
          f"{c.num_layers} layers, {c.num_params / 1e6:.1f} M parameters")
    print(f"weights: {format_bytes(weight_bytes)} ({weight_bytes} bytes, float32)")
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


# -- listening ------------------------------------------------------------------------------
def unix_path(listen: str) -> str | None:
    if not listen.startswith("unix:"):
        return None
    rest = listen[len("unix:"):]
    return rest[2:] if rest.startswith("//") else rest


def check_unix_socket(path: str) -> None:
    """Refuse a socket another process serves; remove a stale one."""
    p = Path(path)
    if not p.exists():
        if not p.parent.is_dir():
            raise StartupError(f"cannot listen on unix:{path}: directory {p.parent} does not exist")
        return
    if not stat.S_ISSOCK(p.stat().st_mode):
        raise StartupError(f"cannot listen on unix:{path}: the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        p.unlink()   # stale: nobody accepts on it
        return
    finally:
        probe.close()
    raise StartupError(f"cannot listen on unix:{path}: another process is serving on it", EXIT_FAILURE)


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    s = settings.server
    if not (s.tls_cert or s.tls_key):
        if s.tls_client_ca:
            raise StartupError("server.tls_client_ca (mutual TLS) needs server.tls_cert and server.tls_key: "
                               "without them the daemon would serve in plain text")
        return None
    if not (s.tls_cert and s.tls_key):
        raise StartupError("server.tls_cert and server.tls_key must be set together")
    try:
        key, cert = Path(s.tls_key).read_bytes(), Path(s.tls_cert).read_bytes()
        ca = Path(s.tls_client_ca).read_bytes() if s.tls_client_ca else None
    except OSError as e:
        raise StartupError(f"cannot read TLS files: {e}") from e
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None   # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def bind(server: grpc.aio.Server, settings: Settings) -> str:
    """Open the listener; returns the address as clients should dial it."""
    listen = settings.server.listen
    path = unix_path(listen)
    if path is not None:
        check_unix_socket(path)
    creds = server_credentials(settings)
    if path is None and creds is None and not is_loopback(listen.rsplit(":", 1)[0]):
        log.warning("listening on %s without TLS: any host that reaches it can use the model and read "
                    "the prompts (set server.tls_cert/tls_key, or listen on loopback or a unix socket)", listen)
    # A unix socket is born with the umask's mode: keep it private until chmod sets the configured one.
    old_umask = os.umask(0o177) if path is not None else None
    try:
        port = server.add_secure_port(listen, creds) if creds else server.add_insecure_port(listen)
    except RuntimeError as e:
        why = "is the port already in use?" if path is None else str(e)
        raise StartupError(f"cannot listen on {listen}: {why} (set server.listen or --listen)",
                           EXIT_FAILURE) from None
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if path is not None:
        os.chmod(path, settings.server.unix_socket_mode)
        return f"unix:{path}"
    host = listen.rsplit(":", 1)[0]
    return f"{host}:{port}"


# -- the daemon -----------------------------------------------------------------------------
class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
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

    def _on_stall_signal(self) -> None:
        seconds = float(os.environ.get("NVLLM_TEST_STALL_S", "0") or 0)
        if self.engine is not None and seconds > 0:
            self.engine.stall(seconds)

    def _on_fault_signal(self) -> None:
        if self.engine is not None:
            self.engine.inject_step_fault()

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
        if os.environ.get("NVLLM_TEST_STALL_S"):
            loop.add_signal_handler(signal.SIGUSR1, self._on_stall_signal)
        if os.environ.get("NVLLM_TEST_FAIL_STEP") == "1":
            log.warning("test hook: SIGUSR2 makes the next engine step fail (NVLLM_TEST_FAIL_STEP)")
            loop.add_signal_handler(signal.SIGUSR2, self._on_fault_signal)
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

        log.info("loading %s from %s", self.model_name, s.model_dir())
        loaded = await loop.run_in_executor(None, load_model, s)
        log.info("model loaded in %.2f s: %s, weights %s", loaded.load_s, loaded.model.config.architecture,
                 format_bytes(loaded.model.weights.nbytes))
        log.info("%s", loaded.sizing.log_line())
        engine = await loop.run_in_executor(None, build_engine, s, loaded)
        log.info("compute: %s, %d BLAS threads", kernels.describe(), engine.blas_threads)

        interval = self.notifier.watchdog_interval()
        self.engine = AsyncEngine(engine, heartbeat_s=min(1.0, interval / 4) if interval else 1.0)
        self.engine.start(loop)
        self.pinger = WatchdogPinger.from_env(self.notifier, lambda: self.engine.progress)
        self.watchdog = MemoryWatchdog(
            memory_reader(), s.watchdog.low_mb * MiB, s.watchdog.high_mb * MiB, s.watchdog.interval_s,
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
        "model": {"path": args.model},
        "server": {"listen": args.listen},
        "cache": {"num_blocks": args.num_blocks},
        "scheduler": {"max_model_len": args.max_model_len},
    }
    return load_settings(args.config, overrides)


def main(args: argparse.Namespace) -> int:
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
    daemon = Daemon(settings)
    try:
        return asyncio.run(daemon.run())
    except StartupError as e:
        log.error("%s", e)
        if not stream_is_journal(sys.stderr):   # under systemd the log line is enough
            print(f"nvllm serve: {e}", file=sys.stderr)
        return e.code
