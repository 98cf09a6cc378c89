"""The tokenizers the text tests share: the tiny Llama's and Qwen2's folders, and a SentencePiece-style
one built in memory."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from helpers.tokenizer_cases import build_sentencepiece_style  # noqa: E402
from nvllm.text.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def llama(tiny_models) -> Tokenizer:
    return Tokenizer.from_dir(tiny_models["tiny-llama"])


@pytest.fixture(scope="module")
def qwen(tiny_models) -> Tokenizer:
    return Tokenizer.from_dir(tiny_models["tiny-qwen2"])


@pytest.fixture(scope="module")
def sp() -> Tokenizer:
    return build_sentencepiece_style()
