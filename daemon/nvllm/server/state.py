"""The daemon's state: what Health reports (read into health.py's Health), what admission reads, and the one
way in (`submit`) shared by every front door (the gRPC service in grpc/service.py, the HTTP API in
http/app.py). It lives on the event loop's thread.

Streams per client are counted by the client's key (clients.py).

Nothing here touches an array: numbers come from the engine's stats snapshot.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from nvllm import __version__
from nvllm.engine.assembly.factory import EngineBuildError
from nvllm.engine.async_engine import AsyncEngine, EngineDead, PendingRequest, RequestStream
from nvllm.engine.prompt import Prompt, Tokenized
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.server.board.heat_monitor import HeatMonitor
from nvllm.server.board.memory_watchdog import MemoryWatchdog
from nvllm.server.health import DRAINING, NOT_ADMITTING, SERVING, STARTING, Health, process_start_time
from nvllm.server.metrics import Metrics
from nvllm.server.models.model_pulls import ModelPulls
from nvllm.server.models.model_set import Lease, ModelSet, NoRoom, UnknownModel
from nvllm.server.models.model_update import ModelUpdates
from nvllm.server.models.speech_slot import SpeechSlot
from nvllm.server.reading import Params, Reading, Served
from nvllm.server.submission import Submission

log = logging.getLogger("nvllm.server.state")

SERVICE_NAME = "nvllm.v1.Generator"   # readiness is reported under it, liveness under ""
LIVENESS = ""
API_NAMES = {"grpc": "gRPC", "http": "HTTP"}   # the metrics' api label -> how the log says it
TOKENIZE_THREADS = 2    # prompts rendered and tokenized, constraints compiled, off the event loop


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"


class Refused(Exception):
    """A request the daemon's state turns away: `busy` for load, memory pressure or the per-client cap
    (gRPC RESOURCE_EXHAUSTED, HTTP 429), else starting or draining (UNAVAILABLE, HTTP 503); `no_room` a
    model the memory budget cannot hold beside those in use (RESOURCE_EXHAUSTED, HTTP 503)."""

    def __init__(self, message: str, busy: bool, no_room: bool = False, per_client: bool = False) -> None:
        super().__init__(message)
        self.busy = busy or no_room
        self.no_room = no_room
        self.per_client = per_client    # the client's own stream cap: never forwarded to an upstream


class _Unread(Exception):
    """A reader's refusal, carried through submit's bookkeeping to be raised again as it was."""

    def __init__(self, refusal: Exception) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class DaemonState:
    """What Health reports and what admission checks read; lives on the event loop's thread.

    The async engine and the watchdog arrive once the model is loaded; until then the state is
    STARTING and every Generate is UNAVAILABLE.
    """

    def __init__(self, model_name: str, health: HealthServicer, max_waiting: int, max_num_seqs: int,
                 max_message_bytes: int, max_streams_per_client: int = 0) -> None:
        self.model_name = model_name
        self.health = health
        self.max_waiting = max_waiting
        self.max_num_seqs = max_num_seqs
        self.max_message_bytes = max_message_bytes
        self.max_streams_per_client = max_streams_per_client   # 0: no limit
        self.reasoning_parser = ""       # server.reasoning_parser: chat answers' thinking apart (chat/reasoning.py)
        self.context_overflow = "error"  # server.context_overflow: a chat's, where the request sets none
        self.speech = SpeechSlot()       # which served model transcribes, the audio limits (server.speech_model...)
        self.streams_by_client: dict[str, int] = {}             # client key -> Generate calls open
        self.phase = Phase.STARTING
        self.heat: HeatMonitor | None = None    # the board's heat ([power]); None when power.enabled is off
        self.models: ModelSet | None = None     # every model served, by name (models/model_set.py), once started
        self.pulls: ModelPulls | None = None    # models pulled and deleted while serving (models/model_pulls.py)
        self.updates = ModelUpdates()           # new versions of served models put in service (models/model_update.py)
        self.watchdog: MemoryWatchdog | None = None
        self.started_at = process_start_time()
        self._tasks: set[asyncio.Task] = set()
        self.startup_s = 0.0
        self.metrics = Metrics(model_name, self)   # every front door reports its requests here
        self.tokenizing = concurrent.futures.ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="nvllm-tokenize")

    # -- transitions (event loop thread) ----------------------------------------------------
    async def set_ready(self, engine: AsyncEngine | ModelSet, watchdog: MemoryWatchdog | None) -> None:
        """engine: the models served, or one engine serving the model of this state's name."""
        self.models = engine if isinstance(engine, ModelSet) else ModelSet.serving(self.model_name, engine,
                                                                                  self.max_num_seqs)
        self.watchdog = watchdog
        self.phase = Phase.SERVING
        self.startup_s = max(0.0, time.time() - self.started_at)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.sync_readiness()

    async def begin_drain(self) -> None:
        self.phase = Phase.DRAINING
        await self.sync_readiness()

    async def sync_readiness(self) -> None:
        """Readiness follows the state: SERVING only when new requests are admitted."""
        serving = self.state() == SERVING
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set(SERVICE_NAME, status)

    def on_admission_change(self, admitting: bool, reason: str) -> None:
        """The watchdog flipped (called on the loop via call_soon_threadsafe)."""
        task = asyncio.get_running_loop().create_task(self.sync_readiness())
        self._tasks.add(task)                     # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    # -- queries ------------------------------------------------------------------------------
    def state(self) -> str:
        """starting, serving, not_admitting or draining (health.py's states)."""
        if self.phase is Phase.STARTING:
            return STARTING
        if self.phase is Phase.DRAINING:
            return DRAINING
        if self.not_admitting_reason():
            return NOT_ADMITTING
        return SERVING

    def not_admitting_reason(self) -> str:
        stopped = [s.name for s in self.models.loaded() if not s.engine or not s.engine.is_running] \
            if self.models is not None and self.phase is Phase.SERVING else []
        if stopped:
            return f"the engine loop of {', '.join(stopped)} is not running"
        if self.watchdog is not None and not self.watchdog.admitting:
            return self.watchdog.reason
        return ""

    # -- admission, shared by every front door (gRPC, HTTP) ------------------------------------
    @property
    def engine(self) -> AsyncEngine | None:
        """The default model's engine, while it is loaded."""
        return self.models.slots[self.models.default].engine if self.models is not None else None

    def resolve(self, model: str | None) -> str:
        """The served model a request's model field names (empty: the default); UnknownModel otherwise."""
        if self.models is None:
            if model and model != self.model_name:
                raise UnknownModel(model, [self.model_name])
            return self.model_name
        return self.models.resolve(model).name

    async def lease(self, model: str | None) -> Lease:
        """The named model, loaded (loading it first where it is not): UnknownModel for a name this daemon
        does not serve; Refused while starting or draining, when the memory budget cannot hold it beside the
        models in use (no_room), or when it cannot be loaded."""
        self.check_serving()
        assert self.models is not None      # serving: the models were set
        try:
            return await self.models.lease(model)
        except NoRoom as e:
            raise Refused(f"not enough memory to load the model: {e}", busy=True, no_room=True) from None
        except EngineBuildError as e:
            raise Refused(f"the model {model or self.model_name!r} could not be loaded: {e}", busy=False) from None

    def served(self, lease: Lease) -> Served:
        return Served(lease.name, lease.engine, lease.max_num_seqs, self.reasoning_parser)

    def check_serving(self) -> None:
        """Refused unless new requests are taken at all (not while starting or draining)."""
        if self.phase is not Phase.SERVING or self.models is None:
            raise Refused("draining: the daemon is shutting down" if self.phase is Phase.DRAINING
                          else "starting: the model is still loading", busy=False)

    def open_stream(self, client: str) -> None:
        """Count a call against its client's streams; Refused past server.max_streams_per_client."""
        open_streams = self.streams_by_client.get(client, 0)
        limit = self.max_streams_per_client
        if limit and open_streams >= limit:
            raise Refused(f"too many concurrent streams from {client}: {open_streams} open, limit {limit} "
                          f"(server.max_streams_per_client)", busy=True, per_client=True)
        self.streams_by_client[client] = open_streams + 1

    def close_stream(self, client: str) -> None:
        left = self.streams_by_client.get(client, 1) - 1
        if left > 0:
            self.streams_by_client[client] = left
        else:
            self.streams_by_client.pop(client, None)

    def check_admission(self, lease: Lease) -> None:
        """Refused for draining, memory pressure, a dead engine or a full queue of the model. Call it with no
        await between it and AsyncEngine.add, so that concurrent calls cannot both pass a full queue."""
        if self.phase is not Phase.SERVING:
            raise Refused("draining: the daemon is shutting down", busy=False)
        reason = self.not_admitting_reason()
        if reason:
            raise Refused(f"not admitting new requests: {reason}", busy=True)
        if not lease.engine.is_running:
            raise Refused(f"not admitting new requests: the engine loop of {lease.name} is not running", busy=True)
        queued = queue_length(lease.engine.stats(), lease.max_num_seqs)
        if queued >= self.max_waiting:
            raise Refused(f"queue full: {queued} waiting, limit {self.max_waiting}", busy=True)

    # -- the one way in ------------------------------------------------------------------------
    async def submit(self, api: str, client: str, request_id: str,
                     asked: Sequence[tuple[Prompt, Params]] | Callable[[Served], Reading], priority: int = 0,
                     arrival: float | None = None, note: str = "", model: str | None = None,
                     keep_alive_s: float | None = None) -> Submission:
        """Hand a front door's request to the engine: one engine request per (prompt, params) choice, ids
        request_id or request_id-<i>. `asked` is the choices, or the front door's reader, called with the
        model leased (a chat is read by the model's template) and returning its Reading (the choices, the
        priority, the note and the keep_alive in place of the arguments).

        In order: the serving check; with a reader, the named `model` leased and the request read; the
        client's stream count; without one, the model leased; rendering, tokenizing and compiling any
        constraint (off the event loop), admission, and the hand-over with no await after admission. The
        submission owns the lease and gives it back, with keep_alive_s as the model's keep_alive from then
        on. Raises Refused, InvalidParameter (the engine's checks; a reading's `refusal` names the front
        door's own field instead), UnknownModel, EngineDead or what the reader raised, each refusal counted in
        the metrics and logged here (what a front door refuses before, its wire format, it counts itself).
        `note` ends the admission's log line."""
        arrival = time.monotonic() if arrival is None else arrival
        opened = False
        lease: Lease | None = None
        reading: Reading | None = None
        try:
            self.check_serving()
            if callable(asked):
                lease = await self.lease(model)
                try:
                    reading = asked(self.served(lease))
                except Exception as e:       # the front door's refusal of what it read, in its own shape
                    raise _Unread(e) from e
                choices, priority, note, keep_alive_s = (reading.choices, reading.priority, reading.note,
                                                         reading.keep_alive_s)
            else:
                choices = asked
            self.open_stream(client)
            opened = True
            lease = lease or await self.lease(model)
            ids = [request_id] if len(choices) == 1 else [f"{request_id}-{i}" for i in range(len(choices))]
            _default_overflow(choices, self.context_overflow)
            pending = await asyncio.get_running_loop().run_in_executor(
                self.tokenizing, _prepare, lease.engine, ids, choices, priority)
            self.check_admission(lease)
            streams = _hand_over(lease.engine, pending)
        except (Refused, InvalidParameter, EngineDead, UnknownModel, _Unread) as e:
            if opened:
                self.close_stream(client)
            if lease is not None:
                lease.release()
            cause = e.refusal if isinstance(e, _Unread) else e
            log.info("refused: %s", cause)
            busy = isinstance(e, Refused) and e.busy
            self.metrics.request(api, arrival).refused(
                "busy" if busy else "invalid" if isinstance(e, (InvalidParameter, UnknownModel, _Unread))
                else "unavailable")
            if isinstance(e, _Unread):
                raise e.refusal from None
            if isinstance(e, InvalidParameter) and reading is not None:
                raise reading.refusal(e) from None
            raise
        except BaseException:      # cancelled while tokenizing: nothing reached the engine
            if opened:
                self.close_stream(client)
            if lease is not None:
                lease.release()
            raise
        trackers = [self.metrics.request(api, arrival, lease.name) for _ in pending]
        for t, p in zip(trackers, pending):
            t.admitted(p.prompt_tokens)
        what = f"max_tokens {pending[0].max_tokens}" if pending[0].max_tokens else "pooled"
        log.info("admitted over %s: %d choice%s, %d prompt tokens, %s%s", API_NAMES.get(api, api),
                 len(pending), "" if len(pending) == 1 else "s", pending[0].prompt_tokens, what, note)
        held = lease

        def release() -> None:
            self.close_stream(client)
            held.release(keep_alive_s)
        return Submission(request_id, streams, trackers, [p.prompt_tokens for p in pending],
                          [p.max_tokens for p in pending], pending[0].thinks, release)

    async def tokenize(self, prompt: Prompt, add_special_tokens: bool = True, add_generation_prompt: bool = True,
                       return_token_strs: bool = False, model: str | None = None,
                       keep_alive_s: float | None = None) -> tuple[Tokenized, int]:
        """A prompt's token ids as a generation request to the model would get them, off the event loop, and
        the model's max_model_len; Refused while starting or draining (or as lease refuses), InvalidParameter
        naming the field."""
        lease = await self.lease(model)
        try:
            done = await asyncio.get_running_loop().run_in_executor(
                self.tokenizing, lease.engine.tokenize, prompt, add_special_tokens, add_generation_prompt,
                return_token_strs)
            return done, lease.engine.max_model_len
        finally:
            lease.release(keep_alive_s)

    async def detokenize(self, ids: list[Any], model: str | None = None, keep_alive_s: float | None = None) -> str:
        """Token ids as text (InvalidParameter for an id outside the vocabulary), off the event loop."""
        lease = await self.lease(model)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.tokenizing, lease.engine.detokenize, ids)
        finally:
            lease.release(keep_alive_s)

    def model_status(self) -> list[dict[str, Any]]:
        """Every model served (model_set.ModelSet.status), with its max_model_len: its engine's, or its
        settings' while unloaded (None: the model's own limit, known once loaded)."""
        if self.models is None:
            return [{"name": self.model_name, "state": "loading", "max_model_len": None, "stats": None,
                     "pinned": False, "keep_alive_s": 0.0, "bytes": 0, "requests": 0, "loads": 0, "default": True,
                     "retiring": 0, "update_state": "", "update_error": "", "updates": {}}]
        out = self.models.status()
        for m in out:
            slot = self.models.slots[m["name"]]
            m["max_model_len"] = slot.engine.max_model_len if slot.engine is not None else \
                slot.spec.settings.scheduler.max_model_len
        return out

    def read_health(self) -> Health:
        """What Health reports, read once for every front door to shape (health.py)."""
        state = self.state()
        watchdog, heat, models = self.watchdog, self.heat, self.models
        reading = watchdog.last_reading if watchdog is not None else None
        return Health(
            state=state, model=self.model_name, version=__version__,
            uptime_s=max(0.0, time.time() - self.started_at), startup_s=self.startup_s,
            not_admitting_reason=self.not_admitting_reason() if state == NOT_ADMITTING else "",
            engine=self.engine.stats() if self.engine is not None else None, models=self.model_status(),
            memory_budget_bytes=models.budget_bytes if models is not None else 0,
            memory_held_bytes=models.used_bytes() if models is not None else 0,
            watchdog_low_bytes=watchdog.low_bytes if watchdog is not None else 0,
            watchdog_high_bytes=watchdog.high_bytes if watchdog is not None else 0,
            available_memory_bytes=max(0, int(reading.available_bytes)) if reading is not None else None,
            thermal_throttled=heat.throttled if heat is not None else False,
            throttle_reason=heat.reason if heat is not None else "",
            cpu_temperature_celsius=heat.cpu_celsius if heat is not None else None)

