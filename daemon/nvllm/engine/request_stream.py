"""What a front door holds of one request: `PendingRequest`, checked and tokenized but not yet queued, and
`RequestStream`, its outputs as an async iterator once AsyncEngine.add queued it (closing it early aborts
the request). async_engine.py owns the engine thread that feeds them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nvllm.engine.outputs import RequestOutput
from nvllm.engine.sequence import Sequence


@dataclass
class Stream:
    """One request's queue of outputs on the asyncio side (AsyncEngine keeps one per request in flight)."""
    queue: asyncio.Queue
    abandoned: bool = False      # the consumer left; outputs are dropped until the final one


class RequestStream:
    """One request's outputs, as an async iterator; a context manager that aborts on early exit."""

    def __init__(self, abandon: Callable[[str, Stream], None], request_id: str, stream: Stream) -> None:
        self.request_id = request_id
        self._abandon = abandon   # AsyncEngine's: the engine aborts the request, its outputs are dropped
        self._stream = stream
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        out = await self._stream.queue.get()
        if isinstance(out, BaseException):
            self._done = True
            raise out
        self._done = out.finished
        return out

    @property
    def finished(self) -> bool:
        return self._done

    def close(self) -> None:
        """Abort the request unless its final output was already taken."""
        if not self._done:
            self._done = True
            self._abandon(self.request_id, self._stream)

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class PendingRequest:
    """A request checked and tokenized (`AsyncEngine.prepare`), not yet queued: what a front door may know of
    it before `AsyncEngine.add` takes it. The sequence inside is the engine's alone."""

    def __init__(self, seq: Sequence) -> None:
        self._seq = seq
        self.request_id = seq.request_id
        self.prompt_tokens = seq.num_prompt_tokens
        # resolved: never None once prepared; 0 for a pooling request, which generates nothing
        self.max_tokens: int = 0 if seq.pooling is not None else seq.params.max_tokens or 0
        # Whether the answer may think (a reasoning parser then splits its text): not a constrained one
        # whose grammar masks from its first token (no thinking tokens, or a prompt that closed the thinking).
        self.thinks = seq.params.structured is None or seq.structured_after_thinking is not None
