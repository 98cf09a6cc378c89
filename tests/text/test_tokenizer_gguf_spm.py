"""Tokenizer.from_gguf_metadata of SentencePiece GGUFs (tokenizer.ggml.model "llama"): the ids of the model's own
tokenizer, decoding and streaming as SentencePiece does, special tokens, llama.cpp's defaults, refusals of a
malformed vocabulary, and a tiny random llama GGUF with such a vocabulary serving chat.

The goldens (tests/golden/tokenizer_spm-llama.json, tokenizer_spm-gemma.json, made by make_golden_spm.py) hold
a tiny trained SentencePiece BPE model as llama.cpp's converter writes it, and the ids transformers'
sentencepiece-backed tokenizer gives.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from gguf import GGMLQuantizationType as T
from hypothesis import given
from hypothesis import strategies as st

from helpers.gguf_util import write_random_gguf
from helpers.paths import ROOT
from helpers.tokenizer_cases import PROPERTY, stream
from nvllm.sampling_params import SamplingParams
from nvllm.text.detokenizer import REPLACEMENT_CHAR
from nvllm.text.gguf_spm import GGUF_BYTE, GGUF_NORMAL
from nvllm.text.gguf_vocab import GGUF_USER_DEFINED
from nvllm.text.tokenizer import Tokenizer

VARIANTS = ["spm-llama", "spm-gemma"]


@cache
def golden(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "tests" / "golden" / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


def meta(name: str, **change: Any) -> dict[str, Any]:
    """The golden's metadata with keys changed (None: removed; dots in keys spelt as __)."""
    out = dict(golden(name)["metadata"])
    for key, value in change.items():
        key = key.replace("__", ".")
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def tid(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    assert i is not None, token
    return i


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> tuple[str, Tokenizer]:
    return request.param, Tokenizer.from_gguf_metadata(meta(request.param), f"{request.param}.gguf")


@pytest.fixture(scope="module")
def llama() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta("spm-llama"), "spm-llama.gguf")