def queue_length(stats: dict[str, Any], max_num_seqs: int) -> int:
    """Requests that would wait for a seat: those queued beyond the free seats."""
    free_seats = max(0, max_num_seqs - stats.get("running", 0))
    return max(0, stats.get("waiting", 0) - free_seats)


def _default_overflow(choices: Sequence[tuple[Prompt, Params]], default: str) -> None:
    """The server's context_overflow onto each chat choice that sets none."""
    for prompt, params in choices:
        if isinstance(params, SamplingParams) and params.context_overflow is None and \
                isinstance(prompt, Mapping) and "messages" in prompt:
            params.context_overflow = default


def _prepare(engine: AsyncEngine, ids: list[str], choices: Sequence[tuple[Prompt, Params]],
             priority: int) -> list[PendingRequest]:
    """Each choice checked and tokenized (in the tokenize pool); a refused one of several carries its place
    (InvalidParameter.index), so that the front door can name it."""
    pending = []
    for i, (rid, (prompt, params)) in enumerate(zip(ids, choices)):
        try:
            pending.append(engine.prepare(rid, prompt, params, priority))
        except InvalidParameter as e:
            if len(choices) > 1:
                e.index = i
            raise
    return pending


def _hand_over(engine: AsyncEngine, pending: list[PendingRequest]) -> list[RequestStream]:
    """Every choice to the engine, or none: one refused closes (aborts) those already taken."""
    streams: list[RequestStream] = []
    try:
        for p in pending:
            streams.append(engine.add(p))
    except BaseException:
        for s in streams:
            s.close()
        raise
    return streams
