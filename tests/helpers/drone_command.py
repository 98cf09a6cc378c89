"""A drone command as a new user would ask for one (issue 25): the JSON Schema and the chat that asks
for it. Bare numbers (lat, lon, speed) are where a small model at temperature 1 used to run on digits."""

from __future__ import annotations

from typing import Any

DRONE_COMMAND: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"enum": ["takeoff", "land", "goto", "hover", "return_home"]},
        "lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180},
        "alt_m": {"type": "number", "minimum": 0, "maximum": 120},
        "speed_mps": {"type": "number"},
        "reason": {"type": "string", "maxLength": 80},
    },
    "required": ["action", "lat", "lon", "alt_m", "speed_mps", "reason"],
    "additionalProperties": False,
}

# Before the digit budget, 2 of 12 seeds (0..11) ran out of 160 tokens on this prompt, inside a number.
DRONE_MESSAGES = [{"role": "user", "content": "Send the drone to 54.6872, 25.2797 at 40 m altitude."}]
