"""A GGUF file's SentencePiece tokenizer (tokenizer.ggml.model "llama") rebuilt as a `tokenizers` BPE.

Llama 2, TinyLlama, Mistral, Phi-3 and Gemma GGUFs carry a SentencePiece BPE model as arrays: the pieces in
id order, their scores and their types. SentencePiece merges the adjacent pair whose union is the piece
of highest score; a `tokenizers` BPE does the same when its merges are ranked by that score, as
transformers builds LlamaTokenizerFast and GemmaTokenizerFast from a tokenizer.model. A piece no merge
reaches is spelt in byte tokens (<0x00>..<0xFF>). The text between special tokens gets the dummy prefix
"▁" of its own (add_space_prefix), as llama.cpp and the legacy Llama tokenizers do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, normalizers

from nvllm.text.gguf_strip import gguf_strips
from nvllm.text.gguf_vocab import (
    GGUF_CONTROL,
    GGUF_USER_DEFINED,
    added_token,
    gguf_bool,
    gguf_list,
    gguf_token_id,
    short_value,
)
from nvllm.text.tokenizer_config import apply_bos_eos_flags

GGUF_NORMAL, GGUF_UNKNOWN, GGUF_UNUSED, GGUF_BYTE = 1, 2, 5, 6
_TYPES = {GGUF_NORMAL, GGUF_UNKNOWN, GGUF_CONTROL, GGUF_USER_DEFINED, GGUF_UNUSED, GGUF_BYTE}
_BYTE = re.compile(r"<0x([0-9A-F]{2})>")
SPACE = "▁"  # U+2581, SentencePiece's visible space

# What llama.cpp assumes of a SentencePiece vocabulary when the file does not say.
SPM_DEFAULTS: dict[str, Any] = {
    "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": False,
    "tokenizer.ggml.add_space_prefix": True,
}


# Control tokens llama.cpp ends a reply at by their text, whatever the file's ids say (Gemma's, Phi-3's, ...).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|end|>", "<|eot_id|>", "<|im_end|>", "<EOT>")


def spm_end_of_turn_ids(metadata: Mapping[str, Any]) -> list[int]:
    """Ids of the control tokens in END_OF_TURN_TOKENS (metadata already checked by spm_backend)."""
    pairs = zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"])
    return [i for i, (t, ty) in enumerate(pairs) if ty == GGUF_CONTROL and t in END_OF_TURN_TOKENS]


def with_spm_defaults(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """metadata with llama.cpp's defaults for the keys a SentencePiece GGUF leaves out (an id only where the
    vocabulary has it)."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    n = len(tokens) if isinstance(tokens, (list, tuple)) else 0
    out = dict(metadata)
    for key, value in SPM_DEFAULTS.items():
        if key not in out and (not key.endswith("_id") or value < n):
            out[key] = value
    return out


def spm_backend(metadata: Mapping[str, Any], source: str) -> _Backend:
    """The `tokenizers` pipeline of a SentencePiece GGUF; metadata already holds with_spm_defaults."""
    tokens = gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    scores = gguf_list(metadata, "tokenizer.ggml.scores", (float, int), source)
    types = gguf_list(metadata, "tokenizer.ggml.token_type", int, source)
    for key, values in (("tokenizer.ggml.scores", scores), ("tokenizer.ggml.token_type", types)):
        if len(values) != len(tokens):
            raise ValueError(f"{source}: {key} has {len(values)} entries for {len(tokens)} tokens")
    bad = next((i for i, s in enumerate(scores) if not math.isfinite(s)), None)
    if bad is not None:
        raise ValueError(f"{source}: tokenizer.ggml.scores[{bad}] is {scores[bad]}, not a finite number")
    bad = next((i for i, t in enumerate(types) if t not in _TYPES), None)
    if bad is not None:
        raise ValueError(f"{source}: tokenizer.ggml.token_type[{bad}] is {types[bad]}, not a SentencePiece "
                         f"token type (1..6)")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ValueError(f"{source}: tokenizer.ggml.tokens holds {short_value(dup)} twice")
    byte_fallback = _check_byte_tokens(tokens, types, source)
    unk_id = gguf_token_id(metadata, "tokenizer.ggml.unknown_token_id", source, len(tokens))
    if unk_id is None and not byte_fallback:
        raise ValueError(f"{source}: tokenizer.ggml.unknown_token_id is not set and the vocabulary has no byte "
                         "tokens: text outside the vocabulary would have no token")
    backend = _Backend(models.BPE(
        vocab=vocab, merges=_merges_by_score(tokens, scores, types), dropout=None, fuse_unk=True,
        unk_token=None if unk_id is None else tokens[unk_id], byte_fallback=byte_fallback))
    prefix = gguf_bool(metadata, "tokenizer.ggml.add_space_prefix", source)
    steps = [normalizers.Prepend(SPACE)] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE)])
    tail = [decoders.Strip(content=" ", left=1, right=0)] if prefix else []
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         *tail])
    # <unk> is special as in the Hugging Face Llama tokenizers: decode(skip_special_tokens) drops it
    special = {GGUF_CONTROL, GGUF_UNKNOWN}
    strips = gguf_strips(metadata, source, tokens, types)
    backend.add_special_tokens([added_token(t, True, strips) for t, ty in zip(tokens, types) if ty in special])
    backend.add_tokens([added_token(t, False, strips) for t, ty in zip(tokens, types) if ty == GGUF_USER_DEFINED])
    flags = {f"add_{k}_token": gguf_bool(metadata, f"tokenizer.ggml.add_{k}_token", source) for k in ("bos", "eos")}
    special_ids = {k: gguf_token_id(metadata, f"tokenizer.ggml.{k}_token_id", source, len(tokens))
                   for k in ("bos", "eos")}
    for k, wanted in flags.items():
        name = k[4:7]
        if wanted and special_ids[name] is None:
            raise ValueError(f"{source}: tokenizer.ggml.{k} is set but tokenizer.ggml.{name}_token_id is not")
    apply_bos_eos_flags(backend, flags, {f"{k}_token": tokens[i] for k, i in special_ids.items() if i is not None})
    return backend


def _check_byte_tokens(tokens: list[str], types: list[int], source: str) -> bool:
    """Whether the vocabulary falls back to bytes: then all 256 byte tokens must be there, each spelt <0xXX>."""
    found = set()
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty != GGUF_BYTE:
            continue
        m = _BYTE.fullmatch(t)
        if m is None:
            raise ValueError(f"{source}: tokenizer.ggml.tokens[{i}] is {short_value(t)}, a byte token "
                             "(token_type 6) not spelt <0xXX>")
        found.add(int(m.group(1), 16))
    if not found:
        return False
    missing = min(set(range(256)) - found, default=None)
    if missing is not None:
        raise ValueError(f"{source}: tokenizer.ggml.tokens has byte tokens but not <0x{missing:02X}>, which byte "
                         f"fallback needs ({256 - len(found)} of the 256 are missing)")
    return True


def _merges_by_score(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, the splits of higher-scoring pieces first (ties:
    the lower id), as transformers derives a SentencePiece BPE's merges."""
    normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == GGUF_NORMAL}
    ranked = []
    for token, i in normal.items():  # a 262k vocabulary (Gemma's) takes seconds here: the loop stays lean
        for cut in range(1, len(token)):
            left = token[:cut]
            if left in normal and token[cut:] in normal:
                ranked.append((-scores[i], i, left, token[cut:]))
    ranked.sort()
    return [(left, right) for _, _, left, right in ranked]
