"""Ollama's API beside OpenAI's on the same app (and, with http.ollama_listen, on a port of its own such as
11434): what Home Assistant, Copilot's Ollama provider and the `ollama` client speak.

GET and HEAD / ("Ollama is running", the clients' probe), GET /api/version, GET /api/tags (every model served,
loaded or not), POST /api/show, GET /api/ps (the loaded ones, with expires_at), POST /api/embed and the older
/api/embeddings (through the pooling path /v1/embeddings takes), POST /api/pull (the daemon's injected puller,
server/models/model_pulls.py; NDJSON progress), DELETE /api/delete, and /api/chat and /api/generate
(ollama_generation.py). The listings' shapes are ollama_models.py's.

Refused, in Ollama's error shape ({"error": "..."}, ollama_errors.py) with its statuses: 400 a bad body or a
missing model field, 401 a missing or wrong key (http.api_key_file, as for every endpoint but / and
/api/version), 404 "model 'x' not found", 409 deleting a model with requests in flight, 500 a failed pull
(as Ollama answers one), 503 starting or draining. /api/copy, /api/create, /api/push and /api/blobs are 501:
nvllm serves model files as they are, it builds none (pull them from the Hub, or name a file).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from nvllm import __version__
from nvllm.engine.assembly.factory import EngineBuildError, ModelDescription, describe_model
from nvllm.server.chat.field_error import FieldError
from nvllm.server.http.body import parse_json
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.ollama_errors import ollama_refused
from nvllm.server.http.ollama_generation import OpenAIApi as Api
from nvllm.server.http.ollama_generation import ollama_chat, ollama_generate
from nvllm.server.http.ollama_models import ps_entry, show_body, tags_entry
from nvllm.server.http.pooling_reader import parse_embeddings
from nvllm.server.http.refusals import refusal
from nvllm.server.logs import request_context
from nvllm.server.models.keep_alive import keep_alive_seconds
from nvllm.server.models.model_pulls import PullFailed
from nvllm.server.models.model_set import ModelBusy, ModelSet, Slot, UnknownModel
from nvllm.server.state import Refused

log = logging.getLogger("nvllm.server.http")

OLLAMA_VERSION = "0.12.0"     # the Ollama release whose API this follows; clients check it for features
NDJSON = "application/x-ndjson"
NOT_HERE = {"/api/copy": "copy a model", "/api/create": "create a model", "/api/push": "push a model",
            "/api/blobs": "take model blobs"}

Handler = Callable[[Request], Awaitable[Response]]


def not_found(name: str) -> ApiError:
    return ApiError(404, f"model '{name[:200]}' not found")


def _ollama(handler: Handler) -> Handler:
    """Every refusal of handler in Ollama's shape."""
    @functools.wraps(handler)
    async def shaped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            if e.status >= 500:
                log.warning("HTTP %d: %s", e.status, e.message)
            return ollama_refused(e)
        except Refused as e:
            return ollama_refused(refusal(e))
    return shaped


