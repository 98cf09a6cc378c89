"""The daemon's front doors in process for the server tests: the Starlette app over a started AsyncEngine
on a real (tiny) engine, driven through an ASGI transport (`serve`), with the gRPC servicer beside it on a
loopback port (`serve_both`), and the shapes of their answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import httpx2 as httpx
from grpc_health.v1._async import HealthServicer

from helpers.daemon_util import assert_pages_all_back, drained
from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.grpc.service import GeneratorService, add_generator_to_server
from nvllm.server.http.app import OpenAIApi
from nvllm.server.state import DaemonState
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

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


def serve_both(engine: LLMEngine, body: Callable[[Client, Any, DaemonState], Awaitable[Any]], model_name: str,
               ready: bool = True, reasoning_parser: str = "") -> Any:
    """body(http client, gRPC stub, state) against both APIs over one started engine."""
    async def main() -> Any:
        ae = AsyncEngine(engine)
        ae.start()
        state = DaemonState(model_name, HealthServicer(), 64, 4, 1 << 20)
        state.reasoning_parser = reasoning_parser
        if ready:
            await state.set_ready(ae, None)
        api = OpenAIApi(state, None, 1 << 20, metrics=state.metrics)
        server = grpc.aio.server()
        add_generator_to_server(GeneratorService(state), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        transport = httpx.ASGITransport(app=api.app(), client=("127.0.0.1", 5000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://nvllm", timeout=60) as client, \
                    grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await body(client, pb_grpc.GeneratorStub(channel), state)
        finally:
            await server.stop(0)
            ae.shutdown()
    return asyncio.run(main())
