"""Streaming detokenization: the text each generated token adds, as the sequence grows.

IncrementalDetokenizer asks the Tokenizer only for its decode and a few id sets worked out at load.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvllm.text.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


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
        self._ids: list[int] = self._prompt_context(prompt_ids)
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

    def _prompt_context(self, prompt_ids: Sequence[int]) -> list[int]:
        context: list[int] = []
        for i in reversed(range(len(prompt_ids))):
            if len(context) == self.PROMPT_CONTEXT:
                break
            tid = int(prompt_ids[i])
            if tid >= 0 and self._keep(tid):
                context.append(tid)
        context.reverse()
        return context

    def _window_text(self, stop: int | None = None) -> str:
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
