"""Text <-> token ids: a Hugging Face `tokenizers` backend with the model folder's specials and chat template.

Everything here aims at giving exactly the ids and text transformers gives for the same model folder:
  encode(text)          == AutoTokenizer(...)(text)["input_ids"]
  encode_chat(messages) == AutoTokenizer(...).apply_chat_template(messages, add_generation_prompt=True)
  decode(ids)           == AutoTokenizer(...).decode(ids, skip_special_tokens=True)
The template itself lives in nvllm.chat_template, streaming text in nvllm.detokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors

from nvllm.chat_template import (Message, load_chat_template, render_chat_template, select_chat_template,
                                  template_takes_tools)

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
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        self._backend = backend
        self.source = source
        # Ids besides eos_token_id that end a reply (a GGUF's end-of-turn token); the engine factory merges them.
        self.extra_eos_ids: frozenset = frozenset(int(i) for i in extra_eos_ids)
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
        # Whether the template renders `tools` itself; if not, render_chat describes them in the system message.
        self.template_takes_tools = template_takes_tools(chat_template)
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

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], source: str) -> "Tokenizer":
        """The tokenizer a GGUF file describes: metadata holds its key/values as plain Python values
        (tokenizer.ggml.* and tokenizer.chat_template). Byte-level BPE ("gpt2") only; the special token
        ids, add_bos and the chat template come from the metadata. The end-of-turn (and end-of-message)
        ids, when they differ from the EOS id, are in extra_eos_ids."""
        backend = gguf_backend(metadata, source)
        tokens = metadata["tokenizer.ggml.tokens"]
        special = gguf_special_tokens(metadata, source)
        eos = special.get("eos_token")
        ends = (_gguf_token_id(metadata, f"tokenizer.ggml.{k}_token_id", source, len(tokens)) for k in ("eot", "eom"))
        template = metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{source}: tokenizer.chat_template is {type(template).__name__}, expected a string")
        return cls(
            backend,
            special_tokens=special,
            chat_template=template,
            source=source,
            extra_eos_ids=[i for i in ends if i is not None and tokens[i] != eos],
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

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Optional[Sequence[Any]] = None) -> str:
        """The chat template's text for messages (and OpenAI tools), rendered as transformers renders it."""
        if self._template is None:
            raise ValueError(
                f"{self.source}: the model has no chat template "
                "(no chat_template in tokenizer_config.json and no chat_template.jinja)"
            )
        return render_chat_template(self._template, messages, add_generation_prompt, self.special_tokens,
                                    tools=tools, takes_tools=self.template_takes_tools)

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Optional[Sequence[Any]] = None) -> List[int]:
        """Token ids of the rendered chat; the template writes its own special tokens."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools), add_special_tokens=False)

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


# ------------------------------------------------------------------------------------ GGUF vocabularies
# A GGUF file carries its tokenizer as arrays (llama.cpp's convert_hf_to_gguf.py writes them from the Hugging
# Face tokenizer): the tokens in id order, their types, the BPE merges ("a b") and a name for the way text
# is split before BPE (`tokenizer.ggml.pre`). We rebuild the `tokenizers` pipeline the original
# tokenizer.json held, so the ids are those of the original model.

GGUF_CONTROL = 3       # llama.cpp's token_type of special tokens (<|im_end|>, <|eot_id|>)
GGUF_USER_DEFINED = 4  # added tokens that are not special (Qwen2.5's <tool_call>): matched whole, kept by decode

# Qwen2's split: contractions, letter runs with one leading non-letter, single digits, punctuation runs,
# newline runs, whitespace. Llama 3's is the same with digits in groups of up to three.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class GGUFPreTokenizer:
    """What a `tokenizer.ggml.pre` value stands for in the original tokenizer.json."""

    split: Optional[str]   # a regex isolating the pieces; None: GPT-2's own regex, inside ByteLevel
    digits: bool = False   # each digit its own piece first (StarCoder's Digits pre-tokenizer)
    nfc: bool = False      # the NFC normalizer (Qwen2's tokenizers have it)
    ignore_merges: bool = False  # a piece that is a whole token is taken as it is (Llama 3's BPE)


_GPT2 = GGUFPreTokenizer(split=None)
_STARCODER = GGUFPreTokenizer(split=None, digits=True)
_QWEN2 = GGUFPreTokenizer(split=_QWEN2_SPLIT, nfc=True)
_LLAMA3 = GGUFPreTokenizer(split=_LLAMA3_SPLIT, ignore_merges=True)

GGUF_PRE_TOKENIZERS: Dict[str, GGUFPreTokenizer] = {
    "gpt-2": _GPT2,
    "smollm": _STARCODER,     # SmolLM, SmolLM2
    "starcoder": _STARCODER,
    "qwen2": _QWEN2,          # Qwen2, Qwen2.5, Qwen3
    "llama-bpe": _LLAMA3,     # Llama 3, 3.1, 3.2, 3.3 (llama.cpp also accepts the two older names)
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
}


def gguf_backend(metadata: Mapping[str, Any], source: str) -> _Backend:
    """The `tokenizers` byte-level BPE a GGUF's tokenizer.ggml.* metadata describes."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "llama":
        raise ValueError(f"{source}: tokenizer.ggml.model is 'llama' (a SentencePiece tokenizer); nvllm reads "
                         "only byte-level BPE ('gpt2') tokenizers from GGUF files")
    if kind != "gpt2":
        raise ValueError(f"{source}: tokenizer.ggml.model is {_short(kind)}; nvllm reads only byte-level BPE ('gpt2') "
                         "tokenizers from GGUF files")
    pre = _gguf_pre_tokenizer(metadata, source)
    tokens = _gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    types = _gguf_list(metadata, "tokenizer.ggml.token_type", int, source)
    if len(types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ValueError(f"{source}: tokenizer.ggml.tokens holds {_short(dup)} twice")
    merges = _gguf_merges(metadata, source)
    backend = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                                  ignore_merges=pre.ignore_merges))
    _set_pipeline(backend, pre)
    backend.add_special_tokens([_added(t, True) for t, ty in zip(tokens, types) if ty == GGUF_CONTROL])
    backend.add_tokens([_added(t, False) for t, ty in zip(tokens, types) if ty == GGUF_USER_DEFINED])
    flags = {f"add_{k}_token": _gguf_bool(metadata, f"tokenizer.ggml.add_{k}_token", source) for k in ("bos", "eos")}
    if any(flags.values()):
        special = gguf_special_tokens(metadata, source)
        for k in ("bos", "eos"):
            if flags[f"add_{k}_token"] and f"{k}_token" not in special:
                raise ValueError(f"{source}: tokenizer.ggml.add_{k}_token is set "
                                 f"but tokenizer.ggml.{k}_token_id is not")
        _apply_bos_eos_flags(backend, flags, special)
    return backend


