"""A GGUF file's byte-level BPE tokenizer (tokenizer.ggml.model "gpt2") rebuilt as a `tokenizers` BPE.

A GGUF file carries its tokenizer as arrays (llama.cpp's convert_hf_to_gguf.py writes them from the Hugging
Face tokenizer): the tokens in id order, their types, the BPE merges ("a b") and a name for the way text
is split before BPE (`tokenizer.ggml.pre`). We rebuild the `tokenizers` pipeline the original
tokenizer.json held, so the ids are those of the original model. SentencePiece ones are gguf_spm.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from nvllm.text.gguf_strip import gguf_strips
from nvllm.text.tokenizer_config import apply_bos_eos_flags

GGUF_CONTROL = 3       # llama.cpp's token_type of special tokens (<|im_end|>, <|eot_id|>)
GGUF_USER_DEFINED = 4  # added tokens that are not special (Qwen2.5's <tool_call>): matched whole, kept by decode

# Qwen2's split: contractions, letter runs with one leading non-letter, single digits, punctuation runs,
# newline runs, whitespace. Llama 3's is the same with digits in groups of up to three.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# GPT-4o's (tiktoken's o200k, Phi-4-mini's): case-aware letter runs with the contraction as their suffix,
# digits in groups of up to three, a punctuation run taking trailing newlines and slashes.
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class GGUFPreTokenizer:
    """What a `tokenizer.ggml.pre` value stands for in the original tokenizer.json."""

    split: str | None   # a regex isolating the pieces; None: GPT-2's own regex, inside ByteLevel
    digits: bool = False   # each digit its own piece first (StarCoder's Digits pre-tokenizer)
    nfc: bool = False      # the NFC normalizer (Qwen2's tokenizers have it)
    ignore_merges: bool = False  # a piece that is a whole token is taken as it is (Llama 3's BPE)


_GPT2 = GGUFPreTokenizer(split=None)
_STARCODER = GGUFPreTokenizer(split=None, digits=True)
_QWEN2 = GGUFPreTokenizer(split=_QWEN2_SPLIT, nfc=True)
_LLAMA3 = GGUFPreTokenizer(split=_LLAMA3_SPLIT, ignore_merges=True)

GGUF_PRE_TOKENIZERS: dict[str, GGUFPreTokenizer] = {
    "gpt-2": _GPT2,
    "smollm": _STARCODER,     # SmolLM, SmolLM2
    "starcoder": _STARCODER,
    "qwen2": _QWEN2,          # Qwen2, Qwen2.5, Qwen3
    "llama-bpe": _LLAMA3,     # Llama 3, 3.1, 3.2, 3.3 (llama.cpp also accepts the two older names)
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "gpt-4o": GGUFPreTokenizer(split=_GPT4O_SPLIT),   # Phi-4-mini
}


def gguf_backend(metadata: Mapping[str, Any], source: str) -> _Backend:
    """The `tokenizers` byte-level BPE a GGUF's tokenizer.ggml.* metadata describes."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{source}: tokenizer.ggml.model is {short_value(kind)}; nvllm reads byte-level BPE "
                         "('gpt2'), SentencePiece ('llama'), WordPiece ('bert') and Unigram ('t5') tokenizers from "
                         "GGUF files")
    pre = _gguf_pre_tokenizer(metadata, source)
    tokens = gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    types = gguf_list(metadata, "tokenizer.ggml.token_type", int, source)
    if len(types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ValueError(f"{source}: tokenizer.ggml.tokens holds {short_value(dup)} twice")
    merges = _gguf_merges(metadata, source)
    backend = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                  ignore_merges=pre.ignore_merges))
    _set_pipeline(backend, pre)
    strips = gguf_strips(metadata, source, tokens, types)
    backend.add_special_tokens([added_token(t, True, strips) for t, ty in zip(tokens, types) if ty == GGUF_CONTROL])
    backend.add_tokens([added_token(t, False, strips) for t, ty in zip(tokens, types) if ty == GGUF_USER_DEFINED])
    flags = {f"add_{k}_token": gguf_bool(metadata, f"tokenizer.ggml.add_{k}_token", source) for k in ("bos", "eos")}
    if any(flags.values()):
        special = gguf_special_tokens(metadata, source)
        for k in ("bos", "eos"):
            if flags[f"add_{k}_token"] and f"{k}_token" not in special:
                raise ValueError(f"{source}: tokenizer.ggml.add_{k}_token is set "
                                 f"but tokenizer.ggml.{k}_token_id is not")
        apply_bos_eos_flags(backend, flags, special)
    return backend


