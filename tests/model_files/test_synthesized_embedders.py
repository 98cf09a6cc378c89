"""`nvllm models synthesize`'s embedding shapes, on small copies of their shapes: the file reads back as the
embedding model it copies (its task from its pooling_type) and embeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from nvllm.config import load_settings
from nvllm.engine.assembly.factory import build_engine
from nvllm.model_files.synthetic.shapes import SHAPES
from nvllm.model_files.synthetic.writer import synthesize
from nvllm.pooling_params import PoolingParams


def test_a_synthesized_qwen3_embedding_embeds_with_its_last_token(tmp_path: Path) -> None:
    small = dataclasses.replace(SHAPES["qwen3-embedding-0.6b"], name="tiny-qwen3-embedding", hidden=128,
                                intermediate=256, layers=2, heads=4, kv_heads=2, head_dim=32, vocab=1280,
                                specials={1024: "<|endoftext|>", 1025: "<|im_start|>", 1026: "<|im_end|>"},
                                bos=1024, eos=1024, bpe=1024)
    path = synthesize(small, "Q8_0", tmp_path / "e.gguf")
    engine = build_engine(load_settings(overrides={"model": {"path": str(path)}}))
    assert engine.task == "embed"
    engine.add_request("a", "Where is the drone?", PoolingParams())
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert outs[-1].pooled is not None and len(outs[-1].pooled) == 128
    assert abs(float(np.linalg.norm(outs[-1].pooled)) - 1) < 1e-5
