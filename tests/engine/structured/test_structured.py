"""Structured output (issue 17): constraints through llguidance, on the real engine.

The request's field and its checks, the mask step of the sampler, the compiler (cache bound, hostile
input refused in bounded time, padded vocabularies), then the engine on a tiny model (regex, choice,
grammar, EOS and the grammar's end, mixed batches, preemption), SmolLM2 at temperature 1 over many
seeds (every answer validated with jsonschema), and the gRPC API through the live daemon.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import numpy as np
import pytest

from helpers.daemon_util import DaemonProcess, joined, request, run_bounded
from nvllm.engine.structured.compiler import StructuredCompiler
from nvllm.llm import LLM
from nvllm.model.sampling import mask
from nvllm.model.sampling.batch import SamplingBatch
from nvllm.model.sampling.sampler import make_generator, sample
from nvllm.sampling_params import InvalidParameter, SamplingParams, StructuredSpec
from nvllm.text.tokenizer import Tokenizer
from nvllm.v1 import nvllm_pb2 as pb
from nvllm.v1 import nvllm_pb2_grpc as pb_grpc

# Enums, number ranges (multipleOf on top of the digit budget, test_json_digit_budget.py), nested objects
# and arrays.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
        "score": {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.01},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "home": {"type": "object",
                 "properties": {"city": {"type": "string", "maxLength": 20},
                                "floor": {"type": "integer", "minimum": -2, "maximum": 99}},
                 "required": ["city", "floor"], "additionalProperties": False},
    },
    "required": ["name", "age", "color", "score", "tags", "home"],
    "additionalProperties": False,
}


def hostile_schema(n: int) -> dict[str, Any]:
    """allOf over n anyOfs: llguidance expands the intersection, 2**n ways."""
    return {"allOf": [{"anyOf": [{"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                  "required": [f"k{i}"]},
                                 {"type": "object", "properties": {f"j{i}": {"type": "string"}}}]}
                      for i in range(n)]}


@pytest.fixture(scope="module")
def tiny(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["tiny-llama"]


@pytest.fixture(scope="module")
def llm(tiny: Path) -> LLM:
    return LLM(tiny, num_blocks=64, max_num_seqs=16)


def one(llm: LLM, prompt, **params):
    return llm.generate(prompt, SamplingParams(**params))[0]


# -- the request's field -------------------------------------------------------------------------
class TestSpec:
    def test_shapes_clients_send_are_normalised(self) -> None:
        # The one-key dicts clients send, which the field's annotation does not admit: __post_init__ turns them
        # into a StructuredSpec.
        p = SamplingParams(structured={"json_schema": {"type": "object"}})  # type: ignore[arg-type]
        assert p.structured == StructuredSpec("json_schema", '{"type":"object"}')
        choice = SamplingParams(structured={"choice": ["a", "b"]}).structured  # type: ignore[arg-type]
        assert choice is not None and choice.value == ("a", "b")
        obj = SamplingParams(structured={"json_object": True})  # type: ignore[arg-type]
        assert obj.structured == StructuredSpec("json_object")
        SamplingParams(structured={"regex": "[0-9]+"}).validate()  # type: ignore[arg-type]

    @pytest.mark.parametrize("spec, field, words", [
        ({"regex": ""}, "structured.regex", "regular expression"),
        ({"choice": []}, "structured.choice", "1 to"),
        ({"choice": ["a", ""]}, "structured.choice", "entry 1"),
        ({"json_schema": "{not json"}, "structured.json_schema", "not valid JSON"),
        ({"json_schema": "[1, 2]"}, "structured.json_schema", "object or boolean"),
        ({"grammar": "x" * 300_000}, "structured.grammar", "at most"),
        (StructuredSpec("xml", "x"), "structured", "one of"),
        ("json", "structured", "StructuredSpec"),
    ])
    def test_bad_shapes_name_the_field(self, spec, field: str, words: str) -> None:
        with pytest.raises(InvalidParameter) as e:
            SamplingParams(structured=spec).validate()
        assert e.value.field == field and words in str(e.value) and str(e.value).startswith(field)


# -- the sampler's mask step ---------------------------------------------------------------------
def _bits(allowed: list[list[int]], vocab: int) -> np.ndarray:
    out = np.zeros((len(allowed), (vocab + 31) // 32), dtype=np.int32)
    u = out.view(np.uint32)
    for r, ids in enumerate(allowed):
        for t in ids:
            u[r, t // 32] |= np.uint32(1 << (t % 32))
    return out


class TestMask:
    def test_only_listed_rows_change_and_only_allowed_tokens_survive(self) -> None:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((3, 70)).astype(np.float32)
        y = mask.masked(x, np.array([2, 0]), _bits([[5, 64, 69], [0, 33]], 70))
        np.testing.assert_array_equal(y[1], x[1])
        assert y.dtype == np.float32 and y.flags.c_contiguous
        assert np.flatnonzero(np.isfinite(y[2])).tolist() == [5, 64, 69]
        assert np.flatnonzero(np.isfinite(y[0])).tolist() == [0, 33]

    def test_tokens_past_the_mask_are_not_allowed(self) -> None:
        x = mask.masked(np.zeros((1, 100), dtype=np.float32), np.array([0]),
                        np.full((1, 2), -1, dtype=np.int32))   # 64 bits for 100 tokens
        assert np.isfinite(x[0, :64]).all() and np.isneginf(x[0, 64:]).all()

    def test_sampler_draws_only_allowed_tokens_and_reports_masked_logprobs(self) -> None:
        rng = np.random.default_rng(1)
        logits = rng.standard_normal((4, 50)).astype(np.float32)
        before = logits.copy()
        n = 4
        batch = SamplingBatch(
            temperature=np.array([1.0, 0.0, 1.0, 0.7]), top_p=np.array([1.0] * n), top_k=np.array([0] * n),
            min_p=np.array([0.0] * n), presence_penalty=np.array([0.0, 0.0, 0.5, 0.0]),
            frequency_penalty=np.array([0.0] * n), repetition_penalty=np.array([1.0, 1.3, 1.0, 1.0]),
            output_token_ids=[np.array([3, 7])] * n, prompt_token_ids=[np.array([1, 2])] * n,
            generators=[make_generator(s) for s in range(n)], num_logprobs=np.array([3, 3, -1, -1]),
            allowed_tokens=_bits([[3, 7, 40], [11, 12]], 50), allowed_rows=np.array([0, 1]))
        out = sample(logits, batch)
        np.testing.assert_array_equal(logits, before)          # the caller's logits are left alone
        assert out.token_ids[0] in (3, 7, 40) and out.token_ids[1] in (11, 12)
        top0, top1 = out.top_logprobs[0], out.top_logprobs[1]
        assert top0 is not None and top1 is not None
        assert set(top0[0].tolist()) <= {3, 7, 40}
        assert set(top1[0].tolist()) == {11, 12}
        assert np.isclose(np.exp(top0[1]).sum(), 1.0, atol=1e-5)


# -- the compiler --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tokenizer(tiny: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny)


class TestCompiler:
    def test_cache_is_bounded_and_keeps_failures(self, tiny_tokenizer: Tokenizer) -> None:
        c = StructuredCompiler(tiny_tokenizer, tiny_tokenizer.vocab_size, [2], cache_size=2)
        for r in ("a+", "b+", "c+"):
            c.matcher(StructuredSpec("regex", r))
        assert c.cache_len == 2
        for _ in range(2):
            with pytest.raises(InvalidParameter) as e:
                c.matcher(StructuredSpec("grammar", "start: undefined_rule\n"))
            assert e.value.field == "structured.grammar" and "compiles" in str(e.value)
        assert c.cache_len == 2

    @pytest.mark.parametrize("spec, words", [
        (StructuredSpec("json_schema", json.dumps({"type": "string", "format": "bogus"})), "bogus"),
        (StructuredSpec("json_schema", json.dumps({"type": "object", "if": {"type": "string"}})), "if"),
        (StructuredSpec("json_schema", json.dumps(hostile_schema(16))), "too large"),
        (StructuredSpec("regex", "(unclosed"), "compiles"),
        (StructuredSpec("grammar", "root ::= \"a\" (\n"), "compiles"),
    ])
    def test_bad_constraints_are_refused_naming_the_field(self, tiny_tokenizer: Tokenizer, spec, words) -> None:
        c = StructuredCompiler(tiny_tokenizer, tiny_tokenizer.vocab_size, [2])
        t0 = time.monotonic()
        with pytest.raises(InvalidParameter) as e:
            c.matcher(spec)
        assert e.value.field == spec.field and words in str(e.value)
        assert time.monotonic() - t0 < c.timeout_s + 30   # bounded: llguidance's limits and the deadline

    def test_a_compile_past_the_deadline_is_refused(self, tiny_tokenizer: Tokenizer) -> None:
        c = StructuredCompiler(tiny_tokenizer, tiny_tokenizer.vocab_size, [2], timeout_s=0.001)
        with pytest.raises(InvalidParameter) as e:
            c.matcher(StructuredSpec("json_schema", json.dumps(hostile_schema(10))))
        assert e.value.field == "structured.json_schema" and "within" in str(e.value)
        c.close()

    def test_added_tokens_that_are_text_are_text_to_the_grammar(self, tiny: Path, tmp_path: Path) -> None:
        """Qwen's <tool_call> is an added token that is not special: the mask offers it where the grammar
        has its text, and the matcher takes it."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        folder = tmp_path / "tiny-added"
        shutil.copytree(tiny, folder)
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool call>", "é!")])
        backend.add_special_tokens([AddedToken("<|special|>", special=True, normalized=False)])
        backend.save(str(folder / "tokenizer.json"))
        tok = Tokenizer.from_dir(folder)
        plain, marker = tok.encode("<tool call>")[0], tok.token_to_id("<|special|>")
        c = StructuredCompiler(tok, tok.vocab_size, [2])
        for text, token in (("<tool call>", plain), ("é!", plain + 1)):
            m = c.matcher(StructuredSpec("grammar", f"start: {json.dumps(text, ensure_ascii=False)} \"x\"\n"))
            allowed = np.unpackbits(c.fill([m]).view(np.uint8), axis=1, bitorder="little")[0]
            assert allowed[token] and not allowed[marker]
            assert m.consume_token(token) and not m.is_error()
            assert m.consume_tokens(tok.encode("x")) and m.is_accepting()

    def test_a_padded_vocabulary_is_masked(self, tiny_tokenizer: Tokenizer) -> None:
        v = tiny_tokenizer.vocab_size
        c = StructuredCompiler(tiny_tokenizer, v + 45, [2])
        bits = c.fill([c.matcher(StructuredSpec("regex", "[a-z ]*")) for _ in range(5)])   # 5 rows: the parallel fill
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
        assert allowed.shape[1] >= v + 45 and allowed[:, :v].any(axis=1).all()
        assert not allowed[:, v:].any()


