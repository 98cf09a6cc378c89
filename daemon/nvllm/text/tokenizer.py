"""Text <-> token ids: a Hugging Face `tokenizers` backend with the model folder's specials and chat template.

Everything here aims at giving exactly the ids and text transformers gives for the same model folder:
  encode(text)          == AutoTokenizer(...)(text)["input_ids"]
  encode_chat(messages) == AutoTokenizer(...).apply_chat_template(messages, add_generation_prompt=True)
  decode(ids)           == AutoTokenizer(...).decode(ids, skip_special_tokens=True)
What the folder adds to tokenizer.json is read in tokenizer_config.py, a GGUF's vocabulary rebuilt in
gguf_vocab.py (byte-level BPE), gguf_spm.py (SentencePiece), gguf_wpm.py (BERT's WordPiece) or gguf_ugm.py
(XLM-RoBERTa's SentencePiece Unigram); the template itself lives in chat_template.py, streaming text in
detokenizer.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend

from nvllm.text.chat_template import (
    Message,
    load_chat_template,
    render_chat_template,
    select_chat_template,
    template_takes_tools,
)
from nvllm.text.gguf_spm import spm_backend, spm_end_of_turn_ids, with_spm_defaults
from nvllm.text.gguf_ugm import ugm_backend
from nvllm.text.gguf_vocab import gguf_backend, gguf_special_tokens, gguf_token_id
from nvllm.text.gguf_wpm import wpm_backend
from nvllm.text.tokenizer_config import add_declared_tokens, apply_bos_eos_flags, folder_special_tokens, read_json

PathLike = str | Path


class Tokenizer:
    """A model folder's tokenizer: encode, decode, chat template, special tokens."""

    def __init__(
        self,
        backend: _Backend,
        *,
        special_tokens: Mapping[str, str] | None = None,
        chat_template: str | None = None,
        source: str = "<memory>",
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        self._backend = backend
        self.source = source
        # Ids besides eos_token_id that end a reply (a GGUF's end-of-turn token); the engine factory merges them.
        self.extra_eos_ids: frozenset = frozenset(int(i) for i in extra_eos_ids)
        # name -> string, only the names that are set (what transformers' special_tokens_map holds)
        self.special_tokens: dict[str, str] = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id: int | None = self.token_to_id(self.special_tokens.get("bos_token"))
        self.eos_token_id: int | None = self.token_to_id(self.special_tokens.get("eos_token"))
        self.pad_token_id: int | None = self.token_to_id(self.special_tokens.get("pad_token"))
        self._skipped_ids = self._ids_skipped_by_decode()
        named = (self.token_to_id(t) for t in self.special_tokens.values())
        self.all_special_ids: frozenset = frozenset(self._skipped_ids | {i for i in named if i is not None})
        self.chat_template: str | None = chat_template
        self._template = None if chat_template is None else load_chat_template(chat_template, self.source)
        # Whether the template renders `tools` itself; if not, render_chat describes them in the system message.
        self.template_takes_tools = template_takes_tools(chat_template)
        # What the incremental detokenizer asks about every token, worked out once here.
        self._decodable = self._decodable_mask()
        self._byte_token_ids = self._find_byte_tokens()

    # ---- loading

    @classmethod
    def from_dir(cls, path: PathLike) -> Tokenizer:
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
        config = read_json(folder / "tokenizer_config.json", required=False) or {}
        special = folder_special_tokens(folder, config)
        add_declared_tokens(backend, config, special)
        apply_bos_eos_flags(backend, config, special)
        return cls(
            backend,
            special_tokens=special,
            chat_template=select_chat_template(folder, config),
            source=str(folder),
        )

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], source: str) -> Tokenizer:
        """The tokenizer a GGUF file describes: metadata holds its key/values as plain Python values
        (tokenizer.ggml.* and tokenizer.chat_template). Byte-level BPE ("gpt2"), SentencePiece
        ("llama", with llama.cpp's defaults for what it leaves out), an encoder's WordPiece ("bert") or
        Unigram ("t5", an XLM-RoBERTa's); the
        special token ids, add_bos and the chat template come from the metadata. The end-of-turn (and
        end-of-message) ids, when they differ from the EOS id, are in extra_eos_ids (for SentencePiece also
        the control tokens llama.cpp ends a turn at by name: <end_of_turn>, <|end|>, ...)."""
        sentencepiece = metadata.get("tokenizer.ggml.model") == "llama"
        if sentencepiece:
            metadata = with_spm_defaults(metadata)
            backend = spm_backend(metadata, source)
        elif metadata.get("tokenizer.ggml.model") == "bert":
            backend = wpm_backend(metadata, source)
        elif metadata.get("tokenizer.ggml.model") == "t5":
            backend = ugm_backend(metadata, source)
        else:
            backend = gguf_backend(metadata, source)
        tokens = metadata["tokenizer.ggml.tokens"]
        special = gguf_special_tokens(metadata, source)
        eos = special.get("eos_token")
        ends = [gguf_token_id(metadata, f"tokenizer.ggml.{k}_token_id", source, len(tokens)) for k in ("eot", "eom")]
        if sentencepiece:
            ends += spm_end_of_turn_ids(metadata)
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
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(int(token_id))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; the tokenizer's post-processor decides about BOS/EOS when add_special_tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_within(self, text: str, max_tokens: int, pair: str | None = None) -> tuple[list[int], list[int]]:
        """(token ids, token type ids) of text, or of text and pair as the post-processor joins a pair (BERT's
        [CLS] a [SEP] b [SEP], types 0 then 1), cut to max_tokens: a single text keeps its first tokens, a
        pair its first text and the start of the second (transformers' only_second); the special tokens
        stay. ValueError when even the special tokens and the first text do not fit."""
        b = self._backend
        first = b.encode(text, add_special_tokens=False)
        second = None if pair is None else b.encode(pair, add_special_tokens=False)
        room = max_tokens - b.num_special_tokens_to_add(pair is not None)
        if second is None:
            if len(first.ids) > room:
                first.truncate(max(0, room))
        elif len(first.ids) + len(second.ids) > room:
            if len(first.ids) >= room:
                raise ValueError(f"the first text takes {len(first.ids)} tokens of the {max_tokens} allowed")
            second.truncate(room - len(first.ids))
        enc = b.post_process(first, second, add_special_tokens=True)
        return list(enc.ids), list(enc.type_ids)

    def difference(self, other: Tokenizer) -> str:
        """Why this tokenizer's ids do not mean other's ("" when they do): every token string with its id
        (a dict compare, milliseconds for 150k tokens)."""
        mine = self._backend.get_vocab(with_added_tokens=True)
        theirs = other._backend.get_vocab(with_added_tokens=True)
        if mine == theirs:
            return ""
        ids_a, ids_b = {i: t for t, i in theirs.items()}, {i: t for t, i in mine.items()}
        first = min(i for i in ids_a.keys() | ids_b.keys() if ids_a.get(i) != ids_b.get(i))
        return f"token {first} is {ids_b.get(first)!r} in it and {ids_a.get(first)!r} in the target"

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; ids the tokenizer does not know are dropped (as transformers does)."""
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ---- chat

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Sequence[Any] | None = None, template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The chat template's text for messages (and OpenAI tools), rendered as transformers renders it;
        template_kwargs are extra template variables (a request's chat_template_kwargs)."""
        if self._template is None:
            raise ValueError(
                f"{self.source}: the model has no chat template "
                "(no chat_template in tokenizer_config.json and no chat_template.jinja)"
            )
        return render_chat_template(self._template, messages, add_generation_prompt, self.special_tokens,
                                    tools=tools, takes_tools=self.template_takes_tools,
                                    template_kwargs=template_kwargs)

    def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Sequence[Any] | None = None, template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of the rendered chat; the template writes its own special tokens."""
        return self.encode(self.render_chat(messages, add_generation_prompt, tools, template_kwargs),
                           add_special_tokens=False)

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
