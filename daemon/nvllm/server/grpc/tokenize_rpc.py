"""A TokenizeRequest read into DaemonState.tokenize's arguments: the checks that need no tokenizer (size,
model name, input; BadRequest naming the proto field), as generate_request.py reads a GenerateRequest."""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.engine.prompt import Prompt
from nvllm.server.grpc.generate_request import BadRequest, check_model, read_messages, template_kwargs
from nvllm.v1 import nvllm_pb2 as pb


@dataclass
class TokenizeArgs:
    input_field: str            # "prompt" or "chat"
    prompt: Prompt
    add_special_tokens: bool
    add_generation_prompt: bool


def read_tokenize(request: pb.TokenizeRequest, model_name: str, max_message_bytes: int) -> TokenizeArgs:
    size = request.ByteSize()
    if size > max_message_bytes:
        raise BadRequest("request", f"the request is {size} bytes; a request may be at most {max_message_bytes} "
                                    f"bytes (server.max_message_bytes)")
    check_model(request.model, model_name)
    which = request.WhichOneof("input")
    if which is None:
        raise BadRequest("input", "input must be set: one of prompt or chat")
    for name, applies in (("add_special_tokens", "prompt"), ("add_generation_prompt", "chat"),
                          ("chat_template_kwargs", "chat")):
        given = request.HasField(name) if name != "chat_template_kwargs" else bool(request.chat_template_kwargs)
        if given and which != applies:
            raise BadRequest(name, f"{name} applies to {applies} input, not to {which}")
    prompt: Prompt
    if which == "prompt":
        prompt = request.prompt
    else:
        if not request.chat.messages:
            raise BadRequest("chat.messages", "chat.messages must hold at least one message")
        messages = read_messages(request.chat)     # as Generate reads them, tool calls included
        prompt = {"messages": messages}
        if request.chat_template_kwargs:
            prompt = {"messages": messages, "chat_template_kwargs": template_kwargs(request.chat_template_kwargs)}
    special = request.add_special_tokens if request.HasField("add_special_tokens") else which == "prompt"
    opened = request.add_generation_prompt if request.HasField("add_generation_prompt") else True
    return TokenizeArgs(which, prompt, special, opened)
