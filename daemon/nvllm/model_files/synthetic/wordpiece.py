"""A working WordPiece vocabulary of any size, in llama.cpp's form, for a synthetic BERT model.

Laid out as bert-base-uncased's vocab.txt is: the special tokens at their ids ([PAD] 0, [UNK] 100, [CLS] 101,
[SEP] 102, [MASK] 103), [unused0], [unused1], ... in the other ids below the shape's `bpe_start` (999), then
the pieces: every printable ASCII character but the capitals (the vocabulary is uncased) as a word's start and
as a continuation ("##c"), the words of vocab.py's ENGLISH text and the starts and ends its words share (so
ordinary words come out whole or in a few pieces, and no word of those characters is [UNK]), and up to the
shape's count pieces that join two of them (picked by a seeded generator, so every id is a real, reachable
piece). Written as llama.cpp's converter writes a BERT vocabulary: a word's first piece "▁word", a
continuation "##piece" as "piece", the special tokens (type CONTROL) as they are, every other token NORMAL,
[unusedN] included.
"""

from __future__ import annotations

import string
from collections import Counter

import numpy as np
from tokenizers import normalizers, pre_tokenizers

from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.vocab import ENGLISH, GGUF_CONTROL, GGUF_NORMAL, GGUF_UNUSED

PHANTOM_SPACE = "\u2581"   # llama.cpp's mark of a word's first piece
CONTINUATION = "##"
CHARACTERS = sorted(set(string.printable.strip()) - set(string.ascii_uppercase))
_AFFIX = 4   # longest word start or end taken as a piece of its own


def _learned() -> list[str]:
    """Pieces from ENGLISH, lowercased and split as BERT's tokenizer splits it: every word of two characters or
    more, then the 2- to 4-character starts and ends (as continuations) that two words or more share, each group
    by count, then alphabetically (so the same on every run, which the `tokenizers` WordPiece trainer is not)."""
    norm, pre = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(w for line in ENGLISH.splitlines() for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    for w in words:
        for k in range(2, min(len(w), _AFFIX + 1)):
            starts[w[:k]] += 1
            ends[CONTINUATION + w[-k:]] += 1
    out: dict[str, None] = {}
    for group in ({w: n for w, n in words.items() if len(w) > 1}, {p: n for p, n in starts.items() if n > 1},
                  {p: n for p, n in ends.items() if n > 1}):
        out.update(dict.fromkeys(sorted(group, key=lambda p: (-group[p], p))))
    return list(out)


def wordpiece_pieces(n: int, seed: int, reserved: frozenset[str] = frozenset()) -> list[str]:
    """n WordPiece pieces in BERT's own spelling ("word", "##piece"), all different and none in `reserved`."""
    pieces = CHARACTERS + [CONTINUATION + c for c in CHARACTERS] + _learned()
    if n < len(pieces):
        raise ValueError(f"a WordPiece vocabulary needs at least {len(pieces)} pieces, asked for {n}")
    base = len(pieces)
    known = set(pieces) | reserved
    rng = np.random.default_rng(seed)
    while len(pieces) < n:
        for a, b in rng.integers(0, base, (n - len(pieces), 2)).tolist():
            p = pieces[a] + pieces[b].removeprefix(CONTINUATION)   # a word's start stays one, a continuation too
            if p not in known and len(pieces) < n:
                known.add(p)
                pieces.append(p)
    return pieces


def phantom(piece: str) -> str:
    """A NORMAL piece as llama.cpp's converter writes it."""
    return piece[len(CONTINUATION):] if piece.startswith(CONTINUATION) else PHANTOM_SPACE + piece


def wordpiece_vocabulary(shape: Shape, seed: int) -> tuple[list[str], list[int]]:
    """The whole token list of a synthetic BERT `shape` (its `vocab` rows) as llama.cpp writes it, and their
    GGUF token types; rows past the pieces (none in the real shapes) are "[PAD{i}]", UNUSED, as the converter
    writes a vocabulary shorter than the embedding."""
    if shape.bpe_start + shape.bpe > shape.vocab:
        raise ValueError(f"{shape.name}: {shape.bpe} pieces from id {shape.bpe_start} pass the {shape.vocab} rows")
    tokens = [f"[PAD{i}]" for i in range(shape.vocab)]
    types = [GGUF_UNUSED] * shape.vocab
    unused = [i for i in range(shape.bpe_start) if i not in shape.specials]
    for n, i in enumerate(unused):
        tokens[i], types[i] = PHANTOM_SPACE + f"[unused{n}]", GGUF_NORMAL
    end = shape.bpe_start + shape.bpe
    taken = frozenset(f"[unused{n}]" for n in range(len(unused)))
    tokens[shape.bpe_start:end] = [phantom(p) for p in wordpiece_pieces(shape.bpe, seed, taken)]
    types[shape.bpe_start:end] = [GGUF_NORMAL] * shape.bpe
    for i, text in shape.specials.items():
        tokens[i], types[i] = text, GGUF_CONTROL
    return tokens, types
