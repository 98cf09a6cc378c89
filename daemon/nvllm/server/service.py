"""The gRPC servicer for nvllm.v1.Generator, and the daemon state Health reports.

Generate: validate (INVALID_ARGUMENT naming the proto field), render chat, tokenize (off the event
loop), check admission (UNAVAILABLE while starting or draining, RESOURCE_EXHAUSTED under memory
pressure, with a full queue or when the client already holds server.max_streams_per_client streams),
then stream the engine's deltas. A client that cancels or passes its deadline closes the stream,
which aborts the request in the engine at once.

Streams per client are counted by the peer's address: the IP without the port for TCP (one host is
one client, however many connections it opens); every unix-socket peer shares the key "unix" (gRPC
does not report the peer's uid/pid), so on a unix socket the limit bounds all local clients together.

Requests are decoded by server/wire.py rather than by the generated handler, so that bytes which do
not decode (invalid UTF-8 in a string field) are refused with INVALID_ARGUMENT naming the field.

Nothing here touches an array: numbers come from the engine's stats snapshot and its outputs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import ipaddress
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator, Union
from urllib.parse import unquote

import grpc
import psutil
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from nvllm import __version__
from nvllm.engine.async_engine import AsyncEngine, EngineDead
from nvllm.engine.sequence import RequestOutput
from nvllm.sampling_params import InvalidParameter, SamplingParams, StructuredSpec
from nvllm.server.logs import request_context
from nvllm.server.metrics import Metrics, RequestTracker
from nvllm.server.watchdog import MemoryWatchdog
from nvllm.server.wire import UndecodableRequest, decode_generate_request
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

log = logging.getLogger("nvllm.server.service")

SERVICE_NAME = "nvllm.v1.Generator"
LIVENESS = ""
MAX_REQUEST_ID_CHARS = 128

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}
# The proto's SamplingParams fields share SamplingParams' names, so neither list is written here.
_SAMPLING_FIELDS = frozenset(pb.SamplingParams.DESCRIPTOR.fields_by_name)


class Phase(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"


class Refused(Exception):
    """A request the daemon's state turns away: `busy` for load, memory pressure or the per-client cap
    (gRPC RESOURCE_EXHAUSTED, HTTP 429), else starting or draining (UNAVAILABLE, HTTP 503)."""

    def __init__(self, message: str, busy: bool) -> None:
        super().__init__(message)
        self.busy = busy


class BadRequest(Exception):
    """A request refused before it reaches the engine; `field` is the proto field's path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def process_start_time() -> float:
    """Wall-clock time the process started (for uptime and startup_s), to the kernel's tick.

    The age comes from the kernel's clocks (CLOCK_BOOTTIME less the start tick in /proc/self/stat);
    psutil's create_time adds the boot time, which /proc/stat gives in whole seconds, so it can be up
    to a second early. psutil is the fallback where /proc is not Linux's.
    """
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()     # fields 3.. (the name may hold spaces)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(after_name[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, IndexError, ValueError, AttributeError):
        pass
    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return time.time()


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
        self.streams_by_client: dict[str, int] = {}             # client key -> Generate calls open
        self.phase = Phase.STARTING
        self.engine: AsyncEngine | None = None
        self.watchdog: MemoryWatchdog | None = None
        self.started_at = process_start_time()
        self._tasks: set[asyncio.Task] = set()
        self.startup_s = 0.0
        self.metrics = Metrics(model_name, self)   # every front door reports its requests here

    # -- transitions (event loop thread) ----------------------------------------------------
    async def set_ready(self, engine: AsyncEngine, watchdog: MemoryWatchdog | None) -> None:
        self.engine, self.watchdog = engine, watchdog
        self.phase = Phase.SERVING
        self.startup_s = max(0.0, time.time() - self.started_at)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.sync_readiness()

    async def begin_drain(self) -> None:
        self.phase = Phase.DRAINING
        await self.sync_readiness()

    async def sync_readiness(self) -> None:
        """Readiness follows the state: SERVING only when new requests are admitted."""
        serving = self.state() == pb.HealthResponse.STATE_SERVING
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set(SERVICE_NAME, status)

    def on_admission_change(self, admitting: bool, reason: str) -> None:
        """The watchdog flipped (called on the loop via call_soon_threadsafe)."""
        task = asyncio.get_running_loop().create_task(self.sync_readiness())
        self._tasks.add(task)                     # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    # -- queries ------------------------------------------------------------------------------
    def state(self) -> int:
        if self.phase is Phase.STARTING:
            return pb.HealthResponse.STATE_STARTING
        if self.phase is Phase.DRAINING:
            return pb.HealthResponse.STATE_DRAINING
        if self.not_admitting_reason():
            return pb.HealthResponse.STATE_NOT_ADMITTING
        return pb.HealthResponse.STATE_SERVING

    def not_admitting_reason(self) -> str:
        if self.engine is not None and not self.engine.is_running:
            return "the engine loop is not running"
        if self.watchdog is not None and not self.watchdog.admitting:
            return self.watchdog.reason
        return ""

    # -- admission, shared by every front door (gRPC, HTTP) ------------------------------------
    def check_serving(self) -> None:
        """Refused unless new requests are taken at all (not while starting or draining)."""
        if self.phase is not Phase.SERVING or self.engine is None:
            raise Refused("draining: the daemon is shutting down" if self.phase is Phase.DRAINING
                          else "starting: the model is still loading", busy=False)

    def open_stream(self, client: str) -> None:
        """Count a call against its client's streams; Refused past server.max_streams_per_client."""
        open_streams = self.streams_by_client.get(client, 0)
        limit = self.max_streams_per_client
        if limit and open_streams >= limit:
            raise Refused(f"too many concurrent streams from {client}: {open_streams} open, limit {limit} "
                          f"(server.max_streams_per_client)", busy=True)
        self.streams_by_client[client] = open_streams + 1

    def close_stream(self, client: str) -> None:
        left = self.streams_by_client.get(client, 1) - 1
        if left > 0:
            self.streams_by_client[client] = left
        else:
            self.streams_by_client.pop(client, None)

    def check_admission(self) -> None:
        """Refused for draining, memory pressure, a dead engine or a full queue. Call it with no await
        between it and AsyncEngine.add, so that concurrent calls cannot both pass a full queue."""
        if self.phase is not Phase.SERVING or self.engine is None:
            raise Refused("draining: the daemon is shutting down", busy=False)
        reason = self.not_admitting_reason()
        if reason:
            raise Refused(f"not admitting new requests: {reason}", busy=True)
        queued = self.queue_length(self.engine.stats())
        if queued >= self.max_waiting:
            raise Refused(f"queue full: {queued} waiting, limit {self.max_waiting}", busy=True)

    def queue_length(self, stats: dict[str, Any]) -> int:
        """Requests that would wait for a seat: those queued beyond the free seats."""
        free_seats = max(0, self.max_num_seqs - stats.get("running", 0))
        return max(0, stats.get("waiting", 0) - free_seats)

    def health_response(self) -> pb.HealthResponse:
        state = self.state()
        r = pb.HealthResponse(state=state, model=self.model_name, version=__version__,
                              uptime_s=max(0.0, time.time() - self.started_at), startup_s=self.startup_s)
        if state == pb.HealthResponse.STATE_NOT_ADMITTING:
            r.not_admitting_reason = self.not_admitting_reason()
        if self.engine is not None:
            s = self.engine.stats()
            r.pages_total, r.pages_free, r.pages_cached = s["pages_total"], s["pages_free"], s["pages_cached"]
            r.running, r.waiting = s["running"], s["waiting"]
            r.tokens_per_s = float(s["tokens_per_s"])
        if self.watchdog is not None:
            r.watchdog_low_bytes, r.watchdog_high_bytes = self.watchdog.low_bytes, self.watchdog.high_bytes
            reading = self.watchdog.last_reading
            if reading is not None:
                r.available_memory_bytes = max(0, int(reading.available_bytes))
        return r


