"""Structured output: a request's constraint compiled by llguidance, one matcher per sequence, and the
batch's token bitmask filled each step.

llguidance reads the tokenizer's own tokenizer.json (a GGUF's tokenizer is rebuilt as one by
nvllm.tokenizer, so both paths serialise the same way), compiles JSON Schema, regex, Lark and GBNF lazily
and computes a row's mask in microseconds (a few inside a JSON string, some hundreds where the grammar
branches; tools/bench_structured.py measures it). What this module adds:

- Compiling happens in `StructuredCompiler.matcher`, which `LLMEngine.make_sequence` calls in the tokenize
  pool, never on the engine thread. llguidance's limits (fuel, lexer states, grammar size) bound the work,
  and the caller waits at most `timeout_s` besides: a hostile schema is refused, naming its field, within
  a bounded time. The grammar is compiled on a small pool of its own, so a compile that overruns keeps its
  thread without holding up the caller.
- Compiled grammars are cached by (kind, text), failures too, at most `cache_size` of them (LRU); each
  sequence gets a cheap copy of the cached matcher, advanced by every token it appends.
- JSON is compact (no whitespace between tokens), so a constrained answer cannot loop on whitespace; a
  schema's own "x-guidance" options still win (llguidance applies them over these defaults).
- JSON's numbers carry at most the digits a double holds (engine/structured/digit_budget.py), so one cannot run on
  until max_tokens: a JSON constraint's matcher is a MatcherPair (engine/structured/matcher_pair.py), the schema's
  matcher with the budget's beside it, whose masks `fill` intersects. Regex, choice and grammars are
  left as they are written.
- The bitmask covers the model's whole vocabulary: ids the tokenizer does not have (a padded embedding)
  are never allowed.
- Added tokens that are not special (Qwen's <tool_call>, say) are text: llguidance, reading tokenizer.json,
  takes every added token for a special one (and its mask and its matcher then disagree about them), so
  such a tokenizer is handed over as token bytes instead, those tokens' bytes being their text.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from nvllm.engine.structured.digit_budget import budget_for
from nvllm.engine.structured.matcher_pair import MatcherPair
from nvllm.sampling_params import InvalidParameter, StructuredSpec
from nvllm.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher, LLTokenizer
    from llguidance._lib import JsonCompileOptions  # a TypedDict of the stubs only

CACHE_SIZE = 64             # compiled grammars kept, by text
COMPILE_TIMEOUT_S = 5.0     # a request waits this long for its grammar at most
COMPILE_THREADS = 2
PARALLEL_MIN_ROWS = 4       # below this many constrained rows, filling them one by one is faster
# llguidance's defaults but for the lexer's state count: ~1-2 kB each, so 250k could take 500 MB.
MAX_LEXER_STATES = 50_000
# Compact JSON: no optional whitespace at all (and so no run of it until max_tokens).
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_ERROR_CHARS = 200          # llguidance's message, cut to its first line and this many characters


def _llg() -> ModuleType:
    """llguidance, imported when a request first asks for structure: a process that never constrains an answer
    does not pay for its import (about 5 MiB resident)."""
    import llguidance

    return llguidance


def words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


class StructuredCompiler:
    """Turns a StructuredSpec into a fresh llguidance matcher; one per engine, shared by the threads that
    tokenize requests."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Iterable[int],
                 cache_size: int = CACHE_SIZE, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)   # the bitmask's width in tokens
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._lltokenizer: LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, object, str | None], Future] = OrderedDict()
        self._compilers = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="nvllm-grammar")
        self._executor: LLExecutor | None = None

    # -- compiling ----------------------------------------------------------------------------------
    def lltokenizer(self) -> LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (about half a second for a 49k vocabulary)."""
        with self._lock:
            if self._lltokenizer is None:
                self._lltokenizer = build_lltokenizer(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._lltokenizer

    def matcher(self, spec: StructuredSpec) -> LLMatcher | MatcherPair:
        """A matcher at the start of spec's grammar; InvalidParameter naming `structured.<kind>` if the
        grammar does not compile, breaks llguidance's limits or takes over timeout_s to compile."""
        spec.validate()
        self.lltokenizer()   # outside the compile deadline: it is the engine's cost, not the request's
        key = (spec.kind, spec.value, spec.digits_schema)
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._compilers.submit(self._compile, spec)
                self._cache[key] = fut
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        try:
            template, error = fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            if fut.cancel():   # still queued behind other compiles: forget it, a later request may retry
                with self._lock:
                    if self._cache.get(key) is fut:
                        del self._cache[key]
            raise InvalidParameter(spec.field, spec.value, f"a constraint that compiles within {self.timeout_s:g} s "
                                   "(it takes longer)") from None
        if error is not None:
            raise InvalidParameter(spec.field, spec.value, f"a constraint that compiles ({error})")
        with self._lock:   # one borrow of the shared template at a time (pyo3 checks)
            return template.deep_copy()

    @property
    def cache_len(self) -> int:
        return len(self._cache)

    def _compile(self, spec: StructuredSpec) -> tuple[LLMatcher | MatcherPair | None, str | None]:
        """(matcher, None) or (None, why not). Runs on the compile pool; never raises."""
        try:
            grammar = self._grammar(spec)
        except Exception as e:   # noqa: BLE001 - the GBNF converter is Python and may fail in any way
            return None, _short(str(e) or type(e).__name__)
        m = self._start(grammar)
        if m.is_error():
            return None, _short(m.get_error())
        if spec.kind not in ("json_schema", "json_object") and spec.digits_schema is None:
            return m, None
        # a grammar of tags and JSON (a forced tool call) is held to its JSON Schema's budget
        schema = spec.value if spec.kind == "json_schema" else spec.digits_schema
        assert schema is None or isinstance(schema, str)
        budget = budget_for(schema)
        digits = None if budget is None else self._start(_llg().LLMatcher.grammar_from_regex(budget.regex()))
        # The budget's regex is ours and small; should it ever fail, the schema still holds alone.
        return MatcherPair(m, None if digits is None or digits.is_error() else digits), None

    def _start(self, grammar: str) -> LLMatcher:
        llg = _llg()
        m = llg.LLMatcher(self.lltokenizer(), grammar, log_level=0,
                          limits=llg.LLParserLimits(max_lexer_states=MAX_LEXER_STATES))
        if not m.is_error():
            m.compute_bitmask()   # the first mask builds the lexer's start: an error may only show here
        return m

    @staticmethod
    def _grammar(spec: StructuredSpec) -> str:
        value = spec.value   # its shape for the kind is StructuredSpec.validate()'s, already passed
        if spec.kind == "json_object":
            return _llg().LLMatcher.grammar_from_json_schema('{"type":"object"}', defaults=JSON_OPTIONS)
        if spec.kind == "choice":
            assert isinstance(value, tuple)
            # Lark string literals take JSON's escapes.
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
            return _llg().LLMatcher.grammar_from_lark(f"start: {alternatives}\n")
        assert isinstance(value, str)
        if spec.kind == "json_schema":
            return _llg().LLMatcher.grammar_from_json_schema(value, defaults=JSON_OPTIONS)
        if spec.kind == "regex":
            return _llg().LLMatcher.grammar_from_regex(value)
        return _llg().grammar_from("grammar", value)   # Lark, or GBNF turned into Lark

    # -- each step ----------------------------------------------------------------------------------
    def fill(self, matchers: Seq[LLMatcher | MatcherPair]) -> np.ndarray:
        """[len(matchers), words(vocab)] int32: each matcher's allowed next tokens, one bit per token."""
        return self.fill_ahead([(m, []) for m in matchers])

    def fill_ahead(self, items: Seq[tuple[LLMatcher | MatcherPair, list[int]]]) -> np.ndarray:
        """As fill, for matchers with proposed tokens too: a row for the next token, then one after each
        proposal (which the matcher must allow: engine/speculation/speculator.py cuts proposals to what it takes);
        the matchers end as they began."""
        out = self._masks([(m.schema if isinstance(m, MatcherPair) else m, drafts) for m, drafts in items])
        budgeted: list[int] = []   # rows under a digit budget, and the budgets' matchers
        budgets: list[tuple[LLMatcher, list[int]]] = []
        row = 0
        for m, drafts in items:
            if isinstance(m, MatcherPair) and m.digits is not None:
                budgeted.extend(range(row, row + 1 + len(drafts)))
                budgets.append((m.digits, drafts))
            row += 1 + len(drafts)
        if budgets:
            both = out[budgeted] & self._masks(budgets)
            some = both.any(axis=1)   # none in common: the schema's mask alone (matcher_pair.py)
            out[np.asarray(budgeted)[some]] = both[some]
        tail = self.tokenizer.vocab_size
        if tail < self.vocab_size:   # a padded vocabulary: ids past the tokenizer's are never allowed
            _clear_from(out, tail)
        return out

    def _masks(self, items: Seq[tuple[LLMatcher, list[int]]]) -> np.ndarray:
        total = sum(1 + len(drafts) for _, drafts in items)
        out = np.zeros((total, words(self.vocab_size)), dtype=np.int32)
        row_bytes = out.shape[1] * 4
        if not any(drafts for _, drafts in items):
            if len(items) >= PARALLEL_MIN_ROWS:
                self._exec().unsafe_compute_mask_ptr([(m, i) for i, (m, _) in enumerate(items)],
                                                     out.ctypes.data, row_bytes, total)
            else:
                for i, (m, _) in enumerate(items):
                    m.unsafe_compute_mask_ptr(out[i].ctypes.data, row_bytes)
            return out
        jobs, row = [], 0
        for m, drafts in items:
            if drafts:
                jobs.append((m, row, list(drafts)))
            else:   # llguidance refuses an empty draft: this row alone
                m.unsafe_compute_mask_ptr(out[row].ctypes.data, row_bytes)
            row += 1 + len(drafts)
        self._exec().unsafe_compute_mask_ptr_with_draft_token(jobs, out.ctypes.data, row_bytes, total)
        return out

    def _exec(self) -> LLExecutor:
        if self._executor is None:
            self._executor = _llg().LLExecutor(max(1, os.cpu_count() or 1))
        return self._executor

    def close(self) -> None:
        self._compilers.shutdown(wait=False, cancel_futures=True)