def test_ids_and_decode_equal_the_reference(variant):
    name, tok = variant
    doc = golden(name)
    assert len(doc["encode"]) > 50
    for case in doc["encode"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        assert tok.decode(case["ids"]) == case["decoded"], case["text"]
        assert tok.decode(tok.encode(case["text"])) == case["decoded"], case["text"]
    for case in doc["chat"]:
        assert tok.render_chat(case["messages"]) == case["text"]
        assert tok.encode_chat(case["messages"]) == case["ids"]


def test_text_round_trips_where_no_special_token_is_written(variant):
    name, tok = variant
    for case in golden(name)["encode"]:
        if "<" not in case["text"]:  # the special-token cases lose their tokens, as SentencePiece's do
            assert tok.decode(tok.encode(case["text"])) == case["text"], case["text"]


@PROPERTY
@given(text=st.text(st.characters(codec="utf-8", exclude_characters="<▁"), max_size=40))
def test_any_text_round_trips_and_streams_whole(variant, text: str):
    name, tok = variant
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    deltas, tail = stream(tok, [], ids)
    assert "".join(deltas) + tail == text


def test_special_tokens_and_flags_come_from_the_metadata(llama: Tokenizer):
    tok = llama
    assert (tok.bos_token, tok.eos_token, tok.special_tokens["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.encode("Hi")[0] == 1 and tok.encode("Hi", add_special_tokens=False)[0] != 1
    user, x, end = (tid(tok, t) for t in ("<|user|>", "▁x", "<|end|>"))
    assert tok.encode("<|user|>x<|end|>", add_special_tokens=False) == [user, x, end]
    # control and unknown tokens are what decode skips; byte tokens are the 256 <0xXX>
    assert tok.skipped_ids() == frozenset(range(7))
    assert len(tok.byte_token_ids()) == 256
    assert tok.decode([1, user, x, end], skip_special_tokens=False) == "<s><|user|> x<|end|>"


def test_end_of_turn_control_tokens_end_a_reply_as_in_llama_cpp():
    llama = Tokenizer.from_gguf_metadata(meta("spm-llama"), "phi3.gguf")
    gemma = Tokenizer.from_gguf_metadata(meta("spm-gemma"), "gemma.gguf")
    assert llama.extra_eos_ids == {tid(llama, "<|end|>")}
    assert gemma.extra_eos_ids == {tid(gemma, "<end_of_turn>")}
    m = meta("spm-llama")  # a user-defined token of that name ends nothing
    m["tokenizer.ggml.token_type"] = [GGUF_USER_DEFINED if t == "<|end|>" else ty
                                      for t, ty in zip(m["tokenizer.ggml.tokens"], m["tokenizer.ggml.token_type"])]
    assert Tokenizer.from_gguf_metadata(m, "user.gguf").extra_eos_ids == frozenset()


def test_gemma_has_no_dummy_prefix_and_keeps_leading_spaces():
    tok = Tokenizer.from_gguf_metadata(meta("spm-gemma"), "gemma.gguf")
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token, tok.pad_token_id) == ("<bos>", 2, "<eos>", 0)
    assert tok.id_to_token(tok.encode("Hello")[1]) == "Hello"
    assert tok.decode(tok.encode(" Hello")) == " Hello"


def test_llama_cpp_defaults_fill_what_the_file_leaves_out():
    bare = meta("spm-llama", tokenizer__ggml__bos_token_id=None, tokenizer__ggml__eos_token_id=None,
                tokenizer__ggml__add_bos_token=None, tokenizer__ggml__add_eos_token=None)
    tok = Tokenizer.from_gguf_metadata(bare, "bare.gguf")
    assert (tok.bos_token_id, tok.eos_token_id, tok.special_tokens["unk_token"]) == (1, 2, "<unk>")
    assert tok.encode("Hi")[0] == 1  # add_bos defaults to true for SentencePiece, as in llama.cpp
    no_bos = Tokenizer.from_gguf_metadata(meta("spm-llama", tokenizer__ggml__add_bos_token=False), "nobos.gguf")
    assert no_bos.encode("Hi") == tok.encode("Hi")[1:]


def test_user_defined_token_is_whole_and_kept_by_decode():
    m = meta("spm-llama")
    m["tokenizer.ggml.tokens"] = m["tokenizer.ggml.tokens"] + ["<tool>"]
    m["tokenizer.ggml.scores"] = m["tokenizer.ggml.scores"] + [-1000.0]
    m["tokenizer.ggml.token_type"] = m["tokenizer.ggml.token_type"] + [GGUF_USER_DEFINED]
    tok = Tokenizer.from_gguf_metadata(m, "user.gguf")
    ids = tok.encode("a<tool>b")
    assert len(m["tokenizer.ggml.tokens"]) - 1 in ids
    assert tok.decode(ids) == "a<tool> b"  # the stretch after it gets its own dummy prefix, as in llama.cpp


def test_the_higher_scoring_piece_is_merged_first_whatever_its_id():
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc"]
    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [2, 3, 3] + [GGUF_NORMAL] * 6}
    for scores, pieces in (([-9.0, -1.0], ["▁", "a", "bc"]), ([-1.0, -9.0], ["▁", "ab", "c"])):
        m = dict(base, **{"tokenizer.ggml.scores": [0.0] * 3 + [-2.0, -3.0, -4.0, -5.0] + scores})
        tok = Tokenizer.from_gguf_metadata(m, "scores.gguf")
        assert [tok.id_to_token(i) for i in tok.encode("abc", add_special_tokens=False)] == pieces


# ------------------------------------------------------------------------------------------ streaming


@pytest.mark.parametrize("text", ["東京 and 🚀 emoji 👍🏽 Здравствуйте", "naïve 東🚀\n\tdone"])
def test_byte_fallback_streams_whole_characters(variant, text: str):
    name, tok = variant
    prompt = tok.encode_chat([{"role": "user", "content": "Hi"}])
    output = tok.encode(text, add_special_tokens=False)
    assert set(output) & tok.byte_token_ids()
    deltas, tail = stream(tok, prompt, output)
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    full = tok.decode(output)
    # after a prompt the stream keeps the leading space decode() strips at the start of a text
    assert "".join(deltas) + tail == (" " + full if name == "spm-llama" else full)
    alone, tail = stream(tok, [], output)
    assert "".join(alone) + tail == full


def test_a_byte_run_cut_short_is_held_then_flushed(llama: Tokenizer):
    output = llama.encode("東京", add_special_tokens=False)[:-1]  # the last byte of 京 never comes
    deltas, tail = stream(llama, [], output)
    assert deltas == [""] * len(output)  # a later byte could still change how the run decodes
    # tokenizers' ByteFallback spells a run that is not UTF-8 as one U+FFFD per byte (SentencePiece: "東\ufffd")
    assert tail == llama.decode(output) == REPLACEMENT_CHAR * (len(output) - 1)


# ------------------------------------------------------------------------------------------ refusals


def refused(m: dict[str, Any], *words: str) -> None:
    with pytest.raises(ValueError) as err:
        Tokenizer.from_gguf_metadata(m, "bad.gguf")
    msg = str(err.value)
    assert msg.startswith("bad.gguf: ") and all(w in msg for w in words), msg


def _types_with(index: int, kind: int) -> list[int]:
    types = list(golden("spm-llama")["metadata"]["tokenizer.ggml.token_type"])
    types[index] = kind
    return types


def _tokens_with(index: int, token: str) -> list[str]:
    tokens = list(golden("spm-llama")["metadata"]["tokenizer.ggml.tokens"])
    tokens[index] = token
    return tokens


_BYTE_A = golden("spm-llama")["metadata"]["tokenizer.ggml.tokens"].index("<0x41>")


@pytest.mark.parametrize("change, words", [
    ({"tokenizer__ggml__scores": None}, ["tokenizer.ggml.scores", "missing"]),
    ({"tokenizer__ggml__scores": [0.0] * 3}, ["tokenizer.ggml.scores", "3 entries", "700 tokens"]),
    ({"tokenizer__ggml__scores": ["x"] * 700}, ["tokenizer.ggml.scores", "'x'", "float"]),
    ({"tokenizer__ggml__scores": [float("nan")] * 700}, ["tokenizer.ggml.scores[0]", "nan"]),
    ({"tokenizer__ggml__token_type": [1] * 699}, ["tokenizer.ggml.token_type", "699 entries"]),
    ({"tokenizer__ggml__token_type": _types_with(9, 9)}, ["tokenizer.ggml.token_type[9]", "is 9"]),
    ({"tokenizer__ggml__tokens": _tokens_with(9, "<s>")}, ["tokenizer.ggml.tokens", "'<s>' twice"]),
    ({"tokenizer__ggml__tokens": _tokens_with(_BYTE_A, "A-byte")}, [f"tokenizer.ggml.tokens[{_BYTE_A}]", "<0xXX>"]),
    ({"tokenizer__ggml__token_type": _types_with(_BYTE_A, GGUF_NORMAL)}, ["tokenizer.ggml.tokens", "<0x41>"]),
    ({"tokenizer__ggml__bos_token_id": 700}, ["tokenizer.ggml.bos_token_id", "700", "0..699"]),
    ({"tokenizer__ggml__unknown_token_id": -1}, ["tokenizer.ggml.unknown_token_id", "-1"]),
    ({"tokenizer__ggml__add_space_prefix": 1}, ["tokenizer.ggml.add_space_prefix", "true or false"]),
    ({"tokenizer__ggml__add_eos_token": True, "tokenizer__ggml__tokens": ["a", "b"], "tokenizer__ggml__scores": [0, 0],
      "tokenizer__ggml__token_type": [2, 1], "tokenizer__ggml__eos_token_id": None}, ["add_eos_token", "eos_token_id"]),
])
def test_malformed_vocabulary_is_refused_naming_the_key(change: dict[str, Any], words: list[str]):
    refused(meta("spm-llama", **change), *words)


def test_without_byte_tokens_unknown_text_is_the_unknown_token():
    m = meta("spm-llama")
    m["tokenizer.ggml.token_type"] = [GGUF_NORMAL if t == GGUF_BYTE else t for t in m["tokenizer.ggml.token_type"]]
    tok = Tokenizer.from_gguf_metadata(m, "nobytes.gguf")  # <unk> at 0, llama.cpp's default id
    ids = tok.encode("a東京b", add_special_tokens=False)
    assert 0 in ids and tok.byte_token_ids() and not set(ids) & tok.byte_token_ids()
    assert tok.decode(ids) == "ab"


# ------------------------------------------------------------------------------------------ serving


def test_a_sentencepiece_gguf_serves_chat(tmp_path):
    from nvllm import LLM

    m = meta("spm-llama")
    path = write_random_gguf(tmp_path / "spm.gguf", T.F32, hidden=64, intermediate=128, heads=2, kv_heads=1,
                             vocab=len(m["tokenizer.ggml.tokens"]), context=256, tokenizer=m)
    llm = LLM(str(path), num_blocks=16, max_model_len=128)
    messages = [{"role": "user", "content": "Größe von 東京?"}]
    out = llm.chat(messages, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    tok = Tokenizer.from_gguf_metadata(m, "spm.gguf")
    assert out.prompt_tokens == len(tok.encode_chat(messages))
    assert len(out.token_ids) == 12 and out.text
    assert out.text == tok.decode(out.token_ids) or out.text == " " + tok.decode(out.token_ids)


def test_the_converted_folder_tokenizes_as_the_gguf(tmp_path):
    from nvllm.model.weights.gguf_convert import build_folder

    class Quiet:
        def step(self, msg: str) -> None: ...
        def count(self, what: str, i: int, n: int) -> None: ...

    m = meta("spm-llama", tokenizer__ggml__add_bos_token=None)  # BOS by llama.cpp's default, not the key
    path = write_random_gguf(tmp_path / "spm.gguf", T.F32, hidden=64, intermediate=128, heads=2, kv_heads=1,
                             vocab=len(m["tokenizer.ggml.tokens"]), tokenizer=m)
    out = tmp_path / "folder"
    out.mkdir()
    build_folder(path, out, Quiet())
    folder, gguf = Tokenizer.from_dir(out), Tokenizer.from_gguf_metadata(m, "spm.gguf")
    for case in golden("spm-llama")["encode"]:
        assert folder.encode(case["text"]) == gguf.encode(case["text"]) == case["ids"], case["text"]
