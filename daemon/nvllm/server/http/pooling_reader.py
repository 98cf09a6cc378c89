"""The bodies of POST /v1/embeddings (OpenAI's) and POST /v1/rerank and /rerank (the shape llama-server, vLLM,
Jina and Cohere accept), read into pooling choices for DaemonState.submit; and the engine's refusals mapped
back onto the body's own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter
from nvllm.server.http.body import ARRAY, BOOL, INT, STRING, check_keys, check_model, need
from nvllm.server.http.errors import ApiError, bad_request
from nvllm.server.http.openai_request import NEUTRAL

EMBEDDING_FIELDS = {"model", "input", "encoding_format", "dimensions", "user", "truncate_prompt_tokens", "priority"}
RERANK_FIELDS = {"model", "query", "documents", "top_n", "return_documents", "truncate_prompt_tokens", "priority"}
MAX_INPUTS = 2048   # OpenAI's limit on an embeddings request's inputs


@dataclass
class EmbeddingsRequest:
    inputs: list[Prompt]
    params: PoolingParams
    encoding_format: str          # "float" or "base64"
    priority: int
    user: str | None


@dataclass
class RerankRequest:
    query: str
    documents: list[str]
    params: PoolingParams
    top_n: int                    # 0: all
    return_documents: bool
    priority: int


def _params(body: dict[str, Any]) -> PoolingParams:
    values = {}
    for name in ("dimensions", "truncate_prompt_tokens"):
        if body.get(name) is not None:
            values[name] = need(name, body[name], INT)
    try:
        return PoolingParams(**values)
    except InvalidParameter as e:
        raise bad_request(e.field, str(e)) from None


def _priority(body: dict[str, Any]) -> int:
    return need("priority", body["priority"], INT) if body.get("priority") is not None else 0


def parse_embeddings(body: dict[str, Any], model_name: str) -> EmbeddingsRequest:
    check_keys(body, EMBEDDING_FIELDS, NEUTRAL)
    check_model(body, model_name)
    if "input" not in body:
        raise bad_request("input", "input is required: a string, an array of strings, or token ids")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad_request("encoding_format", f"encoding_format must be 'float' or 'base64', got {str(fmt)[:32]!r}")
    user = body.get("user")
    if user is not None:
        need("user", user, STRING)
    return EmbeddingsRequest(_inputs(body["input"]), _params(body), fmt, _priority(body), user)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _inputs(value: Any) -> list[Prompt]:
    """input: a string, an array of strings, an array of token ids, or an array of arrays of token ids."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise bad_request("input", "input must be a string, an array of strings, or token ids")
    if not value:
        raise bad_request("input", "input must not be empty")
    if len(value) > MAX_INPUTS:
        raise bad_request("input", f"input holds {len(value)} items; at most {MAX_INPUTS} per request")
    if all(_is_id(v) for v in value):
        return [{"prompt_token_ids": value}]
    inputs: list[Prompt] = []
    for i, v in enumerate(value):
        if isinstance(v, str):
            inputs.append(v)
        elif isinstance(v, list) and v and all(_is_id(t) for t in v):
            inputs.append({"prompt_token_ids": v})
        else:
            raise bad_request(f"input[{i}]", f"input[{i}] must be a string or a non-empty array of token ids "
                                             f"(not mixed with single token ids)")
    return inputs


def parse_rerank(body: dict[str, Any], model_name: str) -> RerankRequest:
    check_keys(body, RERANK_FIELDS, NEUTRAL)
    check_model(body, model_name)
    if "query" not in body or "documents" not in body:
        raise bad_request("query" if "query" not in body else "documents", "query and documents are required")
    query = need("query", body["query"], STRING)
    docs = need("documents", body["documents"], ARRAY)
    if not docs:
        raise bad_request("documents", "documents must not be empty")
    if len(docs) > MAX_INPUTS:
        raise bad_request("documents", f"documents holds {len(docs)} items; at most {MAX_INPUTS} per request")
    documents = []
    for i, d in enumerate(docs):
        text = d.get("text") if isinstance(d, dict) and set(d) == {"text"} else d
        if not isinstance(text, str):
            raise bad_request(f"documents[{i}]", f"documents[{i}] must be a string or {{\"text\": string}}")
        documents.append(text)
    top_n = need("top_n", body["top_n"], INT) if body.get("top_n") is not None else 0
    if top_n < 0:
        raise bad_request("top_n", f"top_n must be at least 0, got {top_n}")
    ret = need("return_documents", body["return_documents"], BOOL) \
        if body.get("return_documents") is not None else False
    return RerankRequest(query, documents, _params(body), top_n, ret, _priority(body))


def pooling_refusal(e: InvalidParameter, items: str) -> ApiError:
    """The engine's refusal of one of several inputs as a 400 naming the body's field: the input itself
    (`items`[i]: input or documents), or a request-wide one (dimensions, truncate_prompt_tokens, model)."""
    if e.field in ("prompt", "prompt_token_ids", "document", "query"):
        name = "query" if e.field == "query" else items if e.index is None else f"{items}[{e.index}]"
    else:
        name = e.field
    text = str(e)
    return bad_request(name, name + text[len(e.field):] if text.startswith(e.field) else text)
