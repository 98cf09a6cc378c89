"""The OpenAI-compatible HTTP app in process for the server tests: the Starlette app over a started
AsyncEngine on a real (tiny) engine, driven through an ASGI transport, and the shapes of its answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2 as httpx
from grpc_health.v1._async import HealthServicer

from helpers.daemon_util import assert_pages_all_back, drained
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.http.app import OpenAIApi
from nvllm.server.state import DaemonState

MAX_NUM_SEQS = 8
MAX_BODY = 8192

Client = httpx.AsyncClient


def serve(engine: LLMEngine, body: Callable[[Client, DaemonState], Awaitable[Any]], key: bytes | None = None,
          ready: bool = True, max_waiting: int = 64, max_streams_per_client: int = 0) -> Any:
    """Run body(client, state) against the app on a started AsyncEngine; checks every page came back."""
    async def main() -> Any:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState("tiny-llama", HealthServicer(), max_waiting, MAX_NUM_SEQS, 1 << 20,
                            max_streams_per_client)
        if ready:
            await state.set_ready(ae, None)
        api = OpenAIApi(state, key, MAX_BODY, metrics=state.metrics)
        transport = httpx.ASGITransport(app=api.app(), client=("127.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://nvllm") as client:
                result = await body(client, state)
            await drained(engine, ae)
            return result
        finally:
            ae.shutdown()
    result = asyncio.run(main())
    assert_pages_all_back(engine)
    return result


def post(path: str, payload: Any, **kw: Any) -> Callable[[Client, DaemonState], Awaitable[httpx.Response]]:
    async def body(client: Client, state: DaemonState) -> httpx.Response:
        return await client.post(path, json=payload, **kw)
    return body


def events(response: httpx.Response) -> list[Any]:
    """The SSE data payloads, parsed (the last must be [DONE])."""
    datas = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]", response.text[-300:]
    return [json.loads(d) for d in datas[:-1]]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# -- generation -----------------------------------------------------------------------------------
