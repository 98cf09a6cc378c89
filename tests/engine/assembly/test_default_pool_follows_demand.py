"""The default pool is no larger than max_num_seqs sequences of max_model_len need, in each KV format,
and every size goes through ModelInfo.kv_bytes_per_token (KVCache.bytes_per_block)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.kv_model import hd64_gguf
from nvllm.config import load_settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import MemoryReading
from nvllm.model.kv_cache import KVCache

PLENTY = MemoryReading(64 << 30, "test")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return hd64_gguf(tmp_path_factory.mktemp("kv"))


@pytest.fixture(scope="module")
def info(model) -> factory.ModelInfo:
    return factory.read_model_info(load_settings(overrides={"model": {"path": str(model)}}))


def settings(model, cache=None, **scheduler):
    return load_settings(overrides={"model": {"path": str(model)}, "scheduler": scheduler, "cache": cache or {}})


@pytest.mark.parametrize("name", list(factory.KV_FORMATS))
@pytest.mark.parametrize("seqs,max_len", [(1, 64), (3, 100), (32, 256)])
def test_the_default_pool_is_what_the_sequences_need(model, info, name, seqs, max_len) -> None:
    fmt = factory.KV_FORMATS[name]
    sz = factory.plan_pool(settings(model, max_num_seqs=seqs, max_model_len=max_len), info, PLENTY, fmt).sizing
    assert sz.num_blocks == seqs * math.ceil(max_len / sz.block_size) and sz.bound == "demand"
    assert sz.bytes_per_block == info.kv_bytes_per_token(fmt) * sz.block_size


def test_under_the_cap_it_never_exceeds_the_demand(model, info) -> None:
    for name, fmt in factory.KV_FORMATS.items():
        for reading in (PLENTY, MemoryReading(1200 << 20, "small")):
            sz = factory.plan_pool(settings(model), info, reading, fmt).sizing
            assert sz.num_blocks <= sz.demand_blocks, name
            assert sz.pool_bytes <= sz.max_pool_bytes


def test_bytes_per_token_per_format(info) -> None:
    values = info.num_layers * 2 * info.num_kv_heads * info.head_dim
    got = {name: info.kv_bytes_per_token(fmt) for name, fmt in factory.KV_FORMATS.items()}
    assert got == {"f32": 4 * values, "f16": 2 * values, "bf16": 2 * values, "q8_0": values // 32 * 34}
    # Without a format, the model's (cache.dtype auto: f16 for a GGUF).
    assert info.kv_format.name == "f16" and info.bytes_per_token == got["f16"] == KVCache.bytes_per_block(
        info.num_layers, 1, info.num_kv_heads, info.head_dim, info.kv_format)


def test_num_blocks_and_max_pool_mb_still_decide(model, info) -> None:
    for fmt in factory.KV_FORMATS.values():
        assert factory.plan_pool(settings(model, {"num_blocks": 40}), info, PLENTY, fmt).sizing.num_blocks == 40
        sz = factory.plan_pool(settings(model, {"max_pool_mb": 1}, max_model_len=32, max_num_seqs=4096),
                               info, PLENTY, fmt).sizing
        assert sz.pool_bytes <= 1 << 20 and sz.bound == "cap"


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0"])
def test_the_engine_allocates_the_planned_bytes(model, dtype) -> None:
    """plan_pool's bytes per block are the bytes the engine's pool takes, in the format cache.dtype gives."""
    s = settings(model, {"dtype": dtype}, max_num_seqs=2, max_model_len=64)
    loaded = factory.load_model(s)
    plan = factory.plan_pool(s, loaded.info, PLENTY)
    engine = factory.create_engine(s, loaded, plan)
    assert engine.kv_cache.format.name == dtype and engine.kv_cache.nbytes == plan.sizing.pool_bytes


def test_serve_s_max_num_seqs_flag_sizes_the_default_pool():
    from nvllm import cli
    from nvllm.cli.serve import settings_from_args

    args = cli.build_parser().parse_args(["serve", "--max-num-seqs", "4"])
    assert settings_from_args(args).scheduler.max_num_seqs == 4
    assert settings_from_args(cli.build_parser().parse_args(["serve"])).scheduler.max_num_seqs == 4