# -- the engine on a tiny model ------------------------------------------------------------------
class TestEngine:
    def test_regex_choice_and_grammar_hold_and_end_with_stop(self, llm: LLM) -> None:
        for seed in range(4):
            out = one(llm, "Hello", temperature=1.0, seed=seed, max_tokens=40,
                      structured=StructuredSpec("regex", "[a-d]{2,5}-[0-9]{2}"))
            assert re.fullmatch("[a-d]{2,5}-[0-9]{2}", out.text) and out.finish_reason == "stop"
            out = one(llm, "Hello", temperature=1.0, seed=seed, max_tokens=40,
                      structured=StructuredSpec("choice", ("alpha", "beta gamma", "delta")))
            assert out.text in ("alpha", "beta gamma", "delta") and out.finish_reason == "stop"
            out = one(llm, "Hello", temperature=1.0, seed=seed, max_tokens=40,
                      structured=StructuredSpec("grammar", 'root ::= "The answer is " ("yes" | "no") "."'))
            assert out.text in ("The answer is yes.", "The answer is no.") and out.finish_reason == "stop"
            assert out.stop_reason is None

    def test_min_tokens_yields_to_the_grammars_end(self, llm: LLM) -> None:
        out = one(llm, "Hello", temperature=0.0, max_tokens=20, min_tokens=10,
                  structured=StructuredSpec("choice", ("ok",)))
        assert out.text == "ok" and out.finish_reason == "stop"

    def test_json_with_penalties_logprobs_and_top_k(self, llm: LLM) -> None:
        schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}, "b": {"type": "boolean"}},
                  "required": ["a", "b"], "additionalProperties": False}
        out = one(llm, "Hello", temperature=1.5, top_k=5, repetition_penalty=1.3, presence_penalty=1.0,
                  seed=3, max_tokens=40, logprobs=3, structured=StructuredSpec("json_schema", json.dumps(schema)))
        jsonschema.validate(json.loads(out.text), schema)
        assert out.finish_reason == "stop"
        assert all(np.isfinite(lp.logprob) for lp in out.logprobs)

    def test_free_rows_are_unchanged_by_constrained_neighbours(self, llm: LLM) -> None:
        prompts = ["Once upon a time", "The quick brown fox", "Hello there"]
        free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        alone = [o.token_ids for o in llm.generate(prompts, free)]
        seeded = SamplingParams(temperature=0.9, seed=7, max_tokens=16, ignore_eos=True)
        alone_seeded = llm.generate(prompts[0], seeded)[0].token_ids
        constrained = [SamplingParams(temperature=1.0, seed=s, max_tokens=30,
                                      structured=StructuredSpec("regex", "[a-z]{10,20}")) for s in range(3)]
        mixed = llm.generate(prompts + prompts + [prompts[0]], [free] * 3 + constrained + [seeded])
        assert [o.token_ids for o in mixed[:3]] == alone
        assert mixed[6].token_ids == alone_seeded
        assert all(re.fullmatch("[a-z]{10,20}", o.text) for o in mixed[3:6])

    def test_preemption_keeps_the_matcher_in_step_with_the_tokens(self, tiny: Path, llm: LLM) -> None:
        spec = StructuredSpec("regex", "[a-z]{120,160}")
        params = [SamplingParams(temperature=0.0, max_tokens=110, structured=spec)] + \
                 [SamplingParams(temperature=1.0, seed=s, max_tokens=110, structured=spec) for s in range(5)]
        prompts = [f"Story number {i}" for i in range(6)]
        roomy = llm.generate(prompts, params)
        small = LLM(tiny, num_blocks=16, block_size=16, max_num_seqs=6, max_model_len=128)   # 6 cannot all fit
        tight = small.generate(prompts, params)
        assert small.stats()["preemptions"] > 0
        assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
        assert all(re.fullmatch("[a-z]{120,160}", o.text) for o in tight)
        small.engine.block_manager.check_integrity()

    def test_a_gguf_models_tokenizer_serves_constraints_too(self, tiny_ggufs: dict[str, Path]) -> None:
        gguf_llm = LLM(tiny_ggufs["tiny-qwen2"], num_blocks=32)
        out = gguf_llm.generate("Hello", SamplingParams(temperature=1.0, seed=2, max_tokens=40,
                                                        structured=StructuredSpec("regex", "[0-9]{3}-[a-z]{3}")))[0]
        assert re.fullmatch("[0-9]{3}-[a-z]{3}", out.text) and out.finish_reason == "stop"

    def test_a_refused_constraint_names_its_field(self, llm: LLM) -> None:
        with pytest.raises(InvalidParameter) as e:
            llm.engine.add_request("bad", "Hello", SamplingParams(
                structured={"json_schema": hostile_schema(16)}))  # type: ignore[arg-type]  # a client's dict
        assert e.value.field == "structured.json_schema"
        assert not llm.engine.has_unfinished()


