"""Tokenizer.from_gguf_metadata on a t5 GGUF (text/gguf_ugm.py), the SentencePiece Unigram vocabulary llama.cpp's
converter wrote for tiny-xlmr-reranker: llama.cpp's own ids for every text it was given (its normalization map,
runs of spaces, unknown characters, special tokens' text; tests/golden/pooling_llamacpp.json), transformers' ids
for the reranker's pairs (<s> A </s></s> B </s>) and the folder's for the test texts, the folder's decoding; the
worst-normal-piece rule for unknown characters beside the converter's -10000 fillers; the flags a file may set
otherwise; and the refusals of a vocabulary it cannot rebuild."""
from __future__ import annotations

import json
from typing import Any

import pytest

from golden.pooling_cases import EMBED_TEXTS, UNIGRAM_TEXTS
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.model.weights.gguf_file import open_gguf
from nvllm.text.tokenizer import Tokenizer

GGUF = "tiny-xlmr-reranker.f32.gguf"


@pytest.fixture(scope="module")
def meta() -> dict[str, Any]:
    return dict(open_gguf(GOLDEN / "converted" / GGUF).metadata)


@pytest.fixture(scope="module")
def tok(meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta, GGUF)


@pytest.fixture(scope="module")
def folder(tiny_encoders: Any) -> Tokenizer:
    return Tokenizer.from_dir(tiny_encoders["tiny-xlmr-reranker"])


def llamacpp_ids() -> list[tuple[str, list[int]]]:
    runs = json.loads((GOLDEN / "pooling_llamacpp.json").read_text())["runs"]
    found = [(c["prompt"], c["input_ids"]) for r in runs if r["gguf"] == GGUF for c in r["cases"]]
    assert len(found) == 2 * 6 + len(UNIGRAM_TEXTS) + len(EMBED_TEXTS)
    return found


def test_every_text_llamacpp_tokenized_has_its_ids(tok: Tokenizer) -> None:
    """Its normalization map (tabs and odd spaces, full-width letters, a ligature, a decomposed é), merged
    spaces, runs of unknown characters as one <unk>, </s> and <s> in the text as the tokens, <mask> as text (the
    converter leaves no <mask>), and the rank prompts' pairs ("query\\tdocument")."""
    for prompt, ids in llamacpp_ids():
        if "\t" in prompt:
            query, document = prompt.split("\t")
            assert tok.encode_within(query, 512, document) == (ids, [0] * len(ids)), prompt
        else:
            assert tok.encode(prompt) == ids, prompt


def test_pairs_are_transformers_and_texts_are_the_folders(tok: Tokenizer, folder: Tokenizer) -> None:
    for c in golden_cases("tiny-xlmr-reranker"):
        assert tok.encode_within(c["query"], 512, c["document"]) == (c["input_ids"], c["token_type_ids"])
        assert c["input_ids"].count(2) == 3   # <s> query </s></s> document </s>
    for text in (*EMBED_TEXTS, *UNIGRAM_TEXTS):
        if "<mask>" not in text:   # the folder's <mask> is a token; the file has none
            assert tok.encode(text) == folder.encode(text), text
            assert tok.decode(tok.encode(text)) == folder.decode(folder.encode(text)), text
    assert tok.decode(tok.encode("The capital of France is Paris.")) == "The capital of France is Paris."
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                  "pad_token": "<pad>", "sep_token": "</s>", "mask_token": "[PAD473]"}


def synthetic(pieces: list[tuple[str, float, int]], **keys: Any) -> dict[str, Any]:
    """A t5 vocabulary: <unk>, <s>, </s> and the pieces (text, score, type)."""
    tokens = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), *pieces]
    return {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": [t for t, _, _ in tokens],
            "tokenizer.ggml.scores": [s for _, s, _ in tokens], "tokenizer.ggml.token_type": [k for _, _, k in tokens],
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.seperator_token_id": 2, "tokenizer.ggml.remove_extra_whitespaces": True,
            "tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.add_sep_token": True, **keys}


