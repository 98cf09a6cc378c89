"""The daemon's life: the models, their page pools and engine threads, the gRPC and HTTP servers, the
board's watches, systemd notifications and the graceful drain, wired together (`nvllm serve`'s command
line, its flags and --dry-run, is cli/serve.py).

Start-up order: bind the listener first (a taken port fails in a second, not after the model
load; Health answers STARTING meanwhile), load the weights, size the page pool from the memory
then available (engine/assembly/factory.py, engine/assembly/memory.py), allocate and touch it, start the
engine thread and the memory watchdog, then READY=1 and the line "nvllm serving MODEL on ADDR" on stdout.

Shutdown: the first SIGTERM/SIGINT stops admission at once (readiness NOT_SERVING, new calls
UNAVAILABLE "draining"), lets running requests finish for up to server.drain_grace_s, ends the rest
with finish_reason ABORT, writes the prefix cache to cache.persist_dir when set, and exits 0. A second
signal exits at once (status 1).

Daemon takes its memory reader (the watchdog's source of "available bytes") and any extra signal
handlers as arguments; `nvllm serve` (cli/serve.py) passes neither, so the daemon reads real memory and
answers only SIGTERM/SIGINT. The tests' launcher (tests/helpers/daemon_main.py) passes its own.

Security defaults: the listener is loopback (127.0.0.1:50051) or a unix socket created with mode
server.unix_socket_mode (never wider, even for an instant: the umask is tightened while it is
made); any other TCP address without TLS is logged as a warning. server.tls_cert/tls_key turn TLS
on; server.tls_client_ca requires client certificates signed by that CA (mutual TLS), and is
refused at start-up without tls_cert/tls_key rather than silently ignored. metrics.listen (off by
default) serves Prometheus metrics over plain HTTP, bound right after the gRPC listener; metrics hold
no prompts or keys, so any address is allowed (server/metrics_listener.py). http.ollama_listen serves the
same HTTP app on a second port (Ollama's clients dial 11434), under the same checks.

Models pulled while serving (Ollama's /api/pull) come through the injected puller (cli/serve.py passes the
Hugging Face Hub's): server/models/model_pulls.py.

SIGHUP puts in service a new version of every loaded model whose files changed since it was loaded (beside
the old one, checked, then swapped: server/models/model_update.py); `nvllm models reload NAME` (gRPC
ReloadModel) does it for one model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from nvllm.config import ConfigError, Settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import MemoryReading, MiB, available_memory, format_bytes
from nvllm.engine.async_engine import AsyncEngine
from nvllm.server.board.heat_monitor import HeatMonitor
from nvllm.server.board.memory_watchdog import MemoryWatchdog
from nvllm.server.grpc.service import GeneratorService, add_generator_to_server
from nvllm.server.listen import ListenError, bind
from nvllm.server.logs import announce, stream_is_journal
from nvllm.server.metrics_listener import MetricsListener
from nvllm.server.models.model_loader import ModelLoader
from nvllm.server.models.model_pulls import ModelPulls, Puller
from nvllm.server.models.model_set import ModelSet, NoRoom
from nvllm.server.models.model_update import ModelUpdates
from nvllm.server.models.served_models import memory_budget, model_specs, served_name
from nvllm.server.models.speech_slot import SpeechSlot
from nvllm.server.state import SERVICE_NAME, DaemonState, Phase
from nvllm.server.systemd import Notifier, WatchdogPinger
from nvllm.server.upstream.forwarder import Forwarder
from nvllm.server.upstream.upstream_policy import UpstreamRoutes
from nvllm.v1 import nvllm_pb2

if TYPE_CHECKING:   # the HTTP API (starlette, uvicorn) is imported only when http.listen is set
    from nvllm.server.http.listener import HttpListener

log = logging.getLogger("nvllm.server.app")

EXIT_OK, EXIT_FAILURE, EXIT_CONFIG = 0, 1, 2   # as server/listen.py
STATUS_EVERY_S = 5.0
# Past the transport cap gRPC itself refuses a message (RESOURCE_EXHAUSTED); between
# server.max_message_bytes and the cap the servicer refuses it with INVALID_ARGUMENT naming the field.
TRANSPORT_CAP_FACTOR = 2
REAP_EVERY_S = 1.0     # how often models idle past their keep_alive are unloaded
STOP_GRACE_S = 5.0     # for handlers to write their last message once the engine has stopped


# -- the daemon -----------------------------------------------------------------------------
class Daemon:
    def __init__(self, settings: Settings, memory_reader: Callable[[], MemoryReading] = available_memory,
                 signal_handlers: Mapping[int, Callable[[Daemon], None]] | None = None,
                 puller: Puller | None = None) -> None:
        """memory_reader feeds the memory watchdog; each of signal_handlers (signal number ->
        handler(daemon)) is registered on the event loop besides SIGTERM/SIGINT; puller fetches a model
        for Ollama's /api/pull (cli/serve.py passes the Hugging Face Hub's; None: no pulls)."""
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
        self.state.reasoning_parser = s.server.reasoning_parser
        self.state.context_overflow = s.server.context_overflow
        self.state.speech = SpeechSlot(s.server.speech_model, s.server.max_audio_bytes, s.server.max_audio_seconds)
        self.state.pulls = ModelPulls(settings, puller)
        # [[upstreams]]: where refused requests may go instead (server/upstream/); None when there are none
        self.upstreams = Forwarder(UpstreamRoutes.from_settings(s.upstreams), self.state.metrics) \
            if s.upstreams else None
        self.state.updates = ModelUpdates(s.server.update_drain_s)
        self._hangups: set[asyncio.Task] = set()
        self.specs, self.default_model = model_specs(settings)     # ConfigError for a bad list of models
        self.models: ModelSet | None = None
        self._seen_progress: dict[int, int] = {}
        self._beats = 0
        self.watchdog: MemoryWatchdog | None = None
        self.heat: HeatMonitor | None = None
        self.pinger: WatchdogPinger | None = None
        self.metrics_listener: MetricsListener | None = None
        self.stop_requested: asyncio.Event | None = None
        self.num_signals = 0
        self.http: HttpListener | None = None
        self.ollama_http: HttpListener | None = None

    def _grpc_server(self) -> grpc.aio.Server:
        cap = self.settings.server.max_message_bytes
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0),
                     ("grpc.max_receive_message_length", TRANSPORT_CAP_FACTOR * cap),
                     ("grpc.max_send_message_length", cap)])
        add_generator_to_server(GeneratorService(self.state, self.upstreams), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (nvllm_pb2.DESCRIPTOR.services_by_name["Generator"].full_name,
                 health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
        return server

    def _http_listeners(self) -> None:
        """The HTTP API (OpenAI's, Anthropic's, Ollama's) on http.listen and on http.ollama_listen, one app,
        each bound now under the same checks (a key or TLS off loopback); neither when both are off."""
        h = self.settings.http
        if not h.listen and not h.ollama_listen:
            return
        from nvllm.server.http.app import OpenAIApi
        from nvllm.server.http.listener import HttpListener, check_security, http_api_key

        for listen, setting in ((h.listen, "http.listen"), (h.ollama_listen, "http.ollama_listen")):
            if listen:
                check_security(dataclasses.replace(h, listen=listen), setting)
        app = OpenAIApi(self.state, http_api_key(h), h.max_body_bytes, metrics=self.state.metrics,
                        upstreams=self.upstreams).app()
        if h.listen:
            self.http = HttpListener(app, h.listen, "http.listen or --http-listen", h.tls_cert, h.tls_key,
                                     STOP_GRACE_S)
        if h.ollama_listen:
            self.ollama_http = HttpListener(app, h.ollama_listen, "http.ollama_listen or --ollama-listen",
                                            h.tls_cert, h.tls_key, STOP_GRACE_S)

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

    def _on_hangup(self) -> None:
        """SIGHUP: a new version of every loaded model whose files changed (ignored until serving)."""
        if self.models is None or self.state.phase is not Phase.SERVING:
            log.info("SIGHUP before serving or while draining: ignored")
            return
        log.info("SIGHUP: reloading the loaded models whose files changed")
        task = asyncio.get_running_loop().create_task(self.state.updates.reload_changed(self.models))
        self._hangups.add(task)             # the loop keeps only a weak reference to a task
        task.add_done_callback(self._hangups.discard)

    @property
    def engine(self) -> AsyncEngine | None:
        """The default model's engine, while it is loaded."""
        return self.state.engine

    def progress(self) -> int:
        """The systemd watchdog's counter: it moves once every loaded engine's loop has moved since its last
        move (with none loaded, at every call: the event loop itself is what answers then)."""
        engines = self.models.engines() if self.models is not None else []
        now = {id(e): e.progress for e in engines}
        if all(now[k] != self._seen_progress.get(k) for k in now):
            self._seen_progress = now
            self._beats += 1
        return self._beats

    def status_line(self) -> str:
        st = self.state
        loaded = self.models.loaded() if self.models is not None else []
        served = len(self.models.slots) if self.models is not None else len(self.specs)   # pulls add, deletes take
        others = f"; {len(loaded)} of {served} models loaded" if served > 1 else ""
        if self.engine is None:
            return f"{self.model_name}: {st.phase.value if st.phase is not Phase.SERVING else 'unloaded'}{others}"
        s = self.engine.stats()
        free = s["pages_free"] + s["pages_cached"]
        admit = st.not_admitting_reason()
        how = ("draining" if st.phase is Phase.DRAINING else
               f"not admitting: {admit}" if admit else "admitting")
        backed = f" ({s['pages_backed']} backed)" if s["pages_backed"] < s["pages_total"] else ""
        return (f"{self.model_name}: {s['running']} running, {s['waiting']} waiting, "
                f"{free}/{s['pages_total']}{backed} pages free, {s['tokens_per_s']:.1f} tokens/s, {how}{others}")

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_EVERY_S)
            self.notifier.status(self.status_line())

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
        for signum, handler in self.signal_handlers.items():
            loop.add_signal_handler(signum, handler, self)
        s = self.settings
        self.notifier.status(f"{self.model_name}: starting")
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        server = self._grpc_server()
        address = bind(server, s)
        if s.metrics.listen:   # bound with the listener, so a taken port fails before the model loads
            self.metrics_listener = MetricsListener(s.metrics.listen, self.state.metrics.exposition)
            self.metrics_listener.start()
        try:
            self._http_listeners()
            return await self._serve(server, address)
        except BaseException:
            if self.metrics_listener is not None:
                self.metrics_listener.stop()
            await server.stop(0)
            for listener in (self.http, self.ollama_http):
                if listener is not None:
                    await listener.stop(0.5)
            for engine in self.models.engines() if self.models is not None else []:
                engine.stop_thread(5.0)
            raise

    async def _serve(self, server: grpc.aio.Server, address: str) -> int:
        loop = asyncio.get_running_loop()
        s = self.settings
        await server.start()
        log.info("listening on %s (Health answers STARTING while the model loads)", address)
        if self.http is not None:
            await self.http.start()
            log.info("HTTP API (OpenAI-compatible) on %s", self.http.address)
        if self.ollama_http is not None:
            await self.ollama_http.start()
            log.info("HTTP API for Ollama's clients on %s", self.ollama_http.address)

        interval = self.notifier.watchdog_interval()
        loader = ModelLoader(self.memory_reader, heartbeat_s=min(1.0, interval / 4) if interval else 1.0,
                             on_step=self.state.metrics.observe_step)
        budget = memory_budget(s, self.memory_reader())
        self.models = ModelSet(self.specs, self.default_model, budget, loader.load, loader.unload, loader.least,
                               loader.reclaim)
        log.info("serving %s; memory budget %s (%s)", ", ".join(spec.name for spec in self.specs),
                 format_bytes(budget), "cache.budget_gb" if s.cache.budget_gb else
                 f"{s.cache.memory_fraction:g} of the memory available less cache.reserve_mb")
        await start_models(self.models)
        slot = self.models.slots[self.models.default]   # start_models loaded it (self.engine: once ready)
        if slot.engine is not None:
            log.info("compute: %s, %s", factory.compute_description(), factory.threads_description(
                slot.engine.engine.threads, slot.spec.settings.model.threads))
        self.pinger = WatchdogPinger.from_env(self.notifier, self.progress)
        self.watchdog = MemoryWatchdog(
            self.memory_reader, s.watchdog.low_mb * MiB, s.watchdog.high_mb * MiB, s.watchdog.interval_s,
            on_change=lambda ok, why: loop.call_soon_threadsafe(self.state.on_admission_change, ok, why))
        self.watchdog.start()
        if s.power.enabled:   # the board's heat, sent to every engine loaded (server/board/heat_monitor.py)
            self.heat = self.state.heat = HeatMonitor(s.power, self.models.engines)
            self.heat.start()
        await self.state.set_ready(self.models, self.watchdog)

        log.info("ready in %.2f s since process start", self.state.startup_s)
        self.notifier.ready(self.status_line())
        if self.http is not None:
            announce(f"nvllm HTTP API on {self.http.address}")
        if self.ollama_http is not None:
            announce(f"nvllm Ollama API on {self.ollama_http.address}")
        announce(f"nvllm serving {self.model_name} on {address}")
        if self.pinger is not None:
            self.pinger.start()
        status_task = asyncio.create_task(self._status_loop())
        reap_task = asyncio.create_task(reap_models(self.models))

        assert self.stop_requested is not None     # run() made it
        await self.stop_requested.wait()
        reap_task.cancel()
        await self.drain(server)
        status_task.cancel()
        return EXIT_OK

    async def drain(self, server: grpc.aio.Server) -> None:
        assert self.models is not None
        await self.state.begin_drain()
        engines = self.models.engines()
        n = sum(e.num_streams for e in engines)
        grace = self.settings.server.drain_grace_s
        self.notifier.stopping(f"{self.model_name}: draining {n} requests (grace {grace:g} s)")
        log.info("draining: %d requests in flight, grace %.1f s", n, grace)
        deadline = time.monotonic() + grace
        while sum(e.num_streams for e in engines) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = sum(e.num_streams for e in engines)
        if left:
            log.warning("drain grace %.1f s elapsed: aborting %d requests", grace, left)
        for e in engines:
            await asyncio.get_running_loop().run_in_executor(None, e.stop_thread)
            e.abort_leftovers()
        if self.heat is not None:
            await self.heat.stop()
        # cache.persist_dir: the pinned and hottest pages for the next start, once nothing runs (the
        # default model's: served_models.py keeps the persisted cache to it).
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.save_cache)
        await server.stop(STOP_GRACE_S)
        for listener in (self.http, self.ollama_http):
            if listener is not None:
                await listener.stop(STOP_GRACE_S)
        if self.metrics_listener is not None:
            self.metrics_listener.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.pinger is not None:
            self.pinger.stop()
        log.info("stopped")
        self.notifier.close()


