"""weights/gguf_encoder.py: the BERT GGUFs llama.cpp's converter wrote for the tiny encoders
(tests/golden/converted/) loaded and run by model/encoder.py give transformers' embeddings (tiny-bert's mean
pooling, F32 and F16 files), the normalized [CLS] row for tiny-bert-cls (its Dense module is not in the
file), llama.cpp's reranker scores; the F16 matrices stay F16; what the factory plans is what loading holds;
and a file nvllm cannot serve as llama.cpp would is refused with one line naming the file and the key or
tensor."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.encoder_batch import encoder_batch
from helpers.gguf_cases import rewrite_file
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.model import encoder as encoder_module
from nvllm.model.encoder import Encoder
from nvllm.model.weights.gguf_encoder import is_gguf_encoder, load_gguf_encoder, read_gguf_encoder
from nvllm.model.weights.gguf_file import open_gguf, read_gguf
from nvllm.model.weights.gguf_reader import GGUFError

CONVERTED = GOLDEN / "converted"
FILES = ("tiny-bert.f32", "tiny-bert.f16", "tiny-bert-cls.f32", "tiny-bert-reranker.f32")


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def encoder(name: str, in_place: bool | None = None) -> Encoder:
    return Encoder(*load_gguf_encoder(CONVERTED / f"{name}.gguf", in_place)[:3])


def llamacpp_run(gguf_name: str, kind: str) -> dict[str, Any]:
    """llama.cpp's flash-attention-off run (float32 K and V, as nvllm) of a file."""
    runs = json.loads((GOLDEN / "pooling_llamacpp.json").read_text())["runs"]
    return next(r for r in runs if r["gguf"] == gguf_name and r["kind"] == kind and r["flash_attn"] == "off")


@pytest.mark.parametrize("name, in_place", [("tiny-bert.f32", None), ("tiny-bert.f16", True),
                                            ("tiny-bert.f16", False)])
def test_mean_pooling_gives_transformers_embeddings(name: str, in_place: bool | None) -> None:
    cases = golden_cases("tiny-bert")
    model = encoder(name, in_place)
    assert model.task == "embed" and model.pooling.method == "mean" and model.pooling.normalize
    got = model.pool(encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases]))
    for c, vec in zip(cases, got):   # measured: 1 - cosine <= 2e-13 (F32), 3e-7 (F16)
        assert cosine(vec, c["embedding"]) >= 0.9999, c["text"]
        assert abs(float(np.linalg.norm(vec)) - 1) < 1e-5


def test_f16_matrices_stay_f16() -> None:
    w = encoder("tiny-bert.f16", in_place=True).weights
    assert w.embed.formats == w.layers[0].qkv.formats == w.layers[1].down.formats == ("F16",)
    assert w.positions is not None
    assert w.positions.formats == ("F32",)   # the converter keeps position_embd and token_types F32


