"""What every HTTP endpoint that takes a model shares, apart from the app (so that the endpoints beside it, as
Ollama's, use them without importing it): a daemon's refusal as an HTTP error, and the body's model and
keep_alive."""

from __future__ import annotations

from typing import Any

from nvllm.server.chat.field_error import FieldError
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.models.keep_alive import keep_alive_seconds
from nvllm.server.state import Refused


def refusal(e: Refused) -> ApiError:
    if e.no_room:
        return ApiError(503, str(e), code="insufficient_memory")
    return ApiError(429 if e.busy else 503, str(e), code="overloaded" if e.busy else "unavailable")


def request_model(body: dict[str, Any]) -> tuple[str | None, float | None]:
    """The body's model (None: the default) and its keep_alive (taken out of the body: every endpoint
    takes it, and no reader need know it); 400 for either of the wrong type."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", "model must be a string")
    if "keep_alive" not in body:
        return model, None
    try:
        return model, keep_alive_seconds(body.pop("keep_alive"))
    except FieldError as e:
        raise bad_request(e.field, e.message) from None
