"""Text <-> token ids: a Hugging Face `tokenizers` backend, the model's chat template, streaming detokenization.

Everything here aims at giving exactly the ids and text transformers gives for the same model folder:
  encode(text)          == AutoTokenizer(...)(text)["input_ids"]
  encode_chat(messages) == AutoTokenizer(...).apply_chat_template(messages, add_generation_prompt=True)
  decode(ids)           == AutoTokenizer(...).decode(ids, skip_special_tokens=True)
IncrementalDetokenizer streams the text of generated tokens one token at a time.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken
from tokenizers import Tokenizer as _Backend
from tokenizers import processors

# The named special tokens transformers passes to chat templates (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

REPLACEMENT_CHAR = "\ufffd"

PathLike = Union[str, Path]
Message = Mapping[str, Any]


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


def _int_ids(value: Any) -> List[int]:
    """eos_token_id in config.json / generation_config.json: an int, a list of ints, or null."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _select_chat_template(folder: Path, config: dict) -> Optional[str]:
    # Like transformers: chat_template.jinja beside tokenizer_config.json wins over the config's entry.
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ValueError(
            f"{folder / 'tokenizer_config.json'}: chat_template lists templates {sorted(map(str, named))} "
            "but none named 'default'"
        )
    raise ValueError(f"{folder / 'tokenizer_config.json'}: chat_template must be a string or a list")


