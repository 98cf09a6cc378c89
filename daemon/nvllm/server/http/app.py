"""The OpenAI-compatible HTTP API as a Starlette app, on the daemon's DaemonState and AsyncEngine.

POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics, and vLLM's
POST /tokenize and POST /detokenize (the prompt's token ids as a generation request would get them); for
an embedding model POST /v1/embeddings, for a reranker POST /v1/rerank and /rerank (server/pooling.py).
OpenAI's Responses API, stateless: POST /v1/responses (responses_request.py, responses_response.py).
Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens (anthropic_request.py,
anthropic_response.py), its errors in Anthropic's shape.

A generation request is read here, then goes in as the gRPC API's do, through `DaemonState.submit`: the
key (401), the body's size (413), its JSON and parameters (400 naming the parameter), then starting or
draining (503), the client's stream cap (429), tokenizing off the loop, admission (429 for a full queue or
memory pressure). n choices are n engine requests on the same prompt (the prefix cache shares its full
pages). A client that closes the connection, mid-stream or while a whole response is computed, aborts its
requests: their pages come back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nvllm.engine.async_engine import EngineDead
from nvllm.engine.outputs import RequestOutput
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter
from nvllm.server.http.anthropic_request import anthropic_invalid, read_count_tokens
from nvllm.server.http.anthropic_response import MESSAGES, anthropic_refused
from nvllm.server.http.auth import check_key
from nvllm.server.http.dialect import Answering, Dialect, Event
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.openai_request import ParsedRequest, parse_chat, parse_completion, parse_json
from nvllm.server.http.openai_response import ResponseBuilder
from nvllm.server.http.pooling_request import parse_embeddings, parse_rerank, pooling_refusal
from nvllm.server.http.pooling_response import embeddings_response, rerank_response
from nvllm.server.http.responses_request import read_responses
from nvllm.server.http.responses_response import ResponsesAnswer
from nvllm.server.http.tokenize_request import parse_detokenize, parse_tokenize
from nvllm.server.logs import request_context
from nvllm.server.metrics import Metrics
from nvllm.server.pooling import PoolingFailed, ranked, run_pooling
from nvllm.server.state import DaemonState, Phase, Refused, host_key
from nvllm.server.submission import Submission

log = logging.getLogger("nvllm.server.http")

PING_S = 15.0           # an SSE comment line this often keeps proxies from closing a quiet stream
# A refusal's status -> the metrics' reason (server/metrics.py's REFUSALS).
_REFUSAL_REASON = {429: "busy", 503: "unavailable"}


def http_client_key(request: Request) -> str:
    """Whom a request counts against: the peer's IP (an IPv4-mapped IPv6 as IPv4), as gRPC counts it,
    so one host's streams over both APIs share server.max_streams_per_client."""
    return host_key(request.client.host if request.client else "unknown")


def refusal(e: Refused) -> ApiError:
    return ApiError(429 if e.busy else 503, str(e), code="overloaded" if e.busy else "unavailable")