def build_lltokenizer(tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]) -> LLTokenizer:
    """llguidance's view of the tokenizer: from its tokenizer.json, then, when it has added tokens that are
    not special, again from the token bytes with those as the text they are."""
    text = tokenizer.backend.to_str()
    eos = eos_token_ids or None
    llg = _llg()
    base = llg.LLTokenizer(text, n_vocab=vocab_size, eos_token=eos)
    plain = {t["id"]: t["content"] for t in json.loads(text).get("added_tokens") or ()
             if not t.get("special") and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)}
    if not plain:
        return base
    return llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(base, plain, tokenizer, eos_token_ids)),
                       n_vocab=vocab_size, eos_token=eos)


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: each token's bytes, the special ids, and encode."""

    def __init__(self, base: LLTokenizer, plain: dict[int, str], tokenizer: Tokenizer,
                 eos_token_ids: list[int]) -> None:
        n = base.vocab_size
        self.eos_token_id = eos_token_ids[0] if eos_token_ids else base.eos_token
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [plain[i].encode("utf-8") if i in plain else base.decode_bytes([i]) for i in range(n)]
        self.special_token_ids = [i for i in range(n) if i not in plain and base.is_special_token(i)]
        self._backend = tokenizer.backend

    def __call__(self, data: bytes) -> list[int]:
        return self._backend.encode(data.decode("utf-8", errors="replace"), add_special_tokens=False).ids


def _clear_from(bits: np.ndarray, first: int) -> None:
    """Clear bits first.. of every row."""
    w, b = divmod(first, 32)
    if b:
        bits[:, w] &= np.int32(np.uint32((1 << b) - 1).view(np.int32))
        w += 1
    bits[:, w:] = 0


def _short(message: str) -> str:
    text = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "..."