def test_cls_pooling_gives_the_normalized_cls_row() -> None:
    """tiny-bert-cls's folder adds a Dense 32 -> 16 the converter does not write: the file's embedding is the
    [CLS] row normalized (32 numbers), as llama.cpp gives it; transformers' `pooled` is that row."""
    cases = golden_cases("tiny-bert-cls")
    model = encoder("tiny-bert-cls.f32")
    assert model.pooling.method == "cls" and model.output_size == 32
    got = model.pool(encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases]))
    for c, vec in zip(cases, got):
        pooled = np.asarray(c["pooled"], np.float64)
        assert vec.shape == (32,) and cosine(vec, pooled / np.linalg.norm(pooled)) >= 0.9999, c["text"]


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml's GELU on the CPU (ggml_vec_gelu_f32): x rounded to float16, the tanh form read from a float16
    table of it; 0 below -10 and x above 10. In place, as encoder.gelu."""
    h = x.astype(np.float16).astype(np.float32)
    c = np.float32(math.sqrt(2 / math.pi))
    y = np.float32(0.5) * h * (np.float32(1) + np.tanh(c * h * (np.float32(1) + np.float32(0.044715) * h * h)))
    x[...] = np.where(x <= -10, np.float32(0), np.where(x >= 10, x, y.astype(np.float16).astype(np.float32)))
    return x


def test_the_reranker_gives_llamacpps_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reranker GGUF has the classifier and no pooler: its score is the classifier on the [CLS] state, as
    llama.cpp computes it (token types all 0, as llama.cpp gives them).

    nvllm's GELU is transformers' exact erf form, llama.cpp's ggml's tanh form from a float16 table: they
    differ by up to ~5e-4 on small activations and by float16's rounding (up to ~4e-3 near 10) on large
    ones. Measured over the six documents: 1.3e-3 at most with nvllm's GELU (hence 2.5e-3), and 5.4e-5 with
    ggml's GELU put in its place (hence 1e-4): what is left is float32 rounding, so the GELU is the whole
    difference."""
    run = llamacpp_run("tiny-bert-reranker.f32.gguf", "rank")
    model = encoder("tiny-bert-reranker.f32")
    assert model.task == "rerank" and model.output_size == 1
    assert model.config.architecture == "BertForSequenceClassification" and model.weights.head is not None
    assert model.weights.head.dense is None
    batch = [c["input_ids"] for c in run["cases"]]
    scores = [float(s[0]) for s in model.pool(encoder_batch(batch))]
    want = [c["score"] for c in run["cases"]]
    assert max(abs(a - b) for a, b in zip(scores, want)) < 2.5e-3
    monkeypatch.setattr(encoder_module, "gelu", ggml_gelu)
    scores = [float(s[0]) for s in model.pool(encoder_batch(batch))]
    assert max(abs(a - b) for a, b in zip(scores, want)) < 1e-4


