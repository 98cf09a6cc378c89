"""open_gguf(vocabulary=False): planning reads a GGUF's shapes without a Python object per token (a 150k
vocabulary is 30 MiB of them), with every check of the full read kept."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from nvllm.config import load_settings
from nvllm.engine.assembly import factory
from nvllm.model.weights.gguf_file import open_gguf, read_gguf
from nvllm.model.weights.gguf_reader import GGUFError, SkippedStrings


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return gu.write_random_gguf(tmp_path_factory.mktemp("small") / "small.gguf", T.Q8_0, hidden=64,
                                intermediate=128, heads=4, kv_heads=2, layers=1, vocab=32)


def test_string_arrays_are_counted_not_decoded(small: Path) -> None:
    full, bare = open_gguf(small), open_gguf(small, vocabulary=False)
    tokens = bare.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, SkippedStrings) and len(tokens) == len(full.metadata["tokenizer.ggml.tokens"]) == 32
    assert {k: v for k, v in bare.metadata.items() if not isinstance(v, SkippedStrings)} == \
        {k: v for k, v in full.metadata.items() if not isinstance(bare.metadata[k], SkippedStrings)}
    assert read_gguf(bare).config == read_gguf(full).config


def test_planning_gives_the_loads_shapes(small: Path) -> None:
    settings = load_settings(overrides={"model": {"path": str(small)}})
    planned, loaded = factory.read_model_info(settings), factory.load_model(settings).info
    assert (planned.vocab_size, planned.num_layers, planned.bytes_per_token) == \
        (loaded.vocab_size, loaded.num_layers, loaded.bytes_per_token)


def test_a_token_that_is_not_utf8_is_refused_all_the_same(small: Path, tmp_path: Path) -> None:
    data = bytearray(small.read_bytes())
    first = gu.find(bytes(data), b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8
    assert struct.unpack_from("<Q", data, first)[0] >= 1   # the first token's length, then its bytes
    data[first + 8] = 0xFF
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    for vocabulary in (True, False):
        with pytest.raises(GGUFError, match=r"tokenizer.ggml.tokens'\[0\] is not valid UTF-8"):
            open_gguf(bad, vocabulary=vocabulary)
