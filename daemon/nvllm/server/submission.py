"""A front door's request once admitted: its engine requests (one per choice), streamed and given back once.

`DaemonState.submit` (state.py) is the one way in: it checks, tokenizes and admits, and returns a
`Submission`. Every output passes the request's metrics on its way to the front door, and `close()` (or
leaving `async with`) aborts what is unfinished, closes the metrics and releases the client's stream count
exactly once, whoever calls it first: the front door's handler, or the response that a disconnect
cancelled before its handler ever ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from nvllm.engine.async_engine import RequestStream
from nvllm.engine.outputs import RequestOutput
from nvllm.server.metrics import RequestTracker


class Submission:
    """`async for index, output in submission`: every choice's outputs as the engine makes them."""

    def __init__(self, request_id: str, streams: list[RequestStream], trackers: list[RequestTracker],
                 prompt_tokens: list[int], max_tokens: list[int], thinks: bool, release: Callable[[], None]) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens   # per choice
        self.max_tokens = max_tokens         # per choice, resolved against the model's limits
        self.thinks = thinks                 # whether the answers may think (a reasoning parser splits them)
        self._streams = streams
        self._trackers = trackers
        self._release = release
        self._pumps: list[asyncio.Task] = []   # with several choices, one task reads each stream
        self.closed = False

    @property
    def num_choices(self) -> int:
        return len(self._streams)

    def close(self) -> None:
        """Abort what is unfinished, close the metrics, release the client's stream: once."""
        if self.closed:
            return
        self.closed = True
        for task in self._pumps:
            task.cancel()
        for s in self._streams:
            s.close()
        for t in self._trackers:
            t.close()
        self._release()

    async def __aenter__(self) -> Submission:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __aiter__(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        return self._outputs()

    async def _outputs(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """(choice index, output) from every stream as they come; leaving early closes (aborts) them all."""
        try:
            async for index, out in self._merged():
                self._trackers[index].output(out)
                yield index, out
        finally:
            for s in self._streams:
                s.close()

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        if len(self._streams) == 1:
            async for out in self._streams[0]:
                yield 0, out
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for out in stream:
                    queue.put_nowait((index, out))
            except Exception as e:      # noqa: BLE001 - handed to the reader, which raises it
                queue.put_nowait((index, e))

        self._pumps = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self._streams)]
        try:
            left = len(self._streams)
            while left:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield index, item
                if item.finished:
                    left -= 1
        finally:
            for task in self._pumps:
                task.cancel()
