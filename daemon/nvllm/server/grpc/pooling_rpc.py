"""An EmbedRequest or a RerankRequest read into pooling choices for DaemonState.submit: the checks that need no
tokenizer (size, model name, inputs; BadRequest naming the proto field), as generate_request.py reads a
GenerateRequest; and the engine's refusals named by the proto's fields."""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter
from nvllm.server.grpc.generate_request import BadRequest, check_model
from nvllm.v1 import nvllm_pb2 as pb

MAX_INPUTS = 2048   # as the HTTP API's (OpenAI's limit)


@dataclass
class PoolingArgs:
    choices: list[tuple[Prompt, PoolingParams]]
    top_n: int = 0


def _checked(request: pb.EmbedRequest | pb.RerankRequest, model_name: str, max_message_bytes: int, items: str,
             count: int) -> PoolingParams:
    size = request.ByteSize()
    if size > max_message_bytes:
        raise BadRequest("request", f"the request is {size} bytes; a request may be at most {max_message_bytes} "
                                    f"bytes (server.max_message_bytes)")
    check_model(request.model, model_name)
    if not count:
        raise BadRequest(items, f"{items} must hold at least one item")
    if count > MAX_INPUTS:
        raise BadRequest(items, f"{items} holds {count} items; at most {MAX_INPUTS} per request")
    values = {}
    for name in ("dimensions", "truncate_prompt_tokens"):
        if name in request.DESCRIPTOR.fields_by_name and request.HasField(name):
            values[name] = getattr(request, name)
    try:
        return PoolingParams(**values)
    except InvalidParameter as e:
        raise BadRequest(e.field, str(e)) from None


def read_embed(request: pb.EmbedRequest, model_name: str, max_message_bytes: int) -> PoolingArgs:
    params = _checked(request, model_name, max_message_bytes, "inputs", len(request.inputs))
    choices: list[tuple[Prompt, PoolingParams]] = []
    for i, item in enumerate(request.inputs):
        which = item.WhichOneof("input")
        if which is None:
            raise BadRequest(f"inputs[{i}]", f"inputs[{i}] must set text or token_ids")
        choices.append((item.text if which == "text" else {"prompt_token_ids": list(item.token_ids.ids)}, params))
    return PoolingArgs(choices)


def read_rerank(request: pb.RerankRequest, model_name: str, max_message_bytes: int) -> PoolingArgs:
    params = _checked(request, model_name, max_message_bytes, "documents", len(request.documents))
    if request.top_n < 0:
        raise BadRequest("top_n", f"top_n must be at least 0, got {request.top_n}")
    return PoolingArgs([({"query": request.query, "document": d}, params) for d in request.documents], request.top_n)


def pooling_message(e: InvalidParameter, items: str) -> str:
    """The engine's refusal naming the proto's field: the item (inputs[i].text, inputs[i].token_ids,
    documents[i], query) or a request-wide one (dimensions, truncate_prompt_tokens, model)."""
    place = "" if e.index is None else f"[{e.index}]"
    names = {"prompt": f"{items}{place}.text", "prompt_token_ids": f"{items}{place}.token_ids",
             "document": f"documents{place}", "query": "query"}
    name = names.get(e.field, e.field)
    text = str(e)
    return name + text[len(e.field):] if text.startswith(e.field) else f"{name}: {text}"
