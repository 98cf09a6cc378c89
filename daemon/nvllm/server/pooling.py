"""Pooling requests for both front doors: an embedding request's inputs or a rerank request's documents, each
one engine request through DaemonState.submit (the same admission, budget and priorities as generation),
collected until every one is answered; and a rerank's results ranked.

A cross-encoder's score is its raw logit; the relevance a rerank returns is its sigmoid (vLLM's and
sentence-transformers' rule for a one-label classifier), in (0, 1), best first.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from nvllm.engine.outputs import RequestOutput
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.server.state import DaemonState

log = logging.getLogger("nvllm.server.pooling")


class PoolingFailed(Exception):
    """The engine failed a request (`aborted`: the daemon is stopping) or the caller went away."""

    def __init__(self, message: str, aborted: bool) -> None:
        super().__init__(message)
        self.aborted = aborted


async def run_pooling(state: DaemonState, api: str, client: str, request_id: str,
                      choices: Sequence[tuple[Prompt, PoolingParams]], priority: int,
                      arrival: float, model: str | None = None, keep_alive_s: float | None = None
                      ) -> list[RequestOutput]:
    """Every choice's final output, in order. Raises what submit raises (Refused, InvalidParameter,
    UnknownModel, EngineDead) and PoolingFailed."""
    sub = await state.submit(api, client, request_id, choices, priority, arrival, model=model,
                             keep_alive_s=keep_alive_s)
    done: list[RequestOutput | None] = [None] * len(choices)
    async with sub, contextlib.aclosing(aiter(sub)) as outputs:
        async for index, out in outputs:
            if out.error is not None:
                log.error("failed in the engine: %s", out.error)
                raise PoolingFailed(f"the model failed: {out.error}", aborted=False)
            if out.finished:
                if out.pooled is None:
                    raise PoolingFailed("the request was aborted: the daemon is shutting down", aborted=True)
                done[index] = out
    results = [out for out in done if out is not None]
    log.info("finished: %d input%s, %d tokens", len(results), "" if len(results) == 1 else "s",
             sum(o.prompt_tokens for o in results))
    return results


@dataclass(frozen=True)
class Ranked:
    index: int             # the document's place in the request
    relevance_score: float


def ranked(outputs: Sequence[RequestOutput], top_n: int = 0) -> list[Ranked]:
    """The documents best first (ties in the request's order), the first top_n (0: all)."""
    scores = [Ranked(i, _sigmoid(out.pooled[0] if out.pooled else float("nan"))) for i, out in enumerate(outputs)]
    scores.sort(key=lambda r: (-r.relevance_score, r.index))
    return scores[:top_n] if top_n else scores


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