def _set_pipeline(backend: _Backend, pre: GGUFPreTokenizer) -> None:
    steps: list[pre_tokenizers.PreTokenizer] = []
    if pre.digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if pre.split is not None:
        steps.append(pre_tokenizers.Split(Regex(pre.split), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre.split is None))
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if pre.nfc:
        backend.normalizer = normalizers.NFC()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.decoder = decoders.ByteLevel()


def added_token(token: str, special: bool, strips: Mapping[str, tuple[bool, bool]]) -> AddedToken:
    """A GGUF's control or user-defined token as an added token; strips: gguf_strips' flags by token."""
    lstrip, rstrip = strips.get(token, (False, False))
    return AddedToken(token, special=special, normalized=False, lstrip=lstrip, rstrip=rstrip, single_word=False)


def _gguf_pre_tokenizer(metadata: Mapping[str, Any], source: str) -> GGUFPreTokenizer:
    name = metadata.get("tokenizer.ggml.pre")
    if name not in GGUF_PRE_TOKENIZERS:
        what = "is missing" if name is None else f"{short_value(name)} is not a pre-tokenizer nvllm reproduces"
        raise ValueError(f"{source}: tokenizer.ggml.pre {what}; known: {', '.join(sorted(GGUF_PRE_TOKENIZERS))}")
    return GGUF_PRE_TOKENIZERS[name]


def gguf_list(metadata: Mapping[str, Any], key: str, kind: type | tuple[type, ...], source: str) -> list:
    value = metadata.get(key)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{source}: {key} is {'missing' if value is None else type(value).__name__}, expected a list")
    bad = next((v for v in value if not isinstance(v, kind) or isinstance(v, bool)), None)
    if bad is not None:
        names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{source}: {key} holds {short_value(bad)}, expected {names} values")
    return list(value)


def _gguf_merges(metadata: Mapping[str, Any], source: str) -> list[tuple]:
    merges = []
    for m in gguf_list(metadata, "tokenizer.ggml.merges", str, source):
        pair = m.split(" ")  # byte-level symbols never hold a plain space
        if len(pair) != 2 or not all(pair):
            raise ValueError(f"{source}: tokenizer.ggml.merges holds {short_value(m)}, "
                             "expected two symbols and one space")
        merges.append((pair[0], pair[1]))
    return merges


def gguf_bool(metadata: Mapping[str, Any], key: str, source: str) -> bool:
    value = metadata.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} is {short_value(value)}, expected true or false")
    return value


def gguf_token_id(metadata: Mapping[str, Any], key: str, source: str, n_tokens: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n_tokens:
        raise ValueError(f"{source}: {key} is {short_value(value)}, not a token id (0..{n_tokens - 1})")
    return value


_GGUF_SPECIAL_IDS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding",
                     "sep_token": "seperator", "cls_token": "cls", "mask_token": "mask"}


def gguf_special_tokens(metadata: Mapping[str, Any], source: str) -> dict[str, str]:
    """Special token name (bos_token, ...) -> token, for the ids the GGUF sets (llama.cpp spells "seperator")."""
    tokens = gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    found = {}
    for name, key in _GGUF_SPECIAL_IDS.items():
        i = gguf_token_id(metadata, f"tokenizer.ggml.{key}_token_id", source, len(tokens))
        if i is not None:
            found[name] = tokens[i]
    return found


def short_value(value: Any) -> str:
    """A metadata value for an error message: a hostile file's value can be any size."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
