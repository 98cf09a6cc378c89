"""Ollama's options onto SamplingParams (server/http/ollama_request.py): each mapped option lands in its field;
Ollama's special values (num_predict -1 and -2, seed -1, repeat_last_n -1 and 0) mean what Ollama means by
them; the options nvllm has nothing for are taken where they ask for nothing it does not do and refused
otherwise, naming options.X; so are unknown ones and bad values, the engine's refusals included. num_ctx
bounds prompt and answer on a real engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx2
import ollama
import pytest

from helpers.ollama_app import MODEL, serve_ollama
from nvllm import LLM
from nvllm.engine.llm_engine import LLMEngine
from nvllm.server.http.errors import ApiError
from nvllm.server.http.ollama_request import read_chat, read_generate
from nvllm.server.reading import Served
from nvllm.server.state import DaemonState

USER = [{"role": "user", "content": "Name a colour."}]
SERVED = cast(Served, SimpleNamespace(model_name=MODEL, max_num_seqs=4, reasoning_parser="",
                                      engine=SimpleNamespace(chat_template=None, max_model_len=512)))


def params(options: dict[str, Any], **body: Any) -> Any:
    return read_chat({"messages": USER, "options": options, **body}, SERVED).params


def refused(options: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as e:
        read_chat({"messages": USER, "options": options}, SERVED)
    assert e.value.status == 400
    return e.value


def test_each_option_lands_in_its_field() -> None:
    p = params({"num_predict": 12, "temperature": 0.3, "top_k": 7, "top_p": 0.8, "min_p": 0.05,
                "repeat_penalty": 1.2, "repeat_last_n": 32, "presence_penalty": 0.4, "frequency_penalty": -0.5,
                "seed": 42, "stop": ["\n\n", "User:"], "num_ctx": 128})
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p) == (12, 0.3, 7, 0.8, 0.05)
    assert (p.repetition_penalty, p.penalty_last_n, p.presence_penalty, p.frequency_penalty) == (1.2, 32, 0.4, -0.5)
    assert (p.seed, p.stop, p.context_limit) == (42, ["\n\n", "User:"], 128)
    assert p.context_overflow == "drop_oldest"          # Ollama drops a long chat's oldest turns
    unset = params({})
    assert (unset.temperature, unset.top_k, unset.repetition_penalty) == (None, None, None)   # the model's
    assert unset.max_tokens is None and unset.penalty_last_n is None and unset.context_limit is None


def test_ollamas_special_values() -> None:
    assert params({"num_predict": -1}).max_tokens is None          # no limit but the context
    assert params({"num_predict": -2}).max_tokens is None          # fill the context
    assert params({"seed": -1}).seed is None                       # a random seed
    assert params({"repeat_last_n": 0}).penalty_last_n == 0         # no penalty
    assert params({"repeat_last_n": -1}).penalty_last_n == 512      # the whole context: max_model_len ...
    assert params({"repeat_last_n": -1, "num_ctx": 64}).penalty_last_n == 64   # ... or num_ctx
    assert params({}, truncate=False).context_overflow == "error"
    assert params({}, logprobs=True, top_logprobs=3).logprobs == 3


@pytest.mark.parametrize("options", [
    {"num_gpu": 99, "num_thread": 4, "num_batch": 512, "use_mmap": False, "use_mlock": True, "numa": False,
     "main_gpu": 0, "low_vram": True, "f16_kv": True},
    {"typical_p": 1.0, "tfs_z": 1, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "penalize_newline": True,
     "num_keep": 24},
    {"temperature": None, "num_predict": None},
])
def test_options_that_ask_for_nothing_more_are_taken(options: dict[str, Any]) -> None:
    params(options)


@pytest.mark.parametrize(("options", "named"), [
    ({"typical_p": 0.9}, "options.typical_p"), ({"mirostat": 2}, "options.mirostat"),
    ({"tfs_z": 0.5}, "options.tfs_z"), ({"vocab_only": True}, "options.vocab_only"),
    ({"num_gpu": "all"}, "options.num_gpu"), ({"flash": True}, "options.flash"),
    ({"temperature": "hot"}, "options.temperature"), ({"num_predict": 0}, "options.num_predict"),
    ({"num_predict": -3}, "options.num_predict"), ({"repeat_last_n": -2}, "options.repeat_last_n"),
    ({"stop": "x"}, "options.stop"), ({"stop": [1]}, "options.stop"), ({"top_k": 1.5}, "options.top_k"),
])
def test_other_options_are_refused_naming_them(options: dict[str, Any], named: str) -> None:
    e = refused(options)
    assert e.param == named and e.message.startswith(named), e.message


def test_generate_takes_the_same_options() -> None:
    req = read_generate({"prompt": "hi", "raw": True, "options": {"num_predict": 3, "seed": 7}}, SERVED)
    assert req.prompt == "hi" and req.params.max_tokens == 3 and req.params.seed == 7


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> LLMEngine:
    return LLM(tiny_models["tiny-llama"], num_blocks=128, max_num_seqs=8).engine


def test_num_ctx_bounds_the_answer_and_the_engines_refusals_name_options(engine: LLMEngine) -> None:
    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> list[Any]:
        bounded = await oc.chat(model=MODEL, messages=USER, options={"temperature": 0, "num_ctx": 60})
        out: list[Any] = [bounded]
        for options in ({"temperature": -1}, {"top_p": 0}, {"num_ctx": 0}, {"num_predict": 300},
                        {"num_ctx": 10}, {"repeat_penalty": 0}):
            out.append(await http.post("/api/chat", json={"model": MODEL, "messages": USER, "options": options,
                                                          "stream": False}))
        return out

    bounded, *refusals = serve_ollama(engine, body)
    assert bounded.done_reason == "length" and bounded.prompt_eval_count + bounded.eval_count == 60
    named = ["options.temperature", "options.top_p", "options.num_ctx", "options.num_predict", "messages",
             "options.repeat_penalty"]
    for response, name in zip(refusals, named):
        assert response.status_code == 400, (name, response.text)
        assert response.json()["error"].startswith(name), (name, response.text)
    assert "options.num_ctx 10" in refusals[4].json()["error"]


def test_a_chat_past_num_ctx_drops_its_oldest_turns_unless_truncate_is_false(engine: LLMEngine) -> None:
    turns: list[dict[str, Any]] = []
    for i in range(3):
        turns += [{"role": "user", "content": f"Turn {i}: report the battery and the wind."},
                  {"role": "assistant", "content": f"Reply {i}: battery fine, wind calm."}]
    chat = [{"role": "system", "content": "Be brief."}, *turns, {"role": "user", "content": "Land now?"}]
    options = {"temperature": 0, "num_predict": 4, "num_ctx": 100}

    async def body(oc: ollama.AsyncClient, http: httpx2.AsyncClient, state: DaemonState) -> list[Any]:
        whole = await http.post("/v1/chat/completions", json={"messages": chat, "max_tokens": 1})
        last = await oc.chat(model=MODEL, messages=[chat[0], chat[-1]], options=options)
        dropped = await oc.chat(model=MODEL, messages=chat, options=options)
        refused = await http.post("/api/chat", json={"model": MODEL, "messages": chat, "options": options,
                                                     "truncate": False, "stream": False})
        return [whole.json(), last, dropped, refused]

    whole, last, dropped, refused = serve_ollama(engine, body)
    assert whole["usage"]["prompt_tokens"] > 100
    assert last.prompt_eval_count < dropped.prompt_eval_count <= 96 and dropped.eval_count == 4
    assert refused.status_code == 400 and refused.json()["error"].startswith("messages")
    assert "options.num_ctx 100" in refused.json()["error"] and "truncate" in refused.json()["error"]
