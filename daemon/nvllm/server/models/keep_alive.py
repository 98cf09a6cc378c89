"""keep_alive, Ollama's, on a request: how long its model stays loaded after it. A duration such as "5m",
"30s", "1h30m" or "250ms", or a number of seconds; 0 unloads the model right after the request, a negative
one keeps it loaded for good. A request's keep_alive becomes its model's from then on (model_set.py)."""

from __future__ import annotations

import math
from typing import Any

from nvllm.config_values import NEVER, duration_seconds
from nvllm.server.chat.field_error import bad_field


def keep_alive_seconds(value: Any, field: str = "keep_alive") -> float:
    """The seconds a keep_alive value means (NEVER for a negative one); FieldError naming field otherwise."""
    what = f'{field} must be a duration such as "5m", "30s" or "1h", a number of seconds, 0 or -1'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise bad_field(field, f"{what}, got {value!r}")
        return NEVER if value < 0 else float(value)
    seconds = duration_seconds(value) if isinstance(value, str) else None
    if seconds is None:
        shown = repr(value[:32]) if isinstance(value, str) else repr(value) if value is None or \
            isinstance(value, bool) else type(value).__name__
        raise bad_field(field, f"{what}, got {shown}")
    return seconds
