"""The encoder's forward pass (model/encoder.py) against transformers (tests/golden/pooling_*.json): the tiny BERTs'
embeddings (mean pooling and normalization; CLS pooling, a Dense layer and normalization), a sentence pair's token
types, a cross-encoder's logits; every sequence of a packed batch as it is alone; the tokenizer's ids as
transformers'; erf; and the refusals of what the model cannot take."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from helpers.encoder_batch import encoder_batch
from helpers.pooling_golden import golden_cases
from nvllm.engine.assembly.pooling_model import load_encoder_folder
from nvllm.model.encoder import Encoder, erf
from nvllm.model.kernels import ops


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def encoders(tiny_encoders: dict[str, Path]) -> dict[str, Encoder]:
    return {name: load_encoder_folder(path, "")[0] for name, path in tiny_encoders.items()}


def test_erf_is_within_a_millionth() -> None:
    x = np.linspace(-6, 6, 200_001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    assert np.abs(erf(x).astype(np.float64) - want).max() < 1e-6   # A&S 7.1.26: 1.5e-7, then float32


@pytest.mark.aarch64
def test_the_c_gelu_is_its_numpy_twins_formula() -> None:
    """ops.gelu_erf (csrc/ops.c) computes what encoder.gelu's NumPy path does, within float32 rounding; NaN
    stays NaN, +inf stays +inf, and -inf is NaN as the formula (and torch's) makes it (-inf * 0)."""
    if ops.lib is None:
        pytest.skip("the C kernels are not built")
    x = np.concatenate([np.linspace(-12, 12, 100_001, dtype=np.float32), [np.nan, np.inf, -np.inf]])
    x = x.astype(np.float32)
    with np.errstate(invalid="ignore"):   # -inf * 0
        twin = x * (np.float32(1) + erf(x * np.float32(1 / math.sqrt(2)))) * np.float32(0.5)
    got = ops.gelu_erf(x.copy())
    assert np.allclose(got[:-3], twin[:-3], rtol=0, atol=2e-6)
    assert np.isnan(got[-3]) and got[-2] == np.inf and np.isnan(got[-1])


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-bert-cls"])
def test_embeddings_of_a_packed_batch_are_transformers(encoders: dict[str, Encoder], tiny_encoders: dict[str, Path],
                                                       name: str) -> None:
    cases = golden_cases(name)
    _, tokenizer = load_encoder_folder(tiny_encoders[name], "")
    for c in cases:   # the WordPiece tokenizer gives transformers' ids and token types
        if c["kind"] == "text":
            assert tokenizer.encode(c["text"]) == c["input_ids"]
        else:
            assert tokenizer.encode_within(c["text"][0], 512, c["text"][1]) == (c["input_ids"], c["token_type_ids"])
    model = encoders[name]
    batch = model.pool(encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases]))
    for c, got in zip(cases, batch):
        assert got.shape == (len(c["embedding"]),) and cosine(got, c["embedding"]) >= 0.9999, c["text"]
        assert abs(float(np.linalg.norm(got)) - 1) < 1e-5
    alone = model.pool(encoder_batch([cases[3]["input_ids"]], [cases[3]["token_type_ids"]]))[0]
    assert np.allclose(alone, batch[3], atol=1e-6)
    # Token types matter: the pair read as one segment is another embedding
    pair = next(c for c in cases if c["kind"] == "pair")
    flat = model.pool(encoder_batch([pair["input_ids"]]))[0]
    assert cosine(flat, pair["embedding"]) < 0.9999


def test_a_cross_encoder_gives_transformers_logits(encoders: dict[str, Encoder]) -> None:
    cases = golden_cases("tiny-bert-reranker")
    model = encoders["tiny-bert-reranker"]
    assert model.task == "rerank" and model.output_size == 1
    scores = model.pool(encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases]))
    assert max(abs(float(s[0]) - c["logit"]) for s, c in zip(scores, cases)) < 1e-3


def test_what_the_model_cannot_take_is_refused(encoders: dict[str, Encoder]) -> None:
    model = encoders["tiny-bert"]
    with pytest.raises(ValueError, match="up to 128 tokens"):
        model.pool(encoder_batch([list(range(5, 135))]))
    with pytest.raises(ValueError, match="token_types: need ids below the model's type_vocab_size 2"):
        model.pool(encoder_batch([[2, 7, 3]], [[0, 2, 0]]))
