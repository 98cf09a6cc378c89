"""A SentencePiece Unigram vocabulary for the tiny XLM-RoBERTa folder (tiny_xlmr.py), made without a trainer
and written in both of the forms an XLM-R checkpoint carries it: the pieces and scores for tokenizer.json, and
sentencepiece.bpe.model, SentencePiece's own protobuf (llama.cpp's converter reads that file).

  unigram_pieces()         the pieces and their log-probabilities, learnt from tiny_encoders.CORPUS
  precompiled_charsmap()   a normalization map in SentencePiece's compiled form (a double-array trie of
                           UTF-8 keys, then the replacements), a small NFKC-like set of rules
  sentencepiece_model()    the ModelProto bytes: pieces, trainer_spec (UNIGRAM), normalizer_spec

Everything is plain Python over sorted inputs, so the bytes are the same on every run.
"""
from __future__ import annotations

import collections
import functools
import math

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tiny_encoders import CORPUS

SPACE = "\u2581"          # SentencePiece's escaped space
MAX_PIECE = 8             # characters in a learnt piece, the leading SPACE counted
SEED_PIECES = 1200        # candidates the learning starts from
KEPT_PIECES = 520         # multi-character pieces kept
ROUNDS = 3
# Letters beside printable ASCII: some of the test texts' accented ones (the others stay unknown).
EXTRA_CHARS = "éüàç"

# The normalization rules (what SentencePiece's nmt_nfkc does to these characters): whitespace to a space,
# ligatures, full-width letters and digits, an ellipsis, a circled digit, and two decomposed letters composed
# (keys of two code points, so the longest match matters).
CHARSMAP_RULES: dict[str, str] = {
    "\t": " ", "\n": " ", "\r": " ", "\u00a0": " ", "\u3000": " ",
    "\ufb01": "fi", "\ufb02": "fl", "\u2026": "...", "\u2460": "1", "e\u0301": "\u00e9", "u\u0308": "\u00fc",
    **{chr(0xFF21 + i): chr(0x41 + i) for i in range(26)},   # Ａ..Ｚ
    **{chr(0xFF41 + i): chr(0x61 + i) for i in range(26)},   # ａ..ｚ
    **{chr(0xFF10 + i): chr(0x30 + i) for i in range(10)},   # ０..９
}


# ---------------------------------------------------------------- the pieces

def _viterbi(word: str, scores: dict[str, float]) -> list[str]:
    """The best-scoring split of a word into known pieces (every character is one)."""
    best: list[tuple[float, int]] = [(0.0, 0)] + [(-math.inf, 0)] * len(word)
    for end in range(1, len(word) + 1):
        for start in range(max(0, end - MAX_PIECE), end):
            s = scores.get(word[start:end])
            if s is not None and best[start][0] + s > best[end][0]:
                best[end] = (best[start][0] + s, start)
    pieces, end = [], len(word)
    while end:
        start = best[end][1]
        pieces.append(word[start:end])
        end = start
    return pieces[::-1]


