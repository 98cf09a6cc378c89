"""The C matmul by weights kept in their GGUF format (model/kernels/matmul.py, kernels/csrc/matmul.c), held to
its NumPy twin QuantizedWeight.matmul.

Tolerance: the kernel decodes every weight bitwise as quant/dequantize.py does (checked exactly through one-hot
rows of x) and sums in float32 in its own order, so each output may differ from the twin's by float32
rounding of a sum: |y - y_twin| <= RTOL * (|x| @ |W|.T), RTOL = 1e-5 (the measured worst is ~3e-7 for
rows of 1280 values; a wrong scale, nibble or bit is off by O(1) of that bound).
"""
from __future__ import annotations

import zlib

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.gguf_util import random_blocks
from nvllm.model.kernels import matmul as mk
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.quant.formats import FORMATS

# Also run under emulated aarch64 (deploy/aarch64-check.sh), where gcc builds the kernels for NEON.
pytestmark = pytest.mark.aarch64

FORMAT = {f.name: f for f in FORMATS.values()}
RTOL = 1e-5
T_SIZES = [1, 3, 16, 64, 200]
# (rows, blocks per row): rows not a multiple of the kernel's tile of 4; one block; many blocks, past
# the kernel's chunk of 1024 values for every format
LAYOUTS = [(1, 1), (5, 1), (37, 5), (6, 40)]

needs_lib = pytest.mark.skipif(mk.lib is None, reason="the C matmul was not built (no C compiler at install)")


@pytest.fixture(autouse=True)
def float_path_for_the_int8_formats():
    """These tests hold the weights' decoding to quant/dequantize.py: Q8_0, Q4_0 and Q4_1 take the float path here,
    not the integer dot products on x quantized to 8 bits (held to their own twin in test_qdot.py)."""
    if mk.lib is None:
        yield
        return
    was = mk.int_variant()
    mk.set_int_variant("float")
    yield
    mk.set_int_variant(was)


def rng_for(*what: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(what).encode()))


def in_features(name: str, blocks: int) -> int:
    """Values per row: whole blocks; the float types get 29 values a 'block' and a few more, so rows end in
    a ragged tail of the kernel's vectors of 8."""
    fmt = FORMAT[name]
    return blocks * fmt.block_elems if fmt.block_elems > 1 else blocks * 29 + blocks % 3


def random_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> QuantizedWeight:
    """Random raw blocks with finite scales (plain floats: normal values)."""
    fmt = FORMAT[name]
    if name == "F32":
        raw = rng.standard_normal((rows, n_in)).astype(np.float32).view(np.uint8)
    elif name == "F16":
        raw = rng.standard_normal((rows, n_in)).astype(np.float16).view(np.uint8)
    elif name == "BF16":
        top = rng.standard_normal((rows, n_in)).astype(np.float32).view(np.uint32) >> 16   # bfloat16 bits
        raw = top.astype(np.uint16).view(np.uint8)
    else:
        raw = random_blocks(rng, GT[name], (rows, n_in))
    return QuantizedWeight(fmt, np.ascontiguousarray(raw), (rows, n_in))


def quantized_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> QuantizedWeight:
    """Normal weights quantized by gguf.quants, as a converter writes them."""
    data = (rng.standard_normal((rows, n_in)) * 0.05).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(data, GT[name])).view(np.uint8).reshape(rows, -1)
    return QuantizedWeight(FORMAT[name], raw, (rows, n_in))


def assert_close_to_twin(w: QuantizedWeight, x: np.ndarray, y: np.ndarray) -> None:
    want = w.matmul(x)
    bound = RTOL * (np.abs(x) @ np.abs(w.dequantize()).T) + 1e-30
    err = np.abs(y.astype(np.float64) - want)
    assert y.shape == want.shape and y.dtype == np.float32
    worst = float(np.max(err / bound)) * RTOL
    assert np.all(err <= bound), f"{w.fmt.name} {w.shape}: worst error {worst:.2e} of |x||W|"


@needs_lib
@pytest.mark.parametrize("name", mk.FORMATS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_format_matches_its_numpy_twin_for_every_batch_size(name: str, layout: tuple) -> None:
    rows, blocks = layout
    rng = rng_for(name, layout)
    w = random_weight(name, rows, in_features(name, blocks), rng)
    for T in T_SIZES:
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        assert_close_to_twin(w, x, mk.quant_matmul(w, x, threads=1))


@needs_lib
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "F16", "BF16"])
def test_data_quantized_by_gguf_matches_its_numpy_twin(name: str) -> None:
    rng = rng_for("gguf", name)
    w = quantized_weight(name, 45, 320, rng)
    for T in T_SIZES:
        x = rng.standard_normal((T, 320)).astype(np.float32)
        assert_close_to_twin(w, x, mk.quant_matmul(w, x, threads=2))


