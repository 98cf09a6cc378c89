"""Text <-> token ids: a Hugging Face `tokenizers` backend with the model folder's specials and chat template.

Everything here aims at giving exactly the ids and text transformers gives for the same model folder:
  encode(text)          == AutoTokenizer(...)(text)["input_ids"]
  encode_chat(messages) == AutoTokenizer(...).apply_chat_template(messages, add_generation_prompt=True)
  decode(ids)           == AutoTokenizer(...).decode(ids, skip_special_tokens=True)
The template itself lives in nvllm.chat_template, streaming text in nvllm.detokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend
from tokenizers import processors

from nvllm.chat_template import Message, load_chat_template, render_chat_template, select_chat_template

# The named special tokens transformers passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

PathLike = Union[str, Path]


# ----------------------------------------------------------------------------------------------- files


def _read_json(path: Path, required: bool) -> Optional[dict]:
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


def _token_content(value: Any) -> Optional[str]:
    """A special token entry is a string, an AddedToken dict ({"content": ...}) or null."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


# ------------------------------------------------------------------------------------------ tokenizer


class Tokenizer:
    """A model folder's tokenizer: encode, decode, chat template, special tokens."""

    def __init__(
        self,
        backend: _Backend,
        *,
        special_tokens: Optional[Mapping[str, str]] = None,
        chat_template: Optional[str] = None,
        source: str = "<memory>",
    ) -> None:
        self._backend = backend
        self.source = source
        # name -> string, only the names that are set (what transformers' special_tokens_map holds)
        self.special_tokens: Dict[str, str] = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: Optional[int] = self.token_to_id(self.special_tokens.get("bos_token"))
        self.eos_token_id: Optional[int] = self.token_to_id(self.special_tokens.get("eos_token"))
        self.pad_token_id: Optional[int] = self.token_to_id(self.special_tokens.get("pad_token"))
        self._skipped_ids = self._ids_skipped_by_decode()
        named = (self.token_to_id(t) for t in self.special_tokens.values())
        self.all_special_ids: frozenset = frozenset(self._skipped_ids | {i for i in named if i is not None})
        self.chat_template: Optional[str] = chat_template
        self._template = None if chat_template is None else load_chat_template(chat_template, self.source)
        # What the incremental detokenizer asks about every token, worked out once here.
        self._decodable = self._decodable_mask()
        self._byte_token_ids = self._find_byte_tokens()

    # ---- loading

    @classmethod
    def from_dir(cls, path: PathLike) -> "Tokenizer":
        """Load tokenizer.json (required), tokenizer_config.json and chat_template.jinja from a Hugging
        Face model folder. The EOS ids of config.json and generation_config.json are the engine
        factory's to merge with eos_token_id."""
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: model folder not found")
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"{tokenizer_file}: required tokenizer file not found")
        try:
            backend = _Backend.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises plain Exception
            raise ValueError(f"{tokenizer_file}: cannot load: {e}") from e
        config = _read_json(folder / "tokenizer_config.json", required=False) or {}
        special = _special_tokens(folder, config)
        _add_declared_tokens(backend, config, special)
        _apply_bos_eos_flags(backend, config, special)
        return cls(
            backend,
            special_tokens=special,
            chat_template=select_chat_template(folder, config),
            source=str(folder),
        )

    def _ids_skipped_by_decode(self) -> frozenset:
        # tokenizers' decode(skip_special_tokens=True) drops the added tokens marked special, only those.
        return frozenset(i for i, t in self._backend.get_added_tokens_decoder().items() if t.special)

    # ---- ids and text

    @property
    def backend(self) -> _Backend:
        return self._backend

    @property
    def bos_token(self) -> Optional[str]:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> Optional[str]:
        return self.special_tokens.get("eos_token")

    def token_to_id(self, token: Optional[str]) -> Optional[int]:
        return None if token is None else self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._backend.id_to_token(int(token_id))

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of text; the tokenizer's post-processor decides about BOS/EOS when add_special_tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; ids the tokenizer does not know are dropped (as transformers does)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- chat

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The chat template's text for messages, rendered as transformers renders it."""
        if self._template is None:
            raise ValueError(
                f"{self.source}: the model has no chat template "
                "(no chat_template in tokenizer_config.json and no chat_template.jinja)"
            )
        return render_chat_template(self._template, messages, add_generation_prompt, self.special_tokens)

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> List[int]:
        """Token ids of the rendered chat; the template writes its own special tokens."""
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)

    # ---- what the incremental detokenizer needs

    def _decodable_mask(self) -> bytearray:
        ids = self._backend.get_vocab(with_added_tokens=True).values()
        mask = bytearray(max(ids, default=-1) + 1)
        for i in ids:
            mask[i] = 1
        return mask

    def _find_byte_tokens(self) -> frozenset:
        found = (self._backend.model.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in found if i is not None)

    def decodable_ids(self) -> bytearray:
        """mask[i] == 1 when decode() yields something for id i (it silently drops unknown ids)."""
        return self._decodable

    def byte_token_ids(self) -> frozenset:
        """Ids of byte-fallback tokens (<0x00>..<0xFF>, SentencePiece-style vocabularies); empty otherwise."""
        return self._byte_token_ids

    def skipped_ids(self) -> frozenset:
        """Ids decode(skip_special_tokens=True) leaves out."""
        return self._skipped_ids

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size})"


def _special_tokens(folder: Path, config: dict) -> Dict[str, str]:
    special: Dict[str, str] = {}
    legacy = _read_json(folder / "special_tokens_map.json", required=False) or {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config[name] if name in config else legacy.get(name)
        content = _token_content(value)
        if content is not None:
            special[name] = content
    return special


def _add_declared_tokens(backend: _Backend, config: dict, special: Mapping[str, str]) -> None:
    """Add tokens tokenizer_config.json declares but tokenizer.json lacks, as transformers does on load."""
    known = {t.content for t in backend.get_added_tokens_decoder().values()}
    declared: List[AddedToken] = []
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
    names = list(special.values()) + [_token_content(t) for t in extra]
    declared += [AddedToken(c, special=True, normalized=False) for c in names if c is not None]
    missing, seen = [], set(known)
    for tok in declared:
        if tok.content not in seen:
            seen.add(tok.content)
            missing.append(tok)
    if missing:
        backend.add_special_tokens([t for t in missing if t.special])
        backend.add_tokens([t for t in missing if not t.special])


def _apply_bos_eos_flags(backend: _Backend, config: dict, special: Mapping[str, str]) -> None:
    """tokenizer_config.json's add_bos_token / add_eos_token rewrite the post-processor (as in transformers)."""
    if "add_bos_token" not in config and "add_eos_token" not in config:
        return
    bos, eos = special.get("bos_token"), special.get("eos_token")
    add_bos = bool(config.get("add_bos_token")) and bos is not None and backend.token_to_id(bos) is not None
    add_eos = bool(config.get("add_eos_token")) and eos is not None and backend.token_to_id(eos) is not None
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
    tokens = []
    if add_bos:
        tokens.append((bos, backend.token_to_id(bos)))
    if add_eos:
        tokens.append((eos, backend.token_to_id(eos)))
    backend.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=tokens)
