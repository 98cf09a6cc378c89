"""XLM-RoBERTa cross-encoders (bge-reranker's family) in model/encoder.py, from tiny-xlmr-reranker's folder and from
the GGUF llama.cpp's converter wrote of it (tests/golden/converted/): the folder gives transformers' logits
(tests/golden/pooling_tiny-xlmr-reranker.json) with its tokenizer's ids; the GGUF, as llama.cpp reads it (the
position table without RoBERTa's two offset rows, the head's dense kept, one token type), gives llama.cpp's
scores (tests/golden/pooling_llamacpp.json) within what its GELU makes of them, and transformers' logits."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.encoder_batch import encoder_batch
from helpers.ggml_gelu import ggml_gelu
from helpers.paths import GOLDEN
from helpers.pooling_golden import golden_cases
from nvllm.engine.assembly.pooling_model import load_encoder_folder, load_encoder_gguf
from nvllm.model import encoder as encoder_module
from nvllm.model.encoder import Encoder
from nvllm.model.weights.gguf_encoder import load_gguf_encoder, read_gguf_encoder
from nvllm.model.weights.gguf_file import open_gguf

GGUF = GOLDEN / "converted" / "tiny-xlmr-reranker.f32.gguf"


def scores(model: Encoder, cases: list[dict[str, Any]], types: bool = True) -> list[float]:
    batch = encoder_batch([c["input_ids"] for c in cases], [c["token_type_ids"] for c in cases] if types else None)
    return [float(s[0]) for s in model.pool(batch)]


def llamacpp_rank(flash_attn: str) -> list[dict[str, Any]]:
    runs = json.loads((GOLDEN / "pooling_llamacpp.json").read_text())["runs"]
    return next(r for r in runs if r["gguf"] == GGUF.name and r["kind"] == "rank"
                and r["flash_attn"] == flash_attn)["cases"]


def test_the_folder_gives_transformers_logits(tiny_encoders: dict[str, Path]) -> None:
    """Positions from pad_token_id + 1, RoBERTa's head (dense, tanh, out_proj), LayerNorm eps 1e-5: measured
    within 3e-7 of transformers' logits."""
    model, tok = load_encoder_folder(tiny_encoders["tiny-xlmr-reranker"], "")
    c = model.config
    assert (c.architecture, c.family, c.head, c.position_offset, c.max_tokens) == (
        "XLMRobertaForSequenceClassification", "xlm-roberta", "roberta", 2, 128)
    assert model.task == "rerank" and c.type_vocab_size == 1 and c.layer_norm_eps == 1e-5
    cases = golden_cases("tiny-xlmr-reranker")
    for case in cases:
        assert tok.encode_within(case["query"], 512, case["document"]) == (case["input_ids"], case["token_type_ids"])
    got = scores(model, cases)
    assert max(abs(a - case["logit"]) for a, case in zip(got, cases)) < 1e-5
    alone = scores(model, cases[2:3])[0]
    assert abs(alone - got[2]) < 1e-6


def test_the_gguf_is_read_as_llamacpp_reads_it() -> None:
    model = Encoder(*load_gguf_encoder(GGUF)[:3])
    c = model.config
    # the converter cut the two rows before the first position: positions count from 0 here
    assert (c.max_position_embeddings, c.position_offset, c.type_vocab_size, c.pad_token_id) == (128, 0, 1, 1)
    assert model.task == "rerank" and c.layer_norm_eps == 1e-5
    head = model.weights.head
    assert head is not None and head.dense is not None   # RoBERTa's dense and tanh, llama.cpp's `cls`
    assert read_gguf_encoder(GGUF).resident_bytes(False) == load_gguf_encoder(GGUF, False).weights.nbytes


def test_the_gguf_gives_transformers_logits_and_llamacpps_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """One token type, so llama.cpp's all-0 types lose nothing: the file gives transformers' logits (measured
    3e-7). Against llama.cpp (flash attention off, float32 K and V) the difference is its GELU (ggml's tanh
    form from a float16 table): measured 6.8e-4 with nvllm's erf GELU, 7.4e-5 with ggml's in its place; 1.5e-3
    against llama.cpp's default run, whose flash attention rounds K and V to float16."""
    model, tok = load_encoder_gguf(open_gguf(GGUF))
    gold = golden_cases("tiny-xlmr-reranker")
    assert max(abs(a - c["logit"]) for a, c in zip(scores(model, gold, types=False), gold)) < 1e-5
    off, auto = llamacpp_rank("off"), llamacpp_rank("auto")
    for c, g in zip(off, gold):   # llama-embedding's "query\tdocument": <s> query </s></s> document </s>
        assert c["input_ids"] == g["input_ids"] == tok.encode_within(c["query"], 512, c["document"])[0]
    assert max(abs(a - c["score"]) for a, c in zip(scores(model, off, types=False), off)) < 1.5e-3
    assert max(abs(a - c["score"]) for a, c in zip(scores(model, auto, types=False), auto)) < 3e-3
    monkeypatch.setattr(encoder_module, "gelu", ggml_gelu)
    assert max(abs(a - c["score"]) for a, c in zip(scores(model, off, types=False), off)) < 1.5e-4


def test_positions_past_the_table_are_refused(tiny_encoders: dict[str, Path]) -> None:
    folder, _ = load_encoder_folder(tiny_encoders["tiny-xlmr-reranker"], "")
    gguf = Encoder(*load_gguf_encoder(GGUF)[:3])
    for model in (folder, gguf):
        with pytest.raises(ValueError, match="takes sequences of up to 128 tokens"):
            model.pool(encoder_batch([list(range(5, 134))]))
    ids = list(range(5, 133))   # 128 tokens: the last row of both tables, the same row
    assert abs(float(folder.pool(encoder_batch([ids]))[0][0]) - float(gguf.pool(encoder_batch([ids]))[0][0])) < 1e-5
    assert np.isfinite(float(folder.pool(encoder_batch([ids]))[0][0]))
