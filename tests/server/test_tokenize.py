"""POST /tokenize and /detokenize (vLLM's shapes) and the gRPC Tokenize RPC, in process over the real engine
(the tiny Llama, its tokenizer made to add a BOS as Llama's does): the ids are those a generation request
starts from, for text and for a chat, with and without the special tokens and the generation prompt; the
token strings; the round trip; every refusal naming its field, in each API's own way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from helpers.http_app import error_of, serve_both
from nvllm import LLM
from nvllm.v1 import nvllm_pb2 as pb

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """The tiny Llama with a post-processor that puts <|endoftext|> first, as Llama's tokenizer puts <s>."""
    folder = tmp_path_factory.mktemp("bos") / "tiny-llama"
    shutil.copytree(tiny_models["tiny-llama"], folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    bos = next(t for t in spec["added_tokens"] if t["content"] == "<|endoftext|>")
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos["content"], "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos["content"]: {"id": bos["content"], "ids": [bos["id"]], "tokens": [bos["content"]]}}}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return LLM(folder, num_blocks=64, max_num_seqs=4)


def run(llm: LLM, body: Any, ready: bool = True) -> Any:
    """body(http client, grpc stub) against both APIs over one started engine."""
    return serve_both(llm.engine, lambda client, stub, state: body(client, stub), "tiny-llama", ready)


def grpc_chat(**kw: Any) -> pb.TokenizeRequest:
    chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in CHAT]
    return pb.TokenizeRequest(chat=pb.ChatMessages(messages=chat), **kw)


async def tokenize_rpc(stub: Any, req: pb.TokenizeRequest) -> pb.TokenizeResponse | grpc.aio.AioRpcError:
    try:
        return await stub.Tokenize(req)
    except grpc.aio.AioRpcError as e:
        return e


def test_the_ids_are_those_a_generation_request_starts_from(llm: LLM) -> None:
    tok = llm.tokenizer
    text_ids, bare_ids = tok.encode(TEXT), tok.encode(TEXT, add_special_tokens=False)
    chat_ids, open_ids = tok.encode_chat(CHAT, add_generation_prompt=False), tok.encode_chat(CHAT)
    assert text_ids != bare_ids and chat_ids != open_ids       # the flags matter for this tokenizer

    async def body(client: httpx.AsyncClient, stub: Any) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for name, payload in (("text", {"prompt": TEXT}), ("bare", {"prompt": TEXT, "add_special_tokens": False}),
                              ("chat", {"messages": CHAT}),
                              ("closed", {"messages": CHAT, "add_generation_prompt": False}),
                              ("strs", {"prompt": TEXT, "return_token_strs": True, "model": "tiny-llama"})):
            r = await client.post("/tokenize", json=payload)
            assert r.status_code == 200, r.text
            got[name] = r.json()
        r = await client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1})
        got["usage"] = r.json()["usage"]["prompt_tokens"]
        r = await client.post("/detokenize", json={"tokens": text_ids})
        got["detokenized"] = r.json()
        got["rpc_text"] = await stub.Tokenize(pb.TokenizeRequest(prompt=TEXT, return_token_strs=True))
        got["rpc_bare"] = await stub.Tokenize(pb.TokenizeRequest(prompt=TEXT, add_special_tokens=False))
        got["rpc_chat"] = await stub.Tokenize(grpc_chat())
        got["rpc_closed"] = await stub.Tokenize(grpc_chat(add_generation_prompt=False))
        return got

    got = run(llm, body)
    max_len = llm.engine.max_model_len
    assert got["text"] == {"count": len(text_ids), "max_model_len": max_len, "tokens": text_ids, "token_strs": None}
    assert got["bare"]["tokens"] == bare_ids
    assert got["chat"]["tokens"] == open_ids and got["usage"] == len(open_ids)
    assert got["closed"]["tokens"] == chat_ids
    assert got["strs"]["token_strs"] == [tok.id_to_token(i) for i in text_ids]
    assert got["detokenized"] == {"prompt": tok.decode(text_ids, skip_special_tokens=False)}
    assert TEXT in got["detokenized"]["prompt"]
    assert list(got["rpc_text"].token_ids) == text_ids and got["rpc_text"].max_model_len == max_len
    assert list(got["rpc_text"].token_strs) == got["strs"]["token_strs"]
    assert list(got["rpc_bare"].token_ids) == bare_ids and not got["rpc_bare"].token_strs
    assert list(got["rpc_chat"].token_ids) == open_ids and list(got["rpc_closed"].token_ids) == chat_ids


