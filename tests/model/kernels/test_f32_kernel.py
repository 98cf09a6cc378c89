"""The plain float products (F32 weights and a folder's float32 arrays through the tile of csrc/matmul.c,
kernels.matmul.float_matmul and matrix/dense.py; F16 and BF16, which quant_matmul packs first, through the
float panels of csrc/dot_float.h, held bit for bit to kernels/fdot.py in test_packed.py), held to the NumPy
twin QuantizedWeight.matmul in every float variant this machine runs (the variants choose F32's tile), for
1 .. 64 rows of x (a decode step) and more (prefill), odd sizes, any thread count.

Tolerance as in test_matmul_kernels.py: |y - y_twin| <= 1e-5 * (|x| @ |W|.T); the order of the sums is
fixed, so rows of x and thread counts never change a bit within one variant.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from nvllm.model.kernels import matmul as mk
from nvllm.model.kernels import threads
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import DECODE_ROWS as SMALL_T
from nvllm.model.quant.formats import FORMATS

SMALL_T_MIN = 2   # fewest rows of x the tile takes: one row goes to BLAS's sgemv

# Also run under emulated aarch64 (deploy/aarch64-check.sh), where the variants are portable and neon.
pytestmark = pytest.mark.aarch64

FORMAT = {f.name: f for f in FORMATS.values()}
RTOL = 1e-5
PLAIN = ("F32", "F16", "BF16")
VARIANTS = mk.float_variants()

needs_lib = pytest.mark.skipif(mk.lib is None, reason="the C matmul was not built (no C compiler at install)")


def rng_for(*what: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(what).encode()))


def plain_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> QuantizedWeight:
    w = rng.standard_normal((rows, n_in)).astype(np.float32)
    if name == "F16":
        raw = w.astype(np.float16).view(np.uint8)
    elif name == "BF16":
        raw = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        raw = w.view(np.uint8)
    return QuantizedWeight(FORMAT[name], np.ascontiguousarray(raw), (rows, n_in))


def assert_close_to_twin(w: QuantizedWeight, x: np.ndarray, y: np.ndarray) -> None:
    want = w.matmul(x)
    bound = RTOL * (np.abs(x) @ np.abs(w.dequantize()).T) + 1e-30
    err = np.abs(y.astype(np.float64) - want)
    assert y.shape == want.shape and y.dtype == np.float32
    assert np.all(err <= bound), f"{w.fmt.name} {w.shape} T={len(x)}: worst {float(np.max(err / bound)) * RTOL:.2e}"


@pytest.fixture(params=VARIANTS or ["none"])
def variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each variant this machine runs, set for the test and the best one put back after."""
    if mk.lib is None:
        pytest.skip("the C matmul was not built (no C compiler at install)")
    before = mk.float_variant()
    mk.set_float_variant(request.param)
    try:
        yield request.param
    finally:
        mk.set_float_variant(before)


@pytest.mark.parametrize("name", PLAIN)
def test_every_batch_size_up_to_64_and_past_it_matches_the_twin(variant: str, name: str) -> None:
    # 13 rows: three tiles of 4 and one row; 77 values: vectors of 16 (and of 4) and a ragged tail
    rng = rng_for("sizes", name)
    w = plain_weight(name, 13, 77, rng)
    x = rng.standard_normal((150, 77)).astype(np.float32)
    for T in list(range(1, 66)) + [127, 128, 129, 150]:
        assert_close_to_twin(w, x[:T], mk.quant_matmul(w, x[:T], threads=2))


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("shape", [(1, 1), (3, 16), (5, 641), (9, 1300), (70, 40)])
def test_odd_shapes_and_rows_longer_than_a_chunk(variant: str, name: str, shape: tuple[int, int]) -> None:
    rng = rng_for("shapes", name, shape)
    w = plain_weight(name, *shape, rng)
    for T in (1, 2, 6, 7, 33, 64, 70):
        x = rng.standard_normal((T, shape[1])).astype(np.float32)
        assert_close_to_twin(w, x, mk.quant_matmul(w, x, threads=3))


