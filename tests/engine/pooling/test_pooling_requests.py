"""Pooling requests through the engine (engine/llm_engine.py, engine/pooling_request.py, the scheduler): many
inputs in one forward pass within the token budget, each computed whole in one step (never chunked: a step
with no room leaves it waiting), answered once and its pages given back; priorities as for generation; a
request for another task refused naming the model; and the factory's rules for a model that keeps no keys
and values (its task, the settings it refuses, max_model_len within the budget, a pool of no bytes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from golden.pooling_cases import EMBED_TEXTS
from helpers.daemon_util import assert_pages_all_back
from helpers.engines import backed_engine
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.config import load_settings
from nvllm.engine.assembly.factory import EngineBuildError, build_engine, plan_for_board
from nvllm.engine.assembly.pooling_model import POOLING_SEQS
from nvllm.engine.llm_engine import LLMEngine
from nvllm.engine.pooling_request import judge_prompt
from nvllm.engine.prompt import Prompt
from nvllm.pooling_params import PoolingParams
from nvllm.sampling_params import InvalidParameter, SamplingParams


def engine(model: Path, task: str = "auto", **scheduler: int) -> LLMEngine:
    return backed_engine(load_settings(overrides={"model": {"path": str(model), "task": task}, "scheduler": scheduler}))


def run(eng: LLMEngine, prompts: list, priorities: list[int] | None = None) -> tuple[dict[str, list[float]], list]:
    """(request id -> its vector, each step's finished ids)."""
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, PoolingParams(), priorities[i] if priorities else 0)
    vectors: dict[str, list[float]] = {}
    steps = []
    while eng.has_unfinished():
        outs = eng.step()
        for o in outs:
            assert o.finished and o.error is None and o.pooled is not None and o.finish_reason == "stop"
            vectors[o.request_id] = o.pooled
        steps.append([o.request_id for o in outs])
    assert_pages_all_back(eng)
    return vectors, steps


def test_many_inputs_share_one_forward_pass_and_give_their_pages_back(tiny_encoders: dict[str, Path]) -> None:
    eng = engine(tiny_encoders["tiny-bert"])
    vectors, steps = run(eng, list(EMBED_TEXTS))
    assert steps == [[f"r{i}" for i in range(len(EMBED_TEXTS))]]     # 260 tokens: one step of the 512 budget
    alone, _ = run(eng, [EMBED_TEXTS[5]])
    assert np.allclose(alone["r0"], vectors["r5"], atol=1e-6)
    assert eng.stats()["prompt_tokens_computed"] > 260


def test_a_step_without_room_leaves_an_input_waiting_whole(tiny_encoders: dict[str, Path]) -> None:
    """A budget of 64 tokens: inputs of 41 and 42 tokens each get a step of their own, never a chunk."""
    eng = engine(tiny_encoders["tiny-bert"], max_num_batched_tokens=64)
    assert eng.max_model_len == 64                                       # cut to what one step computes
    long = [EMBED_TEXTS[3], EMBED_TEXTS[5], EMBED_TEXTS[1]]              # 41, 42 and 9 tokens
    _, steps = run(eng, long)
    assert steps == [["r0"], ["r1", "r2"]]
    with pytest.raises(InvalidParameter, match="prompt must be at most the model's 64 tokens"):
        eng.add_request("x", EMBED_TEXTS[7], PoolingParams())


def test_priorities_order_the_queue_as_for_generation(tiny_encoders: dict[str, Path]) -> None:
    eng = engine(tiny_encoders["tiny-bert"], max_num_batched_tokens=64)
    _, steps = run(eng, [EMBED_TEXTS[3], EMBED_TEXTS[5], EMBED_TEXTS[4]], priorities=[0, 5, -1])
    assert steps == [["r2"], ["r0"], ["r1"]]


def test_a_request_for_another_task_is_refused_naming_the_model(tiny_encoders: dict[str, Path], tiny: Path) -> None:
    embedder, reranker, chat = (engine(tiny_encoders["tiny-bert"]), engine(tiny_encoders["tiny-bert-reranker"]),
                                engine(tiny))
    cases: list[tuple[LLMEngine, Prompt, SamplingParams | PoolingParams, str]] = [
             (embedder, "hello", SamplingParams(), "this model gives embeddings; it cannot serve a request that "
                                                   "asks for text"),
             (embedder, {"query": "a", "document": "b"}, PoolingParams(), "asks for scores"),
             (reranker, "hello", PoolingParams(), "this model scores documents for a query"),
             (chat, "hello", PoolingParams(), "this model generates text")]
    for eng, prompt, params, words in cases:
        with pytest.raises(InvalidParameter, match=words) as e:
            eng.add_request("x", prompt, params)
        assert e.value.field == "model"
    assert not reranker.has_unfinished() and not chat.has_unfinished()