@needs_lib
@pytest.mark.parametrize("name", mk.FORMATS)
def test_one_hot_rows_give_the_dequantized_weights_bitwise(name: str) -> None:
    # x = I makes each output one product w * 1 plus zeros: the kernel's decoding, exposed exactly
    rng = rng_for("eye", name)
    w = random_weight(name, 9, in_features(name, 2), rng)
    x = np.eye(w.shape[1], dtype=np.float32)
    np.testing.assert_array_equal(mk.quant_matmul(w, x, threads=2).T, w.dequantize())


@needs_lib
@pytest.mark.parametrize("name", mk.FORMATS)
def test_threads_and_batch_neighbours_do_not_change_a_bit(name: str) -> None:
    rng = rng_for("threads", name)
    w = random_weight(name, 67, in_features(name, 5), rng)
    x = rng.standard_normal((70, w.shape[1])).astype(np.float32)
    y1 = mk.quant_matmul(w, x, threads=1)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(mk.quant_matmul(w, x, threads=threads), y1)
    for t in (0, 33, 69):   # a row alone gets the bits it gets in the batch (the engine's exactness)
        np.testing.assert_array_equal(mk.quant_matmul(w, x[t:t + 1], threads=2)[0], y1[t])
    np.testing.assert_array_equal(mk.quant_matmul(w, x[5:22], threads=1), y1[5:22])


@needs_lib
def test_strided_rows_of_x_and_a_given_out() -> None:
    rng = rng_for("strided")
    w = random_weight("Q4_K", 10, 512, rng)
    wide = rng.standard_normal((6, 700)).astype(np.float32)
    x = wide[:, 100:612]                               # rows 700 floats apart
    out = np.full((6, 10), np.nan, np.float32)
    got = mk.quant_matmul(w, x, threads=2, out=out)
    assert got is out
    np.testing.assert_array_equal(out, mk.quant_matmul(w, np.ascontiguousarray(x), threads=1))