# ------------------------------------------------------------------------------------------ templates


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by some templates for assistant masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's namespace(), refusing underscore names so templates cannot reach interpreter internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (same trick as jinja's Namespace)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders them in."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def validate_messages(messages: Any) -> List[Dict[str, str]]:
    """Check chat messages and return plain {"role", "content"} dicts; text parts are joined with newlines.

    Raises ValueError naming the bad field, e.g. "messages[2].content must be a string".
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages must not be empty")
    clean = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError(f"{where}.role must be a string, got {type(role).__name__}")
        if not role:
            raise ValueError(f"{where}.role must not be empty")
        clean.append({"role": role, "content": _message_text(message.get("content"), f"{where}.content")})
    return clean


def _message_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where} must be a string (or a list of text parts), got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise ValueError(f"{where}[{j}] must be a dict like {{'type': 'text', 'text': ...}}")
        if part.get("type") != "text":
            raise ValueError(f"{where}[{j}].type must be 'text', got {part.get('type')!r}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}[{j}].text must be a string, got {type(part.get('text')).__name__}")
        texts.append(part["text"])
    # vLLM joins text parts the same way when a template wants string content.
    return "\n".join(texts)


# ------------------------------------------------------------------------------------------ tokenizer


class Tokenizer:
    """A model folder's tokenizer: encode, decode, chat template, special and EOS ids."""

    def __init__(
        self,
        backend: _Backend,
        *,
        special_tokens: Optional[Mapping[str, str]] = None,
        chat_template: Optional[str] = None,
        eos_token_ids: Iterable[int] = (),
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
        eos = set(eos_token_ids)
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        self.eos_token_ids: frozenset = frozenset(eos)
        self._skipped_ids = self._ids_skipped_by_decode()
        named = (self.token_to_id(t) for t in self.special_tokens.values())
        self.all_special_ids: frozenset = frozenset(self._skipped_ids | {i for i in named if i is not None})
        self.chat_template: Optional[str] = chat_template
        self._template = None if chat_template is None else self._compile(chat_template)
        # What the incremental detokenizer asks about every token, worked out once here.
        self._decodable = self._decodable_mask()
        self._byte_token_ids = self._find_byte_tokens()

    # ---- loading

    @classmethod
    def from_dir(cls, path: PathLike) -> "Tokenizer":
        """Load tokenizer.json (required), tokenizer_config.json, chat_template.jinja, and the EOS ids of
        generation_config.json and config.json from a Hugging Face model folder."""
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
        eos_ids: List[int] = []
        for name in ("generation_config.json", "config.json"):
            data = _read_json(folder / name, required=False) or {}
            eos_ids += _int_ids(data.get("eos_token_id"))
        return cls(
            backend,
            special_tokens=special,
            chat_template=_select_chat_template(folder, config),
            eos_token_ids=eos_ids,
            source=str(folder),
        )

    def _compile(self, source: str) -> jinja2.Template:
        try:
            return compile_chat_template(source)
        except jinja2.TemplateError as e:
            raise ValueError(f"{self.source}: chat template does not compile: {e}") from e

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
        if not isinstance(add_generation_prompt, bool):
            raise ValueError("add_generation_prompt must be a bool")
        clean = validate_messages(messages)
        try:
            return self._template.render(
                messages=clean, tools=None, documents=None, add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template error: {e}") from e
        except (TypeError, KeyError, IndexError, AttributeError, ValueError, ArithmeticError) as e:
            raise ValueError(f"chat template error: {type(e).__name__}: {e}") from e

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


# ------------------------------------------------------------------------------ incremental detokenizer


class IncrementalDetokenizer:
    """Streams one sequence's output text token by token.

    Each add() decodes a short window of tokens (the last emitted chunk plus the tokens not yet emitted)
    and returns what the new token adds, as vLLM does with prefix_offset/read_offset. The window starts
    inside the prompt, so a first output token's leading space survives tokenizers whose decoder strips
    the space at position 0 (SentencePiece/Metaspace). Text is held back while it ends in U+FFFD (an
    incomplete UTF-8 sequence) or while the last token is a byte-fallback token (a later byte can still
    change how the whole byte run decodes). Call flush() when the sequence ends to get what is held.

    For byte-level tokenizers (GPT-2, Llama 3, Qwen2, SmolLM2) the concatenation of every add() and
    flush() equals decode(output ids) exactly; for Metaspace ones it may differ only by the first
    token's leading space, which decode() strips and this keeps. Holding is capped (MAX_HOLD_TOKENS,
    MAX_BYTE_RUN) so the cost per token stays bounded even for invalid UTF-8 streams; only a byte run or
    an undecodable stretch longer than the cap can make the stream differ from decode().
    """

    PROMPT_CONTEXT = 5  # prompt tokens the first window starts with
    MAX_BYTE_RUN = 32  # tokens a byte-fallback run is held back at most (when it decodes cleanly)
    MAX_HOLD_TOKENS = 128  # tokens text ending in U+FFFD is held back at most

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._decode = tokenizer.backend.decode
        self._skip_special = skip_special_tokens
        self._skipped = tokenizer.skipped_ids() if skip_special_tokens else frozenset()
        self._decodable = tokenizer.decodable_ids()
        self._byte_ids = tokenizer.byte_token_ids()
        # The window: ids[:read] is the chunk emitted last (at first, the prompt's tail), ids[read:] the
        # tokens held back since. Each add() decodes the whole window and emits what follows ids[:read].
        self._ids: List[int] = self._prompt_context(prompt_ids)
        self._read = len(self._ids)
        self._read_text = self._window_text(self._read)
        self._in_prompt = True  # ids[:read] is still the prompt's tail
        self._text = ""
        self.num_tokens = 0

    def _keep(self, token_id: int) -> bool:
        # Ids decode() would drop anyway stay out of the window, so they cost nothing and hold nothing.
        if token_id < 0:
            raise ValueError(f"token id must be >= 0, got {token_id}")
        if token_id >= len(self._decodable) or not self._decodable[token_id]:
            return False
        return token_id not in self._skipped

    def _prompt_context(self, prompt_ids: Sequence[int]) -> List[int]:
        context: List[int] = []
        for i in reversed(range(len(prompt_ids))):
            if len(context) == self.PROMPT_CONTEXT:
                break
            tid = int(prompt_ids[i])
            if tid >= 0 and self._keep(tid):
                context.append(tid)
        context.reverse()
        return context

    def _window_text(self, stop: Optional[int] = None) -> str:
        return self._decode(self._ids[:stop], skip_special_tokens=self._skip_special)

    def _must_hold(self, text: str) -> bool:
        held = len(self._ids) - self._read
        if text.endswith(REPLACEMENT_CHAR) and held < self.MAX_HOLD_TOKENS:
            return True
        return self._ids[-1] in self._byte_ids and held < self.MAX_BYTE_RUN

    def add(self, token_id: int) -> str:
        """Take the next output token; return the text it makes final ("" while it is held back)."""
        token_id = int(token_id)
        self.num_tokens += 1
        if not self._keep(token_id):
            return ""
        self._ids.append(token_id)
        return self._emit(force=False)

    def flush(self) -> str:
        """Text still held back (an incomplete UTF-8 sequence or byte run at the end); call when done."""
        if len(self._ids) == self._read:
            return ""
        return self._emit(force=True)

    def _emit(self, force: bool) -> str:
        text = self._window_text()
        if not force and self._must_hold(text):
            return ""
        if self._in_prompt and self._prompt_interferes(text):
            # A character or byte run split across the prompt/output boundary: the output's own text.
            del self._ids[:self._read]
            self._read, self._read_text = 0, ""
            text = self._window_text()
        # With the decoders in use text always starts with read_text here.
        delta = text[len(self._read_text):]
        self._in_prompt = False
        del self._ids[:self._read]  # keep only the chunk just emitted, as the next window's context
        self._read = len(self._ids)
        self._read_text = self._window_text()
        self._text += delta
        return delta

    def _prompt_interferes(self, text: str) -> bool:
        if self._read == 0:
            return False
        if self._read_text.endswith(REPLACEMENT_CHAR) or not text.startswith(self._read_text):
            return True
        # a byte-fallback run going on from the prompt into the output decodes as one
        return self._ids[self._read - 1] in self._byte_ids and self._ids[self._read] in self._byte_ids

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        return self._text
