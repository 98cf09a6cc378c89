"""The default pool is no larger than max_num_seqs sequences of max_model_len need, in each KV format,
and every size goes through factory.kv_bytes_per_block."""

from __future__ import annotations

import math

import pytest

from nvllm.config import load_settings
from nvllm.engine import factory
from nvllm.engine.memory import MemoryReading
from nvllm.model.kv_cache import KVCache

PLENTY = MemoryReading(64 << 30, "test")


@pytest.fixture(scope="module")
def info(tiny_models) -> factory.ModelInfo:
    return factory.read_model_info(load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"])}}))


def settings(tiny_models, **scheduler):
    return load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"])}, "scheduler": scheduler})


@pytest.mark.parametrize("fmt", list(factory.KV_FORMAT_BYTES))
@pytest.mark.parametrize("seqs,max_len", [(1, 64), (3, 100), (32, 256)])
def test_the_default_pool_is_what_the_sequences_need(tiny_models, info, fmt, seqs, max_len) -> None:
    plan = factory.plan_pool(settings(tiny_models, max_num_seqs=seqs, max_model_len=max_len), info, PLENTY,
                             factory.KV_FORMAT_BYTES[fmt])
    sz = plan.sizing
    assert sz.num_blocks == seqs * math.ceil(max_len / sz.block_size) and sz.bound == "demand"
    assert sz.bytes_per_block == factory.kv_bytes_per_block(info, sz.block_size, factory.KV_FORMAT_BYTES[fmt])


def test_under_the_cap_it_never_exceeds_the_demand(tiny_models, info) -> None:
    for fmt, per_value in factory.KV_FORMAT_BYTES.items():
        for reading in (PLENTY, MemoryReading(1200 << 20, "small")):
            sz = factory.plan_pool(settings(tiny_models), info, reading, per_value).sizing
            assert sz.num_blocks <= sz.demand_blocks, fmt
            assert sz.pool_bytes <= sz.max_pool_bytes


def test_bytes_per_block_per_format(info) -> None:
    values = KVCache.bytes_per_block(info.num_layers, 16, info.num_kv_heads, info.head_dim, itemsize=1)
    got = {f: factory.kv_bytes_per_block(info, 16, b) for f, b in factory.KV_FORMAT_BYTES.items()}
    assert got == {"f32": 4 * values, "f16": 2 * values, "bf16": 2 * values, "q8_0": values // 32 * 34}
    # The pool the engine allocates is the f32 row's.
    assert info.bytes_per_token * 16 == got["f32"] == KVCache.bytes_per_block(
        info.num_layers, 16, info.num_kv_heads, info.head_dim)


def test_num_blocks_and_max_pool_mb_still_decide(tiny_models, info) -> None:
    s = load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"])}, "cache": {"num_blocks": 40}})
    for per_value in factory.KV_FORMAT_BYTES.values():
        assert factory.plan_pool(s, info, PLENTY, per_value).sizing.num_blocks == 40
    s = load_settings(overrides={"model": {"path": str(tiny_models["tiny-llama"])}, "cache": {"max_pool_mb": 1},
                                 "scheduler": {"max_model_len": 32}})
    for per_value in factory.KV_FORMAT_BYTES.values():
        sz = factory.plan_pool(s, info, PLENTY, per_value).sizing
        assert sz.pool_bytes <= 1 << 20 and (sz.bound == "cap" or sz.num_blocks == sz.demand_blocks)


def test_the_engine_allocates_the_planned_bytes(tiny_models) -> None:
    """plan_pool's bytes per block (the f32 row today) are the bytes the engine's pool takes: a KV format
    must reach both, or this fails."""
    s = settings(tiny_models, max_num_seqs=2, max_model_len=64)
    loaded = factory.load_model(s)
    plan = factory.plan_pool(s, loaded.info, PLENTY)
    engine = factory.create_engine(s, loaded, plan)
    assert engine.kv_cache.nbytes == plan.sizing.pool_bytes