@needs_lib
def test_nan_and_inf_in_x_stay_in_their_row() -> None:
    rng = rng_for("nan")
    w = random_weight("Q8_0", 8, 64, rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    y = mk.quant_matmul(w, x, threads=2)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and not np.isfinite(y[2]).any()


def test_empty_batches_and_rows() -> None:
    rng = rng_for("empty")
    w = random_weight("Q6_K", 4, 256, rng)
    assert mk.quant_matmul(w, np.zeros((0, 256), np.float32), threads=2).shape == (0, 4)
    none = QuantizedWeight(FORMAT["Q8_0"], np.zeros((0, 34), np.uint8), (0, 32))
    assert mk.quant_matmul(none, np.ones((3, 32), np.float32), threads=1).shape == (3, 0)


@pytest.mark.parametrize("name, without", [("Q4_K", "library"), ("Q5_0", "format")])
def test_numpy_twin_stands_in_without_the_library_and_for_formats_without_a_kernel(
        name: str, without: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = rng_for("fallback", name)
    w = random_weight(name, 7, 256, rng)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    if without == "library":
        monkeypatch.setattr(mk, "lib", None)
    else:   # every format nvllm reads has a kernel now: take one away
        monkeypatch.setattr(mk, "FORMATS", tuple(f for f in mk.FORMATS if f != name))
    out = np.empty((3, 7), np.float32)
    assert mk.quant_matmul(w, x, threads=2, out=out) is out
    np.testing.assert_array_equal(out, w.matmul(x))
    assert "NumPy" in mk.describe()


def test_describe_names_the_path() -> None:
    assert ("C matmul" in mk.describe()) == (mk.lib is not None)


def _weight() -> QuantizedWeight:
    return random_weight("Q4_0", 6, 64, rng_for("bad"))


@pytest.mark.parametrize("x, field", [
    (np.zeros((2, 64), np.float64), "x"),                    # dtype
    (np.zeros((2, 63), np.float32), "x"),                    # width
    (np.zeros(64, np.float32), "x"),                         # rank
    (np.zeros((64, 2), np.float32).T, "x"),                  # values not contiguous
    (np.zeros((4, 64), np.float32)[::-2], "x"),              # negative row stride
    ([[0.0] * 64], "x"),                                     # not an array
])
def test_bad_x_is_refused_naming_it(x: object, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        mk.quant_matmul(_weight(), x, threads=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [0, -1, 65, True, 1.5, "2", None])
def test_bad_thread_counts_are_refused(threads: object) -> None:
    with pytest.raises(ValueError, match=r"^threads:"):
        mk.quant_matmul(_weight(), np.zeros((1, 64), np.float32), threads=threads)  # type: ignore[arg-type]


def test_bad_out_is_refused_naming_it() -> None:
    w, x = _weight(), np.zeros((2, 64), np.float32)
    read_only = np.zeros((2, 6), np.float32)
    read_only.flags.writeable = False
    for out in (np.zeros((2, 5), np.float32), np.zeros((2, 6), np.float64), np.zeros((6, 2), np.float32).T,
                read_only, [[0.0] * 6] * 2):
        with pytest.raises(ValueError, match=r"^out:"):
            mk.quant_matmul(w, x, threads=1, out=out)  # type: ignore[arg-type]
    shared = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match=r"^out: overlaps x"):
        mk.quant_matmul(w, shared, threads=1, out=shared.reshape(-1)[:12].reshape(2, 6))


def test_bad_weights_are_refused_naming_them() -> None:
    x = np.zeros((1, 64), np.float32)
    with pytest.raises(ValueError, match=r"^w: need a BlockMatrix"):
        mk.quant_matmul(np.zeros((6, 64), np.float32), x, threads=1)  # type: ignore[arg-type]
    w = _weight()
    mk.quant_matmul(w, x, threads=1)                           # checked once, then kept on it...
    w.blocks = np.zeros((6, 37), np.uint8)                     # ...until replaced: rows of the wrong length
    with pytest.raises(ValueError, match=r"^w.blocks: .*uint8 \[6, 36\]"):
        mk.quant_matmul(w, x, threads=1)
    w.blocks = np.zeros((6, 72), np.uint8)[:, ::2]             # right shape, rows not one after the other
    with pytest.raises(ValueError, match=r"^w.blocks: need rows of 36 bytes"):
        mk.quant_matmul(w, x, threads=1)


@needs_lib
def test_calls_from_several_python_threads_at_once_get_their_own_results() -> None:
    # ctypes lets go of the GIL: the C thread team takes one call at a time, the others wait their turn
    from concurrent.futures import ThreadPoolExecutor

    rng = rng_for("concurrent")
    ws = [random_weight(name, 41, 512, rng) for name in ("Q8_0", "Q4_K", "F16", "Q6_K")]
    xs = [rng.standard_normal((9, 512)).astype(np.float32) for _ in ws]
    want = [mk.quant_matmul(w, x, threads=1) for w, x in zip(ws, xs)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: [mk.quant_matmul(ws[i], xs[i], threads=2) for _ in range(20)], range(4)))
    for i, runs in enumerate(got):
        for y in runs:
            np.testing.assert_array_equal(y, want[i])


@needs_lib
@pytest.mark.parametrize("name", mk.FORMATS)
def test_dequantized_rows_are_quants_py_bitwise_on_any_thread_count(name: str) -> None:
    rng = rng_for("dequantize", name)
    w = random_weight(name, 53, in_features(name, 3), rng)
    want = w.dequantize()
    for threads in (1, 2, 3):
        np.testing.assert_array_equal(mk.dequantize_rows(w, 0, 53, threads), want)
    np.testing.assert_array_equal(mk.dequantize_rows(w, 17, 50, 2), want[17:50])
    assert mk.dequantize_rows(w, 9, 9).shape == (0, w.shape[1])
    with pytest.raises(ValueError, match="start, stop"):
        mk.dequantize_rows(w, 5, 54)


@needs_lib
@pytest.mark.parametrize("name", mk.FORMATS)
def test_dequantized_matmul_is_its_numpy_twin_bitwise(name: str, monkeypatch) -> None:
    """The prefill path: BLAS on the C decoders' rows gives the twin's (NumPy's decoder, same chunks) bits,
    in one chunk and in several (a chunk of 7 rows, the last one short)."""
    rng = rng_for("prefill", name)
    w = random_weight(name, 38, in_features(name, 2), rng)
    x = rng.standard_normal((100, w.shape[1])).astype(np.float32)
    np.testing.assert_array_equal(mk.dequantized_matmul(w, x), w.matmul(x))
    monkeypatch.setattr(mk, "DEQUANT_CHUNK_VALUES", 7 * w.shape[1])
    chunked = mk.dequantized_matmul(w, x)
    np.testing.assert_array_equal(chunked, w.matmul(x, scratch=np.empty(7 * w.shape[1], np.float32)))
    assert_close_to_twin(w, x, chunked)


@needs_lib
def test_dequantized_matmul_refuses_bad_x_naming_it() -> None:
    w = random_weight("Q4_1", 4, 64, rng_for("bad"))
    with pytest.raises(ValueError, match="^x: need float32"):
        mk.dequantized_matmul(w, np.zeros((70, 32), np.float32))
