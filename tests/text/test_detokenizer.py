"""Streaming detokenization (nvllm.text.detokenizer.IncrementalDetokenizer), by property tests and by case, on
byte-level tokenizers (tiny-llama, tiny-qwen2) and a SentencePiece-style one with byte fallback: the deltas add
up to the full decode, no replacement character streams early, incomplete characters are held until complete or
flushed, a prompt keeps the first output token's leading space, and the cost per token stays flat."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from hypothesis import assume, given
from hypothesis import strategies as st

from helpers.tokenizer_cases import PROPERTY, USER, stream
from nvllm.text.detokenizer import IncrementalDetokenizer

FFFD = "\ufffd"


def ids_strategy(vocab_size: int, max_size: int = 40):
    # Mostly real ids, some unknown ones past the vocabulary (a padded lm_head can produce them).
    return st.lists(st.integers(0, vocab_size + 3), max_size=max_size)


class TestIncrementalDetokenizerByteLevel:
    @PROPERTY
    @given(prompt=ids_strategy(512, 12), output=ids_strategy(512), skip=st.booleans())
    def test_deltas_concatenate_to_the_full_decode(self, llama, prompt, output, skip):
        deltas, tail = stream(llama, prompt, output, skip)
        assert "".join(deltas) + tail == llama.decode(output, skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=ids_strategy(512, 12), output=ids_strategy(512), skip=st.booleans())
    def test_no_replacement_char_unless_the_decode_has_one_then(self, llama, prompt, output, skip):
        deltas, _ = stream(llama, prompt, output, skip)
        for n, delta in enumerate(deltas, start=1):
            if FFFD in delta:
                assert FFFD in llama.decode(output[:n], skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=st.text(max_size=20), text=st.text(max_size=40))
    def test_streaming_encoded_text_gives_the_text_back(self, qwen, prompt, text):
        # A special token's text (hypothesis draws string constants from the code, "<|im_start|>" among
        # them) encodes to that token, which decoding leaves out: not text that comes back.
        assume("<|" not in text)
        output = qwen.encode(text)
        # Qwen2's tokenizer normalises to NFC, so the text that comes back is the NFC form.
        text = unicodedata.normalize("NFC", text)
        deltas, tail = stream(qwen, qwen.encode(prompt), output)
        if not text.endswith(FFFD):  # a literal U+FFFD at the end looks incomplete and waits for flush()
            assert tail == ""  # complete text leaves nothing held
        assert "".join(deltas) + tail == text
        assert all(FFFD not in d for d in deltas) or FFFD in text

    def test_first_output_token_keeps_its_leading_space(self, llama):
        prompt = llama.encode_chat([USER])
        deltas, _ = stream(llama, prompt, llama.encode(" Paris is nice"))
        assert "".join(deltas) == " Paris is nice"

    def test_incomplete_character_is_held_then_completed(self, llama):
        ids = llama.encode("€")  # three bytes; the tiny vocabulary has no merge for them
        assert len(ids) >= 2
        detok = IncrementalDetokenizer(llama, [])
        assert [detok.add(t) for t in ids[:-1]] == [""] * (len(ids) - 1)
        assert detok.add(ids[-1]) == "€"

    def test_flush_returns_an_incomplete_character_at_the_end(self, llama):
        ids = llama.encode("€")[:-1]
        deltas, tail = stream(llama, [], ids)
        assert deltas == [""] * len(ids)
        assert tail == llama.decode(ids) == FFFD

    def test_special_tokens_skipped_or_kept(self, llama):
        output = llama.encode("Hi") + [2]
        assert "".join(stream(llama, [], output, skip=True)[0]) == "Hi"
        assert "".join(stream(llama, [], output, skip=False)[0]) == "Hi<|im_end|>"

    def test_cost_per_token_does_not_grow_with_output_length(self, llama):
        detok = IncrementalDetokenizer(llama, llama.encode("Once upon a time"))
        longest = []
        real = detok._decode

        def spy(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
            longest.append(len(ids))
            return real(ids, skip_special_tokens=skip_special_tokens)
        detok._decode = spy
        text = "The quick brown fox jumps over the lazy dog. " * 40
        ids = llama.encode(text)
        out = "".join(detok.add(t) for t in ids)
        assert out == text and len(ids) > 300
        assert max(longest) <= 8


class TestIncrementalDetokenizerSentencePiece:
    @PROPERTY
    @given(output=ids_strategy(376), skip=st.booleans())
    def test_without_prompt_deltas_concatenate_to_the_full_decode(self, sp, output, skip):
        deltas, tail = stream(sp, [], output, skip)
        assert "".join(deltas) + tail == sp.decode(output, skip_special_tokens=skip)

    @PROPERTY
    @given(prompt=ids_strategy(376, 12), output=ids_strategy(376), skip=st.booleans())
    def test_with_prompt_only_the_leading_space_may_differ(self, sp, prompt, output, skip):
        deltas, tail = stream(sp, prompt, output, skip)
        full = sp.decode(output, skip_special_tokens=skip)
        # decode() strips the first token's leading space; the stream keeps it after a prompt.
        assert "".join(deltas) + tail in (full, " " + full)

    @PROPERTY
    @given(prompt=ids_strategy(376, 12), output=ids_strategy(376), skip=st.booleans())
    def test_no_replacement_char_unless_the_decode_has_one_then(self, sp, prompt, output, skip):
        deltas, _ = stream(sp, prompt, output, skip)
        for n, delta in enumerate(deltas, start=1):
            if FFFD in delta:
                assert FFFD in sp.decode(output[:n], skip_special_tokens=skip)

    @PROPERTY
    @given(text=st.text(min_size=1, max_size=40), cut=st.integers(0, 40))
    def test_prompt_text_plus_stream_is_the_whole_text(self, sp, text, cut):
        ids = sp.encode(text)
        cut = min(cut, len(ids))
        prompt, output = ids[:cut], ids[cut:]
        head, whole = sp.decode(prompt), sp.decode(ids)
        assume(whole.startswith(head) and not head.endswith(FFFD) and (not prompt or prompt[-1] > 258))
        deltas, tail = stream(sp, prompt, output)
        assert head + "".join(deltas) + tail == whole

    def test_leading_space_of_first_output_token_is_kept(self, sp):
        ids = sp.encode("The quick brown fox")
        words = [sp.id_to_token(i) for i in ids]
        cut = next(i for i, w in enumerate(words) if i > 1 and w.startswith("▁"))
        deltas, _ = stream(sp, ids[:cut], ids[cut:])
        assert "".join(deltas).startswith(" ")
        assert sp.decode(ids[:cut]) + "".join(deltas) == "The quick brown fox"

    def test_a_later_byte_that_spoils_the_run_is_not_streamed_early(self, sp):
        c3, a9, word = 3 + 0xC3, 3 + 0xA9, sp.token_to_id("x▁")
        output = [c3, a9, a9, word]
        deltas, tail = stream(sp, [], output)
        assert sp.decode(output).startswith(FFFD * 3)  # the third byte spoils the whole run
        assert "".join(deltas) + tail == sp.decode(output)
        assert deltas[:3] == ["", "", ""]

    def test_long_valid_byte_run_streams_before_it_ends(self, sp):
        text = "東京" * 20  # no CJK in the vocabulary: 120 byte tokens in one run
        ids = sp.encode(text, add_special_tokens=False)[1:]  # after the "▁" the normalizer prepends
        assert len(ids) == 120 and set(ids) <= sp.byte_token_ids()
        deltas, tail = stream(sp, [], ids)
        assert "".join(deltas) + tail == text
        assert sum(1 for d in deltas if d) >= 3  # bounded latency: it did not wait for the run to end
        assert all(FFFD not in d for d in deltas)