HTTP_REFUSED = [  # path, body, status, the param named, words of the message
    ("/tokenize", {}, 400, "prompt", "either prompt (text) or messages"),
    ("/tokenize", {"prompt": TEXT, "messages": CHAT}, 400, "messages", "not both"),
    ("/tokenize", {"prompt": 5}, 400, "prompt", "prompt must be a string"),
    ("/tokenize", {"prompt": TEXT, "add_generation_prompt": True}, 400, "add_generation_prompt",
     "applies to messages"),
    ("/tokenize", {"prompt": TEXT, "add_special_tokens": "yes"}, 400, "add_special_tokens", "true or false"),
    ("/tokenize", {"messages": []}, 400, "messages", "non-empty array"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi", "colour": 1}]}, 400, "messages[0].colour",
     "not supported"),
    ("/tokenize", {"messages": CHAT, "tools": {}}, 400, "tools", "tools must be an array"),
    ("/tokenize", {"prompt": TEXT, "temperature": 1}, 400, "temperature", "unknown parameter"),
    ("/tokenize", {"prompt": TEXT, "model": "gpt-4"}, 404, "model", "does not exist"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens", "tokens must be token ids in [0, "),
    ("/detokenize", {"tokens": [1, "2"]}, 400, "tokens[1]", "integer token id"),
    ("/detokenize", {"tokens": 3}, 400, "tokens", "array of token ids"),
]


def test_http_refusals_name_the_parameter(llm: LLM) -> None:
    async def body(client: httpx.AsyncClient, stub: Any) -> list[httpx.Response]:
        return [await client.post(path, json=payload) for path, payload, *_ in HTTP_REFUSED]

    for r, (path, payload, status, param, words) in zip(run(llm, body), HTTP_REFUSED):
        err = error_of(r, status)
        assert err["param"] == param and words in err["message"], (path, payload, err)


def test_grpc_refusals_are_invalid_argument_naming_the_field(llm: LLM) -> None:
    cases = [
        (pb.TokenizeRequest(), "input must be set"),
        (pb.TokenizeRequest(prompt=TEXT, add_generation_prompt=False), "add_generation_prompt applies to chat"),
        (grpc_chat(add_special_tokens=True), "add_special_tokens applies to prompt"),
        (pb.TokenizeRequest(prompt=TEXT, model="gpt-4"), "the model 'gpt-4' does not exist"),
        (pb.TokenizeRequest(chat=pb.ChatMessages()), "chat.messages must hold at least one message"),
        (grpc_chat(chat_template_kwargs="[1]"), "chat_template_kwargs must be a JSON object"),
        (grpc_chat(chat_template_kwargs='{"messages": 1}'), "chat_template_kwargs"),
    ]

    async def body(client: httpx.AsyncClient, stub: Any) -> list[Any]:
        return [await tokenize_rpc(stub, req) for req, _ in cases]

    for got, (req, words) in zip(run(llm, body), cases):
        assert isinstance(got, grpc.aio.AioRpcError), req
        code = grpc.StatusCode.NOT_FOUND if req.model else grpc.StatusCode.INVALID_ARGUMENT   # an unknown model
        assert got.code() == code and words in got.details(), got.details()


def test_while_the_model_loads_both_are_unavailable(llm: LLM) -> None:
    async def body(client: httpx.AsyncClient, stub: Any) -> tuple[httpx.Response, Any]:
        return (await client.post("/tokenize", json={"prompt": TEXT}),
                await tokenize_rpc(stub, pb.TokenizeRequest(prompt=TEXT)))

    r, rpc = run(llm, body, ready=False)
    error_of(r, 503)
    assert isinstance(rpc, grpc.aio.AioRpcError) and rpc.code() == grpc.StatusCode.UNAVAILABLE
