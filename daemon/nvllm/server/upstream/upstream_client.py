"""HTTP to an upstream (httpx2, the client huggingface_hub brings already; asyncio): a whole answer, or a
stream of server-sent events read as it comes.

Each call has its own connection (an upstream is a server on the board's network, a request to it rare next
to the tokens it streams), closed however the call ends. timeout_s bounds the connection and every wait for
bytes. What is not an answer is UpstreamFailed: the connection refused or cut, a wait past timeout_s, a status
other than 200, a body that is not an OpenAI answer (not JSON, not an object with choices), a stream that is not
server-sent events, or one whose first event is not JSON.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import AsyncIterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from nvllm.server.upstream.upstream_policy import Upstream

if TYPE_CHECKING:
    import httpx2 as httpx

MAX_ANSWER_BYTES = 32 << 20      # a whole answer larger than this is not one
MAX_EVENT_BYTES = 4 << 20        # nor an event of a stream
DONE = "[DONE]"


def _httpx() -> ModuleType:
    """httpx2, imported by the first forwarded request: a daemon without upstreams never loads it."""
    import httpx2

    return httpx2


class UpstreamFailed(Exception):
    """The upstream gave no answer; the message says why, for the log."""


@functools.cache
def _tls() -> ssl.SSLContext:
    """The system's CAs, read once (a client per call would otherwise read them every time)."""
    return ssl.create_default_context()


def _client(up: Upstream) -> httpx.AsyncClient:
    # trust_env off: no proxy or .netrc from the environment; the base URL is where the answer comes from
    return _httpx().AsyncClient(timeout=_httpx().Timeout(up.timeout_s), trust_env=False, follow_redirects=False,
                             verify=_tls())


def _headers(up: Upstream, stream: bool) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "text/event-stream" if stream else "application/json"}
    if up.api_key:
        h["Authorization"] = f"Bearer {up.api_key}"
    return h


def _failed(up: Upstream, e: Exception) -> UpstreamFailed:
    what = "timed out" if isinstance(e, _httpx().TimeoutException) else f"failed ({type(e).__name__}: {e})"
    return UpstreamFailed(f"upstream {up.name} {what}")


async def post_whole(up: Upstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The upstream's whole answer to body at path; UpstreamFailed for anything else."""
    try:
        async with _client(up) as client, \
                client.stream("POST", up.url(path), json=body, headers=_headers(up, False)) as r:
            if r.status_code != 200:
                raise UpstreamFailed(f"upstream {up.name} answered HTTP {r.status_code}")
            data = bytearray()
            async for chunk in r.aiter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise UpstreamFailed(f"upstream {up.name} answered more than {MAX_ANSWER_BYTES} bytes")
    except _httpx().HTTPError as e:
        raise _failed(up, e) from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise UpstreamFailed(f"upstream {up.name} answered something that is not JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
        raise UpstreamFailed(f"upstream {up.name} answered JSON that is not a completion (no choices)")
    return answer


class UpstreamEvents:
    """An upstream's stream of server-sent events, open: each event's data as it arrives (`DONE` last, where
    the upstream sends it). Close it (aclose) however it ends: that closes the connection."""

    def __init__(self, up: Upstream, client: httpx.AsyncClient, response: httpx.Response) -> None:
        self.up = up
        self._client = client
        self._response = response
        self._lines = response.aiter_lines()
        self.first = ""     # the first event's data, read by open_events
        self._closed = False

    async def next_data(self) -> str | None:
        """The next event's data; None at the stream's end; UpstreamFailed where it breaks or stalls."""
        data: list[str] = []
        size = 0
        try:
            async for line in self._lines:
                if not line:
                    if data:
                        return "\n".join(data)
                    continue
                if line.startswith("data:"):
                    part = line[6:] if line[5:6] == " " else line[5:]
                    size += len(part)
                    if size > MAX_EVENT_BYTES:
                        raise UpstreamFailed(f"upstream {self.up.name} sent an event over {MAX_EVENT_BYTES} bytes")
                    data.append(part)
                # comments (":"), event:, id:, retry: lines carry nothing an OpenAI client reads
        except _httpx().HTTPError as e:
            raise _failed(self.up, e) from None
        return "\n".join(data) if data else None

    async def __aiter__(self) -> AsyncIterator[str]:
        while True:
            data = await self.next_data()
            if data is None:
                return
            yield data

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._response.aclose()
        finally:
            await self._client.aclose()


async def open_events(up: Upstream, path: str, body: dict[str, Any]) -> UpstreamEvents:
    """The upstream's answer to body (which asks for a stream) at path, open, its first event read and
    checked; UpstreamFailed (nothing left open) for anything else."""
    client = _client(up)
    events: UpstreamEvents | None = None
    try:
        try:
            request = client.build_request("POST", up.url(path), json=body, headers=_headers(up, True))
            response = await client.send(request, stream=True)
        except _httpx().HTTPError as e:
            raise _failed(up, e) from None
        events = UpstreamEvents(up, client, response)
        if response.status_code != 200:
            raise UpstreamFailed(f"upstream {up.name} answered HTTP {response.status_code}")
        kind = response.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            raise UpstreamFailed(f"upstream {up.name} answered {kind or 'no content type'}, not an event stream")
        first = await events.next_data()
        if first is None or first == DONE:
            raise UpstreamFailed(f"upstream {up.name} ended its stream before any answer")
        try:
            ok = isinstance(json.loads(first), dict)
        except ValueError:
            ok = False
        if not ok:
            raise UpstreamFailed(f"upstream {up.name} streamed an event that is not a JSON object")
        events.first = first
        return events
    except BaseException:
        if events is not None:
            await events.aclose()
        else:
            await client.aclose()
        raise