@pytest.mark.parametrize("name", PLAIN)
def test_one_hot_rows_give_the_weights_bitwise(variant: str, name: str) -> None:
    rng = rng_for("eye", name)
    w = plain_weight(name, 11, 50, rng)
    np.testing.assert_array_equal(mk.quant_matmul(w, np.eye(50, dtype=np.float32), threads=2).T, w.dequantize())


@pytest.mark.parametrize("name", PLAIN)
def test_threads_and_the_other_rows_of_x_change_no_bit(variant: str, name: str) -> None:
    rng = rng_for("bits", name)
    w = plain_weight(name, 37, 300, rng)
    x = rng.standard_normal((140, 300)).astype(np.float32)
    y = mk.quant_matmul(w, x, threads=1)
    for n in (2, 3, 4, 7, 9, 64):
        np.testing.assert_array_equal(mk.quant_matmul(w, x, threads=n), y)
    for T in range(1, 66):   # any batch of up to 64 rows, and past it: row t gets the same bits
        np.testing.assert_array_equal(mk.quant_matmul(w, x[:T], threads=2), y[:T])
    for t in (0, 5, 63, 64, 139):
        np.testing.assert_array_equal(mk.quant_matmul(w, x[t:t + 1], threads=2)[0], y[t])
    np.testing.assert_array_equal(mk.quant_matmul(w, x[7:101], threads=2), y[7:101])


def test_every_variant_is_reachable_and_a_missing_one_is_refused(variant: str) -> None:
    assert mk.float_variant() == variant and variant in mk.describe()
    assert "portable" in VARIANTS
    for absent in set(mk.FLOAT_VARIANTS) - set(VARIANTS):
        with pytest.raises(ValueError, match=rf"^variant: '{absent}' does not run here"):
            mk.set_float_variant(absent)
    with pytest.raises(ValueError, match="^variant:"):
        mk.set_float_variant("sse9")
    assert mk.float_variant() == variant


def test_the_best_variant_is_the_default() -> None:
    if mk.lib is None:
        pytest.skip("the C matmul was not built")
    best = [v for v in ("avx512", "avx2", "neon") if v in VARIANTS]
    assert mk.float_variant() == (best[0] if best else "portable")


def test_nan_and_inf_stay_in_their_row(variant: str) -> None:
    rng = rng_for("nan")
    w = plain_weight("F32", 9, 40, rng)
    x = rng.standard_normal((4, 40)).astype(np.float32)
    x[1, 3], x[2, 39] = np.nan, np.inf
    y = mk.quant_matmul(w, x, threads=2)
    assert np.isfinite(y[[0, 3]]).all() and np.isnan(y[1]).all() and not np.isfinite(y[2]).any()


# ---------------------------------------------------------------- float_matmul and DenseWeight

@needs_lib
def test_float_matmul_reads_the_array_in_place_as_an_f32_weight() -> None:
    rng = rng_for("array")
    w = rng.standard_normal((21, 99)).astype(np.float32)
    x = rng.standard_normal((10, 99)).astype(np.float32)
    as_blocks = QuantizedWeight(FORMAT["F32"], w.view(np.uint8), w.shape)
    np.testing.assert_array_equal(mk.float_matmul(w, x, threads=2), mk.quant_matmul(as_blocks, x, threads=1))
    out = np.empty((10, 21), np.float32)
    assert mk.float_matmul(w, x, threads=2, out=out) is out


