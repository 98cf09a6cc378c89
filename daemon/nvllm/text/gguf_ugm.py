"""A GGUF file's SentencePiece Unigram tokenizer (tokenizer.ggml.model "t5": llama.cpp's UGM, an XLM-RoBERTa's as
its converter writes it) rebuilt as the `tokenizers` pipeline transformers builds for the folder it came from.

The file holds the pieces with their scores and types, SentencePiece's normalization map
(`tokenizer.ggml.precompiled_charsmap`, run by tokenizers' Precompiled normalizer, which reads the same bytes
llama.cpp does), add_space_prefix and remove_extra_whitespaces. With remove_extra_whitespaces (XLM-R's) every word
is split on whitespace and gets a "▁" (transformers' WhitespaceSplit then Metaspace; llama.cpp merges the spaces
and puts one before each word: the same pieces, since no piece holds a "▁" past its first character); without
it each stretch between special tokens is one piece of work, its spaces "▁" and one more in front where
add_space_prefix says. The Unigram model finds the best-scoring split as llama.cpp's does, an unknown
character scoring the worst normal piece's score less 10 and a run of them one <unk>: so every piece that is
not a normal one (a control token, the converter's "[PADn]" filler, scored -10000) is given the worst normal
score here, which tokenizers takes its minimum over. Control and unknown tokens are special added tokens
(matched whole before normalization, as llama.cpp's special-token pass does); user-defined ones are added
tokens that decode keeps.

The post-processor is llama.cpp's (llama-embedding's and its server's rerank prompt): [bos] A [eos] for a text
and [bos] A [eos] [sep] B [eos] for a pair, each where add_bos_token / add_eos_token / add_sep_token ask (an
XLM-R's: <s> A </s> and <s> A </s></s> B </s>, transformers' too); token types all 0.

What llama.cpp does and this does not: it treats only " " as a space (tokenizers' WhitespaceSplit takes any
Unicode whitespace the map leaves), and the converter drops XLM-R's <mask> (its id holds a "[PADn]" filler).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer as _Backend

from nvllm.text.gguf_vocab import GGUF_CONTROL, GGUF_USER_DEFINED, gguf_bool, gguf_list, gguf_token_id, short_value

SPACE = "\u2581"                # SentencePiece's escaped space
GGUF_NORMAL, GGUF_UNKNOWN = 1, 2
CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"


def ugm_backend(metadata: Mapping[str, Any], source: str) -> _Backend:
    """The `tokenizers` Unigram pipeline a t5 GGUF's tokenizer.ggml.* metadata describes."""
    tokens = gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    scores = gguf_list(metadata, "tokenizer.ggml.scores", (float, int), source)
    types = gguf_list(metadata, "tokenizer.ggml.token_type", int, source)
    if not len(tokens) == len(scores) == len(types):
        raise ValueError(f"{source}: {len(tokens)} tokens, {len(scores)} scores and {len(types)} token types")
    normal = [float(s) for s, t in zip(scores, types) if t == GGUF_NORMAL]
    if not normal:
        raise ValueError(f"{source}: tokenizer.ggml.token_type names no normal piece; a Unigram model needs them")
    worst = min(normal)
    unk = gguf_token_id(metadata, "tokenizer.ggml.unknown_token_id", source, len(tokens))
    if unk is None:
        unk = next((i for i, t in enumerate(types) if t == GGUF_UNKNOWN), None)
    if unk is None:
        raise ValueError(f"{source}: tokenizer.ggml.unknown_token_id is not set and no token is of the unknown type")
    ids = {k: gguf_token_id(metadata, f"tokenizer.ggml.{k}_token_id", source, len(tokens))
           for k in ("bos", "eos", "seperator")}   # llama.cpp spells "seperator"
    # llama.cpp's defaults for a UGM vocabulary where the file does not say
    flags = {k: gguf_bool(metadata, f"tokenizer.ggml.add_{k}_token", source) if f"tokenizer.ggml.add_{k}_token"
             in metadata else default for k, default in (("bos", False), ("eos", True), ("sep", False))}
    for flag, key in (("bos", "bos"), ("eos", "eos"), ("sep", "seperator")):
        if flags[flag] and ids[key] is None:
            raise ValueError(f"{source}: tokenizer.ggml.add_{flag}_token is set but tokenizer.ggml.{key}_token_id "
                             "is not")
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(i, t, kind == GGUF_USER_DEFINED) for i, (t, kind) in enumerate(zip(tokens, types))
                         if kind in (GGUF_CONTROL, GGUF_UNKNOWN, GGUF_USER_DEFINED)],
        "normalizer": _normalizer(metadata, source),
        "pre_tokenizer": _pre_tokenizer(metadata, source),
        "post_processor": _template(tokens, ids["bos"] if flags["bos"] else None, ids["eos"] if flags["eos"] else None,
                                    ids["seperator"] if flags["sep"] else None),
        "decoder": {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": unk, "byte_fallback": False,
                  "vocab": [[t, float(s) if kind == GGUF_NORMAL else worst]
                            for t, s, kind in zip(tokens, scores, types)]},
    }
    try:
        return _Backend.from_str(json.dumps(spec))
    except Exception as e:  # the Rust side raises plain Exception
        raise ValueError(f"{source}: cannot build its Unigram tokenizer: {e}") from None


def _normalizer(metadata: Mapping[str, Any], source: str) -> dict[str, Any] | None:
    """SentencePiece's compiled normalization map where the file has one (llama.cpp normalizes nothing without)."""
    raw = metadata.get(CHARSMAP_KEY)
    if raw is None:
        return None
    values = gguf_list(metadata, CHARSMAP_KEY, int, source)
    if len(values) < 4 or any(not -128 <= v < 256 for v in values):
        raise ValueError(f"{source}: {CHARSMAP_KEY} is not a byte array of a compiled map ({short_value(raw)})")
    data = bytes(v & 0xFF for v in values)
    return {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(data).decode("ascii")}


def _pre_tokenizer(metadata: Mapping[str, Any], source: str) -> dict[str, Any]:
    prefix = gguf_bool(metadata, "tokenizer.ggml.add_space_prefix", source) \
        if "tokenizer.ggml.add_space_prefix" in metadata else True
    merge = gguf_bool(metadata, "tokenizer.ggml.remove_extra_whitespaces", source)
    if merge:
        return {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always", "split": True}]}
    # llama.cpp normalizes each stretch of text between special tokens on its own, a "▁" in front of each
    return {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": "always" if prefix else "never",
            "split": False}


def _added(i: int, content: str, user_defined: bool) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": not user_defined}


def _template(tokens: list[str], bos: int | None, eos: int | None, sep: int | None) -> dict[str, Any]:
    """[bos] A [eos] and [bos] A [eos] [sep] B [eos], the ids present; all of type 0."""
    def special(i: int | None) -> list[dict[str, Any]]:
        return [] if i is None else [{"SpecialToken": {"id": tokens[i], "type_id": 0}}]

    def seq(name: str) -> list[dict[str, Any]]:
        return [{"Sequence": {"id": name, "type_id": 0}}]

    used = {i for i in (bos, eos, sep) if i is not None}
    return {"type": "TemplateProcessing",
            "single": special(bos) + seq("A") + special(eos),
            "pair": special(bos) + seq("A") + special(eos) + special(sep) + seq("B") + special(eos),
            "special_tokens": {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]} for i in sorted(used)}}
