"""Ollama's error shape, for every /api/* endpoint: {"error": "message"} with the HTTP status that fits (400
bad input, 401 a missing or wrong key, 404 a model not served, 413 an oversized body, 429 and 503 refused for
load or memory, with Retry-After, 500 a failure inside the engine). A stream that fails after its first
line ends with one line of the same shape."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from nvllm.server.http.errors import ApiError


def error_body(e: ApiError) -> dict[str, Any]:
    return {"error": e.message}


def ollama_refused(e: ApiError) -> JSONResponse:
    """The refusal with the status and headers (Retry-After, WWW-Authenticate) OpenAI's shape gets."""
    headers = {k: v for k, v in e.response().headers.items() if k in ("retry-after", "www-authenticate")}
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)
