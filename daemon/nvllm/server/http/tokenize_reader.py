"""The bodies of POST /tokenize and POST /detokenize, in vLLM's shapes, read into what the engine takes.

/tokenize: {"prompt": text} (add_special_tokens, default true) or {"messages": [...]} with the chat
template's add_generation_prompt (default true), tools and chat_template_kwargs (a chat's template writes
its own special tokens, so add_special_tokens defaults to false there); return_token_strs asks for each
token as the vocabulary writes it. /detokenize: {"tokens": [ids]}. Either may name the served model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.engine.prompt import Prompt
from nvllm.server.http.body import ARRAY, BOOL, OBJECT, STRING, check_keys, check_model, need
from nvllm.server.http.errors import bad_request
from nvllm.server.http.openai_request import NEUTRAL, chat_messages

TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt",
                   "return_token_strs", "tools", "chat_template_kwargs"}
DETOKENIZE_FIELDS = {"model", "tokens"}


@dataclass
class TokenizeRequest:
    prompt: Prompt
    add_special_tokens: bool
    add_generation_prompt: bool
    return_token_strs: bool


def parse_tokenize(body: dict[str, Any], model_name: str) -> TokenizeRequest:
    check_keys(body, TOKENIZE_FIELDS, NEUTRAL)
    check_model(body, model_name)
    chat = "messages" in body
    if chat == ("prompt" in body):
        raise bad_request("prompt" if not chat else "messages",
                          "give either prompt (text) or messages (a chat), not " + ("both" if chat else "neither"))
    flags = {name: need(name, body[name], BOOL) if body.get(name) is not None else default
             for name, default in (("add_special_tokens", not chat), ("add_generation_prompt", True),
                                   ("return_token_strs", False))}
    prompt: Prompt
    if chat:
        for name in ("tools", "chat_template_kwargs"):
            if body.get(name) is not None:
                need(name, body[name], ARRAY if name == "tools" else OBJECT)
        prompt = {"messages": chat_messages(body["messages"]),
                  **{k: body[k] for k in ("tools", "chat_template_kwargs") if body.get(k) is not None}}
    else:
        for name in ("add_generation_prompt", "tools", "chat_template_kwargs"):
            if body.get(name) is not None:
                raise bad_request(name, f"{name} applies to messages, not to a prompt")
        prompt = {"prompt": need("prompt", body["prompt"], STRING)}
    return TokenizeRequest(prompt, **flags)


def parse_detokenize(body: dict[str, Any], model_name: str) -> list[int]:
    check_keys(body, DETOKENIZE_FIELDS, NEUTRAL)
    check_model(body, model_name)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise bad_request("tokens", "tokens must be an array of token ids")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad_request(f"tokens[{i}]", f"tokens[{i}] must be an integer token id")
    return tokens
