"""An upstream's answer as this API's response (server/upstream/): the whole JSON answer, or its server-sent
events relayed one by one as they arrive (never collected first), each with the header that says where it
was answered and usage.answered_by where the upstream sent usage. A stream the upstream breaks after its first
event ends with an error event, as a local stream whose engine fails does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse, Response

from nvllm.server.http.delivery import ClosingStream
from nvllm.server.upstream.forwarder import ANSWERED_BY_HEADER, Forwarder, mark_event
from nvllm.server.upstream.upstream_client import DONE, UpstreamEvents, UpstreamFailed
from nvllm.server.upstream.upstream_policy import Upstream


async def forwarded_answer(fwd: Forwarder, up: Upstream, reason: str, path: str,
                           body: dict[str, Any]) -> Response | None:
    """The upstream's answer to body at path as a response; None where it failed (refuse as before)."""
    headers = {ANSWERED_BY_HEADER: up.answered_by}
    if body.get("stream") is True:
        events = await fwd.events(up, reason, path, body)
        if events is None:
            return None
        return ClosingStream(_relay(events, up), events.aclose, media_type="text/event-stream",
                              headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    answer = await fwd.whole(up, reason, path, body)
    return None if answer is None else JSONResponse(answer, headers=headers)


def _event(data: str) -> str:
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


async def _relay(events: UpstreamEvents, up: Upstream) -> AsyncIterator[str]:
    try:
        yield _event(mark_event(events.first, up))
        async for data in events:
            yield _event(data if data == DONE else mark_event(data, up))
    except UpstreamFailed as e:
        yield _event(json.dumps({"error": {"message": f"{e} mid-stream", "type": "upstream_error",
                                           "code": "upstream_failed"}}))
    finally:
        await events.aclose()
