"""What a front door and the one way in (DaemonState.submit) hand each other: the model a request is read by
(`Served`, the model leased), and what the front door's reader made of the request (`Reading`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvllm.engine.async_engine import AsyncEngine
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter, SamplingParams
from nvllm.transcription_params import TranscriptionParams

# a generation request's, a pooling request's (embed, rerank), or a transcription's ({"audio": bytes})
Params = SamplingParams | PoolingParams | TranscriptionParams


@dataclass(frozen=True)
class Served:
    """What a front door reads one request by: the model it leased (its name, engine and seats) and the
    daemon's chat settings."""
    model_name: str
    engine: AsyncEngine
    max_num_seqs: int
    reasoning_parser: str = ""


@dataclass(frozen=True)
class Reading:
    """A request as its front door's reader read it by the model leased (DaemonState.submit calls the reader):
    the engine requests it makes, and how the rest of the way in treats it."""
    choices: Sequence[tuple[Prompt, Params]]
    refusal: Callable[[InvalidParameter], Exception]   # the engine's refusal, naming the front door's field
    priority: int = 0
    note: str = ""                        # ends the admission's log line
    keep_alive_s: float | None = None     # the model's keep_alive from this request on (None: as it was)