# -- request -> engine arguments ------------------------------------------------------------
def sampling_params_from_proto(request: pb.GenerateRequest) -> SamplingParams:
    """The proto's SamplingParams as our dataclass; unset fields keep their defaults (None = model's).
    ListFields gives the optional scalars that are set and the repeated fields that are not empty."""
    sp = request.sampling_params
    params = SamplingParams(**{f.name: _field_value(f, v) for f, v in sp.ListFields()})
    params.structured = structured_from_proto(request)
    return params


def _field_value(f: Any, v: Any) -> Any:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        return dict(v)   # logit_bias
    return list(v) if f.is_repeated else v


def structured_from_proto(request: pb.GenerateRequest) -> StructuredSpec | None:
    """GenerateRequest.structured as the engine's constraint (None: free text). Whether it compiles is the
    engine's to say (INVALID_ARGUMENT naming structured.<kind>)."""
    kind = request.structured.WhichOneof("kind") if request.HasField("structured") else None
    if kind is None:
        return None
    if kind == "json_object":
        if not request.structured.json_object:
            raise BadRequest("structured.json_object",
                             "structured.json_object must be true (leave structured unset for free text)")
        return StructuredSpec("json_object")
    if kind == "choice":
        return StructuredSpec("choice", tuple(request.structured.choice.choices))
    return StructuredSpec(kind, getattr(request.structured, kind))