def test_the_factory_reads_the_task_and_refuses_what_an_encoder_cannot_do(tiny_encoders: dict[str, Path]) -> None:
    bert = str(tiny_encoders["tiny-bert"])
    assert engine(tiny_encoders["tiny-bert-reranker"]).task == "rerank"
    for overrides, words in [({"model": {"path": bert, "task": "generate"}}, "model.task='generate', but BertModel"),
                             ({"model": {"path": bert}, "speculative": {"method": "ngram"}}, "speculative.method"),
                             ({"model": {"path": bert}, "cache": {"persist_dir": "/tmp/x"}}, "cache.persist_dir")]:
        with pytest.raises(EngineBuildError, match=words):
            build_engine(load_settings(overrides=overrides))
    assert build_engine(load_settings(overrides={"model": {"path": bert, "task": "embed"}})).task == "embed"
    info, plan = plan_for_board(load_settings(overrides={"model": {"path": bert},
                                                         "scheduler": {"max_num_seqs": 40}}), 1.0)
    assert info.bytes_per_token == 0 and plan.sizing.bytes_per_block == 0 and plan.max_model_len == 128
    assert plan.sizing.num_blocks == 40 * 8 and plan.sizing.bound == "demand"   # forty sequences of 128 tokens
    _, few = plan_for_board(load_settings(overrides={"model": {"path": bert}, "scheduler": {"max_num_seqs": 4}}),
                            1.0)
    assert few.sizing.num_blocks == POOLING_SEQS * 8    # a board's 4 streams are not an embedding request's texts


def st_folder(src: Path, dst: Path, pooling: str) -> Path:
    """src with sentence-transformers' modules: `pooling` (a Pooling config's mode), then Normalize."""
    shutil.copytree(src, dst)
    (dst / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (dst / "1_Pooling").mkdir()
    (dst / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": pooling}))
    return dst


def test_a_decoder_embeds_with_its_last_token_where_its_files_or_the_task_say(tiny_models: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    qwen3 = engine(st_folder(tiny_models["tiny-qwen3"], tmp_path / "emb", "lasttoken"))
    assert qwen3.task == "embed" and qwen3.max_model_len == 512       # cut to the token budget
    vectors, steps = run(qwen3, ["the drone", "return home", "battery low"])
    assert len(steps) == 1 and all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in vectors.values())
    llama = build_engine(load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"]), "task": "embed"}}))
    assert llama.task == "embed" and len(run(llama, ["the drone"])[0]["r0"]) == 64
    with pytest.raises(EngineBuildError, match="a decoder embeds with its last token's state"):
        engine(st_folder(tiny_models["tiny-qwen3"], tmp_path / "mean", "mean"))
    with pytest.raises(EngineBuildError, match="needs the tokens 'yes' and 'no'"):
        build_engine(load_settings(overrides={"model": {"path": str(tiny_models["tiny-qwen3"]), "task": "rerank"}}))


CONVERTED = GOLDEN / "converted"   # llama.cpp's converter's files


def test_gguf_encoders_serve_as_llamacpp_reads_them() -> None:
    """The embedder's GGUF gives transformers' embeddings; the reranker's, which has no pooler and is scored
    with every token type 0, gives llama.cpp's scores (tests/golden/pooling_llamacpp.json, flash attention
    off), within what llama.cpp's tanh GELU makes of it (tests/model/weights/test_gguf_encoder.py)."""
    embedder = engine(CONVERTED / "tiny-bert.f32.gguf")
    assert embedder.task == "embed"
    golden = {c["text"]: c["embedding"] for c in golden_cases("tiny-bert") if c["kind"] == "text"}
    vectors, _ = run(embedder, list(EMBED_TEXTS))
    for i, text in enumerate(EMBED_TEXTS):
        v, want = np.asarray(vectors[f"r{i}"]), np.asarray(golden[text])
        assert v @ want / np.linalg.norm(v) / np.linalg.norm(want) >= 0.9999, text
    reranker = engine(CONVERTED / "tiny-bert-reranker.f32.gguf")
    assert reranker.task == "rerank"
    cases = next(r for r in json.loads((CONVERTED.parent / "pooling_llamacpp.json").read_text())["runs"]
                 if r["kind"] == "rank" and r["flash_attn"] == "off")["cases"]
    scores, _ = run(reranker, [{"query": c["query"], "document": c["document"]} for c in cases])
    assert max(abs(scores[f"r{i}"][0] - c["score"]) for i, c in enumerate(cases)) < 2.5e-3


@pytest.mark.smollm2
def test_a_decoder_reranker_judges_in_its_own_prompt(smollm2_gguf: Path) -> None:
    """model.task rerank on a decoder with "yes" and "no" tokens (SmolLM2's; a Qwen3-Reranker's in practice):
    each pair's score is logit("yes") - logit("no") after the pair in Qwen3-Reranker's prompt, the logits a
    generation request with that prompt gets for its first token."""
    reranker = engine(smollm2_gguf, "rerank")
    chat = engine(smollm2_gguf)
    pairs = [{"query": "What powers the drone?", "document": d}
             for d in ("A lithium battery powers the drone.", "Bees make honey.")]
    scores, steps = run(reranker, pairs)
    assert len(steps) == 1
    tok = reranker.tokenizer
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    assert yes is not None and no is not None
    for i, p in enumerate(pairs):
        ids = tok.encode(judge_prompt(p["query"], p["document"]))
        # both lifted alike, to the top two: the difference of their logprobs is that of their logits
        chat.add_request(f"g{i}", {"prompt_token_ids": ids}, SamplingParams(
            max_tokens=1, logprobs=2, temperature=0, logit_bias={yes: 30.0, no: 30.0}))
        outs = []
        while chat.has_unfinished():
            outs += chat.step()
        lps = outs[-1].logprobs
        assert lps is not None
        top = {t.token_id: t.logprob for t in lps[0].top}
        assert no in top and yes in top
        assert abs((top[yes] - top[no]) - scores[f"r{i}"][0]) < 1e-3