@pytest.mark.parametrize("w, message", [
    (np.zeros((4, 8), np.float64), "need a float32"),
    (np.zeros(8, np.float32), "need a float32"),
    (np.zeros((8, 4), np.float32).T, "C-contiguous"),
    ([[0.0] * 8] * 4, "need a float32"),
])
def test_float_matmul_refuses_what_it_cannot_read_in_place(w: object, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^w: .*{message}"):
        mk.float_matmul(w, np.zeros((1, 8), np.float32), threads=1)  # type: ignore[arg-type]


@pytest.fixture(params=["c-matmul", "numpy-matmul"])
def matmul_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a DenseWeight multiplies: the C tile, and the NumPy twin where the library is absent."""
    if request.param == "numpy-matmul":
        monkeypatch.setattr(mk, "lib", None)
    elif mk.lib is None:
        pytest.skip("the C matmul was not built")
    return request.param


def folder_weight(n_in: int, n_out: int, rng: np.random.Generator) -> DenseWeight:
    """A float32 weight as the loader lays one out: a DenseWeight of a C-contiguous [out, in]."""
    return DenseWeight(np.ascontiguousarray(rng.standard_normal((n_out, n_in)).astype(np.float32)))


@pytest.mark.parametrize("T", [SMALL_T_MIN, 3, 17, SMALL_T])
def test_a_dense_weight_sends_a_few_rows_to_the_tile_bit_for_bit(T: int, matmul_path: str) -> None:
    rng = rng_for("linear", T)
    w = folder_weight(96, 40, rng)
    x = rng.standard_normal((T, 96)).astype(np.float32)
    y = w.apply(x)
    assert y.shape == (T, 40) and y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable
    np.testing.assert_array_equal(y, mk.float_matmul(w.array, x, threads=1))   # the twin where lib is None
    np.testing.assert_allclose(y, x @ w.array.T, rtol=1e-4, atol=1e-4)
    if mk.lib is not None:
        for t in range(T - SMALL_T_MIN + 1):   # a decode row gets the same bits in any batch of the range
            np.testing.assert_array_equal(w.apply(x[t:t + SMALL_T_MIN]), y[t:t + SMALL_T_MIN])


def test_a_dense_weight_sends_prefill_and_other_layouts_to_blas(matmul_path: str) -> None:
    rng = rng_for("prefill")
    w = folder_weight(48, 24, rng)
    x = rng.standard_normal((SMALL_T + 1, 48)).astype(np.float32)
    np.testing.assert_array_equal(w.apply(x), x @ w.array.T)
    np.testing.assert_array_equal(w.apply(x[:SMALL_T_MIN - 1]), x[:SMALL_T_MIN - 1] @ w.array.T)   # one row: sgemv
    f_order = DenseWeight(np.asfortranarray(w.array))   # not C-contiguous: BLAS as before
    np.testing.assert_array_equal(f_order.apply(x[:3]), x[:3] @ f_order.array.T)
    as_blocks = QuantizedWeight(FORMAT["F32"], w.array.view(np.uint8), (24, 48))
    np.testing.assert_array_equal(as_blocks.apply(x), x @ w.array.T)


def test_a_dense_weight_uses_the_thread_count_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = rng_for("threads")
    w = folder_weight(200, 33, rng)
    x = rng.standard_normal((5, 200)).astype(np.float32)   # in the tile's range
    monkeypatch.setattr(threads, "count", 1)
    one = w.apply(x)
    monkeypatch.setattr(threads, "count", 3)
    np.testing.assert_array_equal(w.apply(x), one)


@needs_lib
@pytest.mark.skipif(not {"avx2", "avx512"} <= set(VARIANTS), reason="needs a CPU with both avx2 and avx512")
def test_avx2_and_avx512_sum_in_the_same_order() -> None:
    # both fuse each multiply-add into the same 16 lanes: one of 16 floats, the other two of 8
    rng = rng_for("same order")
    w = plain_weight("F32", 19, 333, rng)
    x = rng.standard_normal((23, 333)).astype(np.float32)
    before = mk.float_variant()
    try:
        got = {}
        for v in ("avx2", "avx512"):
            mk.set_float_variant(v)
            got[v] = mk.quant_matmul(w, x, threads=2)
    finally:
        mk.set_float_variant(before)
    np.testing.assert_array_equal(got["avx2"], got["avx512"])
