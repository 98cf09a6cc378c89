"""A step's activations live in arrays made once (model/workspace.py): a prefill chunk allocates nothing of
its size through NumPy beyond the embedding lookup and the logits, each step works in the same memory,
and the engine reserves its token budget's worth when it is built and says how much."""

from __future__ import annotations

import logging
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.kernels import matmul, ops

needs_kernels = pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")


def test_views_are_taken_from_the_same_arrays_and_grow_only_when_asked(tiny_models: dict[str, Path]) -> None:
    model = Model.from_dir(tiny_models["tiny-qwen2"])
    ws, c = model.workspace, model.config
    ws.reserve(64)
    nbytes = ws.nbytes
    qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
    wide, narrow = max(qkv, c.hidden_size, 2 * c.intermediate_size), max(c.hidden_size, c.num_heads * c.head_dim,
                                                                           c.intermediate_size)
    assert nbytes == ws.bytes_for(64) == 4 * 64 * (c.hidden_size + wide + narrow)
    a, b = ws.take(10), ws.take(64)
    assert a.gate_up.shape == (10, 2 * c.intermediate_size) and a.attn.shape == (10, c.num_heads, c.head_dim)
    assert np.shares_memory(a.x, b.x) and np.shares_memory(a.act, b.act)
    for v in (a.x, a.h, a.qkv, a.attn, a.out, a.gate_up, a.act):
        assert v.flags.c_contiguous and v.shape[0] == 10
    # an op's input and output never share a buffer: norm -> qkv -> attention -> o, norm -> gate_up -> act -> down
    for src, dst in ((a.h, a.qkv), (a.qkv, a.attn), (a.attn, a.out), (a.gate_up, a.act), (a.act, a.out)):
        assert not np.shares_memory(src, dst)
    assert not any(np.shares_memory(a.x, v) for v in (a.h, a.qkv, a.attn, a.out, a.gate_up, a.act))
    ws.reserve(8)
    assert ws.nbytes == nbytes                 # never less than is held
    assert ws.take(65).x.shape[0] == 65 and ws.rows == 65


@needs_kernels
def test_a_prefill_chunk_allocates_little_beyond_its_workspace(smollm2_gguf: Path) -> None:
    """Through NumPy a 256-token chunk of SmolLM2 allocates its embedding rows, the step's small tables
    (rope, metadata) and the logits asked for, not its layers' activations: gate_up alone is 3 MiB."""
    from nvllm.model.weights.gguf_file import read_gguf
    from nvllm.model.weights.gguf_weights import load_gguf_weights

    g = read_gguf(smollm2_gguf)
    model = Model(g.config, load_gguf_weights(g))
    c, T, bs = model.config, 256, 16
    ids = np.random.default_rng(0).integers(0, c.vocab_size, T)
    pos = np.arange(T)
    batch = ForwardBatch.build(ids, pos, pos, np.array([T]), np.array([T]), np.arange(T // bs, dtype=np.int32)[None],
                               np.array([T - 1]))
    cache = model.make_kv_cache(T // bs, bs)
    model.forward(batch, cache)                # the workspace made, the kernels' jobs set up
    tracemalloc.start()
    try:
        model.forward(batch, cache)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    gate_up = 4 * T * 2 * c.intermediate_size
    assert peak < gate_up / 2, (peak, gate_up)


def test_the_engine_reserves_its_budget_and_says_so(tiny: Path, caplog: pytest.LogCaptureFixture) -> None:
    from nvllm.config import load_settings
    from nvllm.engine.assembly import factory
    from nvllm.engine.assembly.memory import MemoryReading

    settings = load_settings(overrides={"model": {"path": str(tiny)}, "cache": {"num_blocks": 32},
                                        "scheduler": {"max_num_batched_tokens": 96}})
    loaded = factory.load_model(settings)
    with caplog.at_level(logging.INFO):
        plan = factory.plan_pool(settings, loaded.info, MemoryReading(1 << 30, "test"))
        factory.create_engine(settings, loaded, plan)
    assert isinstance(loaded.model, Model) and loaded.model.workspace.rows == 96
    assert any("forward scratch of" in r.getMessage() and "up to 96 tokens" in r.getMessage() for r in caplog.records)
