"""SmolLM2's own tokenizer (the default model, models/smollm2-135m-instruct): its special ids, the chat
template's default system prompt, and streaming detokenization of encoded text and of random ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.tokenizer_cases import PROPERTY, USER, stream
from nvllm.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def smol(smollm2) -> Tokenizer:
    # conftest's smollm2 fixture skips (or fails in CI) when the default model is not pulled
    return Tokenizer.from_dir(smollm2)


@pytest.mark.smollm2
class TestSmolLM2:
    def test_special_ids(self, smol):
        assert smol.eos_token == "<|im_end|>"
        assert smol.token_to_id("<|im_end|>") == smol.eos_token_id
        assert smol.vocab_size == 49152

    def test_chat_default_system_prompt(self, smol):
        text = smol.render_chat([USER])
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        ids = smol.encode_chat([USER])
        assert ids[0] == smol.token_to_id("<|im_start|>")

    @PROPERTY
    @given(prompt=st.text(max_size=20), text=st.text(max_size=60))
    def test_streaming_gives_the_text_back(self, smol, prompt, text):
        output = smol.encode(text)
        deltas, tail = stream(smol, smol.encode_chat([{"role": "user", "content": prompt}]), output)
        # (text with bytes SmolLM2's vocabulary lacks does not round-trip; the stream still equals decode)
        assert "".join(deltas) + tail == smol.decode(output)

    @PROPERTY
    @given(output=st.lists(st.integers(0, 49151), max_size=30), skip=st.booleans())
    def test_random_ids_stream_to_the_full_decode(self, smol, output, skip):
        deltas, tail = stream(smol, smol.encode("Hello"), output, skip)
        assert "".join(deltas) + tail == smol.decode(output, skip_special_tokens=skip)