def proto_field(name: str, input_field: str) -> str:
    """The proto path of a field an InvalidParameter names."""
    if name in _SAMPLING_FIELDS:
        return f"sampling_params.{name}"
    if name in ("prompt", "prompt_token_ids"):
        return input_field    # a prompt too long for the model: blame what the client sent
    if name == "messages":
        return "chat.messages"
    return name


def invalid_message(e: InvalidParameter, input_field: str) -> str:
    field = proto_field(e.field, input_field)
    text = str(e)
    return field + text[len(e.field):] if text.startswith(e.field) else f"{field}: {text}"


def oversized_field(request: pb.GenerateRequest) -> str:
    """The field that makes a request big, for the size error."""
    sizes = {"request_id": len(request.request_id.encode()), "model": len(request.model.encode())}
    which = request.WhichOneof("input")
    if which is not None:
        sizes[which] = getattr(request, which).ByteSize() if which != "prompt" else len(request.prompt.encode())
    if request.HasField("sampling_params"):
        sizes["sampling_params.stop"] = sum(len(s.encode()) for s in request.sampling_params.stop)
        sizes["sampling_params.stop_token_ids"] = 10 * len(request.sampling_params.stop_token_ids)
    if request.HasField("structured"):
        sizes["structured"] = request.structured.ByteSize()
    return max(sizes, key=sizes.__getitem__)


def client_key(peer: str) -> str:
    """Whom a call counts against: "ipv4:10.0.0.7:51234" -> "10.0.0.7", "ipv6:[::1]:51234" -> "::1",
    "ipv6:[::ffff:10.0.0.7]:51234" (IPv4 on a dual-stack socket) -> "10.0.0.7"; unix peers -> "unix"."""
    scheme, _, rest = unquote(peer).partition(":")
    if scheme in ("unix", "unix-abstract"):
        return "unix"
    if scheme not in ("ipv4", "ipv6"):
        return peer
    return host_key(rest.rsplit(":", 1)[0].strip("[]"))


