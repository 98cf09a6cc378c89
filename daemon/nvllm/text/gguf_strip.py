"""Which added tokens of a GGUF swallow the whitespace beside them (lstrip / rstrip), by llama.cpp's rules.

A GGUF keeps no per-token strip flags: the converter drops Hugging Face's AddedToken lstrip / rstrip. llama.cpp
puts some back by model when it loads the vocabulary (src/llama-vocab.cpp, llama_vocab::impl::load, "set
attributes by model/tokenizer/architecture name"), from general.name (its ASCII letters lower-cased),
tokenizer.ggml.pre and general.architecture, each matched as a substring; the first rule that matches is the
only one applied. Phi-3-mini's files flag every added token rstrip but <unk>, <s> and <|endoftext|>, so its
chat template's "<|user|>\\n" is the token alone; without the rule the "\\n" became pieces of its own.

Where this differs from llama.cpp: the Phi-3 rule also matches "phi 3", since today's converter names
Phi-3-mini-4k-instruct "Phi 3 Mini 4k Instruct" (dashes made spaces), which llama.cpp's "phi-3" and "phi3"
miss (it then tokenizes such a file unlike the model's own tokenizer; no Phi-4 name holds any of the three);
the flags become `tokenizers` AddedToken ones, which strip any Unicode whitespace (llama.cpp: ASCII only), as
the Hugging Face folder's do; a token a rule names that the vocabulary lacks, or has as a normal piece, is
left out (llama.cpp refuses to load a Phi-3-named file without </s>, <unk>, <s> and <|endoftext|>).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# llama.cpp's special tokens, the ones its rules flag: unknown, control and user-defined (gguf.TokenType 2, 3, 4)
_SPECIAL_TYPES = frozenset((2, 3, 4))
# llama.cpp lower-cases the name byte by byte (std::tolower): the ASCII letters alone
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class StripRule:
    """When a rule applies (any of its substrings found), and which tokens it flags."""

    names: tuple[str, ...] = ()    # in general.name, lower-cased
    pres: tuple[str, ...] = ()     # in tokenizer.ggml.pre
    archs: tuple[str, ...] = ()    # in general.architecture
    lstrip: tuple[str, ...] = ()
    rstrip_special: bool = False   # every special token rstrip ...
    rstrip: tuple[str, ...] = ()   # ... and these
    not_rstrip: tuple[str, ...] = ()   # ... but these

    def matches(self, name: str, pre: str, arch: str) -> bool:
        return (any(s in name for s in self.names) or any(s in pre for s in self.pres)
                or any(s in arch for s in self.archs))


# In llama.cpp's order: the first match wins.
STRIP_RULES = (
    StripRule(pres=("jina-v2-de", "jina-v2-es", "jina-v2-code"), archs=("nomic-bert-moe", "jina-bert-v3"),
              lstrip=("<mask>",)),
    StripRule(names=("phi-3", "phi3", "phi 3"), rstrip_special=True, rstrip=("</s>",),
              not_rstrip=("<unk>", "<s>", "<|endoftext|>")),
    StripRule(names=("modern-bert",), lstrip=("[MASK]",)),
)


def gguf_strips(metadata: Mapping[str, Any], source: str, tokens: Sequence[str],
                types: Sequence[int]) -> dict[str, tuple[bool, bool]]:
    """token -> (lstrip, rstrip) for the tokens the file's rule flags (none when no rule matches)."""
    name, pre, arch = (_text(metadata, key, source)
                       for key in ("general.name", "tokenizer.ggml.pre", "general.architecture"))
    name = name.translate(_ASCII_LOWER)
    rule = next((r for r in STRIP_RULES if r.matches(name, pre, arch)), None)
    if rule is None:
        return {}
    rstrip = set(rule.rstrip)
    if rule.rstrip_special:
        rstrip |= {t for t, ty in zip(tokens, types) if ty in _SPECIAL_TYPES}
    rstrip -= set(rule.not_rstrip)
    lstrip = set(rule.lstrip)
    return {t: (t in lstrip, t in rstrip) for t in lstrip | rstrip}


def _text(metadata: Mapping[str, Any], key: str, source: str) -> str:
    value = metadata.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{source}: {key} is {type(value).__name__}, expected a string")
    return value
