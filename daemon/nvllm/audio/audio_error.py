"""AudioError: an upload that is not audio nvllm reads, or is audio it refuses; the message names the request's
`file` field and the reason, for a 400."""

from __future__ import annotations


class AudioError(ValueError):
    field = "file"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{self.field}: {reason}")