def host_key(host: str) -> str:
    """An address as one client: an IPv4-mapped IPv6 address (IPv4 on a dual-stack socket) as IPv4."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def _refusal_code(e: Refused) -> grpc.StatusCode:
    return grpc.StatusCode.RESOURCE_EXHAUSTED if e.busy else grpc.StatusCode.UNAVAILABLE


async def _abort_refused(context: grpc.aio.ServicerContext, track: RequestTracker, e: Refused) -> None:
    """Ends a call refused for load, memory or the daemon's state: logged when for load, counted, and
    aborted with RESOURCE_EXHAUSTED or UNAVAILABLE (context.abort raises)."""
    if e.busy:
        log.info("refused: %s", e)
    track.refused("busy" if e.busy else "unavailable")
    await context.abort(_refusal_code(e), str(e))


def add_generator_to_server(servicer: "GeneratorService", server: grpc.aio.Server) -> None:
    """nvllm_pb2_grpc.add_GeneratorServicer_to_server, with Generate's requests decoded by
    server/wire.py (so undecodable bytes are refused naming the field)."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=decode_generate_request,
            response_serializer=pb.GenerateResponse.SerializeToString),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health, request_deserializer=pb.HealthRequest.FromString,
            response_serializer=pb.HealthResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class GeneratorService(pb_grpc.GeneratorServicer):
    def __init__(self, state: DaemonState, executor: concurrent.futures.Executor | None = None) -> None:
        self.state = state
        # Tokenizing a long prompt must not block the event loop; two workers are plenty here.
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="nvllm-tokenize")

    # -- Health -------------------------------------------------------------------------------
    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return self.state.health_response()

    # -- Generate -----------------------------------------------------------------------------
    async def Generate(self, request: Union[pb.GenerateRequest, UndecodableRequest],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        t0 = time.monotonic()
        if isinstance(request, UndecodableRequest):
            with request_context(uuid.uuid4().hex):
                log.info("refused: %s", request.message)
                self.state.metrics.request("grpc", t0).refused("invalid")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        rid = request.request_id or uuid.uuid4().hex
        with request_context(rid), self.state.metrics.request("grpc", t0) as track:
            st = self.state
            client = client_key(context.peer())
            try:
                st.check_serving()
                st.open_stream(client)
            except Refused as e:
                await _abort_refused(context, track, e)
            try:
                async with contextlib.aclosing(self._generate(request, context, rid, t0, track)) as responses:
                    async for response in responses:
                        yield response
            finally:
                st.close_stream(client)

    async def _generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext, rid: str,
                        t0: float, track: RequestTracker) -> AsyncIterator[pb.GenerateResponse]:
        """Generate's work once the call counts against its client's streams."""
        st = self.state
        engine = st.engine
        try:
            input_field, prompt, params = self._check(request, rid)
            seq = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._make_sequence, engine, rid, input_field, prompt, params)
        except BadRequest as e:
            log.info("refused: %s", e)
            track.refused("invalid")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # Admission: checked after the (awaited) tokenization and with no await before the
        # engine takes the request, so concurrent calls cannot both pass a full queue.
        try:
            st.check_admission()
        except Refused as e:
            await _abort_refused(context, track, e)
        try:
            stream = engine.add(seq)
        except (InvalidParameter, EngineDead) as e:
            track.refused("invalid" if isinstance(e, InvalidParameter) else "unavailable")
            code = grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, InvalidParameter) else grpc.StatusCode.UNAVAILABLE
            await context.abort(code, str(e))
        track.admitted(seq.num_prompt_tokens)
        log.info("admitted: %d prompt tokens, max_tokens %d", seq.num_prompt_tokens, seq.params.max_tokens)
        first_token_time = None
        try:
            with stream:
                async for out in stream:
                    track.output(out)
                    if out.error is not None:
                        log.error("failed in the engine: %s", out.error)
                        await context.abort(grpc.StatusCode.INTERNAL, f"generation failed: {out.error}")
                    if first_token_time is None and out.token_ids:
                        first_token_time = time.monotonic()
                    yield self._response(rid, out, t0, first_token_time)
                    if out.finished:
                        log.info("finished: %s, %d prompt + %d output tokens (%d cached)%s",
                                 out.finish_reason, out.prompt_tokens, out.completion_tokens,
                                 out.cached_tokens,
                                 "" if first_token_time is None
                                 else f", first token after {1000 * (first_token_time - t0):.0f} ms")
        except asyncio.CancelledError:
            log.info("cancelled (client went away or its deadline passed); request aborted")
            raise
        except InvalidParameter as e:     # the engine refused it (a request id in use)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, invalid_message(e, input_field))

    def _check(self, request: pb.GenerateRequest, rid: str) -> tuple[str, Any, SamplingParams]:
        """Checks that need no tokenizer; returns (input field, prompt or messages, params)."""
        st = self.state
        size = request.ByteSize()
        if size > st.max_message_bytes:
            field = oversized_field(request)
            raise BadRequest(field, f"{field} makes the request {size} bytes; a request may be at most "
                                    f"{st.max_message_bytes} bytes (server.max_message_bytes)")
        if len(rid) > MAX_REQUEST_ID_CHARS:
            raise BadRequest("request_id", f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, "
                                           f"got {len(rid)}")
        if request.model and request.model != st.model_name:
            raise BadRequest("model", f"model must be empty or {st.model_name!r} (the served model), "
                                      f"got {request.model[:64]!r}")
        which = request.WhichOneof("input")
        if which is None:
            raise BadRequest("input", "input must be set: one of prompt, chat or prompt_token_ids")
        if which == "prompt":
            if not request.prompt:
                raise BadRequest("prompt", "prompt must not be empty")
            prompt: Any = request.prompt
        elif which == "chat":
            if not request.chat.messages:
                raise BadRequest("chat.messages", "chat.messages must hold at least one message")
            prompt = {"messages": [{"role": m.role, "content": m.content} for m in request.chat.messages]}
        else:
            if not request.prompt_token_ids.ids:
                raise BadRequest("prompt_token_ids.ids", "prompt_token_ids.ids must hold at least one id")
            prompt = [int(t) for t in request.prompt_token_ids.ids]
        try:
            params = sampling_params_from_proto(request)
        except (TypeError, ValueError) as e:
            raise BadRequest("sampling_params", f"sampling_params: {e}") from None
        return which, prompt, params

    def _make_sequence(self, engine: AsyncEngine, rid: str, input_field: str, prompt: Any,
                       params: SamplingParams):
        """Render chat, tokenize, validate (the engine does all three): runs in the executor."""
        try:
            return engine.make_sequence(rid, prompt, params)
        except InvalidParameter as e:
            raise BadRequest(proto_field(e.field, input_field), invalid_message(e, input_field)) from None

    def _response(self, rid: str, out: RequestOutput, t0: float, first_token_time: float | None
                  ) -> pb.GenerateResponse:
        r = pb.GenerateResponse(request_id=rid, text=out.text, token_ids=out.token_ids)
        for lp in out.logprobs or ():
            r.logprobs.add(token_id=lp.token_id, logprob=lp.logprob,
                           top=[pb.TopLogprob(token_id=t.token_id, logprob=t.logprob, token=t.token) for t in lp.top])
        if out.finished:
            r.finish_reason = _FINISH.get(out.finish_reason or "abort", pb.FINISH_REASON_ABORT)
            if out.finish_reason == "stop" and out.stop_reason is not None:
                if isinstance(out.stop_reason, str):
                    r.stop_str = out.stop_reason
                else:
                    r.stop_token_id = int(out.stop_reason)
            r.usage.prompt_tokens = out.prompt_tokens
            r.usage.completion_tokens = out.completion_tokens
            r.usage.cached_tokens = out.cached_tokens
            if first_token_time is not None:
                r.time_to_first_token_ms = 1000.0 * (first_token_time - t0)
        return r

