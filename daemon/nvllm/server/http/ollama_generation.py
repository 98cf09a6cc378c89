"""Ollama's /api/chat and /api/generate: the body read (after the key), the model it names resolved (404 in
Ollama's words), then, as Ollama does, a request with nothing to answer (no messages; no prompt and no
system) loads the model and answers {"done": true, "done_reason": "load"}, or with keep_alive 0 unloads it
("unload"); anything else is one more dialect of the one way in, OpenAIApi.generate with OLLAMA_CHAT or
OLLAMA_GENERATE (ollama_request.py reads it, ollama_response.py answers it). Every refusal in Ollama's shape.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nvllm.engine.outputs import RequestOutput
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.server.http.body import STRING, parse_json
from nvllm.server.http.dialect import Dialect
from nvllm.server.http.errors import ApiError
from nvllm.server.http.ollama_errors import ollama_refused
from nvllm.server.http.ollama_request import CHAT, GENERATE
from nvllm.server.http.ollama_response import chat_dialect, created_at, generate_dialect
from nvllm.server.http.refusals import refusal, request_model
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import DaemonState, Refused

log = logging.getLogger("nvllm.server.http")

_REASONS = {429: "busy", 503: "unavailable"}


class OpenAIApi(Protocol):
    """What Ollama's endpoints (these and ollama_api.py's) use of app.py's OpenAIApi (named so, not imported:
    app.py routes here)."""
    state: DaemonState

    def check_key(self, request: Request) -> None: ...

    async def read_body(self, request: Request) -> bytes: ...

    async def generate(self, request: Request, dialect: Dialect, hears: bool = False,
                       body: dict[str, Any] | None = None) -> Response: ...

    async def _pool(self, request: Request, rid: str, choices: list[tuple[Prompt, PoolingParams]], priority: int,
                    t0: float, items: str, model: str, keep_alive: float | None) -> list[RequestOutput]: ...


async def ollama_chat(api: OpenAIApi, request: Request) -> Response:
    """POST /api/chat."""
    return await _ollama(api, request, CHAT)


async def ollama_generate(api: OpenAIApi, request: Request) -> Response:
    """POST /api/generate."""
    return await _ollama(api, request, GENERATE)


async def _ollama(api: OpenAIApi, request: Request, kind: str) -> Response:
    t0 = time.monotonic()
    st = api.state
    try:
        api.check_key(request)
        body = parse_json(await api.read_body(request))
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ApiError(400, f"model must be {STRING}", "model")
        try:
            name = st.resolve(model)
        except UnknownModel:
            raise ApiError(404, f'model "{str(model)[:64]}" not found, try pulling it first', "model",
                           "model_not_found") from None
        if _empty(body, kind):
            return await _load_or_unload(api, body, name, kind, t0)
    except ApiError as e:
        st.metrics.request("http", arrival=t0).refused(_REASONS.get(e.status, "invalid"))
        return ollama_refused(e)
    except Refused as e:
        err = refusal(e)
        st.metrics.request("http", arrival=t0).refused(_REASONS.get(err.status, "invalid"))
        return ollama_refused(err)
    dialect = chat_dialect(t0) if kind == CHAT else generate_dialect(t0)
    return await api.generate(request, dialect, body=body)


def _empty(body: dict[str, Any], kind: str) -> bool:
    """Nothing to answer: Ollama's load (or, with keep_alive 0, unload) request."""
    if kind == CHAT:
        return body.get("messages") in (None, [])
    return body.get("prompt") in (None, "") and body.get("system") in (None, "")


async def _load_or_unload(api: OpenAIApi, body: dict[str, Any], name: str, kind: str, t0: float) -> Response:
    """The model loaded (kept keep_alive from now, where given), or with keep_alive 0 unloaded once idle."""
    st = api.state
    model, keep_alive = request_model(body)
    shown = model or name
    if keep_alive == 0:
        st.check_serving()
        assert st.models is not None
        slot = st.models.resolve(name)
        if slot.spec.pinned:
            raise ApiError(400, f'model "{shown[:64]}" is pinned (loaded for good by the daemon\'s settings) and is '
                                f"not unloaded", "keep_alive", "unsupported_parameter")
        slot.keep_alive_s = 0.0           # whatever is in flight finishes first; the reaper unloads it then
        if slot.idle():
            await st.models.unload(slot)
        reason = "unload"
    else:
        lease = await st.lease(name)
        lease.release(keep_alive)
        reason = "load"
    log.info("model %s: %s over Ollama's API", name, reason)
    answer: dict[str, Any] = {"model": shown, "created_at": created_at()}
    answer.update({"message": {"role": "assistant", "content": ""}} if kind == CHAT else {"response": ""})
    answer.update(done=True, done_reason=reason)
    if reason == "load":
        answer["total_duration"] = answer["load_duration"] = max(0, int((time.monotonic() - t0) * 1e9))
    return JSONResponse(answer)