async def start_models(models: ModelSet) -> None:
    """Load the default model and every pinned one before the daemon is ready."""
    for slot in models.slots.values():
        if slot.name == models.default or slot.spec.pinned:
            try:
                lease = await models.lease(slot.name, request=False)
            except NoRoom as e:
                raise factory.EngineBuildError(f"cannot start: {e}") from None
            lease.release()


async def reap_models(models: ModelSet, every_s: float = REAP_EVERY_S) -> None:
    """Unload the models idle past their keep_alive, every second (a failure is logged, never fatal)."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await models.reap()
        except Exception:
            log.exception("unloading an idle model failed")


def serve(settings: Settings, **injected: Any) -> int:
    """Run the daemon until it is stopped; its exit status. `injected` goes to Daemon (the tests' launcher
    passes its memory reader and signal handlers), nvllm itself passes nothing."""
    try:
        daemon = Daemon(settings, **injected)
    except ConfigError as e:
        print(f"nvllm serve: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return asyncio.run(daemon.run())
    except (factory.EngineBuildError, ListenError) as e:
        log.error("%s", e)
        if not stream_is_journal(sys.stderr):   # under systemd the log line is enough
            print(f"nvllm serve: {e}", file=sys.stderr)
        return getattr(e, "code", EXIT_CONFIG)
