"""What a model folder adds to its tokenizer.json, as transformers reads it: the named special tokens
(tokenizer_config.json, else special_tokens_map.json), tokens declared but missing from tokenizer.json, and
the add_bos_token / add_eos_token flags (which a GGUF's tokenizer.ggml.add_*_token mean too)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as _Backend

# The named special tokens transformers passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def read_json(path: Path, required: bool) -> dict | None:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"{path}: required tokenizer file not found")
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def token_content(value: Any) -> str | None:
    """A special token entry is a string, an AddedToken dict ({"content": ...}) or null."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def folder_special_tokens(folder: Path, config: dict) -> dict[str, str]:
    """Name -> token for SPECIAL_TOKEN_NAMES as tokenizer_config.json sets them, else special_tokens_map.json."""
    special: dict[str, str] = {}
    legacy = read_json(folder / "special_tokens_map.json", required=False) or {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config[name] if name in config else legacy.get(name)
        content = token_content(value)
        if content is not None:
            special[name] = content
    return special


def add_declared_tokens(backend: _Backend, config: dict, special: Mapping[str, str]) -> None:
    """Add tokens tokenizer_config.json declares but tokenizer.json lacks, as transformers does on load."""
    known = {t.content for t in backend.get_added_tokens_decoder().values()}
    declared: list[AddedToken] = []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for _, tok in sorted(decoder.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            if isinstance(tok, dict) and isinstance(tok.get("content"), str):
                declared.append(AddedToken(
                    tok["content"], single_word=bool(tok.get("single_word", False)),
                    lstrip=bool(tok.get("lstrip", False)), rstrip=bool(tok.get("rstrip", False)),
                    normalized=bool(tok.get("normalized", not tok.get("special", False))),
                    special=bool(tok.get("special", False)),
                ))
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    if isinstance(extra, dict):  # model-specific named tokens
        extra = list(extra.values())
    names = list(special.values()) + [token_content(t) for t in extra]
    declared += [AddedToken(c, special=True, normalized=False) for c in names if c is not None]
    missing, seen = [], set(known)
    for tok in declared:
        if tok.content not in seen:
            seen.add(tok.content)
            missing.append(tok)
    if missing:
        backend.add_special_tokens([t for t in missing if t.special])
        backend.add_tokens([t for t in missing if not t.special])


def apply_bos_eos_flags(backend: _Backend, config: dict, special: Mapping[str, str]) -> None:
    """tokenizer_config.json's add_bos_token / add_eos_token rewrite the post-processor (as in transformers)."""
    if "add_bos_token" not in config and "add_eos_token" not in config:
        return
    # The tokens to add: flagged, named, and in the vocabulary (else None).
    bos = special.get("bos_token") if config.get("add_bos_token") else None
    eos = special.get("eos_token") if config.get("add_eos_token") else None
    bos = bos if bos is not None and backend.token_to_id(bos) is not None else None
    eos = eos if eos is not None and backend.token_to_id(eos) is not None else None
    single = f"{bos + ':0 ' if bos is not None else ''}$A:0{' ' + eos + ':0' if eos is not None else ''}"
    pair = f"{single}{' ' + bos + ':1' if bos is not None else ''} $B:1{' ' + eos + ':1' if eos is not None else ''}"
    tokens = []
    if bos is not None:
        tokens.append((bos, backend.token_to_id(bos)))
    if eos is not None:
        tokens.append((eos, backend.token_to_id(eos)))
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=tokens)
