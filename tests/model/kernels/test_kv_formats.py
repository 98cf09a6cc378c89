"""The KV pool's formats (cache.dtype: f32, f16, bf16, q8_0; model/quant/kv_format.py): the C write
(csrc/ops.c's rope_write_kv) stores the bits of its NumPy twin, special values included; C paged decode
attention reads each format as the NumPy path does; a prefill chunk reads its own new keys as the pool
holds them, so chunking does not change what attention sees; and the pool's bytes follow the format."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kernel_cases import needs_kernels, numpy_path, random_decode_case
from nvllm.model.attention import _decode, write_kv
from nvllm.model.kernels import ops as kernels
from nvllm.model.kv_cache import KVCache
from nvllm.model.quant import kv_format
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS

pytestmark = pytest.mark.aarch64   # the C read and write build for NEON too (deploy/aarch64-check.sh)

NAMES = kv_format.NAMES


def _special_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ordinary values with, among them, every case a conversion can get wrong: f16's rounding ties
    and its subnormals, overflow to inf, zeros of both signs, inf, a quiet NaN, and blocks of zeros."""
    x = rng.standard_normal(n).astype(np.float32) * 3
    odd = np.array([65504, 65519.99, 65520, 70000, -65520, 1e-8, -3e-7, 6.1e-5, 2.0**-24, 2.0**-25,
                    1 + 2.0**-11, 1 + 3 * 2.0**-11, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.4e38,
                    -1.0000001], np.float32)
    x[:odd.size] = odd
    x[64:96] = 0                                           # a whole q8_0 block of zeros
    x[96:128] = 1e-44                                      # one whose 1/d overflows
    return x


def _pool(fmt: kv_format.KVFormat, nb: int, bs: int, nkv: int, hd: int) -> np.ndarray:
    return KVCache(1, nb, bs, nkv, hd, fmt).pool[0]


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
def test_the_c_write_stores_the_bits_of_its_numpy_twin(name):
    fmt = kv_format.by_name(name)
    nh, nkv, hd, T = 4, 2, 64, 6
    rng = np.random.default_rng(7)
    qkv = np.zeros((T, (nh + 2 * nkv) * hd), np.float32)
    qkv[:, nh * hd:] = _special_values(rng, T * 2 * nkv * hd).reshape(T, 2 * nkv * hd)
    cos, sin = np.ones((T, hd // 2), np.float32), np.zeros((T, hd // 2), np.float32)   # rope is the identity
    slots = np.array([3, 17, 0, 40, 22, 9])
    ours, ref = _pool(fmt, 6, 8, nkv, hd), _pool(fmt, 6, 8, nkv, hd)
    with np.errstate(all="ignore"):
        rotated = qkv.copy()   # (inf * sin 0 is NaN: the twin stores the keys the C rope made)
        kernels.RopeWriteKV(cos, sin, slots, nh, nkv, hd, 1.0)(rotated, ours)
        k = rotated[:, nh * hd:(nh + nkv) * hd].reshape(T, nkv, hd)
        v = qkv[:, (nh + nkv) * hd:].reshape(T, nkv, hd)
        write_kv(ref[0], ref[1], k, v, slots)
    a, b = fmt.decode(ours), fmt.decode(ref)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    # every element (a q8_0 block, a value) that holds no NaN: the same bytes (NaN payloads may differ)
    clean = ~np.isnan(a).reshape(ours.shape + (fmt.per_element,)).any(axis=-1)
    assert clean.mean() > 0.9
    assert ours[clean].tobytes() == ref[clean].tobytes()


@pytest.mark.parametrize("name", NAMES)
def test_encode_then_decode_is_within_the_format_s_precision(name):
    fmt = kv_format.by_name(name)
    x = np.random.default_rng(1).standard_normal((5, 3, 64)).astype(np.float32)
    y = fmt.round_trip(x)
    assert y.shape == x.shape and y.dtype == np.float32
    err = float(np.abs(y - x).max() / np.abs(x).max())
    assert err <= {"f32": 0, "f16": 1e-3, "bf16": 8e-3, "q8_0": 1e-2}[name]
    assert name == "f32" or err > 0   # rounded, not passed through
    if name != "f32":   # the twin is the GGUF format applied to each head: gguf's own reading agrees
        raw = fmt.encode(x).reshape(-1).view(np.uint8)
        np.testing.assert_array_equal(dequantize(fmt.block, raw, x.shape), y)


@needs_kernels
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("S,nh,nkv,hd,bs", [(9, 9, 3, 64, 16), (3, 4, 4, 32, 4), (4, 14, 2, 128, 1)])
def test_decode_attention_reads_each_format_as_numpy_does(name, S, nh, nkv, hd, bs, monkeypatch):
    fmt = kv_format.by_name(name)
    rng = np.random.default_rng(S + hd)
    q, f32_pool, meta = random_decode_case(rng, S, nh, nkv, hd, bs)
    pool = fmt.encode(f32_pool)
    ours = np.full_like(q, np.nan)
    _decode(q, pool, meta, ours)
    kernels.PagedDecode(meta.block_tables, meta.context_lens)(q, pool, split := np.full_like(q, np.nan), 3,
                                                              _team_run())
    np.testing.assert_array_equal(split, ours)   # split over threads: the same bits
    numpy_path(monkeypatch)
    ref = np.full_like(q, np.nan)
    _decode(q, pool, meta, ref)
    np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=1e-4)
    exact = np.full_like(q, np.nan)
    _decode(q, fmt.round_trip(f32_pool), meta, exact)   # the f32 path on the values the format holds
    np.testing.assert_allclose(ref, exact, atol=1e-6, rtol=1e-5)


def _team_run():
    from nvllm.model.kernels import matmul as mk

    if mk.lib is None:
        pytest.skip("the C matmul library (its thread team) was not built")
    return mk.team_run


@pytest.mark.parametrize("name", NAMES)
def test_the_pool_s_bytes_follow_the_format(name):
    fmt = kv_format.by_name(name)
    cache = KVCache(3, 5, 16, 2, 64, fmt)
    per_block = KVCache.bytes_per_block(3, 16, 2, 64, fmt)
    assert cache.nbytes == 5 * per_block
    assert per_block == 3 * 2 * 16 * 2 * {"f32": 256, "f16": 128, "bf16": 128, "q8_0": 68}[name]
    assert kv_format.of_pool(cache.pool) is fmt and fmt.block in FORMATS.values()


def test_q8_0_refuses_a_head_size_its_blocks_do_not_divide():
    with pytest.raises(ValueError, match=r"cache.dtype='q8_0' .* head size 24"):
        KVCache(1, 4, 16, 2, 24, kv_format.by_name("q8_0"))
    KVCache(1, 4, 16, 2, 24, kv_format.by_name("f16"))   # the float formats take any


@needs_kernels
def test_the_kernels_refuse_a_pool_of_another_element_type():
    pool = np.zeros((2, 4, 16, 2, 64), np.float64)
    with pytest.raises(ValueError, match="kv_pool: need elements of float32, float16"):
        kernels.check_pool(pool, written=False)
