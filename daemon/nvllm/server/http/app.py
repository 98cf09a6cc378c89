"""The OpenAI-compatible HTTP API as a Starlette app, on the daemon's DaemonState and AsyncEngine.

POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics, and vLLM's
POST /tokenize and POST /detokenize (the prompt's token ids as a generation request would get them); for
an embedding model POST /v1/embeddings, for a reranker POST /v1/rerank and /rerank (server/pooling.py).
OpenAI's Responses API, stateless: POST /v1/responses (responses_request.py, responses_response.py).
Anthropic's Messages API: POST /v1/messages and POST /v1/messages/count_tokens (anthropic_request.py,
anthropic_response.py), its errors in Anthropic's shape. Speech: POST /v1/audio/transcriptions and
/v1/audio/translations (transcription_api.py), and a chat's input_audio parts heard first (input_audio.py).
Ollama's POST /api/chat and /api/generate (ollama_generation.py), answered as newline-delimited JSON.

A generation request goes in as the gRPC API's do, through `DaemonState.submit`: the key (401), starting
or draining (503), the body's size (413) and its JSON are checked here; submit leases the model named (404
for one not served) and reads the body by it with the dialect's reader (400 naming the parameter), then
the client's stream cap (429), tokenizing off the loop, admission (429 for a full queue or memory
pressure). n choices are n engine requests on the same prompt (the prefix cache shares its full
pages). A client that closes the connection, mid-stream or while a whole response is computed, aborts its
requests: their pages come back at once.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

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
from nvllm.server.clients import host_key
from nvllm.server.health import DRAINING, NOT_ADMITTING, SERVING, STARTING
from nvllm.server.http.anthropic_request import anthropic_invalid, read_count_tokens
from nvllm.server.http.anthropic_response import MESSAGES, anthropic_refused
from nvllm.server.http.auth import check_key
from nvllm.server.http.body import parse_json
from nvllm.server.http.delivery import event_stream, ndjson_stream, whole
from nvllm.server.http.dialect import NDJSON, Asked, Dialect
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.forwarded_answer import forwarded_answer
from nvllm.server.http.input_audio import HeardAnswer, hear_chat
from nvllm.server.http.ollama_api import OllamaApi
from nvllm.server.http.openai_request import ParsedRequest, parse_chat, parse_completion
from nvllm.server.http.openai_response import ResponseBuilder
from nvllm.server.http.pooling_reader import parse_embeddings, parse_rerank, pooling_refusal
from nvllm.server.http.pooling_response import embeddings_response, rerank_response
from nvllm.server.http.refusals import refusal, request_model
from nvllm.server.http.responses_request import read_responses
from nvllm.server.http.responses_response import ResponsesAnswer
from nvllm.server.http.tokenize_reader import parse_detokenize, parse_tokenize
from nvllm.server.http.transcription_api import TranscriptionApi
from nvllm.server.logs import request_context
from nvllm.server.metrics import Metrics
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.pooling import PoolingFailed, ranked, run_pooling
from nvllm.server.reading import Reading, Served
from nvllm.server.state import DaemonState, Refused
from nvllm.server.upstream.forwarder import CHAT_PATH, COMPLETIONS_PATH, Forwarder

log = logging.getLogger("nvllm.server.http")

# A refusal's status -> the metrics' reason (server/metrics.py's REFUSALS).
_REFUSAL_REASON = {429: "busy", 503: "unavailable"}


def http_client_key(request: Request) -> str:
    """Whom a request counts against: the peer's IP (an IPv4-mapped IPv6 as IPv4), as gRPC counts it,
    so one host's streams over both APIs share server.max_streams_per_client."""
    return host_key(request.client.host if request.client else "unknown")


def not_found(e: UnknownModel) -> ApiError:
    return ApiError(404, str(e), "model", "model_not_found")