def _log_probs(counts: dict[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {p: math.log(n / total) for p, n in counts.items()}


@functools.cache
def unigram_pieces() -> tuple[tuple[str, float], ...]:
    """(piece, score) by score, best first: a Unigram model learnt as SentencePiece's trainer does in spirit
    (candidate substrings, then rounds of Viterbi counts and pruning), with no ties: each score is moved by
    a distinct thousandth, so that no two splits of a text can score the same."""
    words = collections.Counter(SPACE + w for line in CORPUS for w in line.split())
    alphabet = sorted({chr(c) for c in range(33, 127)} | set(EXTRA_CHARS) | {c for w in words for c in w[1:]})
    singles = [SPACE, *alphabet]
    seed: collections.Counter[str] = collections.Counter()
    for w, n in words.items():
        for i in range(len(w)):
            for j in range(i + 2, min(len(w), i + MAX_PIECE) + 1):
                seed[w[i:j]] += n
    multi = sorted((p for p, n in seed.items() if n >= 2), key=lambda p: (-seed[p] * len(p), p))[:SEED_PIECES]
    counts: dict[str, float] = {p: 1.0 for p in singles} | {p: float(seed[p]) for p in multi}
    for _ in range(ROUNDS):
        scores = _log_probs(counts)
        used: collections.Counter[str] = collections.Counter()
        for w, n in sorted(words.items()):
            used.update({p: n for p in _viterbi(w, scores)})
        multi = sorted((p for p in multi if used[p]), key=lambda p: (-used[p], p))[:KEPT_PIECES]
        counts = {p: used[p] + 0.5 for p in singles} | {p: float(used[p]) for p in multi}
    ranked = sorted(_log_probs(counts).items(), key=lambda kv: (-kv[1], kv[0]))
    golden = (math.sqrt(5) - 1) / 2
    return tuple((p, float(np.float32(s - 1e-3 * ((i * golden) % 1)))) for i, (p, s) in enumerate(ranked))


# ---------------------------------------------------------------- the normalization map

def precompiled_charsmap(rules: dict[str, str] = CHARSMAP_RULES) -> bytes:
    """SentencePiece's precompiled_charsmap: a little-endian u32 (the trie's size in bytes), the trie (a
    darts-clone double array over the keys' UTF-8 bytes, one u32 unit per node), then each replacement
    NUL-terminated. A unit holds its label (bits 0-7), has-leaf (bit 8) and the offset to its children (bits
    10-30: a child with label c of node i is at i ^ offset ^ c; a key's end is the child labelled 0, a value
    unit with bit 31 set that holds the replacement's position). llama.cpp, tokenizers' Precompiled
    normalizer and SentencePiece read it alike."""
    trie: dict = {}
    blob = bytearray()
    for key in sorted(rules):
        node = trie
        for b in key.encode():
            node = node.setdefault(b, {})
        node[None] = len(blob)
        blob += rules[key].encode() + b"\0"
    units = {0: 0}
    bases: set[int] = set()

    def place(node: dict, index: int) -> None:
        """Children at base ^ label for the lowest base no other node has and whose slots are free (a base of
        its own, as darts-clone gives each node: else a unit reached from another parent could pass the label
        check); each child's slot taken before any grandchild's."""
        keys = sorted(k for k in node if k is not None)
        labels = keys + [0] * (None in node)
        base = 1
        while base in bases or any((base ^ c) in units for c in labels):
            base += 1
        bases.add(base)
        units[index] |= (index ^ base) << 10 | (1 << 8 if None in node else 0)
        for k in keys:
            units[base ^ k] = k
        if None in node:
            units[base] = node[None] | 1 << 31
        for k in keys:
            place(node[k], base ^ k)

    place(trie, 0)
    array = np.zeros(-(-(max(units) + 1) // 256) * 256, "<u4")   # whole blocks of 256 units, as darts-clone
    for i, u in units.items():
        array[i] = u
    assert max(units) < 1 << 21, "the offsets must fit darts-clone's short form"
    return len(array.tobytes()).to_bytes(4, "little") + array.tobytes() + bytes(blob)


# ---------------------------------------------------------------- sentencepiece.bpe.model

NORMAL, UNKNOWN, CONTROL = 1, 2, 3   # ModelProto.SentencePiece.Type
UNIGRAM = 1                          # TrainerSpec.ModelType


def _model_proto() -> type:
    """ModelProto and the parts of it written here, as sentencepiece_model.proto declares them (same names,
    numbers and types; the fields left out keep their defaults)."""
    f = descriptor_pb2.FileDescriptorProto(name="sentencepiece_model.proto", package="sentencepiece",
                                           syntax="proto2")
    T = descriptor_pb2.FieldDescriptorProto

    def field(msg, name: str, number: int, kind: int, type_name: str = "", repeated: bool = False) -> None:
        f = msg.field.add(name=name, number=number, type=kind,
                          label=T.LABEL_REPEATED if repeated else T.LABEL_OPTIONAL)
        if type_name:
            f.type_name = type_name

    def enum(msg, name: str, values: dict[str, int]) -> None:
        e = msg.enum_type.add(name=name)
        for k, v in values.items():
            e.value.add(name=k, number=v)

    trainer = f.message_type.add(name="TrainerSpec")
    enum(trainer, "ModelType", {"UNIGRAM": 1, "BPE": 2, "WORD": 3, "CHAR": 4})
    field(trainer, "model_type", 3, T.TYPE_ENUM, ".sentencepiece.TrainerSpec.ModelType")
    field(trainer, "vocab_size", 4, T.TYPE_INT32)
    field(trainer, "split_by_whitespace", 22, T.TYPE_BOOL)
    field(trainer, "byte_fallback", 35, T.TYPE_BOOL)
    for name, number in (("unk_id", 40), ("bos_id", 41), ("eos_id", 42), ("pad_id", 43)):
        field(trainer, name, number, T.TYPE_INT32)
    norm = f.message_type.add(name="NormalizerSpec")
    field(norm, "name", 1, T.TYPE_STRING)
    field(norm, "precompiled_charsmap", 2, T.TYPE_BYTES)
    for name, number in (("add_dummy_prefix", 3), ("remove_extra_whitespaces", 4), ("escape_whitespaces", 5)):
        field(norm, name, number, T.TYPE_BOOL)
    model = f.message_type.add(name="ModelProto")
    piece = model.nested_type.add(name="SentencePiece")
    enum(piece, "Type", {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6})
    field(piece, "piece", 1, T.TYPE_STRING)
    field(piece, "score", 2, T.TYPE_FLOAT)
    field(piece, "type", 3, T.TYPE_ENUM, ".sentencepiece.ModelProto.SentencePiece.Type")
    field(model, "pieces", 1, T.TYPE_MESSAGE, ".sentencepiece.ModelProto.SentencePiece", repeated=True)
    field(model, "trainer_spec", 2, T.TYPE_MESSAGE, ".sentencepiece.TrainerSpec")
    field(model, "normalizer_spec", 3, T.TYPE_MESSAGE, ".sentencepiece.NormalizerSpec")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sentencepiece.ModelProto"))


def sentencepiece_model(pieces: tuple[tuple[str, float], ...], charsmap: bytes) -> bytes:
    """The model file of XLM-R's layout: <unk> 0, <s> 1, </s> 2, then the pieces (no <pad>, no <mask>: the
    Hugging Face tokenizer adds those, and shifts every piece by one)."""
    proto = _model_proto()()
    for text, score, kind in [("<unk>", 0.0, UNKNOWN), ("<s>", 0.0, CONTROL), ("</s>", 0.0, CONTROL),
                              *((p, s, NORMAL) for p, s in pieces)]:
        proto.pieces.add(piece=text, score=score, type=kind)
    t = proto.trainer_spec
    t.model_type, t.vocab_size, t.split_by_whitespace, t.byte_fallback = UNIGRAM, len(proto.pieces), True, False
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = 0, 1, 2, -1
    n = proto.normalizer_spec
    n.name, n.precompiled_charsmap = "tiny_nfkc", charsmap
    n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = True, True, True
    return proto.SerializeToString(deterministic=True)
