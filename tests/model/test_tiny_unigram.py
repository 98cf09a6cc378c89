"""models/tiny_unigram.py, tiny-xlmr-reranker's SentencePiece Unigram vocabulary in its two forms: the
sentencepiece.bpe.model it writes reads back (protobuf) as XLM-R's layout of the tokenizer.json vocabulary (ids
shifted by one, <pad> and <mask> only in tokenizer.json), and its compiled normalization map, walked here as
llama.cpp walks it, gives every rule's replacement and nothing for other text."""
from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np

from helpers.paths import MODELS

sys.path.insert(0, str(MODELS))   # the makers, imported by name as make_test_models.py imports them
import tiny_unigram  # noqa: E402


def lookup(charsmap: bytes, text: bytes) -> tuple[int, bytes] | None:
    """The longest key of the map that text starts with, and its replacement (llama.cpp's normalize_prefix)."""
    size = int.from_bytes(charsmap[:4], "little")
    units = np.frombuffer(charsmap[4:4 + size], "<u4")
    blob = charsmap[4 + size:]

    def offset(i: int) -> int:
        u = int(units[i])
        return (u >> 10) << ((u & (1 << 9)) >> 6)

    found, node = None, offset(0)
    for n, c in enumerate(text, start=1):
        node ^= c
        if node >= len(units) or int(units[node]) & ((1 << 31) | 0xFF) != c:
            break
        leaf = (int(units[node]) >> 8) & 1
        node ^= offset(node)
        if leaf:
            start = int(units[node]) & ((1 << 31) - 1)
            found = (n, blob[start:blob.index(b"\0", start)])
    return found


def test_the_map_holds_each_rule_and_no_other_text() -> None:
    charsmap = tiny_unigram.precompiled_charsmap()
    assert len(charsmap) - 4 > int.from_bytes(charsmap[:4], "little") > 0
    assert int.from_bytes(charsmap[:4], "little") % 1024 == 0   # whole blocks of 256 units, as darts-clone
    for key, value in tiny_unigram.CHARSMAP_RULES.items():
        assert lookup(charsmap, key.encode() + b"x") == (len(key.encode()), value.encode()), repr(key)
    for text in ("e", "u", "abc", "\u00e9", "\u0301", "Z", " "):
        assert lookup(charsmap, text.encode()) is None, repr(text)
    # the longest key wins: "e" + U+0301 is a key, "e" alone is not
    assert lookup(charsmap, "e\u0301\u0301".encode()) == (3, "\u00e9".encode())


def test_the_model_file_is_tokenizer_jsons_vocabulary_in_xlmrs_layout(tiny_encoders: dict[str, Path]) -> None:
    folder = tiny_encoders["tiny-xlmr-reranker"]
    proto = tiny_unigram._model_proto()()
    proto.ParseFromString((folder / "sentencepiece.bpe.model").read_bytes())
    pieces = [(p.piece, p.score, p.type) for p in proto.pieces]
    assert pieces[:3] == [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    assert [v[0] for v in vocab[:4]] == ["<s>", "<pad>", "</s>", "<unk>"] and vocab[-1][0] == "<mask>"
    assert [(p, s) for p, s, _ in pieces[3:]] == [tuple(v) for v in vocab[4:-1]]   # float32 scores, both
    assert {t for _, _, t in pieces[3:]} == {1}
    t, n = proto.trainer_spec, proto.normalizer_spec
    assert (t.model_type, t.vocab_size, t.unk_id, t.bos_id, t.eos_id, t.pad_id) == (1, len(pieces), 0, 1, 2, -1)
    assert n.add_dummy_prefix and n.remove_extra_whitespaces and n.escape_whitespaces
    charsmap = spec["normalizer"]["precompiled_charsmap"]
    assert n.precompiled_charsmap == base64.b64decode(charsmap) == tiny_unigram.precompiled_charsmap()
    assert all(" " not in p and "\u2581" not in p[1:] for p, _, _ in pieces[3:])   # split by whitespace
