"""The answers of POST /v1/embeddings (OpenAI's list of embedding objects, each as floats or as base64 of its
little-endian float32 bytes) and of POST /v1/rerank and /rerank (results best first, each with its index and
relevance score, and the document where return_documents asks)."""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any

from nvllm.engine.outputs import RequestOutput
from nvllm.server.pooling import Ranked


def _encoded(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    return values


def embeddings_response(outputs: Sequence[RequestOutput], model: str, encoding_format: str) -> dict[str, Any]:
    tokens = sum(o.prompt_tokens for o in outputs)
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": _encoded(o.pooled or [], encoding_format)}
                     for i, o in enumerate(outputs)],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def rerank_response(rid: str, results: Sequence[Ranked], documents: Sequence[str], outputs: Sequence[RequestOutput],
                    model: str, return_documents: bool) -> dict[str, Any]:
    tokens = sum(o.prompt_tokens for o in outputs)
    rows = []
    for r in results:
        row: dict[str, Any] = {"index": r.index, "relevance_score": r.relevance_score}
        if return_documents:
            row["document"] = {"text": documents[r.index]}
        rows.append(row)
    return {"id": rid, "object": "list", "model": model, "results": rows,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
