"""A GGUF file's WordPiece tokenizer (tokenizer.ggml.model "bert") rebuilt as the `tokenizers` pipeline of
the BERT tokenizer.json it was converted from.

llama.cpp's converter writes a BERT vocabulary in its "phantom space" form: a word's first piece as
"▁word", a continuation "##piece" as "piece", the special tokens (type CONTROL) as they are. The original
strings come back by undoing that, and with them BERT's pipeline: BertNormalizer (clean_text,
handle_chinese_chars, lowercase from `tokenizer.ggml.normalizer.lowercase`, accents stripped when
lowercasing as transformers does), BertPreTokenizer, WordPiece, [CLS] A [SEP] and [CLS] A [SEP] B [SEP]
(type ids 0, then 1 for B where the model has two token types) from the file's bos and sep ids, and the
WordPiece decoder. So the ids are transformers' for the original folder.

A word longer than 100 characters is one [UNK], as transformers' WordPiece has it
(max_input_chars_per_word); llama.cpp has no such limit and splits it into pieces.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer as _Backend

from nvllm.text.gguf_vocab import GGUF_CONTROL, GGUF_USER_DEFINED, gguf_list, gguf_token_id, short_value

PHANTOM_SPACE = "▁"          # U+2581: llama.cpp's mark of a word's first piece
GGUF_UNKNOWN = 2
MAX_WORD_CHARS = 100          # transformers' BertTokenizer / WordPiece default
LOWERCASE_KEY = "tokenizer.ggml.normalizer.lowercase"


def wpm_vocabulary(tokens: list[str], types: list[int]) -> list[str]:
    """The original WordPiece strings of a phantom-space vocabulary, in id order."""
    out = []
    for token, kind in zip(tokens, types):
        if kind in (GGUF_CONTROL, GGUF_UNKNOWN):
            out.append(token)
        elif token.startswith(PHANTOM_SPACE):
            out.append(token[len(PHANTOM_SPACE):])
        else:
            out.append("##" + token)
    return out


def wpm_backend(metadata: Mapping[str, Any], source: str) -> _Backend:
    """The `tokenizers` WordPiece pipeline a bert GGUF's tokenizer.ggml.* metadata describes."""
    tokens = gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    types = gguf_list(metadata, "tokenizer.ggml.token_type", int, source)
    if len(types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    words = wpm_vocabulary(tokens, types)
    vocab: dict[str, int] = {}
    for i, w in enumerate(words):
        if w in vocab:
            j = vocab[w]
            raise ValueError(f"{source}: tokenizer.ggml.tokens[{j}] ({short_value(tokens[j])}) and [{i}] "
                             f"({short_value(tokens[i])}) both read back as {short_value(w)}")
        vocab[w] = i
    ids = {}
    for key in ("unknown", "bos", "seperator"):   # llama.cpp spells "seperator"
        found = gguf_token_id(metadata, f"tokenizer.ggml.{key}_token_id", source, len(tokens))
        if found is None:
            raise ValueError(f"{source}: tokenizer.ggml.{key}_token_id is not set; a WordPiece tokenizer needs it")
        ids[key] = found
    lowercase = metadata.get(LOWERCASE_KEY, True)   # llama.cpp lowercases where the file does not say
    if not isinstance(lowercase, bool):
        raise ValueError(f"{source}: {LOWERCASE_KEY} is {short_value(lowercase)}, expected true or false")
    type_count = metadata.get("tokenizer.ggml.token_type_count", 2)
    second = 1 if isinstance(type_count, int) and type_count >= 2 else 0   # one type only: B's ids are 0 too
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(i, w, kind == GGUF_USER_DEFINED) for i, (w, kind) in enumerate(zip(words, types))
                         if kind in (GGUF_CONTROL, GGUF_UNKNOWN, GGUF_USER_DEFINED)],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": _template(words[ids["bos"]], ids["bos"], words[ids["seperator"]], ids["seperator"], second),
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": words[ids["unknown"]], "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": MAX_WORD_CHARS, "vocab": vocab},
    }
    try:
        return _Backend.from_str(json.dumps(spec))
    except Exception as e:  # the Rust side raises plain Exception
        raise ValueError(f"{source}: cannot build its WordPiece tokenizer: {e}") from None


def _added(i: int, content: str, user_defined: bool) -> dict[str, Any]:
    """A special token as BERT's tokenizer.json adds it (matched whole, before normalization); a user-defined
    one is added but not special (decode keeps it)."""
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": not user_defined}


def _template(cls: str, cls_id: int, sep: str, sep_id: int, second: int) -> dict[str, Any]:
    """BERT's TemplateProcessing: [CLS] A [SEP] and [CLS] A [SEP] B [SEP], B's part of type `second`. (llama.cpp
    adds bos and sep to every WordPiece text whatever add_bos_token and add_eos_token say; so does this.)"""
    def special(token: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": token, "type_id": type_id}}

    def seq(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    return {"type": "TemplateProcessing",
            "single": [special(cls, 0), seq("A", 0), special(sep, 0)],
            "pair": [special(cls, 0), seq("A", 0), special(sep, 0), seq("B", second), special(sep, second)],
            "special_tokens": {t: {"id": t, "ids": [i], "tokens": [t]} for t, i in ((cls, cls_id), (sep, sep_id))}}
