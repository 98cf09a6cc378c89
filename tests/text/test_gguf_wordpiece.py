"""Tokenizer.from_gguf_metadata on a bert GGUF (text/gguf_wpm.py): the WordPiece tokenizer rebuilt from the
phantom-space vocabulary llama.cpp's converter writes gives transformers' ids and token type ids for every
golden case (tests/golden/pooling_*.json), is the folder's tokenizer.json itself, keeps transformers'
100-character word limit where llama.cpp has none, and refuses a vocabulary it cannot rebuild."""
from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.paths import GOLDEN, ROOT
from helpers.pooling_golden import golden_cases
from nvllm.model.weights.gguf_file import open_gguf
from nvllm.text.gguf_wpm import MAX_WORD_CHARS, wpm_vocabulary
from nvllm.text.tokenizer import Tokenizer

CONVERTED = GOLDEN / "converted"


def metadata(name: str) -> dict[str, Any]:
    return dict(open_gguf(CONVERTED / f"{name}.gguf").metadata)


@pytest.fixture(scope="module")
def bert_meta() -> dict[str, Any]:
    return metadata("tiny-bert.f32")


@pytest.fixture(scope="module")
def tok(bert_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(bert_meta, "tiny-bert.f32.gguf")


@pytest.mark.parametrize("gguf, name", [("tiny-bert.f32", "tiny-bert"), ("tiny-bert-cls.f32", "tiny-bert-cls")])
def test_every_golden_text_and_pair_has_transformers_ids(gguf: str, name: str) -> None:
    tok = Tokenizer.from_gguf_metadata(metadata(gguf), f"{gguf}.gguf")
    for c in golden_cases(name):
        if c["kind"] == "text":
            assert tok.encode(c["text"]) == c["input_ids"], c["text"]
            assert tok.encode_within(c["text"], 512) == (c["input_ids"], c["token_type_ids"])
        else:
            assert tok.encode_within(c["text"][0], 512, c["text"][1]) == (c["input_ids"], c["token_type_ids"])


def test_the_rerankers_pairs_have_transformers_ids_and_types() -> None:
    tok = Tokenizer.from_gguf_metadata(metadata("tiny-bert-reranker.f32"), "tiny-bert-reranker.f32.gguf")
    for c in golden_cases("tiny-bert-reranker"):
        assert tok.encode_within(c["query"], 512, c["document"]) == (c["input_ids"], c["token_type_ids"])
        assert set(c["token_type_ids"]) == {0, 1}


def test_the_rebuilt_pipeline_is_the_folders_tokenizer_json(tok: Tokenizer) -> None:
    folder = Tokenizer.from_dir(ROOT / "models" / "tiny-bert")
    assert tok.difference(folder) == ""
    assert json.loads(tok.backend.to_str()) == json.loads(folder.backend.to_str())
    assert tok.special_tokens == {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "[UNK]",
                                  "pad_token": "[PAD]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
    text = "The ÜBER-fast Café, in Zürich!"
    assert tok.decode(tok.encode(text)) == folder.decode(folder.encode(text)) == "the uber - fast cafe, in zurich!"


def test_phantom_space_pieces_read_back_as_wordpiece() -> None:
    assert wpm_vocabulary(["[CLS]", "▁the", "he", "▁[unused0]"], [3, 1, 1, 1]) == ["[CLS]", "the", "##he", "[unused0]"]


def test_llamacpp_agrees_but_for_the_word_past_the_limit(tok: Tokenizer) -> None:
    """llama.cpp's own ids (pooling_llamacpp.json) are ours for every text, except the 120-letter word: one
    [UNK] for transformers and for nvllm, 120 pieces for llama.cpp, which has no word limit."""
    run = json.loads((GOLDEN / "pooling_llamacpp.json").read_text())["runs"][0]
    long_word = 0
    for c in run["cases"]:
        if c["kind"] != "text":
            continue
        ours = tok.encode(c["prompt"])
        if max(len(w) for w in c["prompt"].split()) <= MAX_WORD_CHARS:
            assert ours == c["input_ids"], c["prompt"]
        else:
            long_word += 1
            assert ours.count(1) == 1 and tok.id_to_token(1) == "[UNK]" and len(c["input_ids"]) - len(ours) >= 100
    assert long_word == 1


def test_the_lowercase_flag_is_the_files(bert_meta: dict[str, Any]) -> None:
    cased = Tokenizer.from_gguf_metadata({**bert_meta, "tokenizer.ggml.normalizer.lowercase": False}, "cased.gguf")
    unk = cased.token_to_id("[UNK]")
    assert cased.encode("The Paris") == [2, unk, unk, 3]
    assert cased.encode("the paris") == Tokenizer.from_gguf_metadata(bert_meta, "x").encode("The Paris")


def test_one_token_type_gives_a_pair_types_0(bert_meta: dict[str, Any]) -> None:
    one = Tokenizer.from_gguf_metadata({**bert_meta, "tokenizer.ggml.token_type_count": 1}, "one.gguf")
    ids, types = one.encode_within("bees", 64, "honey bees")
    assert ids[0] == 2 and ids.count(3) == 2 and set(types) == {0}


@pytest.mark.parametrize("change, message", [
    ({"tokenizer.ggml.seperator_token_id": None}, r"tokenizer.ggml.seperator_token_id is not set"),
    ({"tokenizer.ggml.unknown_token_id": 5000}, r"tokenizer.ggml.unknown_token_id is 5000, not a token id"),
    ({"tokenizer.ggml.normalizer.lowercase": "yes"}, r"normalizer.lowercase is 'yes', expected true or false"),
    ({"tokenizer.ggml.token_type": [1, 3]}, r"token_type has 2 entries for 896 tokens"),
])
def test_what_cannot_be_rebuilt_is_refused(bert_meta: dict[str, Any], change: dict[str, Any], message: str) -> None:
    meta = {k: v for k, v in {**bert_meta, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_gguf_metadata(meta, "bad.gguf")


def test_two_tokens_that_read_back_the_same_are_refused(bert_meta: dict[str, Any]) -> None:
    tokens = list(bert_meta["tokenizer.ggml.tokens"])
    tokens[4] = "the"   # a control token spelt as "▁the" reads back
    with pytest.raises(ValueError, match=r"tokens\[4\] \('the'\) and \[110\] \('▁the'\) both read back as 'the'"):
        Tokenizer.from_gguf_metadata({**bert_meta, "tokenizer.ggml.tokens": tokens}, "dup.gguf")
