"""`nvllm models synthesize`'s BERT shapes (bge-small-en-v1.5, all-MiniLM-L6-v2), on small copies: the file is a
`bert` GGUF as llama.cpp's converter writes one, reads back through the factory as an embedding model with
its pooling, and embeds; its WordPiece vocabulary is bert-base-uncased's layout and tokenizes English."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.model.weights.gguf_file import open_gguf
from nvllm.model_files.synthetic.shapes import SHAPES, Shape
from nvllm.model_files.synthetic.writer import synthesize
from nvllm.pooling_params import PoolingParams
from nvllm.text.tokenizer import Tokenizer

TEXT = "The quick brown fox jumps over the lazy dog, while the operator checks the drone's battery and camera."


def small(name: str, vocab: int = 2048) -> Shape:
    return dataclasses.replace(SHAPES[name], name=f"tiny-{name}", hidden=64, intermediate=128, layers=2, heads=4,
                               kv_heads=4, head_dim=16, vocab=vocab, bpe=vocab - 999, context=160)


def embed(path: Path, text: str) -> tuple[np.ndarray, str]:
    engine = build_engine(load_settings(overrides={"model": {"path": str(path)}}))
    assert engine.task == "embed"
    engine.add_request("a", text, PoolingParams())
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].pooled is not None and engine.model.pooling is not None
    return np.asarray(outs[-1].pooled, np.float32), engine.model.pooling.method


@pytest.mark.parametrize(("name", "method"), [("bge-small-en-v1.5", "cls"), ("all-minilm-l6-v2", "mean")])
def test_a_synthesized_bert_embeds_with_its_pooling_in_f16_and_q8_0(tmp_path: Path, name: str, method: str) -> None:
    vectors = []
    for file_type in ("F16", "Q8_0"):
        path = synthesize(small(name), file_type, tmp_path / f"{file_type}.gguf")
        vec, pooling = embed(path, TEXT)
        assert pooling == method
        assert vec.shape == (64,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
        vectors.append(vec)
    assert float(vectors[0] @ vectors[1]) > 0.99   # the Q8_0 file is the F16 file quantized


def test_the_file_is_a_bert_gguf_as_llama_cpps_converter_writes_it(tmp_path: Path) -> None:
    path = synthesize(small("bge-small-en-v1.5"), "Q8_0", tmp_path / "q8.gguf")
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert {k: meta[k] for k in ("general.architecture", "bert.pooling_type", "bert.attention.causal",
                                 "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.token_type_count",
                                 "tokenizer.ggml.cls_token_id", "tokenizer.ggml.seperator_token_id")} == {
        "general.architecture": "bert", "bert.pooling_type": 2, "bert.attention.causal": False,
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.pre": "bert-bge", "tokenizer.ggml.token_type_count": 2,
        "tokenizer.ggml.cls_token_id": 101, "tokenizer.ggml.seperator_token_id": 102}
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["token_embd.weight"] == types["blk.1.ffn_down.weight"] == "Q8_0"
    assert types["position_embd.weight"] == types["token_types.weight"] == types["blk.0.attn_q.bias"] == "F32"
    assert Counter(n.split(".", 2)[1] for n in types if n.startswith("blk.")) == {"0": 16, "1": 16}
    assert "output_norm.weight" not in types   # a BERT has none, and the converter drops the pooler


def test_the_vocabulary_is_bert_base_uncased_s_layout_and_tokenizes_english(tmp_path: Path) -> None:
    shape = dataclasses.replace(small("bge-small-en-v1.5", vocab=30522), layers=1)
    f = open_gguf(synthesize(shape, "F16", tmp_path / "v.gguf"))
    try:
        tokens = f.metadata["tokenizer.ggml.tokens"]
        kinds = f.metadata["tokenizer.ggml.token_type"]
        tok = Tokenizer.from_gguf_metadata(f.metadata, str(f.path))
    finally:
        f.close()
    assert len(tokens) == len(set(tokens)) == 30522
    assert {i: tokens[i] for i in (0, 100, 101, 102, 103)} == {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]",
                                                               103: "[MASK]"}
    assert tokens[1] == "▁[unused0]" and tokens[998] == "▁[unused993]" and tokens[999] == "▁!"
    assert [i for i, k in enumerate(kinds) if k == 3] == [0, 100, 101, 102, 103]   # CONTROL; the rest NORMAL
    ids = tok.encode(TEXT)
    assert ids[0] == 101 and ids[-1] == 102 and 100 not in ids
    assert tok.decode(ids) == TEXT.lower().replace("drone's", "drone ' s")
    words = "please summarise the weather report : light wind from the west , some rain in the afternoon"
    assert len(tok.encode(words, add_special_tokens=False)) == len(words.split())   # learned whole