class OpenAIApi:
    def __init__(self, state: DaemonState, api_key: bytes | None = None, max_body_bytes: int = 1 << 20,
                 metrics: Metrics | None = None, upstreams: Forwarder | None = None) -> None:
        """metrics: the daemon's Metrics (server/metrics.py), served at /metrics (None: no such page);
        upstreams: where chat completions and completions go that would be refused here (None: nowhere)."""
        self.state = state
        self.upstreams = upstreams
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    def app(self) -> Starlette:
        speech = TranscriptionApi(self.state, self.check_key, refusal, http_client_key)
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
            Route("/v1/audio/transcriptions", speech.transcriptions, methods=["POST"]),
            Route("/v1/audio/translations", speech.translations, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_page, methods=["GET"]),
            *OllamaApi(self).routes(),
        ]
        return Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error,
                                                            Exception: _internal_error})

    def check_key(self, request: Request) -> None:
        check_key(self.api_key, request.headers.get("authorization"), request.headers.get("x-api-key"))

    # -- small endpoints ------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        """Every model served, loaded or not (Ollama's and llama-server's router list them all)."""
        self.check_key(request)
        st = self.state
        return JSONResponse({"object": "list", "data": [
            {"id": m["name"], "object": "model", "created": int(st.started_at), "owned_by": "nvllm",
             "loaded": m["state"] == "loaded", "state": m["state"], "max_model_len": m["max_model_len"]}
            for m in st.model_status()]})

    async def health(self, request: Request) -> Response:
        """200 only when new requests are admitted; 503 with the state and the reason otherwise."""
        h = self.state.read_health()
        body: dict[str, Any] = {"state": h.state, "model": h.model, "version": h.version,
                                "uptime_s": round(h.uptime_s, 3)}
        if h.state == NOT_ADMITTING:
            body["reason"] = h.not_admitting_reason
        elif h.state in (STARTING, DRAINING):
            body["reason"] = ("the model is still loading" if h.state == STARTING
                              else "the daemon is shutting down")
        if h.engine is not None:
            body.update({k: h.engine[k] for k in ("running", "waiting", "pages_total", "pages_backed", "pages_free",
                                                  "pages_cached", "kv_cache_dtype", "page_bytes")})
        body.update(thermal_throttled=h.thermal_throttled, throttle_reason=h.throttle_reason,
                    cpu_temperature_celsius=h.cpu_temperature_celsius, memory_budget_bytes=h.memory_budget_bytes,
                    memory_held_bytes=h.memory_held_bytes)
        body["models"] = [{**{k: v for k, v in m.items() if k != "stats"},
                           **({k: m["stats"][k] for k in ("running", "waiting", "pages_total", "pages_free")}
                              if m["stats"] is not None else {})} for m in h.models]
        return JSONResponse(body, status_code=200 if h.state == SERVING else 503)

    async def _model_body(self, request: Request) -> tuple[dict[str, Any], str, float | None]:
        """The body, the served model it names (404 otherwise) and its keep_alive."""
        self.check_key(request)
        body = parse_json(await self.read_body(request))
        model, keep_alive = request_model(body)
        try:
            name = self.state.resolve(model)
        except UnknownModel as e:
            raise not_found(e) from None
        if model:       # an alias, or a name with ":latest": read as the served name
            body["model"] = name
        return body, name, keep_alive

    async def tokenize(self, request: Request) -> Response:
        st = self.state
        body, name, keep_alive = await self._model_body(request)
        req = parse_tokenize(body, name)
        try:
            done, max_len = await st.tokenize(req.prompt, req.add_special_tokens, req.add_generation_prompt,
                                              req.return_token_strs, model=name, keep_alive_s=keep_alive)
        except InvalidParameter as e:
            raise bad_request(e.field, str(e)) from None
        except Refused as e:
            raise refusal(e) from None
        return JSONResponse({"count": len(done.ids), "max_model_len": max_len, "tokens": done.ids,
                             "token_strs": done.strs})

    async def detokenize(self, request: Request) -> Response:
        st = self.state
        body, name, keep_alive = await self._model_body(request)
        ids = parse_detokenize(body, name)
        try:
            text = await st.detokenize(ids, model=name, keep_alive_s=keep_alive)
        except InvalidParameter as e:
            raise bad_request("tokens", str(e).replace("prompt_token_ids", "tokens", 1)) from None
        except Refused as e:
            raise refusal(e) from None
        return JSONResponse({"prompt": text})

    # -- pooling --------------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        """OpenAI's embeddings: each input one engine request, batched by the scheduler."""
        t0, rid = time.monotonic(), uuid.uuid4().hex
        with request_context(rid):
            body, name, keep_alive = await self._pooling_body(request, t0)
            req = parse_embeddings(body, name)
            outs = await self._pool(request, rid, [(p, req.params) for p in req.inputs], req.priority, t0, "input",
                                    name, keep_alive)
            return JSONResponse(embeddings_response(outs, name, req.encoding_format),
                                headers={"X-Request-Id": rid})

    async def rerank(self, request: Request) -> Response:
        """A query against documents: each pair one engine request to the cross-encoder, results best first."""
        t0, rid = time.monotonic(), uuid.uuid4().hex
        with request_context(rid):
            body, name, keep_alive = await self._pooling_body(request, t0)
            req = parse_rerank(body, name)
            pairs: list[tuple[Prompt, PoolingParams]] = [({"query": req.query, "document": d}, req.params)
                                                         for d in req.documents]
            outs = await self._pool(request, rid, pairs, req.priority, t0, "documents", name, keep_alive)
            return JSONResponse(rerank_response(rid, ranked(outs, req.top_n), req.documents, outs, name,
                                                req.return_documents), headers={"X-Request-Id": rid})

    async def _pooling_body(self, request: Request, t0: float) -> tuple[dict[str, Any], str, float | None]:
        try:
            return await self._model_body(request)
        except ApiError as e:
            self.state.metrics.request("http", arrival=t0).refused(_REFUSAL_REASON.get(e.status, "invalid"))
            raise

    async def _pool(self, request: Request, rid: str, choices: list[tuple[Prompt, PoolingParams]], priority: int,
                    t0: float, items: str, model: str, keep_alive: float | None) -> list[RequestOutput]:
        try:
            return await run_pooling(self.state, "http", http_client_key(request), rid, choices, priority, t0,
                                     model, keep_alive)
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
    def _read_chat(self, body: dict[str, Any], st: Served) -> ParsedRequest:
        # the template tells the model's tool-call format (tool_plan.py)
        return parse_chat(body, st.model_name, st.max_num_seqs, st.engine.chat_template)

    def _openai(self, read: Callable[[dict[str, Any], Served], ParsedRequest]) -> Dialect:
        return Dialect(read, lambda req, rid, served, thinks: ResponseBuilder(req, rid, served.model_name,
                                                                             served.reasoning_parser, thinks))

    async def chat_completions(self, request: Request) -> Response:
        return await self.generate(request, self._openai(self._read_chat), hears=True, forward=CHAT_PATH)

    async def completions(self, request: Request) -> Response:
        return await self.generate(request, self._openai(
            lambda body, st: parse_completion(body, st.model_name, st.max_num_seqs)), forward=COMPLETIONS_PATH)

    async def messages(self, request: Request) -> Response:
        return await self.generate(request, MESSAGES)

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's count_tokens: the prompt a /v1/messages request would have, tokenized as it would be."""
        st = self.state
        lease = None
        try:
            body, name, keep_alive = await self._model_body(request)
            lease = await st.lease(name)       # the template renders the prompt and the tools
            prompt, origins = read_count_tokens(body, st.served(lease))
            done, _ = await st.tokenize(prompt, model=name, keep_alive_s=keep_alive)
        except InvalidParameter as e:
            return anthropic_refused(anthropic_invalid(e, origins))
        except Refused as e:
            return anthropic_refused(refusal(e))
        except ApiError as e:
            return anthropic_refused(e)
        finally:
            if lease is not None:
                lease.release()
        return JSONResponse({"input_tokens": len(done.ids)})

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API, stateless: the whole conversation comes as input items every time."""
        return await self.generate(request, Dialect(read_responses, ResponsesAnswer.start))

    async def generate(self, request: Request, dialect: Dialect, hears: bool = False,
                       body: dict[str, Any] | None = None, forward: str = "") -> Response:
        """A generation request in any of the API's dialects: its body read, handed in through
        DaemonState.submit, the answer built from its outputs; every refusal in the dialect's shape. hears:
        the chat's audio parts are transcribed first (the voice query, input_audio.py); body: the body,
        where the caller read it already (after the key check), as Ollama's endpoints do; forward: the path
        at an upstream that answers it where it would be refused here (OpenAI's two endpoints alone)."""
        try:
            return await self._generate(request, dialect, hears, body, forward)
        except ApiError as e:
            if e.status >= 500:
                log.warning("HTTP %d: %s", e.status, e.message)
            return dialect.refused(e)

    async def _generate(self, request: Request, dialect: Dialect, hears: bool = False,
                        body: dict[str, Any] | None = None, forward: str = "") -> Response:
        t0 = time.monotonic()
        rid = uuid.uuid4().hex
        st = self.state
        with request_context(rid):
            try:   # what HTTP refuses before the one way in: the key, starting or draining (a 503), the body
                self.check_key(request)
                st.check_serving()
                if body is None:
                    body = parse_json(await self.read_body(request))
                original = copy.deepcopy(body) if forward and self.upstreams else None   # as the client sent it
                model, keep_alive = request_model(body)
            except (ApiError, Refused) as e:
                err = refusal(e) if isinstance(e, Refused) else e
                st.metrics.request("http", arrival=t0).refused(_REFUSAL_REASON.get(err.status, "invalid"))
                raise err from None
            if original is not None and st.heat is not None and st.heat.throttled:   # hot: upstream first
                answered = await self._forward(original, "hot", [model or st.model_name], forward)
                if answered is not None:
                    return answered
            heard = await hear_chat(st, body, http_client_key(request), rid, t0, refusal) if hears else []
            asked: Asked | None = None
            served: Served | None = None
            invalid: InvalidParameter | None = None     # the engine's refusal behind the reader's

            def refuse(e: InvalidParameter) -> Exception:
                nonlocal invalid
                invalid = e
                assert asked is not None
                return asked.refusal(e)

            def read(model_served: Served) -> Reading:   # by the model leased: a chat is read by its template
                nonlocal asked, served
                if body.get("model"):   # an alias, or a name with ":latest": read as the served name
                    body["model"] = model_served.model_name
                asked, served = dialect.read(body, model_served), model_served
                return Reading(asked.choices(), refuse, asked.priority,
                               f", user {asked.user!r}" if asked.user else "", keep_alive)
            try:
                sub = await st.submit("http", http_client_key(request), rid, read, arrival=t0, model=model)
            except (Refused, UnknownModel, ApiError) as e:
                if original is not None:        # an upstream may answer what is refused here
                    names = [model or st.model_name, served.model_name if served is not None else ""]
                    answered = await self._forward(original, Forwarder.reason(e, invalid), names, forward)
                    if answered is not None:
                        return answered
                if isinstance(e, Refused):
                    raise refusal(e) from None
                if isinstance(e, UnknownModel):
                    raise not_found(e) from None
                raise
            except EngineDead as e:
                raise ApiError(503, str(e), code="unavailable") from None
            assert asked is not None and served is not None    # submit read it
            answering = dialect.answering(asked, rid, served, sub.thinks)
            if heard:
                answering = HeardAnswer(answering, heard)
            if asked.stream:
                return (ndjson_stream if dialect.streams == NDJSON else event_stream)(sub, answering, rid, t0)
            async with sub:
                return await whole(request, sub, answering, rid)

    async def _forward(self, body: dict[str, Any], reason: str | None, names: list[str],
                       path: str) -> Response | None:
        """The answer of the upstream that takes this request for reason; None: none does, or it failed."""
        assert self.upstreams is not None
        up = self.upstreams.route(names, reason)
        if up is None or reason is None:
            return None
        if not body.get("model"):       # the default model here: named, since the upstream's default differs
            body = {**body, "model": names[0]}
        return await forwarded_answer(self.upstreams, up, reason, path, body)

    async def read_body(self, request: Request) -> bytes:
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
