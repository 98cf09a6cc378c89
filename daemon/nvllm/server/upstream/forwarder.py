"""The Forwarder: what the front doors ask at their refusal points. It names the reason a refusal is one an
upstream may answer (`reason`), finds the upstream (upstream_policy.py), has it answer (upstream_client.py),
marks the answer with where it was answered, counts it in /metrics (nvllm:forwarded_requests_total by
upstream, reason and outcome) and logs it. Where the upstream fails it logs why and gives back None: the
front door then refuses as it would have without an upstream."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from nvllm.engine.prompt import ContextOverflow
from nvllm.server.metrics import Metrics
from nvllm.server.models.model_set import UnknownModel
from nvllm.server.state import Refused
from nvllm.server.upstream.upstream_client import UpstreamEvents, UpstreamFailed, open_events, post_whole
from nvllm.server.upstream.upstream_policy import Upstream, UpstreamRoutes

log = logging.getLogger("nvllm.server.upstream")

ANSWERED_BY_HEADER = "X-Nvllm-Answered-By"     # HTTP; gRPC's metadata key is its lower case
ANSWERED_BY_FIELD = "answered_by"              # in usage
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class Forwarder:
    def __init__(self, routes: UpstreamRoutes, metrics: Metrics | None = None) -> None:
        self.routes = routes
        self.metrics = metrics

    def __bool__(self) -> bool:
        return bool(self.routes)

    @staticmethod
    def reason(refused: BaseException, invalid: BaseException | None = None) -> str | None:
        """Why a request refused here might be answered upstream (FORWARD_REASONS), or None. refused: what
        DaemonState.submit raised; invalid: the engine's InvalidParameter behind a reader's refusal of it."""
        if isinstance(refused, UnknownModel):
            return "not_served"
        if isinstance(refused, Refused):
            if refused.no_room:
                return "no_room"
            return "busy" if refused.busy and not refused.per_client else None
        if isinstance(refused, ContextOverflow) or isinstance(invalid, ContextOverflow):
            return "too_long"
        return None

    def route(self, names: Sequence[str], reason: str | None) -> Upstream | None:
        return self.routes.route(names, reason) if reason is not None else None

    async def whole(self, up: Upstream, reason: str, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The upstream's whole answer, its usage marked; None where it failed."""
        try:
            answer = await post_whole(up, path, body)
        except UpstreamFailed as e:
            self._failed(up, reason, e)
            return None
        self._answered(up, reason)
        mark(answer, up)
        return answer

    async def events(self, up: Upstream, reason: str, path: str, body: dict[str, Any]) -> UpstreamEvents | None:
        """The upstream's stream, open, its first event read (None where it failed before that); the caller
        closes it."""
        try:
            events = await open_events(up, path, body)
        except UpstreamFailed as e:
            self._failed(up, reason, e)
            return None
        self._answered(up, reason)
        return events

    def _answered(self, up: Upstream, reason: str) -> None:
        log.info("forwarded to upstream %s (%s)", up.name, _REASON_TEXT.get(reason, reason))
        if self.metrics is not None:
            self.metrics.forwarded(up.name, reason, "answered")

    def _failed(self, up: Upstream, reason: str, e: UpstreamFailed) -> None:
        log.warning("%s; refused here instead (%s)", e, _REASON_TEXT.get(reason, reason))
        if self.metrics is not None:
            self.metrics.forwarded(up.name, reason, "failed")


_REASON_TEXT = {"not_served": "the model is not served here", "too_long": "longer than the local context",
                "no_room": "the memory plan has no room", "busy": "busy here", "hot": "the board is hot"}


def mark(answer: dict[str, Any], up: Upstream) -> None:
    """usage.answered_by set on an answer (or a stream's chunk) that has a usage object."""
    usage = answer.get("usage")
    if isinstance(usage, dict):
        usage[ANSWERED_BY_FIELD] = up.answered_by


def mark_event(data: str, up: Upstream) -> str:
    """A stream event's data, its usage marked where it has one (the rest passed as it came)."""
    if '"usage"' not in data:
        return data
    try:
        chunk = json.loads(data)
    except ValueError:
        return data
    if not isinstance(chunk, dict) or not isinstance(chunk.get("usage"), dict):
        return data
    mark(chunk, up)
    return json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))
