"""truncate_prompt_tokens (vLLM's) on generation requests, offline and over both APIs: a prompt longer than it
keeps its last tokens and is answered as that shorter prompt is; one longer than max_model_len is answered
instead of refused; a bad value is refused naming the field in each API's way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest

from helpers.http_app import error_of, serve_both
from nvllm import LLM, SamplingParams
from nvllm.v1 import nvllm_pb2 as pb

IDS = [(7 * i) % 400 + 3 for i in range(60)]


@pytest.fixture(scope="module")
def llm(tiny: Path) -> LLM:
    return LLM(tiny, num_blocks=64, max_num_seqs=4, max_model_len=48)


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **kw)


def test_the_prompt_keeps_its_last_tokens(llm: LLM) -> None:
    cut = llm.generate([{"prompt_token_ids": IDS}], greedy(truncate_prompt_tokens=10))[0]
    alone = llm.generate([{"prompt_token_ids": IDS[-10:]}], greedy())[0]
    assert cut.token_ids == alone.token_ids and cut.prompt_tokens == 10
    with pytest.raises(ValueError, match="shorter than max_model_len 48"):   # 60 tokens, without it
        llm.generate([{"prompt_token_ids": IDS}], greedy())


def test_both_apis_take_it_and_name_it_when_bad(llm: LLM) -> None:
    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> dict[str, Any]:
        sp = pb.SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, truncate_prompt_tokens=10)
        req = pb.GenerateRequest(prompt_token_ids=pb.TokenIds(ids=IDS), sampling_params=sp)
        rpc = [r async for r in stub.Generate(req)]
        with pytest.raises(grpc.aio.AioRpcError) as bad_rpc:
            sp0 = pb.SamplingParams(max_tokens=2, truncate_prompt_tokens=0)
            [r async for r in stub.Generate(pb.GenerateRequest(prompt="hi", sampling_params=sp0))]
        return {"completion": (await client.post("/v1/completions", json={
                    "prompt": IDS, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                    "truncate_prompt_tokens": 10})).json(),
                "bad": await client.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}], "truncate_prompt_tokens": "10"}),
                "rpc": rpc, "bad_rpc": bad_rpc.value}

    got = serve_both(llm.engine, body, "tiny-llama")
    want = llm.generate([{"prompt_token_ids": IDS[-10:]}], greedy())[0]
    assert got["completion"]["usage"]["prompt_tokens"] == 10
    assert got["completion"]["choices"][0]["text"] == want.text
    assert [t for r in got["rpc"] for t in r.token_ids] == want.token_ids and got["rpc"][-1].usage.prompt_tokens == 10
    err = error_of(got["bad"], 400)
    assert err["param"] == "truncate_prompt_tokens" and "an integer" in err["message"]
    assert got["bad_rpc"].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling_params.truncate_prompt_tokens" in got["bad_rpc"].details()
