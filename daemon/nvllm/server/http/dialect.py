"""What a generation endpoint of the HTTP API is made of, whichever API it speaks (OpenAI's chat and
completions, Anthropic's Messages, OpenAI's Responses, Ollama's chat and generate): a reader of its JSON, a
builder of its answer (whole, or streamed as server-sent events or as newline-delimited JSON) and its error
shape. app.py runs every one the same way: read, submit
through DaemonState.submit, collect or stream, abort on disconnect."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from nvllm.engine.outputs import RequestOutput
from nvllm.engine.prompt import Prompt
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.server.http.errors import ApiError
from nvllm.server.reading import Served

Event = dict[str, str]      # one server-sent event: "data" and, where the API names its events, "event"
# How a dialect streams (http/delivery.py): server-sent events, or one JSON object a line (an NDJSON stream
# sends each event's "data" alone).
SSE, NDJSON = "sse", "ndjson"


class Asked(Protocol):
    """A request body read and checked."""
    stream: bool
    priority: int
    user: str | None

    def choices(self) -> list[tuple[Prompt, SamplingParams]]:
        """The engine requests it makes: (prompt, params) each."""

    def refusal(self, e: InvalidParameter) -> ApiError:
        """An engine-side refusal as a 400 naming the request's own field."""


class Answering(Protocol):
    """One request's answer built from the engine's outputs (index: which choice)."""

    def add(self, index: int, out: RequestOutput) -> None:
        """Collect an output for the whole response."""

    def response(self) -> dict[str, Any]:
        """The whole response, once every choice finished."""

    def events(self, index: int, out: RequestOutput) -> list[Event]:
        """The stream's events for one output (none when it adds nothing a client sees)."""

    def closing(self) -> list[Event]:
        """The stream's last events, once every choice finished."""

    def failed(self, e: ApiError) -> Event:
        """The event that ends a stream which failed."""

    def token_counts(self) -> tuple[int, int]:
        """(prompt tokens, output tokens) so far, for the log."""


@dataclass(frozen=True)
class Dialect:
    """read(body, served) -> Asked (ApiError 400 naming the field; served: the model the request leased);
    answering(asked, request id, served, thinks) -> Answering; refused(error) -> the error response in this
    API's shape; streams: SSE or NDJSON."""
    read: Callable[[dict[str, Any], Served], Asked]
    answering: Callable[[Any, str, Served, bool], Answering]
    refused: Callable[[ApiError], Response] = ApiError.response
    streams: str = SSE