def test_embeddings_are_llamacpps_with_its_gelu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for tiny-bert's unnormalized vectors (token types 0): within 1.7e-4 with nvllm's GELU, 2.4e-5
    (relative to the vector's length) with ggml's."""
    run = llamacpp_run("tiny-bert.f32.gguf", "embedding")
    cases = [c for c in run["cases"] if "embedding" in c]   # not the one past llama.cpp's 128 positions
    model = encoder("tiny-bert.f32")
    monkeypatch.setattr(encoder_module, "gelu", ggml_gelu)
    got = model.pool(encoder_batch([c["input_ids"] for c in cases]))
    for c, vec in zip(cases, got):
        want = np.asarray(c["embedding"])
        assert np.abs(vec - want / np.linalg.norm(want)).max() < 1e-4, c["prompt"]


@pytest.mark.parametrize("name", FILES)
def test_planned_bytes_are_the_loaded_bytes(name: str) -> None:
    path = CONVERTED / f"{name}.gguf"
    assert is_gguf_encoder(open_gguf(path).metadata)
    for in_place in (None, False):   # None: in place where the C kernels are built
        planned = read_gguf_encoder(path).resident_bytes(in_place)
        assert planned == load_gguf_encoder(path, in_place).weights.nbytes


# ---------------------------------------------------------------- refusals

def rewrite(out: Path, src: str = "tiny-bert.f32", arch: str = "bert", drop: tuple[str, ...] = (),
            extra: dict[str, Any] | None = None, tensors: dict[str, np.ndarray | None] | None = None) -> Path:
    """A converted GGUF written again with keys dropped or set and tensors dropped (None), replaced or added."""
    return rewrite_file(CONVERTED / f"{src}.gguf", out, arch, drop, extra, tensors)


H = 32
POOLING = "metadata 'bert.pooling_type'"
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "pooling none": ({"extra": {"bert.pooling_type": 0}}, rf"{POOLING} is 0 \(none\): a vector per token"),
    "pooling unknown": ({"extra": {"bert.pooling_type": 7}}, rf"{POOLING} is 7, not one of"),
    "no pooling key": ({"drop": ("bert.pooling_type",)}, rf"{POOLING} is missing and the file has no classifier"),
    "rank without a classifier": ({"extra": {"bert.pooling_type": 4}},
                                  rf"{POOLING} is 4 \(rank\) but tensor 'cls.output.weight'"),
    "missing key": ({"drop": ("bert.embedding_length",)}, r"metadata 'bert.embedding_length' is missing"),
    "missing epsilon": ({"drop": ("bert.attention.layer_norm_epsilon",)},
                        r"metadata 'bert.attention.layer_norm_epsilon' is missing"),
    "heads": ({"extra": {"bert.attention.head_count": 5}}, r"embedding length 32 is not a multiple of the 5"),
    "layers": ({"extra": {"bert.block_count": 3}}, r"tensor 'blk.2.attn_q.weight' is missing"),
    "causal": ({"extra": {"bert.attention.causal": True}}, r"metadata 'bert.attention.causal' is True"),
    "token types": ({"extra": {"tokenizer.ggml.token_type_count": 3}},
                    r"metadata 'tokenizer.ggml.token_type_count' is 3, but tensor 'token_types.weight' has 2 rows"),
    "wrong shape": ({"tensors": {"position_embd.weight": np.zeros((64, H), np.float32)}},
                    r"tensor 'position_embd.weight' has shape \[64, 32\], expected \[128, 32\]"),
    "missing tensor": ({"tensors": {"blk.1.ffn_down.bias": None}}, r"tensor 'blk.1.ffn_down.bias' is missing"),
    "extra tensor": ({"tensors": {"blk.0.ffn_gate.weight": np.zeros((64, H), np.float32)}},
                     r"unexpected tensor 'blk.0.ffn_gate.weight' for a 2-layer bert model"),
    "half a dense": ({"tensors": {"cls.weight": np.zeros((H, H), np.float32)}}, r"tensor 'cls.bias' is missing"),
    "jina-bert-v2": ({"arch": "jina-bert-v2"}, r"architecture 'jina-bert-v2' is an encoder nvllm does not serve "
                                               r"\(encoders served: bert, nomic-bert\)"),
    "a decoder": ({"arch": "llama"}, r"architecture 'llama' is not an encoder"),
    "a byte-level BPE vocabulary": ({"extra": {"tokenizer.ggml.model": "gpt2"}},
                                    r"metadata 'tokenizer.ggml.model' is 'gpt2': nvllm reads an encoder's WordPiece "
                                    r"\('bert'\) or SentencePiece Unigram \('t5'\) vocabulary"),
    "two labels": ({"src": "tiny-bert-reranker.f32", "extra": {"bert.classifier.output_labels": ["a", "b"]}},
                   r"a classifier with 2 labels; only one-label classifiers"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_cannot_be_served_is_refused(tmp_path: Path, case: str) -> None:
    kwargs, message = REFUSED[case]
    path = rewrite(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(GGUFError, match=rf"^{re.escape(str(path))}: {message}"):
        load_gguf_encoder(path)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    data = (CONVERTED / "tiny-bert.f16.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(GGUFError, match=r"run past the end of the file .* truncated or corrupt"):
        load_gguf_encoder(tmp_path / "cut.gguf")


def test_the_decoder_reader_names_an_encoder_for_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"architecture 'bert' is an encoder \(embeddings, reranking\), not a model "
                                        r"that generates text"):
        read_gguf(CONVERTED / "tiny-bert.f32.gguf")
    assert not is_gguf_encoder({"general.architecture": "llama"})
    assert is_gguf_encoder({"general.architecture": "nomic-bert"})
    assert is_gguf_encoder({"general.architecture": "jina-bert-v2"})


def test_a_file_with_a_dense_before_its_classifier_applies_it(tmp_path: Path) -> None:
    """llama.cpp's `cls` (a classifier's dense, then tanh) where a converter writes one: identity weights and
    zero bias give the classifier on tanh(h)."""
    path = rewrite(tmp_path / "dense.gguf", "tiny-bert-reranker.f32", tensors={
        "cls.weight": np.eye(H, dtype=np.float32), "cls.bias": np.zeros(H, np.float32)})
    with_dense, plain = Encoder(*load_gguf_encoder(path)[:3]), encoder("tiny-bert-reranker.f32")
    assert with_dense.weights.head is not None and with_dense.weights.head.dense is not None
    ids = golden_cases("tiny-bert-reranker")[0]["input_ids"]
    h = plain.hidden(encoder_batch([ids]))[0]
    head = plain.weights.head
    assert head is not None
    want = float(head.out.apply(np.tanh(h)[None])[0, 0] + head.out_bias[0])
    assert abs(float(with_dense.pool(encoder_batch([ids]))[0][0]) - want) < 1e-5
