"""A working byte-level BPE vocabulary of any size, for a synthetic model.

Its first merges are learned from the short English text below, so ordinary prompts encode to sensible
pieces; the rest, up to the real model's count, join two of those tokens (picked by a seeded generator),
so every token is reachable and the merge list has the real one's length. Special tokens keep the real
ids; ids left over are unused padding, as in the real files.
"""

from __future__ import annotations

import json

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from nvllm.model_files.synthetic.shapes import Shape

ENGLISH = """\
The drone holds its position above the field while the operator asks how much battery is left.
A small language model answers on the board itself, with no network, in well under a second.
What is the capital of France? Paris is the capital of France, and it lies on the river Seine.
Please summarise the weather report: light wind from the west, some rain in the afternoon, 12 degrees.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
def add(a, b):
    return a + b
for i in range(10):
    print(i, i * i)
Return the list of waypoints as JSON: {"waypoints": [{"lat": 48.85, "lon": 2.35}, {"lat": 48.86, "lon": 2.34}]}
Once upon a time there was a robot who wanted to learn how to paint the colours of the sky at sunset.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 42 2026.
The system prompt tells the assistant to be brief, to answer in English, and to ask when it is unsure.
"""
_LEARNED = 2000  # merges learned from ENGLISH at most (it holds fewer pairs worth merging)


def _learned() -> tuple[list[str], list[tuple[str, str]]]:
    """Byte-level BPE learned from ENGLISH: (tokens in id order, merges in rank order)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + _LEARNED, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(ENGLISH.splitlines(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return sorted(vocab, key=vocab.__getitem__), merges  # type: ignore[return-value]


def bpe_vocabulary(n: int, seed: int) -> tuple[list[str], list[str]]:
    """n tokens and their merges ("a b", one per token past the byte alphabet)."""
    tokens, pairs = _learned()
    if n < len(tokens):
        raise ValueError(f"a BPE vocabulary needs at least {len(tokens)} tokens, asked for {n}")
    base = len(tokens)
    known = set(tokens)
    rng = np.random.default_rng(seed)
    while len(tokens) < n:
        for a, b in rng.integers(0, base, (n - len(tokens), 2)).tolist():
            t = tokens[a] + tokens[b]
            if t not in known:
                known.add(t)
                tokens.append(t)
                pairs.append((tokens[a], tokens[b]))
    return tokens, [f"{a} {b}" for a, b in pairs]


GGUF_NORMAL, GGUF_CONTROL, GGUF_UNUSED = 1, 3, 5


def vocabulary(shape: Shape, seed: int) -> tuple[list[str], list[int], list[str]]:
    """The whole token list of a synthetic `shape` (its `vocab` rows), their GGUF token types, and the merges."""
    bpe, merges = bpe_vocabulary(shape.bpe, seed)
    tokens = [f"[PAD{i}]" for i in range(shape.vocab)]
    types = [GGUF_UNUSED] * shape.vocab
    tokens[shape.bpe_start:shape.bpe_start + shape.bpe] = bpe
    types[shape.bpe_start:shape.bpe_start + shape.bpe] = [GGUF_NORMAL] * shape.bpe
    for i, text in shape.specials.items():
        tokens[i], types[i] = text, GGUF_CONTROL
    return tokens, types, merges
