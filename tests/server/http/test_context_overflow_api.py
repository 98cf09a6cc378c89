"""A conversation longer than the context over the HTTP API: refused by default with a 400 naming messages
and both lengths; answered with context_overflow "drop_oldest" (the request's field or the server's
setting), its usage saying how many prompt tokens were dropped; a bad value named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from helpers.http_app import error_of, serve_both
from nvllm import LLM, SamplingParams
from nvllm.engine.prompt import tokenize

SYSTEM = {"role": "system", "content": "You are the drone's assistant. Answer briefly."}
TURNS = [m for i in range(5) for m in (
    {"role": "user", "content": f"Turn {i}: report the battery, the wind and the altitude now."},
    {"role": "assistant", "content": f"Reply {i}: battery fine, wind calm, altitude one hundred."})]
CONVERSATION = [SYSTEM, *TURNS, {"role": "user", "content": "And now, should we land?"}]


@pytest.fixture(scope="module")
def llm(tiny: Path) -> LLM:
    return LLM(tiny, num_blocks=64, max_num_seqs=4, max_model_len=256)


def chat(**kw: Any) -> dict[str, Any]:
    return {"messages": CONVERSATION, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}


def test_refused_by_default_and_answered_with_drop_oldest(llm: LLM) -> None:
    async def body(client: httpx.AsyncClient, stub: Any, state: Any) -> dict[str, Any]:
        got = {"refused": await client.post("/v1/chat/completions", json=chat()),
               "dropped": (await client.post("/v1/chat/completions", json=chat(context_overflow="drop_oldest"))).json(),
               "bad": await client.post("/v1/chat/completions", json=chat(context_overflow="drop_newest"))}
        state.context_overflow = "drop_oldest"          # server.context_overflow
        got["server"] = (await client.post("/v1/chat/completions", json=chat())).json()
        got["asked_error"] = await client.post("/v1/chat/completions", json=chat(context_overflow="error"))
        return got

    got = serve_both(llm.engine, body, "tiny-llama")
    e = llm.engine
    full = len(tokenize(e.tokenizer, e.model.config.vocab_size, {"messages": CONVERSATION}).ids)
    err = error_of(got["refused"], 400)
    assert err["param"] == "messages" and f"{full} tokens" in err["message"] and "max_model_len 256" in err["message"]
    assert "drop_oldest" in err["message"]
    usage = got["dropped"]["usage"]
    assert usage["dropped_prompt_tokens"] > 0 and usage["prompt_tokens"] + usage["dropped_prompt_tokens"] == full
    want = llm.chat(CONVERSATION, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                 context_overflow="drop_oldest"))[0]
    assert got["dropped"]["choices"][0]["message"]["content"] == want.text
    again = got["server"]["usage"]     # the same turns kept: their pages come from the prefix cache
    assert again["dropped_prompt_tokens"] == usage["dropped_prompt_tokens"] and again["prompt_tokens_details"][
        "cached_tokens"] > 0
    assert error_of(got["asked_error"], 400)["param"] == "messages"      # the request's own field wins
    bad = error_of(got["bad"], 400)
    assert bad["param"] == "context_overflow" and "'error' or 'drop_oldest'" in bad["message"]