def test_an_unknown_character_costs_the_worst_normal_piece_less_10() -> None:
    """"▁Xbcd" with X unknown: "▁", <unk>, "bcd" scores -2 - (20 + 10) - 1 = -33 and "▁Xb", "c", "d"
    -20 - 9 - 9 = -38, so llama.cpp takes the <unk> (its penalty is 10 below the worst normal piece, -20). Were
    the -10000 filler counted, the <unk> would cost -10010 and lose."""
    pieces = [("▁Xb", -20.0, 1), ("bcd", -1.0, 1), ("c", -9.0, 1), ("d", -9.0, 1), ("b", -9.5, 1), ("▁", -2.0, 1),
              ("[PAD9]", -10000.0, 5)]
    tok = Tokenizer.from_gguf_metadata(synthetic(pieces), "synthetic")
    assert tok.encode("Xbcd") == [1, 8, 0, 4, 2]   # <s> ▁ <unk> bcd </s>


def test_what_the_flags_say() -> None:
    pieces = [("▁a", -1.0, 1), ("▁", -2.0, 1), ("a", -3.0, 1), ("b", -3.0, 1), ("▁b", -1.5, 1)]
    plain = Tokenizer.from_gguf_metadata(synthetic(pieces), "s")
    assert plain.encode("a  b ") == [1, 3, 7, 2] and plain.encode_within("a", 9, "b") == ([1, 3, 2, 2, 7, 2], [0] * 6)
    # No merging: every space a ▁; no prefix; only the EOS token
    kept = Tokenizer.from_gguf_metadata(synthetic(pieces, **{
        "tokenizer.ggml.remove_extra_whitespaces": False, "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_sep_token": False}), "s")
    assert kept.encode("a  b") == [5, 4, 7, 2] and kept.encode_within("a", 9, "b") == ([5, 2, 6, 2], [0] * 4)
    # No merging, with the prefix: a "▁" before each stretch between special tokens, as llama.cpp normalizes them
    spaced = Tokenizer.from_gguf_metadata(synthetic(pieces, **{"tokenizer.ggml.remove_extra_whitespaces": False}), "s")
    assert spaced.encode("a  b</s>b") == [1, 3, 4, 7, 2, 7, 2]
    # llama.cpp's defaults for a UGM vocabulary where the file says nothing: no BOS, an EOS, no separator
    bare = {k: v for k, v in synthetic(pieces).items() if not k.startswith("tokenizer.ggml.add_")}
    assert Tokenizer.from_gguf_metadata(bare, "s").encode("a") == [3, 2]


@pytest.mark.parametrize("change, message", [
    ({"tokenizer.ggml.scores": [0.0]}, r"8 tokens, 1 scores and 8 token types"),
    ({"tokenizer.ggml.token_type": [2, 3, 3, 3, 3, 3, 3, 3]}, r"tokenizer.ggml.token_type names no normal piece"),
    ({"tokenizer.ggml.unknown_token_id": None, "tokenizer.ggml.token_type": [1] * 8},
     r"tokenizer.ggml.unknown_token_id is not set and no token is of the unknown type"),
    ({"tokenizer.ggml.seperator_token_id": None},
     r"tokenizer.ggml.add_sep_token is set but tokenizer.ggml.seperator_token_id"),
    ({"tokenizer.ggml.precompiled_charsmap": [1, 2]},
     r"tokenizer.ggml.precompiled_charsmap is not a byte array of a compiled map"),
])
def test_a_vocabulary_it_cannot_rebuild_is_refused(change: dict[str, Any], message: str) -> None:
    pieces = [("▁a", -1.0, 1), ("▁", -2.0, 1), ("a", -3.0, 1), ("b", -3.0, 1), ("▁b", -1.5, 1)]
    meta = {k: v for k, v in {**synthetic(pieces), **change}.items() if v is not None}
    with pytest.raises(ValueError, match=rf"^bad\.gguf: {message}"):
        Tokenizer.from_gguf_metadata(meta, "bad.gguf")
