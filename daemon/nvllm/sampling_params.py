"""SamplingParams: what one request may ask of the sampler and of the stop checks, validated once.

Names, ranges and defaults follow vLLM. The five fields a model's generation_config.json may set
(temperature, top_k, top_p, min_p, repetition_penalty) default to None, meaning "the model's default";
`resolve()` fills them (from generation_config.json, else vLLM's neutral values) and returns a concrete,
validated copy. The engine only ever sees resolved instances.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# vLLM's neutral values for the fields a model may override.
NEUTRAL_DEFAULTS: dict[str, float | int] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}

MAX_LOGPROBS = 20  # vLLM's default max_logprobs
# vLLM raises temperatures in (0, 0.01) to 0.01: below it softmax overflows into inf/nan.
MIN_TEMPERATURE = 0.01
# The engine computes in float32: a larger temperature or repetition penalty would only overflow to
# inf on the way in (with a RuntimeWarning); it is capped here, where it acts the same.
FLOAT32_MAX = 3.4028234663852886e38
SEED_LIMIT = 1 << 64  # numpy seeds are unsigned; the proto's int64 stays well inside
_SHOW_CHARS = 48  # a refused value is echoed in the error, cut to this many characters
# What a structured-output constraint may be, and how big its text may get (a schema or grammar over this
# is refused before anything compiles it).
STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
MAX_STRUCTURED_CHARS = 256 * 1024
MAX_CHOICES = 1024
MAX_LOGIT_BIAS = 1024   # tokens one request may bias (OpenAI caps the value at +-100, not the count)
LOGIT_BIAS_LIMIT = 100.0


class InvalidParameter(ValueError):
    """A request parameter out of range; the message names the parameter, the value and the range."""

    def __init__(self, field: str, value: Any, reason: str, shown: str | None = None,
                 message: str | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.index: int | None = None   # which of a request's several inputs it was, where it had several
        super().__init__(message or f"{field} must be {reason}, got {_show(value) if shown is None else shown}")


def _show(value: Any) -> str:
    if isinstance(value, str):
        text = repr(value)
        if len(text) > _SHOW_CHARS:
            text = f"{text[:_SHOW_CHARS]}... ({len(value)} characters)"
        return text
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, numbers.Real):
        return str(value)  # 'nan', 'inf', '-1.5' (str(np.float32) is bare too)
    text = repr(value)
    if len(text) > _SHOW_CHARS:
        text = text[:_SHOW_CHARS] + "..."
    return f"{text} ({type(value).__name__})"


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    # bool is an Integral to Python; a flag where a number is wanted is a client bug.
    return isinstance(v, numbers.Real) and not isinstance(v, bool)  # np.bool_ is no Real


def _real(name: str, v: Any, lo: float, hi: float, lo_open: bool, reason: str) -> None:
    """Refuse anything but a finite real number in the range."""
    if not _is_real(v):
        raise InvalidParameter(name, v, reason)
    x = float(v)
    if not math.isfinite(x) or x > hi or x < lo or (lo_open and x == lo):
        raise InvalidParameter(name, v, reason)


def _integer(name: str, v: Any, lo: int, hi: int | None, reason: str) -> None:
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        raise InvalidParameter(name, v, reason)


def _flag(name: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise InvalidParameter(name, v, "true or false")


@dataclass(frozen=True)
class StructuredSpec:
    """A constraint on the output, compiled by the engine (engine/structured/compiler.py, through llguidance).

    kind: "json_schema" (value: the schema as JSON text, or a dict, kept as compact JSON text),
    "json_object" (any JSON object; value unused), "regex" (value: the regex the whole output matches),
    "choice" (value: the strings, one of which is the whole output; kept as a tuple), "grammar" (value: a
    Lark grammar in llguidance's dialect, or a GBNF one). Shape is checked by validate(); whether it
    compiles, by the engine (InvalidParameter naming `structured.<kind>` either way).
    """

    kind: str
    value: str | tuple[str, ...] | None = None
    # A grammar of literal text and JSON only (a forced tool call's tags and call): the JSON Schema whose
    # numbers' digit budget then holds the whole answer, as it does a json_schema's (engine/structured/).
    digits_schema: str | None = None

    def __post_init__(self) -> None:
        # Normalise the shapes clients naturally send; validate() refuses anything else.
        if self.kind == "json_schema" and isinstance(self.value, Mapping):
            try:
                text = json.dumps(self.value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError):
                text = None  # left as it is for validate() to refuse
            if text is not None:
                object.__setattr__(self, "value", text)
        elif self.kind == "choice" and isinstance(self.value, list):
            object.__setattr__(self, "value", tuple(self.value))

    @property
    def field(self) -> str:
        """The parameter a refusal names: structured.json_schema, structured.choice, ..."""
        return f"structured.{self.kind}" if self.kind in STRUCTURED_KINDS else "structured"

    def validate(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise InvalidParameter("structured", self.kind, "one of " + ", ".join(STRUCTURED_KINDS))
        name, v = self.field, self.value
        if self.digits_schema is not None and (self.kind != "grammar" or not isinstance(self.digits_schema, str)):
            raise InvalidParameter(name, self.digits_schema, "a grammar's JSON Schema text, for its digit budget")
        if self.kind == "json_object":
            return
        if self.kind == "choice":
            if not isinstance(v, tuple) or not 1 <= len(v) <= MAX_CHOICES:
                raise InvalidParameter(name, v, f"a list of 1 to {MAX_CHOICES} strings")
            total = 0
            for i, c in enumerate(v):
                if not isinstance(c, str) or not c:
                    raise InvalidParameter(name, c, f"a list of non-empty strings (entry {i} is not)")
                total += len(c)
            if total > MAX_STRUCTURED_CHARS:
                raise InvalidParameter(name, v, f"at most {MAX_STRUCTURED_CHARS} characters in all",
                                       f"{total} characters")
            return
        what = {"json_schema": "a JSON Schema (an object, or its JSON text)", "regex": "a regular expression",
                "grammar": "a Lark or GBNF grammar"}[self.kind]
        if not isinstance(v, str) or not v:
            raise InvalidParameter(name, v, what)
        if len(v) > MAX_STRUCTURED_CHARS:
            raise InvalidParameter(name, v, f"{what} of at most {MAX_STRUCTURED_CHARS} characters",
                                   f"{len(v)} characters")
        if self.kind == "json_schema":
            try:
                schema = json.loads(v)
            except ValueError as e:
                raise InvalidParameter(name, v, f"{what}: not valid JSON ({e})") from None
            except RecursionError:
                raise InvalidParameter(name, v, f"{what} nested less deeply (Python's JSON parser gives up)") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidParameter(name, v, f"{what}: a JSON object or boolean")


def _structured(v: Any) -> Any:
    """A one-key mapping ({"json_schema": {...}}, {"choice": [...]}, {"json_object": true}) -> StructuredSpec."""
    if isinstance(v, Mapping) and len(v) == 1:
        kind, value = next(iter(v.items()))
        if kind in STRUCTURED_KINDS:
            return StructuredSpec(kind, None if kind == "json_object" else value)
    return v


@dataclass
class SamplingParams:
    # None: the model's default (generation_config.json), else vLLM's neutral value.
    temperature: float | None = None  # 0 = greedy
    top_k: int | None = None  # 0 or -1 = off; resolve() makes it 0
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None  # None: up to the context limit
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None  # top-N alternatives per token; the chosen token's always when set
    structured: StructuredSpec | None = None  # constrain the output (JSON Schema, regex, choice, grammar)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit before any other step
    # Speculative decoding never changes the output; a request may still opt out (to time the model alone).
    disable_speculation: bool = False
    # vLLM's: a prompt longer than this many tokens keeps its last ones (the rest is dropped), instead of
    # being refused for max_model_len.
    truncate_prompt_tokens: int | None = None
    # A chat prompt longer than the context: "error" (None's meaning) refuses it naming both lengths;
    # "drop_oldest" drops whole turns from the oldest on, keeping the system messages and the last turn.
    context_overflow: str | None = None
    # llama.cpp's penalty_last_n (Ollama's repeat_last_n): None, vLLM's way (the repetition penalty over the
    # prompt and the output, the frequency and presence penalties over the output); N >= 1, all three over the
    # last N tokens of prompt and output together; 0, no penalty at all.
    penalty_last_n: int | None = None
    # At most this many tokens of prompt and answer together (Ollama's num_ctx): the request's own context,
    # within the model's max_model_len (the smaller of the two bounds it). None: max_model_len alone.
    context_limit: int | None = None

    def __post_init__(self) -> None:
        self.structured = _structured(self.structured)
        # Accept the shapes clients naturally send; anything else is left for validate() to refuse.
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids)

    @property
    def penalised(self) -> bool:
        """Whether any penalty applies (on a resolved instance: its repetition penalty is a number)."""
        return self.penalty_last_n != 0 and (self.presence_penalty != 0 or self.frequency_penalty != 0
                                             or self.repetition_penalty not in (None, 1))

    @property
    def is_greedy(self) -> bool:
        """True when the request asks for greedy decoding (temperature 0).

        On an unresolved instance a None temperature is the model's to decide, and counts as not greedy.
        """
        return self.temperature is not None and _is_real(self.temperature) and self.temperature == 0

    def validate(self, max_stop_strings: int = 16, max_stop_string_chars: int = 256,
                 vocab_size: int | None = None, max_model_len: int | None = None) -> None:
        """Raise InvalidParameter for the first field out of range. None is accepted for the
        model-default fields (an unresolved instance); resolve() validates the filled values."""
        if self.temperature is not None:
            _real("temperature", self.temperature, 0.0, math.inf, False, "a finite number >= 0")
        if self.top_k is not None:
            _integer("top_k", self.top_k, -1, None, "an integer, -1 or 0 (off) or >= 1")
        if self.top_p is not None:
            _real("top_p", self.top_p, 0.0, 1.0, True, "a number in (0, 1]")
        if self.min_p is not None:
            _real("min_p", self.min_p, 0.0, 1.0, False, "a number in [0, 1]")
        if self.repetition_penalty is not None:
            _real("repetition_penalty", self.repetition_penalty, 0.0, math.inf, True,
                  "a finite number > 0")
        _real("presence_penalty", self.presence_penalty, -2.0, 2.0, False, "a number in [-2, 2]")
        _real("frequency_penalty", self.frequency_penalty, -2.0, 2.0, False, "a number in [-2, 2]")
        if self.seed is not None:
            _integer("seed", self.seed, 0, SEED_LIMIT - 1, "an integer in [0, 2**64) or unset")
        if self.truncate_prompt_tokens is not None:
            _integer("truncate_prompt_tokens", self.truncate_prompt_tokens, 1, max_model_len,
                     "an integer >= 1 or unset" if max_model_len is None
                     else f"an integer in [1, {max_model_len}] (max_model_len) or unset")
        if self.penalty_last_n is not None:
            _integer("penalty_last_n", self.penalty_last_n, 0, None,
                     "an integer >= 0 (the last tokens the penalties look at; 0: none) or unset")
        if self.context_limit is not None:
            _integer("context_limit", self.context_limit, 1, None,
                     "an integer >= 1 (tokens of prompt and answer together) or unset")
        if self.context_overflow not in (None, "error", "drop_oldest"):
            raise InvalidParameter("context_overflow", self.context_overflow, "'error', 'drop_oldest' or unset")
        if self.max_tokens is not None:
            if max_model_len is None:
                _integer("max_tokens", self.max_tokens, 1, None, "an integer >= 1 or unset")
            else:
                _integer("max_tokens", self.max_tokens, 1, max_model_len,
                         f"an integer in [1, {max_model_len}] (max_model_len) or unset")
        if self.max_tokens is None or not _is_int(self.max_tokens):
            _integer("min_tokens", self.min_tokens, 0, None, "an integer >= 0")
        else:
            _integer("min_tokens", self.min_tokens, 0, self.max_tokens,
                     f"an integer in [0, max_tokens={self.max_tokens}]")
        self._validate_stop(max_stop_strings, max_stop_string_chars)
        self._validate_stop_token_ids(vocab_size)
        self._validate_logit_bias(vocab_size)
        _flag("ignore_eos", self.ignore_eos)
        _flag("include_stop_str_in_output", self.include_stop_str_in_output)
        _flag("skip_special_tokens", self.skip_special_tokens)
        _flag("disable_speculation", self.disable_speculation)
        if self.logprobs is not None:
            _integer("logprobs", self.logprobs, 0, MAX_LOGPROBS,
                     f"an integer in [0, {MAX_LOGPROBS}] or unset")
        if self.structured is not None:
            if not isinstance(self.structured, StructuredSpec):
                raise InvalidParameter("structured", self.structured,
                                       'a StructuredSpec or one of {"json_schema": ...}, {"json_object": true}, '
                                       '{"regex": ...}, {"choice": [...]}, {"grammar": ...}')
            self.structured.validate()

    def _validate_stop(self, max_count: int, max_chars: int) -> None:
        stop = self.stop
        if not isinstance(stop, list):
            raise InvalidParameter("stop", stop, "a string or a list of strings")
        if len(stop) > max_count:
            raise InvalidParameter("stop", stop, f"at most {max_count} strings", f"{len(stop)} strings")
        for i, s in enumerate(stop):
            if not isinstance(s, str):
                raise InvalidParameter("stop", s, f"a list of strings (entry {i} is not)")
            if not 1 <= len(s) <= max_chars:
                raise InvalidParameter(
                    "stop", s, f"a list of non-empty strings of at most {max_chars} characters "
                    f"(entry {i} has {len(s)})")

    def _validate_stop_token_ids(self, vocab_size: int | None) -> None:
        ids = self.stop_token_ids
        if not isinstance(ids, list):
            raise InvalidParameter("stop_token_ids", ids, "a list of integers")
        hi = None if vocab_size is None else vocab_size - 1
        reason = ("a list of integers >= 0" if hi is None
                  else f"a list of integers in [0, {hi}] (the vocabulary)")
        for t in ids:
            _integer("stop_token_ids", t, 0, hi, reason)

    def _validate_logit_bias(self, vocab_size: int | None) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
            raise InvalidParameter("logit_bias", bias, f"a map of at most {MAX_LOGIT_BIAS} token ids to numbers")
        hi = None if vocab_size is None else vocab_size - 1
        where = "" if hi is None else f" in [0, {hi}] (the vocabulary)"
        for token, value in bias.items():
            _integer("logit_bias", token, 0, hi, f"keyed by token ids{where}")
            _real("logit_bias", value, -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT, False,
                  f"a map to numbers in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}] (token {token}'s is not)")

    def resolve(self, model_defaults: Mapping[str, Any] | None = None, *, max_stop_strings: int = 16,
                max_stop_string_chars: int = 256, vocab_size: int | None = None,
                max_model_len: int | None = None) -> SamplingParams:
        """A new, concrete, validated instance: None fields take the model's default (keys as in
        generation_config.json), else vLLM's neutral value; then vLLM's normalisations apply
        (top_k -1 -> 0; temperature in (0, 0.01) -> 0.01; greedy turns top_k/top_p/min_p off).

        max_tokens stays None when unset: its limit depends on the prompt's length, which the engine
        knows (vLLM: min(max_model_len - prompt length, generation_config's max_new_tokens)).
        A bad model default is reported as such, not blamed on the client.
        """
        defaults = model_defaults or {}
        filled: dict[str, Any] = {}
        from_model: set[str] = set()
        for name in NEUTRAL_DEFAULTS:
            if getattr(self, name) is None:
                if defaults.get(name) is not None:
                    filled[name] = defaults[name]
                    from_model.add(name)
                else:
                    filled[name] = NEUTRAL_DEFAULTS[name]
        out = dataclasses.replace(self, **filled)
        out.stop = list(out.stop) if isinstance(out.stop, list) else out.stop
        out.stop_token_ids = list(out.stop_token_ids) if isinstance(out.stop_token_ids, list) else out.stop_token_ids
        out.logit_bias = dict(out.logit_bias) if isinstance(out.logit_bias, Mapping) else out.logit_bias
        try:
            out.validate(max_stop_strings, max_stop_string_chars, vocab_size, max_model_len)
        except InvalidParameter as e:
            if e.field not in from_model:
                raise
            raise InvalidParameter(e.field, e.value, e.reason + " (the model's generation_config.json default)",
                                   str(e).split(", got ", 1)[-1]) from None
        out._normalise()
        return out

    def _normalise(self) -> None:
        # Plain Python numbers from here on (a numpy scalar in would leak float64 math elsewhere).
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            setattr(self, name, float(getattr(self, name)))
        for name in ("top_k", "min_tokens"):
            setattr(self, name, int(getattr(self, name)))
        for name in ("penalty_last_n", "context_limit"):
            if getattr(self, name) is not None:
                setattr(self, name, int(getattr(self, name)))
        self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.seed is not None:
            self.seed = int(self.seed)
        if self.max_tokens is not None:
            self.max_tokens = int(self.max_tokens)
        if self.logprobs is not None:
            self.logprobs = int(self.logprobs)
        # resolve() filled these before it called here (float(None) above would have raised).
        assert self.top_k is not None and self.temperature is not None and self.repetition_penalty is not None
        if self.top_k < 0:
            self.top_k = 0
        self.temperature = min(self.temperature, FLOAT32_MAX)
        self.repetition_penalty = min(self.repetition_penalty, FLOAT32_MAX)
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        if self.temperature == 0.0:
            # Greedy ignores truncation; vLLM resets these so that the sampler skips them.
            self.top_k, self.top_p, self.min_p = 0, 1.0, 0.0
