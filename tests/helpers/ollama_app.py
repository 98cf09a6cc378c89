"""Ollama's API in process for the server tests: the Starlette app over a started AsyncEngine (as http_app.serve
runs it), driven by the official `ollama` client over httpx's ASGI transport, with an httpx2 client beside it
for /v1 and for raw bodies; or over a ModelSet that loads and unloads the engine for real (`serve_loading`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import httpx2
import ollama
from grpc_health.v1._async import HealthServicer

from helpers.daemon_util import assert_pages_all_back, drained
from nvllm.config import Settings
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.http.app import OpenAIApi
from nvllm.server.models.model_set import ModelSet, ModelSpec
from nvllm.server.state import DaemonState

MODEL = "tiny-llama"          # the name DaemonState gives the one model here
Body = Callable[[ollama.AsyncClient, httpx2.AsyncClient, DaemonState], Awaitable[Any]]


def _clients(api: OpenAIApi) -> tuple[ollama.AsyncClient, httpx2.AsyncClient]:
    app = api.app()
    oc = ollama.AsyncClient(host="http://nvllm", transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 5000)))
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app, client=("127.0.0.1", 5000)),
                              base_url="http://nvllm", timeout=60)
    return oc, http


def serve_ollama(engine: LLMEngine, body: Body, reasoning_parser: str = "", max_body: int = 1 << 20) -> Any:
    """body(ollama client, httpx2 client, state) against the app on a started engine; every page back after."""
    async def main() -> Any:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState(MODEL, HealthServicer(), 64, 8, 1 << 20)
        state.reasoning_parser = reasoning_parser
        await state.set_ready(ae, None)
        oc, http = _clients(OpenAIApi(state, None, max_body, metrics=state.metrics))
        try:
            async with http:
                result = await body(oc, http, state)
            await drained(engine, ae)
            return result
        finally:
            ae.shutdown()
    result = asyncio.run(main())
    assert_pages_all_back(engine)
    return result


def serve_loading(engine: LLMEngine, body: Body, keep_alive_s: float = 300.0) -> tuple[Any, list[str]]:
    """body against a daemon whose one model loads on its first lease and unloads when its keep_alive says
    (the engine started and stopped for real); (its result, the loads and unloads in order)."""
    events: list[str] = []

    async def load(spec: ModelSpec, free: int) -> tuple[AsyncEngine, int]:
        ae = AsyncEngine(engine)
        ae.start()
        events.append("load")
        return ae, 1

    async def unload(ae: AsyncEngine) -> None:
        ae.shutdown()
        events.append("unload")

    async def main() -> Any:
        models = ModelSet([ModelSpec(MODEL, Settings(), keep_alive_s)], MODEL, 1 << 30, load, unload, lambda spec: 1)
        state = DaemonState(MODEL, HealthServicer(), 64, 8, 1 << 20)
        await state.set_ready(models, None)
        oc, http = _clients(OpenAIApi(state, None, 1 << 20, metrics=state.metrics))
        try:
            async with http:
                return await body(oc, http, state)
        finally:
            for slot in models.slots.values():
                await models.unload(slot)
    return asyncio.run(main()), events


def ndjson(response: httpx2.Response) -> list[dict[str, Any]]:
    """The lines of an NDJSON answer, parsed."""
    assert response.headers["content-type"].startswith("application/x-ndjson"), response.headers
    return [json.loads(line) for line in response.text.splitlines() if line]
