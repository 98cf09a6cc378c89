"""An answer delivered over HTTP, whichever API's (dialect.py): whole, once every choice finished, or while
the engine makes it as server-sent events or as newline-delimited JSON (Ollama's stream: each event's data
a line). Either way a client that goes away aborts its requests
(their pages come back at once), and a failure in the engine ends the answer in the dialect's shape."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from nvllm.engine.outputs import RequestOutput
from nvllm.server.http.dialect import Answering, Event
from nvllm.server.http.errors import ApiError
from nvllm.server.submission import Submission

log = logging.getLogger("nvllm.server.http")

PING_S = 15.0           # an SSE comment line this often keeps proxies from closing a quiet stream


def event_stream(sub: Submission, answering: Answering, rid: str, t0: float) -> Response:
    """The answer as server-sent events; the response gives back what the request holds when it ends."""
    return _EventStream(events(sub, answering, rid, t0), sub, ping=PING_S, sep="\n", headers={"X-Request-Id": rid})


def ndjson_stream(sub: Submission, answering: Answering, rid: str, t0: float) -> Response:
    """The answer as newline-delimited JSON (application/x-ndjson), one event's data a line; like the events,
    the response gives back what the request holds however it ends."""
    async def lines() -> AsyncIterator[str]:
        evs = events(sub, answering, rid, t0)
        try:
            async for event in evs:
                yield event["data"] + "\n"
        finally:
            await evs.aclose()
    return ClosingStream(lines(), sub.close, media_type="application/x-ndjson", headers={"X-Request-Id": rid})


async def whole(request: Request, sub: Submission, answering: Answering, rid: str) -> Response:
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

async def events(sub: Submission, answering: Answering, rid: str, t0: float) -> AsyncGenerator[Event, None]:
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


class ClosingStream(StreamingResponse):
    """A streamed body whose `close` (a Submission's, an upstream's connection's; sync or async) runs however
    the response ends: a disconnect may cancel the response before its generator ever started, when the
    generator's own cleanup would never run (as _EventStream)."""

    def __init__(self, content: AsyncIterator[str], close: Callable[[], Any], **kw: Any) -> None:
        super().__init__(content, **kw)
        self.close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            done = self.close()
            if inspect.isawaitable(done):
                await done


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