# -- SmolLM2: JSON Schema at temperature 1 -------------------------------------------------------
@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_answers_validate_at_temperature_1_over_many_seeds(smollm2: Path) -> None:
    llm = LLM(smollm2, max_num_seqs=32)
    messages = [{"role": "user", "content": "Describe a fictional person as JSON."}]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=160,
                             structured={"json_schema": PERSON})  # type: ignore[arg-type]  # a client's dict
              for seed in range(32)]
    outs = llm.chat([messages] * len(params), params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), PERSON)
    assert len({o.text for o in outs}) > 16        # really sampled


# -- gRPC ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    d = DaemonProcess(tmp_path_factory.mktemp("daemon"), tiny)
    yield d
    d.stop()


def _structured(**kind: Any) -> pb.GenerateRequest:
    req = request("Hello", temperature=1.0, seed=5, max_tokens=40)
    req.structured.CopyFrom(pb.StructuredOutput(**kind))
    return req


def test_grpc_structured_end_to_end(daemon: DaemonProcess) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}

    async def go():
        async with grpc.aio.insecure_channel(daemon.address) as ch:
            stub = pb_grpc.GeneratorStub(ch)
            results = {}
            good: list[tuple[str, dict[str, Any]]] = [
                ("schema", dict(json_schema=json.dumps(schema))), ("object", dict(json_object=True)),
                ("regex", dict(regex="[0-9]{4}")), ("choice", dict(choice=pb.Choice(choices=["up", "down"]))),
                ("grammar", dict(grammar='start: "A" | "B"'))]
            for name, kind in good:
                results[name] = [r async for r in stub.Generate(_structured(**kind), timeout=60)]
            errors = {}
            bad: list[tuple[str, dict[str, Any]]] = [
                ("structured.json_schema", dict(json_schema=json.dumps(hostile_schema(16)))),
                ("structured.regex", dict(regex="(")),
                ("structured.json_object", dict(json_object=False)),
                ("structured.choice", dict(choice=pb.Choice()))]
            for name, kind in bad:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    [r async for r in stub.Generate(_structured(**kind), timeout=60)]
                errors[name] = e.value
            return results, errors

    results, errors = run_bounded(go())
    texts = {k: joined(v)[0] for k, v in results.items()}
    jsonschema.validate(json.loads(texts["schema"]), schema)
    assert isinstance(json.loads(texts["object"]), dict)
    assert re.fullmatch("[0-9]{4}", texts["regex"])
    assert texts["choice"] in ("up", "down") and texts["grammar"] in ("A", "B")
    assert all(v[-1].finish_reason == pb.FINISH_REASON_STOP for v in results.values())
    for field, e in errors.items():
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details().startswith(field), e.details()
