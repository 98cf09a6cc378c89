"""The gRPC servicer for nvllm.v1.Generator: Generate and Health, on the daemon's state (state.py).

Generate: validate (INVALID_ARGUMENT naming the proto field, generate_request.py), render chat, tokenize
(off the event loop), check admission (UNAVAILABLE while starting or draining, RESOURCE_EXHAUSTED under
memory pressure, with a full queue or when the client already holds server.max_streams_per_client
streams), then stream the engine's deltas. A client that cancels or passes its deadline closes the
stream, which aborts the request in the engine at once.

Requests are decoded by server/wire.py rather than by the generated handler, so that bytes which do
not decode (invalid UTF-8 in a string field) are refused with INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any, NoReturn

import grpc

from nvllm.engine.async_engine import AsyncEngine, EngineDead
from nvllm.engine.sequence import RequestOutput, Sequence
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.server.generate_request import BadRequest, invalid_message, proto_field, read_request
from nvllm.server.logs import request_context
from nvllm.server.metrics import RequestTracker
from nvllm.server.reasoning import ReasoningStream, answer_thinks, thinking_requested
from nvllm.server.state import SERVICE_NAME, DaemonState, Refused, client_key
from nvllm.server.wire import UndecodableRequest, decode_generate_request
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

log = logging.getLogger("nvllm.server.service")

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT}


def _refusal_code(e: Refused) -> grpc.StatusCode:
    return grpc.StatusCode.RESOURCE_EXHAUSTED if e.busy else grpc.StatusCode.UNAVAILABLE


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """context.abort, which raises; said here so the type checker knows (grpc ships no types)."""
    await context.abort(code, details)
    raise AssertionError("context.abort returned")


async def _abort_refused(context: grpc.aio.ServicerContext, track: RequestTracker, e: Refused) -> NoReturn:
    """Ends a call refused for load, memory or the daemon's state: logged when for load, counted, and
    aborted with RESOURCE_EXHAUSTED or UNAVAILABLE."""
    if e.busy:
        log.info("refused: %s", e)
    track.refused("busy" if e.busy else "unavailable")
    await _abort(context, _refusal_code(e), str(e))


def add_generator_to_server(servicer: GeneratorService, server: grpc.aio.Server) -> None:
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
    async def Generate(self, request: pb.GenerateRequest | UndecodableRequest,
                       context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.GenerateResponse, None]:
        t0 = time.monotonic()
        if isinstance(request, UndecodableRequest):
            with request_context(uuid.uuid4().hex):
                log.info("refused: %s", request.message)
                self.state.metrics.request("grpc", t0).refused("invalid")
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
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
                        t0: float, track: RequestTracker) -> AsyncGenerator[pb.GenerateResponse, None]:
        """Generate's work once the call counts against its client's streams."""
        st = self.state
        engine = st.engine
        assert engine is not None    # Generate's check_serving() passed, and the engine is never unset
        try:
            input_field, prompt, params = read_request(request, rid, st.model_name, st.max_message_bytes)
            seq = await asyncio.get_running_loop().run_in_executor(
                self.executor, self._make_sequence, engine, rid, input_field, prompt, params, request.priority)
        except BadRequest as e:
            log.info("refused: %s", e)
            track.refused("invalid")
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # Admission: checked after the (awaited) tokenization and with no await before the
        # engine takes the request, so concurrent calls cannot both pass a full queue.
        try:
            st.check_admission()
        except Refused as e:
            await _abort_refused(context, track, e)
        reasoning = self._reasoning(input_field, prompt, seq)    # before the engine takes seq
        try:
            stream = engine.add(seq)
        except (InvalidParameter, EngineDead) as e:
            track.refused("invalid" if isinstance(e, InvalidParameter) else "unavailable")
            code = grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, InvalidParameter) else grpc.StatusCode.UNAVAILABLE
            await _abort(context, code, str(e))
        track.admitted(seq.num_prompt_tokens)
        log.info("admitted: %d prompt tokens, max_tokens %d", seq.num_prompt_tokens, seq.params.max_tokens)
        first_token_time = None
        try:
            with stream:
                async for out in stream:
                    track.output(out)
                    if out.error is not None:
                        log.error("failed in the engine: %s", out.error)
                        await _abort(context, grpc.StatusCode.INTERNAL, f"generation failed: {out.error}")
                    if first_token_time is None and out.token_ids:
                        first_token_time = time.monotonic()
                    yield self._response(rid, out, t0, first_token_time, reasoning)
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
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, invalid_message(e, input_field))

    def _make_sequence(self, engine: AsyncEngine, rid: str, input_field: str, prompt: Any,
                       params: SamplingParams, priority: int) -> Sequence:
        """Render chat, tokenize, validate (the engine does all three): runs in the executor."""
        try:
            return engine.make_sequence(rid, prompt, params, priority)
        except InvalidParameter as e:
            raise BadRequest(proto_field(e.field, input_field), invalid_message(e, input_field)) from None

    def _reasoning(self, input_field: str, prompt: Any, seq: Sequence) -> ReasoningStream | None:
        """The answer's thinking reader (server.reasoning_parser): chat only."""
        parser = self.state.reasoning_parser
        if not parser or input_field != "chat":
            return None
        thinks = answer_thinks(seq) and thinking_requested(parser, prompt.get("chat_template_kwargs"))
        return ReasoningStream(parser, thinks)

    def _response(self, rid: str, out: RequestOutput, t0: float, first_token_time: float | None,
                  reasoning: ReasoningStream | None = None) -> pb.GenerateResponse:
        text, thought = out.text, ""
        if reasoning is not None:
            thought, text = reasoning.feed(text, final=out.finished)
        r = pb.GenerateResponse(request_id=rid, text=text, token_ids=out.token_ids, reasoning_text=thought)
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
