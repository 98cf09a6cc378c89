"""The gRPC servicer for nvllm.v1.Generator: Generate, Tokenize, Embed, Rerank, Transcribe and Health, on the
daemon's state (server/state.py). Embed and Rerank read their proto (pooling_rpc.py) and run through
server/pooling.py; Transcribe is transcribe_rpc.py's, and a Generate chat's audio is heard first (chat_audio.py).

Generate is a translation, as the HTTP handlers are: bytes that do not decode, an oversized request or a bad
id are refused first (INVALID_ARGUMENT naming the field); then `DaemonState.submit`, the one way in, leases
the model and reads the proto by it through this front door's reader (generate_request.py), and refuses,
counts and logs as for every front door; what it raises is mapped onto a status (UNAVAILABLE while starting
or draining, RESOURCE_EXHAUSTED under memory pressure, with a full queue or when the client already holds
server.max_streams_per_client streams, NOT_FOUND for a model not served, INVALID_ARGUMENT for what the
reader or the engine refuses). The engine's deltas are streamed as responses: a chat's text read by
server/chat/answer.py's AnswerStream, as the HTTP API reads it, into text, reasoning_text and tool_calls. A
client that cancels or passes its deadline closes the stream, which aborts the request in the engine at once.
Tokenize: read the proto (tokenize_rpc.py), then the prompt's ids through `DaemonState.tokenize`, off the
event loop. Health: the daemon's Health shaped as HealthResponse (health_reply.py).

Requests are decoded by wire.py rather than by the generated handler, so that bytes which do not decode
(invalid UTF-8 in a string field) are refused with INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, NoReturn

import grpc

from nvllm.engine.async_engine import EngineDead
from nvllm.engine.outputs import RequestOutput
from nvllm.sampling_params import InvalidParameter
from nvllm.server.chat.answer import ARGUMENTS, CALL, REASONING, TEXT, AnswerStream
from nvllm.server.chat.tool_plan import ToolPlan
from nvllm.server.clients import client_key
from nvllm.server.grpc.chat_audio import ChatAudioRefused, hear_chat
from nvllm.server.grpc.forward_generate import ANSWERED_BY_KEY, forwardable, generate_responses, openai_body
from nvllm.server.grpc.generate_request import (
    BadRequest,
    GenerateArgs,
    check_envelope,
    invalid_message,
    read_keep_alive,
    read_request,
)
from nvllm.server.grpc.health_reply import health_reply
from nvllm.server.grpc.pooling_rpc import PoolingArgs, pooling_message, read_embed, read_rerank
from nvllm.server.grpc.reload_rpc import reload_model
from nvllm.server.grpc.tokenize_rpc import read_tokenize
from nvllm.server.grpc.transcribe_rpc import decode_transcribe_request, transcribe
from nvllm.server.grpc.wire import (
    UndecodableRequest,
    decode_embed_request,
    decode_generate_request,
    decode_rerank_request,
    decode_tokenize_request,
)
from nvllm.server.logs import request_context
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.pooling import PoolingFailed, ranked, run_pooling
from nvllm.server.reading import Reading, Served
from nvllm.server.state import SERVICE_NAME, DaemonState, Refused
from nvllm.server.submission import Submission
from nvllm.server.upstream.forwarder import Forwarder
from nvllm.server.upstream.upstream_client import UpstreamFailed
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

log = logging.getLogger("nvllm.server.service")

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH, "abort": pb.FINISH_REASON_ABORT,
           "tool_calls": pb.FINISH_REASON_TOOL_CALLS}


def _refusal_code(e: Refused) -> grpc.StatusCode:
    return grpc.StatusCode.RESOURCE_EXHAUSTED if e.busy else grpc.StatusCode.UNAVAILABLE


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """context.abort, which raises; said here so the type checker knows (grpc ships no types)."""
    await context.abort(code, details)
    raise AssertionError("context.abort returned")


def chat_answer(parser: str, input_field: str, prompt: Any, thinks: bool,
                plan: ToolPlan | None = None) -> AnswerStream | None:
    """A chat answer's reader: its thinking (server.reasoning_parser) and its tool calls (the request's
    plan). None where the text goes out as it comes: not a chat, or nothing to read apart."""
    if input_field != "chat" or (not parser and (plan is None or plan.style is None)):
        return None
    return AnswerStream(plan, parser, thinks, prompt.get("chat_template_kwargs"))


def _unread(request: pb.GenerateRequest | UndecodableRequest, rid: str, max_message_bytes: int) -> str | None:
    """Why a Generate request is refused before anything else, or None: its bytes did not decode, or its size
    or id is wrong."""
    if isinstance(request, UndecodableRequest):
        return request.message
    try:
        check_envelope(request, rid, max_message_bytes)
    except BadRequest as e:
        return str(e)
    return None


def add_generator_to_server(servicer: GeneratorService, server: grpc.aio.Server) -> None:
    """nvllm_pb2_grpc.add_GeneratorServicer_to_server, with Generate's requests decoded by
    grpc/wire.py (so undecodable bytes are refused naming the field)."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate, request_deserializer=decode_generate_request,
            response_serializer=pb.GenerateResponse.SerializeToString),
        "Tokenize": grpc.unary_unary_rpc_method_handler(
            servicer.Tokenize, request_deserializer=decode_tokenize_request,
            response_serializer=pb.TokenizeResponse.SerializeToString),
        "Embed": grpc.unary_unary_rpc_method_handler(
            servicer.Embed, request_deserializer=decode_embed_request,
            response_serializer=pb.EmbedResponse.SerializeToString),
        "Rerank": grpc.unary_unary_rpc_method_handler(
            servicer.Rerank, request_deserializer=decode_rerank_request,
            response_serializer=pb.RerankResponse.SerializeToString),
        "Transcribe": grpc.stream_stream_rpc_method_handler(
            servicer.Transcribe, request_deserializer=decode_transcribe_request,
            response_serializer=pb.TranscribeResponse.SerializeToString),
        "Health": grpc.unary_unary_rpc_method_handler(
            servicer.Health, request_deserializer=pb.HealthRequest.FromString,
            response_serializer=pb.HealthResponse.SerializeToString),
        "ReloadModel": grpc.unary_unary_rpc_method_handler(
            servicer.ReloadModel, request_deserializer=pb.ReloadModelRequest.FromString,
            response_serializer=pb.ReloadModelResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class GeneratorService(pb_grpc.GeneratorServicer):
    def __init__(self, state: DaemonState, upstreams: Forwarder | None = None) -> None:
        """upstreams: where Generate requests go that would be refused here (None: nowhere)."""
        self.state = state
        self.upstreams = upstreams

    # -- Health -------------------------------------------------------------------------------
    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        return health_reply(self.state.read_health())

    # -- ReloadModel (reload_rpc.py) ------------------------------------------------------------
    async def ReloadModel(self, request: pb.ReloadModelRequest,
                          context: grpc.aio.ServicerContext) -> pb.ReloadModelResponse:
        return await reload_model(self.state, request, context)

    # -- Tokenize -----------------------------------------------------------------------------
    async def Tokenize(self, request: pb.TokenizeRequest | UndecodableRequest,
                       context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        st = self.state
        if isinstance(request, UndecodableRequest):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.message)
        name = await self._model(request.model, context)
        if request.model:      # an alias, or a name with ":latest": read as the served name
            request.model = name
        try:
            args = read_tokenize(request, name, st.max_message_bytes)
            keep_alive = read_keep_alive(request.keep_alive)
        except BadRequest as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            done, max_len = await st.tokenize(args.prompt, args.add_special_tokens, args.add_generation_prompt,
                                              request.return_token_strs, model=name, keep_alive_s=keep_alive)
        except Refused as e:
            await _abort(context, _refusal_code(e), str(e))
        except InvalidParameter as e:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, invalid_message(e, args.input_field))
        return pb.TokenizeResponse(token_ids=done.ids, token_strs=done.strs or [], max_model_len=max_len)

    async def _model(self, model: str, context: grpc.aio.ServicerContext) -> str:
        """The served model a request names (empty: the default); NOT_FOUND naming the choices otherwise."""
        try:
            return self.state.resolve(model)
        except UnknownModel as e:
            await _abort(context, grpc.StatusCode.NOT_FOUND, str(e))

    # -- Embed, Rerank -------------------------------------------------------------------------
    async def Embed(self, request: pb.EmbedRequest | UndecodableRequest,
                    context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        rid, outs = await self._pool(request, context, read_embed, "inputs")
        r = pb.EmbedResponse(request_id=rid, prompt_tokens=sum(o.prompt_tokens for o in outs))
        for o in outs:
            r.embeddings.add(values=o.pooled or [], prompt_tokens=o.prompt_tokens)
        return r

    async def Rerank(self, request: pb.RerankRequest | UndecodableRequest,
                     context: grpc.aio.ServicerContext) -> pb.RerankResponse:
        rid, outs = await self._pool(request, context, read_rerank, "documents")
        assert isinstance(request, pb.RerankRequest)   # _pool refused anything else
        r = pb.RerankResponse(request_id=rid, prompt_tokens=sum(o.prompt_tokens for o in outs))
        for x in ranked(outs, request.top_n):
            r.results.add(index=x.index, relevance_score=x.relevance_score)
        return r

    async def _pool(self, request: Any, context: grpc.aio.ServicerContext, read: Callable[..., PoolingArgs],
                    items: str) -> tuple[str, list[RequestOutput]]:
        """A pooling request read, run through DaemonState.submit (server/pooling.py) and collected."""
        t0, st = time.monotonic(), self.state
        rid = getattr(request, "request_id", "") or uuid.uuid4().hex
        with request_context(rid):
            try:
                if isinstance(request, UndecodableRequest):
                    raise BadRequest(request.field, request.message)
                name = st.resolve(request.model)
                if request.model:      # an alias, or a name with ":latest": read as the served name
                    request.model = name
                args = read(request, name, st.max_message_bytes)
                keep_alive = read_keep_alive(request.keep_alive)
            except (BadRequest, UnknownModel) as e:
                log.info("refused: %s", e)
                st.metrics.request("grpc", t0).refused("invalid")
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, BadRequest)
                             else grpc.StatusCode.NOT_FOUND, str(e))
            try:
                return rid, await run_pooling(st, "grpc", client_key(context.peer()), rid, args.choices,
                                              request.priority, t0, name, keep_alive)
            except Refused as e:
                await _abort(context, _refusal_code(e), str(e))
            except InvalidParameter as e:
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, pooling_message(e, items))
            except (EngineDead, PoolingFailed) as e:
                failed = isinstance(e, PoolingFailed) and not e.aborted
                await _abort(context, grpc.StatusCode.INTERNAL if failed else grpc.StatusCode.UNAVAILABLE, str(e))

    # -- Transcribe ---------------------------------------------------------------------------
    async def Transcribe(self, requests: Any, context: grpc.aio.ServicerContext
                         ) -> AsyncGenerator[pb.TranscribeResponse, None]:
        async with contextlib.aclosing(transcribe(self.state, requests, context)) as responses:
            async for response in responses:
                yield response

    # -- Generate -----------------------------------------------------------------------------
    async def Generate(self, request: pb.GenerateRequest | UndecodableRequest,
                       context: grpc.aio.ServicerContext) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The request handed in through DaemonState.submit, read there from the proto by the model leased,
        its outputs as responses."""
        t0 = time.monotonic()
        st = self.state
        rid = (request.request_id if isinstance(request, pb.GenerateRequest) else "") or uuid.uuid4().hex
        with request_context(rid):
            # What the wire refuses before the model is leased: bytes that do not decode, the size and the
            # id (an oversized request never loads a model).
            unread = _unread(request, rid, st.max_message_bytes)
            if unread is not None:
                log.info("refused: %s", unread)
                st.metrics.request("grpc", t0).refused("invalid")
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, unread)
            assert isinstance(request, pb.GenerateRequest)
            try:     # the voice query: a chat's audio transcribed first (the request then holds the text)
                heard = await hear_chat(st, request, client_key(context.peer()), rid, t0)
            except ChatAudioRefused as e:
                await _abort(context, e.code, e.details)
            args: GenerateArgs | None = None
            asked_model, served_name = request.model, ""
            invalid: InvalidParameter | None = None     # the engine's refusal behind the reader's
            if self.upstreams and st.heat is not None and st.heat.throttled:    # hot: the upstream first
                answered: list[bool] = []
                async with contextlib.aclosing(self._forwarded(request, context, rid, "hot",
                                                               [asked_model or st.model_name], answered)) as relayed:
                    async for response in relayed:
                        yield response
                if answered:
                    return

            def read(served: Served) -> Reading:
                nonlocal args, served_name
                served_name = served.model_name
                if request.model:      # an alias, or a name with ":latest": read as the served name
                    request.model = served.model_name
                args = read_request(request, rid, served.model_name, st.max_message_bytes,
                                    served.engine.chat_template)
                a = args

                def refuse(e: InvalidParameter) -> BadRequest:
                    nonlocal invalid
                    invalid = e
                    return BadRequest(e.field, invalid_message(e, a.input_field, a.constraint_param))
                return Reading([(a.prompt, a.params)], refuse, request.priority,
                               keep_alive_s=read_keep_alive(request.keep_alive))
            refused: BadRequest | UnknownModel | Refused | None = None
            try:
                sub = await st.submit("grpc", client_key(context.peer()), rid, read, arrival=t0,
                                      model=request.model)
            except (BadRequest, UnknownModel, Refused) as e:
                refused = e
            except EngineDead as e:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
            if refused is not None:      # an upstream may answer what is refused here
                if self.upstreams:
                    names, answered = [asked_model or st.model_name, served_name], []
                    reason = Forwarder.reason(refused, invalid)
                    async with contextlib.aclosing(self._forwarded(request, context, rid, reason, names,
                                                                   answered)) as relayed:
                        async for response in relayed:
                            yield response
                    if answered:
                        return
                code = grpc.StatusCode.INVALID_ARGUMENT if isinstance(refused, BadRequest) else \
                    grpc.StatusCode.NOT_FOUND if isinstance(refused, UnknownModel) else _refusal_code(refused)
                await _abort(context, code, str(refused))
            assert args is not None     # submit read it
            async with sub:
                answer = chat_answer(st.reasoning_parser, args.input_field, args.prompt, sub.thinks, args.tool_plan)
                async with contextlib.aclosing(self._responses(sub, context, rid, t0, answer)) as responses:
                    async for response in responses:
                        if heard:     # what was heard, on the first response
                            response.transcripts.extend(heard)
                            heard = []
                        yield response

    async def _forwarded(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext, rid: str,
                         reason: str | None, names: list[str],
                         answered: list[bool]) -> AsyncGenerator[pb.GenerateResponse, None]:
        """The answer of the upstream that takes the request for reason, as responses, the metadata saying
        where it was answered (answered then holds True); nothing where none takes it or it fails before its
        first event (answered stays empty: the caller refuses or answers as without it)."""
        assert self.upstreams is not None
        up = self.upstreams.route(names, reason)
        if up is None or reason is None or not forwardable(request):
            return
        try:
            path, body = openai_body(request, request.model or names[0])
        except ValueError:     # a schema or kwargs that are not JSON: refused here, naming them
            return
        events = await self.upstreams.events(up, reason, path, body)
        if events is None:
            return
        answered.append(True)
        await context.send_initial_metadata(((ANSWERED_BY_KEY, up.answered_by),))
        try:
            async with contextlib.aclosing(generate_responses(events, rid)) as responses:
                async for response in responses:
                    yield response
        except UpstreamFailed as e:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"{e} mid-stream")
        finally:
            await events.aclose()

    async def _responses(self, sub: Submission, context: grpc.aio.ServicerContext, rid: str, t0: float,
                         answer: AnswerStream | None) -> AsyncGenerator[pb.GenerateResponse, None]:
        first_token_time = None
        try:
            async with contextlib.aclosing(aiter(sub)) as outputs:
                async for _, out in outputs:
                    if out.error is not None:
                        log.error("failed in the engine: %s", out.error)
                        await _abort(context, grpc.StatusCode.INTERNAL, f"generation failed: {out.error}")
                    if first_token_time is None and out.token_ids:
                        first_token_time = time.monotonic()
                    yield self._response(rid, out, t0, first_token_time, answer)
                    if out.finished:
                        log.info("finished: %s, %d prompt + %d output tokens (%d cached)%s",
                                 answer.finish_reason(out.finish_reason) if answer is not None else out.finish_reason,
                                 out.prompt_tokens, out.completion_tokens, out.cached_tokens,
                                 "" if first_token_time is None
                                 else f", first token after {1000 * (first_token_time - t0):.0f} ms")
        except asyncio.CancelledError:
            log.info("cancelled (client went away or its deadline passed); request aborted")
            raise
        except InvalidParameter as e:     # the engine refused it (a request id in use)
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _response(self, rid: str, out: RequestOutput, t0: float, first_token_time: float | None,
                  answer: AnswerStream | None = None) -> pb.GenerateResponse:
        r = pb.GenerateResponse(request_id=rid, token_ids=out.token_ids)
        if answer is None:
            r.text = out.text
        else:
            for d in answer.feed(out.text, final=out.finished):
                if d.kind == TEXT:
                    r.text += d.text
                elif d.kind == REASONING:
                    r.reasoning_text += d.text
                elif d.kind == CALL:
                    r.tool_calls.add(index=d.index, id=d.call_id, name=d.name)
                elif d.kind == ARGUMENTS:    # onto its call's delta in this message, else a delta of its own
                    last = r.tool_calls[-1] if r.tool_calls and r.tool_calls[-1].index == d.index else \
                        r.tool_calls.add(index=d.index)
                    last.arguments += d.text
        for lp in out.logprobs or ():
            r.logprobs.add(token_id=lp.token_id, logprob=lp.logprob,
                           top=[pb.TopLogprob(token_id=t.token_id, logprob=t.logprob, token=t.token) for t in lp.top])
        if out.finished:
            reason = answer.finish_reason(out.finish_reason) if answer is not None else out.finish_reason
            r.finish_reason = _FINISH.get(reason or "abort", pb.FINISH_REASON_ABORT)
            if reason == "stop" and out.stop_reason is not None:
                if isinstance(out.stop_reason, str):
                    r.stop_str = out.stop_reason
                else:
                    r.stop_token_id = int(out.stop_reason)
            r.usage.prompt_tokens = out.prompt_tokens
            r.usage.completion_tokens = out.completion_tokens
            r.usage.cached_tokens = out.cached_tokens
            r.usage.dropped_prompt_tokens = out.dropped_prompt_tokens
            if first_token_time is not None:
                r.time_to_first_token_ms = 1000.0 * (first_token_time - t0)
        return r