class OllamaApi:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.state = api.state
        self._described: dict[tuple[str, int, int], ModelDescription | None] = {}
        self._pulling: set[asyncio.Task] = set()

    def routes(self) -> list[Route]:
        o = _ollama
        routes = [
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/api/version", o(self.version), methods=["GET"]),
            Route("/api/tags", o(self.tags), methods=["GET"]),
            Route("/api/show", o(self.show), methods=["POST"]),
            Route("/api/ps", o(self.ps), methods=["GET"]),
            Route("/api/embed", o(self.embed), methods=["POST"]),
            Route("/api/embeddings", o(self.embeddings), methods=["POST"]),
            Route("/api/pull", o(self.pull), methods=["POST"]),
            Route("/api/delete", o(self.delete), methods=["DELETE"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/generate", self.generate, methods=["POST"]),
        ]
        for path, what in NOT_HERE.items():
            refuse = o(functools.partial(self.not_here, what))
            routes.append(Route(path, refuse, methods=["POST", "DELETE"]))
            if path == "/api/blobs":
                routes.append(Route("/api/blobs/{digest}", refuse, methods=["HEAD", "POST"]))
        return routes

    # -- small endpoints -----------------------------------------------------------------------
    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION, "nvllm_version": __version__})

    async def not_here(self, what: str, request: Request) -> Response:
        raise ApiError(501, f"nvllm does not {what}: it serves model files as they are (pull one from the "
                            "Hugging Face Hub with /api/pull, or give nvllm serve its path)")

    def _models(self, request: Request) -> ModelSet:
        self.api.check_key(request)
        self.state.check_serving()
        assert self.state.models is not None        # serving
        return self.state.models

    async def _describe(self, slot: Slot) -> ModelDescription | None:
        """What the model's files say (cached while they are unchanged); None where they cannot be read."""
        settings = slot.spec.settings
        path = settings.model_path()
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
        if key not in self._described:
            try:
                self._described[key] = await asyncio.get_running_loop().run_in_executor(None, describe_model,
                                                                                         settings)
            except EngineBuildError as e:
                log.warning("cannot describe the model %s: %s", slot.name, e)
                self._described[key] = None
        return self._described[key]

    async def tags(self, request: Request) -> Response:
        models = self._models(request)
        out = []
        for slot in list(models.slots.values()):
            path = slot.spec.settings.model_path()
            out.append(tags_entry(slot.name, path, await self._describe(slot)))
        return JSONResponse({"models": out})

    async def ps(self, request: Request) -> Response:
        models = self._models(request)
        out, now = [], time.time()
        for slot in models.loaded():
            path, engine = slot.spec.settings.model_path(), slot.engine
            out.append(ps_entry(slot.name, path, await self._describe(slot), slot.cost_bytes,
                                models.expires_in(slot), engine.max_model_len if engine is not None else 0, now))
        return JSONResponse({"models": out})

    async def _body(self, request: Request, model_required: bool = True) -> dict[str, Any]:
        self.api.check_key(request)
        body = parse_json(await self.api.read_body(request))
        if "model" not in body and isinstance(body.get("name"), str):     # the older field
            body["model"] = body.pop("name")
        model = body.get("model")
        if model is not None and not isinstance(model, str) or model_required and not model:
            raise bad_request("model", "model is required" if not model else "model must be a string")
        return body

    def _slot(self, name: str) -> Slot:
        models = self.state.models
        self.state.check_serving()
        assert models is not None
        try:
            return models.resolve(name)
        except UnknownModel:
            raise not_found(name) from None

    async def show(self, request: Request) -> Response:
        body = await self._body(request)
        slot = self._slot(body["model"])
        d = await self._describe(slot)
        if d is None:
            raise ApiError(500, f"cannot read the files of the model '{slot.name}'")
        engine = slot.engine
        return JSONResponse(show_body(slot.name, slot.spec.settings.model_path(), d,
                                      bool(self.state.reasoning_parser),
                                      engine.chat_template if engine is not None else None))

    # -- embeddings -------------------------------------------------------------------------------
    async def embed(self, request: Request) -> Response:
        """{"model", "input": str | [str], "truncate", "dimensions", "options", "keep_alive"}."""
        body = await self._body(request)
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise bad_request("input", "input must be a string or a list of strings")
        truncate = body.get("truncate", True)
        if not isinstance(truncate, bool):
            raise bad_request("truncate", "truncate must be true or false")
        vectors, tokens, took = await self._embed(request, body, texts, truncate)
        return JSONResponse({"model": body["model"], "embeddings": vectors, "total_duration": took,
                             "load_duration": 0, "prompt_eval_count": tokens})

    async def embeddings(self, request: Request) -> Response:
        """The older {"model", "prompt"} -> {"embedding": [...]}."""
        body = await self._body(request)
        prompt = body.get("prompt", "")
        if not isinstance(prompt, str):
            raise bad_request("prompt", "prompt must be a string")
        vectors, _, _ = await self._embed(request, body, [prompt] if prompt else [], True)
        return JSONResponse({"embedding": vectors[0] if vectors else []})

    async def _embed(self, request: Request, body: dict[str, Any], texts: list[str],
                     truncate: bool) -> tuple[list[list[float]], int, int]:
        """(the vectors, the prompt tokens, the nanoseconds taken)."""
        t0, rid = time.monotonic(), uuid.uuid4().hex
        try:
            keep_alive = keep_alive_seconds(body["keep_alive"]) if body.get("keep_alive") is not None else None
        except FieldError as e:
            raise bad_request(e.field, e.message) from None
        name = self._slot(body["model"]).name
        if not texts:
            return [], 0, 0
        asked: dict[str, Any] = {"input": texts}
        if body.get("dimensions") is not None:
            asked["dimensions"] = body["dimensions"]
        limit = next((m["max_model_len"] for m in self.state.model_status() if m["name"] == name), None)
        if truncate and limit:
            asked["truncate_prompt_tokens"] = limit
        with request_context(rid):
            req = parse_embeddings(asked, name)
            try:
                outs = await self.api._pool(request, rid, [(p, req.params) for p in req.inputs], 0, t0, "input",
                                            name, keep_alive)
            except UnknownModel:      # deleted meanwhile
                raise not_found(body["model"]) from None
        return ([list(o.pooled or []) for o in outs], sum(o.prompt_tokens for o in outs),
                int((time.monotonic() - t0) * 1e9))

    # -- pull and delete --------------------------------------------------------------------------
    async def pull(self, request: Request) -> Response:
        """{"model" | "name", "insecure", "stream"}: NDJSON progress as Ollama streams it (stream false: one
        {"status": "success"}); a failed pull ends with an {"error": ...} line (stream false: a 500)."""
        body = await self._body(request)
        stream = body.get("stream", True)
        if not isinstance(stream, bool):
            raise bad_request("stream", "stream must be true or false")
        models = self._models(request)
        pulls = self.state.pulls
        if pulls is None:
            raise ApiError(501, "this daemon pulls no models")
        lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def run() -> None:
            try:
                await pulls.pull(models, body["model"], lines.put_nowait)
            except PullFailed as e:
                lines.put_nowait({"error": str(e)})
            except Exception as e:      # never a silent end of the stream
                log.exception("pull failed")
                lines.put_nowait({"error": f"internal error: {type(e).__name__}"})
            finally:
                lines.put_nowait(None)
        task = asyncio.get_running_loop().create_task(run())
        self._pulling.add(task)       # a client that leaves does not stop the pull: it finishes and is served
        task.add_done_callback(self._pulling.discard)
        if not stream:
            await asyncio.shield(task)
            last: dict[str, Any] = {}
            while (line := lines.get_nowait()) is not None:
                last = line
            if "error" in last:
                raise ApiError(500, last["error"])
            return JSONResponse({"status": "success"})
        return StreamingResponse(_ndjson(lines), media_type=NDJSON)

    async def delete(self, request: Request) -> Response:
        body = await self._body(request)
        models = self._models(request)
        pulls = self.state.pulls
        try:
            if pulls is not None:
                await pulls.delete(models, body["model"])
            else:
                await models.remove(body["model"])
        except UnknownModel:
            raise not_found(body["model"]) from None
        except ModelBusy as e:
            raise ApiError(409 if e.in_flight else 400, f"cannot delete: {e}") from None
        return Response(status_code=200)

    # -- generation (ollama_generation.py) ----------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await ollama_chat(self.api, request)

    async def generate(self, request: Request) -> Response:
        return await ollama_generate(self.api, request)


async def _ndjson(lines: asyncio.Queue[dict[str, Any] | None]) -> AsyncIterator[bytes]:
    while (line := await lines.get()) is not None:
        yield (json.dumps(line) + "\n").encode()


__all__ = ["OLLAMA_VERSION", "OllamaApi"]
