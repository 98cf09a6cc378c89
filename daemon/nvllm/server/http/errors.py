"""OpenAI's error shape: {"error": {"message", "type", "param", "code"}} with the HTTP status that fits.

400 bad input, 401 a missing or wrong key, 404 an unknown model or path, 405 a wrong method, 413 an
oversized body, 429 refused for load, memory pressure or the per-client cap (with Retry-After), 500 a
failure inside the engine, 503 while starting or draining.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

RETRY_AFTER_S = 1     # what a 429 or 503 tells the client to wait; load here changes within a second

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A refusal or failure to send as OpenAI's error object; `param` names the request's field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "api_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {}
        if self.status in (429, 503):
            headers["Retry-After"] = str(RETRY_AFTER_S)
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(param: str | None, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)
