"""nvllm.text.whisper_vocab: Whisper's special tokens placed by the vocabulary's size, the merges recovered from a
whisper.cpp vocabulary's ranks equal to Hugging Face's tokenizer.json, openai-whisper's non-speech tokens, and
vocabularies refused in bounded time."""
from __future__ import annotations

import pytest

from helpers.whisper_tensors import bpe_bytes, en_tokenizer_json
from nvllm.text.whisper_vocab import (
    MERGE_WORK,
    byte_level,
    rank_merges,
    suppress_tokens,
    tokenizer_from_bytes,
    whisper_specials,
)


def test_the_specials_follow_the_vocabulary_size():
    en, ml, v3 = whisper_specials(51864), whisper_specials(51865), whisper_specials(51866)
    assert (en.eot, en.sot, en.languages["en"], en.translate, en.notimestamps, en.timestamp_begin) == (
        50256, 50257, 50258, 50357, 50362, 50363)
    assert (ml.eot, ml.sot, ml.languages["en"], ml.transcribe, ml.notimestamps) == (50257, 50258, 50259, 50359, 50363)
    assert (v3.languages["yue"], v3.nospeech, v3.notimestamps, v3.timestamp_begin) == (50358, 50363, 50364, 50365)
    assert not en.is_multilingual and ml.is_multilingual and len(en.languages) == len(ml.languages) == 99
    names = v3.names()
    assert names[v3.nospeech] == "<|nospeech|>" and ml.names()[ml.nospeech] == "<|nocaptions|>"
    assert names[v3.languages["he"]] == "<|iw|>" and names[51865] == "<|30.00|>" and len(names) == 51866 - 50257
    for size in (51863, 51867, 0):
        with pytest.raises(ValueError, match=f"a vocabulary of {size} tokens is no Whisper model's"):
            whisper_specials(size)


def test_the_ranks_give_tokenizer_jsons_merges():
    data = en_tokenizer_json()
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
    assert rank_merges([byte_level(t) for t in bpe_bytes(data)]) == merges


def test_the_suppress_table_is_openai_whispers():
    tok = tokenizer_from_bytes(bpe_bytes(en_tokenizer_json()), 51864, "tiny.en")
    table = suppress_tokens(tok, whisper_specials(51864))
    assert table[:8] == [1, 2, 7, 8, 9, 10, 14, 25] and len(table) == 90
    assert table[-8:] == [47282, 49146, 50257, 50357, 50358, 50359, 50360, 50361]


def test_vocabularies_that_are_no_whispers_are_refused():
    tokens = bpe_bytes(en_tokenizer_json())
    with pytest.raises(ValueError, match=r"50255 BPE tokens, but a 51864-token Whisper vocabulary has 50256"):
        tokenizer_from_bytes(tokens[:-1], 51864, "x")
    with pytest.raises(ValueError, match=r"token 50255 repeats token 7"):
        tokenizer_from_bytes([*tokens[:-1], tokens[7]], 51864, "x")
    with pytest.raises(ValueError, match=r"the byte 0x21 has no token of its own"):
        tokenizer_from_bytes([b"\x00\xffnot a token", *tokens[1:]], 51864, "x")


def test_recovering_merges_is_bounded():
    """Tokens as long as a file allows would make the recovery quadratic: refused before any work."""
    long = ["a" * 1000 + str(i) for i in range(MERGE_WORK // 1_000_000 + 1)]
    with pytest.raises(ValueError, match=r"the tokens are far longer than a Whisper vocabulary's"):
        rank_merges(long)