def _set_pipeline(backend: _Backend, pre: GGUFPreTokenizer) -> None:
    steps = []
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


def _added(token: str, special: bool) -> AddedToken:
    return AddedToken(token, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)


def _gguf_pre_tokenizer(metadata: Mapping[str, Any], source: str) -> GGUFPreTokenizer:
    name = metadata.get("tokenizer.ggml.pre")
    if name not in GGUF_PRE_TOKENIZERS:
        what = "is missing" if name is None else f"{_short(name)} is not a pre-tokenizer nvllm reproduces"
        raise ValueError(f"{source}: tokenizer.ggml.pre {what}; known: {', '.join(sorted(GGUF_PRE_TOKENIZERS))}")
    return GGUF_PRE_TOKENIZERS[name]


def _gguf_list(metadata: Mapping[str, Any], key: str, kind: type, source: str) -> list:
    value = metadata.get(key)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{source}: {key} is {'missing' if value is None else type(value).__name__}, expected a list")
    bad = next((v for v in value if not isinstance(v, kind) or isinstance(v, bool)), None)
    if bad is not None:
        raise ValueError(f"{source}: {key} holds {_short(bad)}, expected {kind.__name__} values")
    return list(value)


def _gguf_merges(metadata: Mapping[str, Any], source: str) -> List[tuple]:
    merges = []
    for m in _gguf_list(metadata, "tokenizer.ggml.merges", str, source):
        pair = m.split(" ")  # byte-level symbols never hold a plain space
        if len(pair) != 2 or not all(pair):
            raise ValueError(f"{source}: tokenizer.ggml.merges holds {_short(m)}, expected two symbols and one space")
        merges.append((pair[0], pair[1]))
    return merges


def _gguf_bool(metadata: Mapping[str, Any], key: str, source: str) -> bool:
    value = metadata.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {key} is {_short(value)}, expected true or false")
    return value


def _gguf_token_id(metadata: Mapping[str, Any], key: str, source: str, n_tokens: int) -> Optional[int]:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n_tokens:
        raise ValueError(f"{source}: {key} is {_short(value)}, not a token id (0..{n_tokens - 1})")
    return value


_GGUF_SPECIAL_IDS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding",
                     "sep_token": "seperator", "cls_token": "cls", "mask_token": "mask"}


def gguf_special_tokens(metadata: Mapping[str, Any], source: str) -> Dict[str, str]:
    """Special token name (bos_token, ...) -> token, for the ids the GGUF sets (llama.cpp spells "seperator")."""
    tokens = _gguf_list(metadata, "tokenizer.ggml.tokens", str, source)
    found = {}
    for name, key in _GGUF_SPECIAL_IDS.items():
        i = _gguf_token_id(metadata, f"tokenizer.ggml.{key}_token_id", source, len(tokens))
        if i is not None:
            found[name] = tokens[i]
    return found


def _short(value: Any) -> str:
    """A metadata value for an error message: a hostile file's value can be any size."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