class OpenAIApi:
    def __init__(self, state: DaemonState, api_key: bytes | None = None, max_body_bytes: int = 1 << 20,
                 metrics: Metrics | None = None) -> None:
        """metrics: the daemon's Metrics (server/metrics.py), served at /metrics (None: no such page)."""
        self.state = state
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/responses", self.responses, methods=["POST"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
            Route("/v1/rerank", self.rerank, methods=["POST"]),
            Route("/rerank", self.rerank, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                            Exception: _internal_error})

    def check_key(self, request: Request) -> None:
        check_key(self.api_key, request.headers.get("authorization"), request.headers.get("x-api-key"))

    # -- small endpoints ------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        self.check_key(request)
        st = self.state
        return JSONResponse({"object": "list", "data": [
            {"id": st.model_name, "object": "model", "created": int(st.started_at), "owned_by": "nvllm",
             "max_model_len": st.engine.engine.max_model_len if st.engine is not None else None}]})

    async def health(self, request: Request) -> Response:
        """200 only when new requests are admitted; 503 with the state and the reason otherwise."""
        st = self.state
        h = st.health_response()
        state = {Phase.STARTING: "starting", Phase.DRAINING: "draining"}.get(st.phase) or \
            ("not_admitting" if st.not_admitting_reason() else "serving")
        body: dict[str, Any] = {"state": state, "model": st.model_name, "version": h.version,
                                "uptime_s": round(h.uptime_s, 3)}
        if state == "not_admitting":
            body["reason"] = st.not_admitting_reason()
        elif state in ("starting", "draining"):
            body["reason"] = ("the model is still loading" if state == "starting"
                              else "the daemon is shutting down")
        if st.engine is not None:
            body.update(running=h.running, waiting=h.waiting, pages_total=h.pages_total,
                        pages_backed=h.pages_backed, pages_free=h.pages_free, pages_cached=h.pages_cached,
                        kv_cache_dtype=h.kv_cache_dtype, page_bytes=h.page_bytes)
        return JSONResponse(body, status_code=200 if state == "serving" else 503)

    async def tokenize(self, request: Request) -> Response:
        self.check_key(request)
        st = self.state
        req = parse_tokenize(parse_json(await self._read_body(request)), st.model_name)
        try:
            done = await st.tokenize(req.prompt, req.add_special_tokens, req.add_generation_prompt,
                                     req.return_token_strs)
        except InvalidParameter as e:
            raise bad_request(e.field, str(e)) from None
        except Refused as e:
            raise refusal(e) from None
        assert st.engine is not None     # tokenize refuses before the engine is made
        return JSONResponse({"count": len(done.ids), "max_model_len": st.engine.engine.max_model_len,
                             "tokens": done.ids, "token_strs": done.strs})

    async def detokenize(self, request: Request) -> Response:
        self.check_key(request)
        st = self.state
        ids = parse_detokenize(parse_json(await self._read_body(request)), st.model_name)
        try:
            text = await st.detokenize(ids)
        except InvalidParameter as e:
            raise bad_request("tokens", str(e).replace("prompt_token_ids", "tokens", 1)) from None
        except Refused as e:
            raise refusal(e) from None
        return JSONResponse({"prompt": text})

    # -- pooling --------------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings: each input one engine request, batched by the scheduler."""
        t0, rid, st = time.monotonic(), uuid.uuid4().hex, self.state
        with request_context(rid):
            body = await self._pooling_body(request, t0)
            req = parse_embeddings(body, st.model_name)
            outs = await self._pool(request, rid, [(p, req.params) for p in req.inputs], req.priority, t0, "input")
            return JSONResponse(embeddings_response(outs, st.model_name, req.encoding_format),
                                headers={"X-Request-Id": rid})

    async def rerank(self, request: Request) -> Response:
        """A query against documents: each pair one engine request to the cross-encoder, results best first."""
        t0, rid, st = time.monotonic(), uuid.uuid4().hex, self.state
        with request_context(rid):
            body = await self._pooling_body(request, t0)
            req = parse_rerank(body, st.model_name)
            pairs: list[tuple[Prompt, PoolingParams]] = [({"query": req.query, "document": d}, req.params)
                                                         for d in req.documents]
            outs = await self._pool(request, rid, pairs, req.priority, t0, "documents")
            return JSONResponse(rerank_response(rid, ranked(outs, req.top_n), req.documents, outs, st.model_name,
                                                req.return_documents), headers={"X-Request-Id": rid})

    async def _pooling_body(self, request: Request, t0: float) -> dict[str, Any]:
        try:
            self.check_key(request)
            return parse_json(await self._read_body(request))
        except ApiError as e:
            self.state.metrics.request("http", arrival=t0).refused(_REFUSAL_REASON.get(e.status, "invalid"))
            raise

    async def _pool(self, request: Request, rid: str, choices: list[tuple[Prompt, PoolingParams]], priority: int,
                    t0: float, items: str) -> list[RequestOutput]:
        try:
            return await run_pooling(self.state, "http", http_client_key(request), rid, choices, priority, t0)
        except Refused as e:
            raise refusal(e) from None
        except InvalidParameter as e:
            raise pooling_refusal(e, items) from None
        except EngineDead as e:
            raise ApiError(503, str(e), code="unavailable") from None
        except PoolingFailed as e:
            raise ApiError(503 if e.aborted else 500, str(e), code="unavailable" if e.aborted else "engine_error") \
                from None

    async def metrics_page(self, request: Request) -> Response:
        if self.metrics is None:
            raise ApiError(404, "metrics are not available", code="not_found")
        body, content_type = self.metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

    # -- generation -----------------------------------------------------------------------------
    def _read_chat(self, body: dict[str, Any], st: DaemonState) -> ParsedRequest:
        engine = st.engine      # the template tells the model's tool-call format (tool_plan.py)
        return parse_chat(body, st.model_name, st.max_num_seqs, engine.chat_template if engine is not None else None)

    def _openai(self, read: Callable[[dict[str, Any], DaemonState], ParsedRequest]) -> Dialect:
        return Dialect(read, lambda req, rid, st, thinks: ResponseBuilder(req, rid, st.model_name,
                                                                         st.reasoning_parser, thinks))

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, self._openai(self._read_chat))

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, self._openai(
            lambda body, st: parse_completion(body, st.model_name, st.max_num_seqs)))

    async def messages(self, request: Request) -> Response:
        return await self.generate(request, MESSAGES)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's count_tokens: the prompt a /v1/messages request would have, tokenized as it would be."""
        st = self.state
        try:
            self.check_key(request)
            prompt, origins = read_count_tokens(parse_json(await self._read_body(request)), st)
            try:
                done = await st.tokenize(prompt)
            except InvalidParameter as e:
                raise anthropic_invalid(e, origins) from None
            except Refused as e:
                raise refusal(e) from None
        except ApiError as e:
            return anthropic_refused(e)
        return JSONResponse({"input_tokens": len(done.ids)})

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API, stateless: the whole conversation comes as input items every time."""
        return await self.generate(request, Dialect(read_responses, ResponsesAnswer.start))

    async def generate(self, request: Request, dialect: Dialect) -> Response:
        """A generation request in any of the API's dialects: its body read, handed in through
        DaemonState.submit, the answer built from its outputs; every refusal in the dialect's shape."""
        try:
            return await self._generate(request, dialect)
        except ApiError as e:
            if e.status >= 500:
                log.warning("HTTP %d: %s", e.status, e.message)
            return dialect.refused(e)

    async def _generate(self, request: Request, dialect: Dialect) -> Response:
        t0 = time.monotonic()
        rid = uuid.uuid4().hex
        st = self.state
        with request_context(rid):
            try:
                self.check_key(request)
                if st.engine is None:   # starting: reading a chat needs the model's template, so 503 first
                    st.check_serving()
                asked = dialect.read(parse_json(await self._read_body(request)), st)
            except Refused as e:
                st.metrics.request("http", arrival=t0).refused("unavailable")
                raise refusal(e) from None
            except ApiError as e:
                st.metrics.request("http", arrival=t0).refused(_REFUSAL_REASON.get(e.status, "invalid"))
                raise
            try:
                sub = await st.submit("http", http_client_key(request), rid, asked.choices(), asked.priority, t0,
                                      f", user {asked.user!r}" if asked.user else "")
            except Refused as e:
                raise refusal(e) from None
            except InvalidParameter as e:
                raise asked.refusal(e) from None
            except EngineDead as e:
                raise ApiError(503, str(e), code="unavailable") from None
            answering = dialect.answering(asked, rid, st, sub.thinks)
            if asked.stream:    # the event stream gives back what the request holds when it ends
                return _EventStream(self._events(sub, answering, rid, t0), sub, ping=PING_S, sep="\n",
                                    headers={"X-Request-Id": rid})
            async with sub:
                return await self._whole(request, sub, answering, rid)

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused with 413 as soon as it passes http.max_body_bytes (never read whole first)."""
        limit = self.max_body_bytes
        declared = request.headers.get("content-length")
        too_big = ApiError(413, f"the request body is larger than {limit} bytes (http.max_body_bytes)",
                           code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
        except ClientDisconnect:
            log.info("the client went away before sending the whole body")
            raise ApiError(400, "the client closed the connection before sending the whole body") from None
        return b"".join(chunks)

    async def _whole(self, request: Request, sub: Submission, answering: Answering, rid: str) -> Response:
        """Collect every choice; a client that disconnects meanwhile aborts them."""
        collect = asyncio.ensure_future(_collect(sub, answering))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():
                collect.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await collect
                sub.close()
        if collect.cancelled():
            log.info("cancelled (the client went away); request aborted")
            return Response(status_code=499)    # nobody reads it
        collect.result()           # raises the engine's failure as ApiError
        log.info("finished over HTTP: %d prompt + %d output tokens", *answering.token_counts())
        return JSONResponse(answering.response(), headers={"X-Request-Id": rid})

    async def _events(self, sub: Submission, answering: Answering, rid: str, t0: float) -> AsyncIterator[Event]:
        """The SSE events as the engine makes the outputs, then the closing ones. Leaving early (the client
        disconnected, the server stops) aborts whatever is unfinished."""
        extra = {"request_id": rid}
        first: float | None = None
        try:
            async with contextlib.aclosing(aiter(sub)) as outputs:
                async for index, out in outputs:
                    try:
                        _raise_failure(out)
                    except ApiError as e:
                        yield answering.failed(e)
                        return
                    if first is None and out.token_ids:
                        first = time.monotonic()
                    for event in answering.events(index, out):
                        yield event
            for event in answering.closing():
                yield event
            log.info("finished over HTTP: %d prompt + %d output tokens%s", *answering.token_counts(),
                     "" if first is None else f", first token after {1000 * (first - t0):.0f} ms", extra=extra)
        except (asyncio.CancelledError, GeneratorExit):
            log.info("cancelled (the client went away); request aborted", extra=extra)
            raise
        finally:
            sub.close()


class _EventStream(EventSourceResponse):
    """Server-sent events that close their Submission however they end: a disconnect may cancel the response
    before its generator ever started, when the generator's own cleanup would never run."""

    def __init__(self, content: AsyncIterator[dict[str, str]], sub: Submission, **kw: Any) -> None:
        super().__init__(content, **kw)
        self.sub = sub

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.sub.close()


async def _collect(sub: Submission, answering: Answering) -> None:
    async with contextlib.aclosing(aiter(sub)) as outputs:
        async for index, out in outputs:
            _raise_failure(out)
            answering.add(index, out)


def _raise_failure(out: RequestOutput) -> None:
    if out.error is not None:
        log.error("failed in the engine: %s", out.error)
        raise ApiError(500, f"generation failed: {out.error}", code="engine_error")
    if out.finished and out.finish_reason == "abort":
        raise ApiError(503, "the request was aborted: the daemon is shutting down", code="unavailable")


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.status >= 500:
        log.warning("HTTP %d: %s", exc.status, exc.message)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return ApiError(404, f"no such path: {request.method} {request.url.path[:200]}", code="not_found").response()
    if exc.status_code == 405:
        return ApiError(405, f"{request.method} is not allowed on {request.url.path[:200]}",
                        code="method_not_allowed").response()
    return ApiError(exc.status_code, str(exc.detail)).response()


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("HTTP handler failed")
    return ApiError(500, f"internal error: {type(exc).__name__}", code="internal_error").response()


__all__ = ["OpenAIApi", "bad_request"]
