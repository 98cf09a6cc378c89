"""The repacked weights (csrc/pack.c against quant/packed.py's twin, and back) and the kernels that read them
(every variant of csrc/dot_*.c against kernels/qdot.py, and for F16 and BF16 kernels/fdot.py, bit for
bit)."""

from __future__ import annotations

import ctypes
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from helpers.gguf_util import random_blocks
from nvllm.model.kernels import fdot, qdot
from nvllm.model.kernels import matmul as mk
from nvllm.model.quant import packed
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.formats import FORMATS

# Also run under emulated aarch64 (deploy/aarch64-check.sh): NEON, NEON with sdot, and the scalar code.
pytestmark = [pytest.mark.aarch64, pytest.mark.usefixtures("keep_int_variant")]

FORMAT = {f.name: f for f in FORMATS.values()}
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
# (rows, blocks of 32 per row): under a panel, a panel and a row, several panels; one block; a model's 48
LAYOUTS = [(1, 1), (9, 3), (37, 8), (16, 48)]
T_SIZES = [1, 2, 3, 5, 8, 17, 64, 65]
VARIANTS = [v for v in mk.int_variants() if v != "float"]

needs_lib = pytest.mark.skipif(mk.lib is None, reason="the C matmul was not built (no C compiler at install)")


def rng_for(*what: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(what).encode()))


def float_weight(name: str, rows: int, n_in: int, rng: np.random.Generator) -> BlockMatrix:
    """F16 or BF16 values of both signs and many magnitudes (random_blocks' are small positive scales)."""
    v = (rng.standard_normal((rows, n_in)) * np.exp2(rng.integers(-6, 4, (rows, n_in)))).astype(np.float32)
    bf16 = (v.view(np.uint32) >> 16).astype("<u2")
    raw = v.astype(np.float16).view(np.uint8) if name == "F16" else bf16.view(np.uint8)
    return BlockMatrix(FORMAT[name], np.ascontiguousarray(raw.reshape(rows, 2 * n_in)), (rows, n_in))


def weight(name: str, rows: int, blocks: int, rng: np.random.Generator) -> BlockMatrix:
    n_in = 256 * -(-blocks // 8) if name in K_QUANTS else 32 * blocks
    if name in fdot.FORMATS:
        return float_weight(name, rows, n_in, rng)
    raw = random_blocks(rng, GT[name], (rows, n_in))
    return BlockMatrix(FORMAT[name], np.ascontiguousarray(raw), (rows, n_in))


def twin(w: BlockMatrix, x: np.ndarray, variant: str) -> np.ndarray:
    if w.fmt.name in fdot.FORMATS:   # x stays float whatever the variant's activations
        return fdot.matmul(w, x)
    return qdot.matmul(w, x, 16 if variant.endswith("-i16") else 8)


def run(pm: packed.PackedMatrix, x: np.ndarray, variant: str, threads: int = 1) -> np.ndarray:
    mk.set_int_variant(variant)
    return mk.quant_matmul(pm, x, threads)


@pytest.mark.parametrize("name", packed.FIELDS)
def test_the_fields_cover_each_block_once(name: str) -> None:
    covered = sorted(b for offset, size in packed.FIELDS[name] for b in range(offset, offset + size))
    assert covered == list(range(FORMAT[name].block_bytes))


@needs_lib
@pytest.mark.parametrize("name", packed.FIELDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pack_is_the_twin_and_unpack_gives_the_blocks_back(name: str, layout: tuple) -> None:
    w = weight(name, layout[0], layout[1], rng_for("pack", name, layout))
    pm = mk.pack(w)
    np.testing.assert_array_equal(pm.data, packed.pack_twin(w))
    assert pm.data.nbytes == pm.panels * packed.PANEL * w.blocks.shape[1]
    np.testing.assert_array_equal(mk.unpack_rows(pm, 0, w.shape[0]), w.blocks)
    mid = (w.shape[0] // 3, w.shape[0] - w.shape[0] // 4)
    np.testing.assert_array_equal(mk.unpack_rows(pm, *mid), w.blocks[mid[0]:mid[1]])


@needs_lib
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
def test_packing_a_chunk_of_rows_at_a_time_is_packing_the_whole(name: str) -> None:
    # as a loader packs from the mapped file: whole panels a chunk at a time (8 rows here), the last short
    w = weight(name, 37, 8, rng_for("chunks", name))
    asked = []

    def fill(start: int, stop: int, out: np.ndarray) -> None:
        asked.append((start, stop))
        out[...] = w.blocks[start:stop]

    got = mk.pack_rows(w.fmt, w.shape, fill, chunk_bytes=1)
    assert asked == [(r, min(37, r + 8)) for r in range(0, 37, 8)]
    np.testing.assert_array_equal(got.data, mk.pack(w).data)


def test_the_twin_unpacks_what_it_packs() -> None:
    for name in packed.FIELDS:
        w = weight(name, 11, 9, rng_for("twin", name))
        pm = packed.PackedMatrix(w.fmt, packed.pack_twin(w), w.shape)
        np.testing.assert_array_equal(packed.unpack_twin(pm, 2, 11), w.blocks[2:])


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", packed.FIELDS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_variant_equals_the_twin_bitwise(name: str, layout: tuple, variant: str) -> None:
    rng = rng_for("dot", name, layout)
    w = weight(name, layout[0], layout[1], rng)
    pm = mk.pack(w)
    for T in T_SIZES:
        x = (rng.standard_normal((T, w.shape[1])) * 2).astype(np.float32)
        np.testing.assert_array_equal(run(pm, x, variant), twin(w, x, variant), err_msg=f"T={T}")


@needs_lib
@pytest.mark.parametrize("name", fdot.FORMATS)
@pytest.mark.parametrize("n_in", [1, 3, 6, 37, 640])
def test_floats_of_any_row_length_equal_the_twin_in_every_variant(name: str, n_in: int) -> None:
    # rows not a multiple of the four sums (the last 1 .. 3 values go to sums 0 .. 2 only), and "float",
    # the variant with no integer kernel, which still reads these panels
    rng = rng_for("floats", name, n_in)
    w = float_weight(name, 13, n_in, rng)
    pm = mk.pack(w)
    for variant in ["float", *VARIANTS]:
        for T in (1, 2, 3, 4, 5, 9):
            x = rng.standard_normal((T, n_in)).astype(np.float32)
            np.testing.assert_array_equal(run(pm, x, variant), fdot.matmul(w, x), err_msg=f"{variant} T={T}")


@needs_lib
@pytest.mark.parametrize("name", fdot.FORMATS)
def test_float_panels_read_the_format_exactly(name: str) -> None:
    # one weight 1 in each row's own column, x a row of distinct values: y is the weight's exact value
    # times x, so a conversion that rounds (or a BF16 read as F16) shows; subnormal halves included
    rows, n_in = 9, 12
    v = np.zeros((rows, n_in), np.float32)
    vals = np.array([1.5, -2.0, 6.1e-5, -3.0e-6, 65504.0, 0.333, -7.25, 1e-7, 2.0 ** -14], np.float32)
    v[np.arange(rows), np.arange(rows)] = vals
    half = v.astype(np.float16) if name == "F16" else None
    raw = half.view(np.uint8) if half is not None else (v.view(np.uint32) >> 16).astype("<u2").view(np.uint8)
    w = BlockMatrix(FORMAT[name], np.ascontiguousarray(raw.reshape(rows, 2 * n_in)), (rows, n_in))
    exact = half.astype(np.float32) if half is not None else ((v.view(np.uint32) >> 16) << 16).view(np.float32)
    x = np.ones((1, n_in), np.float32)
    for variant in VARIANTS:
        np.testing.assert_array_equal(run(mk.pack(w), x, variant)[0], exact[np.arange(rows), np.arange(rows)])


# Where each format's fp16 scales (d, m, dmin) lie in its block: the other bytes are its integer quants and
# 6-bit scales, which the extreme weights below set all to one value.
FLOAT_AT = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82),
            "Q3_K": (108,)}


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", qdot.FORMATS)
def test_extreme_weights_against_extreme_x_sum_exactly(name: str, variant: str) -> None:
    # every quant byte 0x00 or 0xff (the largest weights and offsets each format has, and its largest
    # scales) against x at its largest quant, all of one sign or alternating: no partial sum may wrap
    rng = rng_for("extreme", name)
    w = weight(name, 16, 8, rng)
    blocks = w.blocks.reshape(16, -1, FORMAT[name].block_bytes)
    keep = np.zeros(FORMAT[name].block_bytes, bool)
    for at in FLOAT_AT.get(name, (0,)):
        keep[at:at + 2] = True
    blocks[:8, :, ~keep] = 0xFF
    blocks[8:, :, ~keep] = 0x00
    x = np.full((4, w.shape[1]), 3.0, np.float32)
    x[1] = -3.0
    x[2, ::2] = -3.0
    x[3, ::3] = -3.0
    y = run(mk.pack(w), x, variant)
    np.testing.assert_array_equal(y, twin(w, x, variant))


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q5_0"])
def test_a_range_of_panels_writes_those_rows_only(name: str, variant: str) -> None:
    # what each thread is given: panels p0 .. p1 (a kernel may take two panels at once: an odd range ends
    # on a single one, and the panel after it is another thread's)
    rng = rng_for("range", name)
    w = weight(name, 37, 8, rng)   # 5 panels, the last with 5 rows
    pm = mk.pack(w)
    v = mk.INT_VARIANTS[variant]
    lib = mk.lib
    assert lib is not None
    i64 = ctypes.c_int64
    for T in (1, 5):
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        full = run(pm, x, variant)
        qx = np.empty(lib.dot_x_bytes(v, T, w.shape[1]), np.uint8)
        lib.dot_quantize_x(v, x.ctypes.data, w.shape[1], w.shape[1], 0, T, qx.ctypes.data)
        for p0, p1 in ((0, 1), (1, 4), (3, 5), (2, 3), (4, 5)):
            y = np.full((T, 37), np.inf, np.float32)
            rc = lib.dot_panels(ctypes.c_int(v), ctypes.c_int(w.fmt.ggml_type), ctypes.c_void_p(pm.data.ctypes.data),
                                i64(w.shape[1]), i64(p0), i64(p1), ctypes.c_void_p(qx.ctypes.data), i64(T),
                                ctypes.c_void_p(y.ctypes.data), i64(37), i64(37))
            assert rc == 0
            r0, r1 = 8 * p0, min(37, 8 * p1)
            np.testing.assert_array_equal(y[:, r0:r1], full[:, r0:r1], err_msg=f"T={T} panels {p0}..{p1}")
            assert np.isinf(np.delete(y, np.s_[r0:r1], axis=1)).all()


@needs_lib
@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_and_inf_in_x_stay_in_their_row(variant: str) -> None:
    rng = rng_for("nan", variant)
    w = weight("Q4_K", 10, 16, rng)
    x = rng.standard_normal((3, w.shape[1])).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 300] = np.inf
    y = run(mk.pack(w), x, variant)
    assert np.isfinite(y[0]).all() and np.isnan(y[1]).all() and np.isnan(y[2]).all()
    np.testing.assert_array_equal(y, twin(w, x, variant))


@needs_lib
@pytest.mark.parametrize("bits", [8, 16])
def test_x_is_quantized_as_the_twin_quantizes_it(bits: int) -> None:
    # dot.c's blocks of x: d, s, the half sums and the quants (exact: q = 255 hi + lo, both planes in
    # -127 .. 127, never -128), read back through their C layout (packed.h's xq8_t / xq16_t)
    rng = rng_for("x", bits)
    x = (rng.standard_normal((3, 96)) * 5).astype(np.float32)
    x[2, :32] = 0.0
    planes = [("q", "i1", 32)] if bits == 8 else [("hi", "i1", 32), ("lo", "i1", 32)]
    xq = np.dtype([("d", "<f4"), ("s", "<f4"), ("sum", "<i4", 2), *planes])
    v = mk.INT_VARIANTS["scalar" if bits == 8 else "scalar-i16"]
    assert mk.lib is not None
    assert mk.lib.dot_x_bytes(v, 3, 96) == 9 * xq.itemsize
    got = np.empty(9, xq)
    mk.lib.dot_quantize_x(v, x.ctypes.data, 96, 96, 0, 3, got.ctypes.data)
    d, q, s = qdot.quantize_rows(x, bits)
    q = q.reshape(9, 32).astype(np.int32)
    if bits == 16:
        assert got["hi"].min() >= -127 and got["lo"].min() >= -127
        np.testing.assert_array_equal(255 * got["hi"].astype(np.int32) + got["lo"], q)
        assert np.abs(q).max() == qdot.BITS[16][0]
    else:
        np.testing.assert_array_equal(got["q"], q)
    np.testing.assert_array_equal(got["d"], d.reshape(9))
    np.testing.assert_array_equal(got["s"], s.reshape(9))
    np.testing.assert_array_equal(got["sum"], q.reshape(9, 2, 16).sum(axis=2))


def test_every_exact_quant_has_two_planes_in_int8() -> None:
    q = np.arange(-qdot.BITS[16][0], qdot.BITS[16][0] + 1)
    hi = (q + 127 + 255 * 128) // 255 - 128
    lo = q - 255 * hi
    assert hi.min() == -127 and hi.max() == 127 and lo.min() == -127 and lo.max() == 127
    np.testing.assert_array_equal(255 * hi + lo, q)


def test_formats_without_a_packing_are_refused_naming_the_format() -> None:
    w = BlockMatrix(FORMAT["F32"], np.zeros((2, 128), np.uint8), (2, 32))
    with pytest.raises(ValueError, match="F32 is not packed"):
        mk.pack(w)


@needs_lib
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K", "F16", "BF16"])
def test_threads_and_batch_neighbours_do_not_change_a_bit(name: str) -> None:
    rng = rng_for("threads", name)
    w = weight(name, 61, 16, rng)
    pm = mk.pack(w)
    x = rng.standard_normal((9, w.shape[1])).astype(np.float32)
    for variant in VARIANTS:
        alone = np.concatenate([run(pm, x[t:t + 1], variant) for t in range(9)])
        for threads in (1, 2, 3, 8):
            np.testing.assert_array_equal(run(pm, x, variant, threads), alone, err_msg=f"{variant} {threads}")


@needs_lib
def test_the_float_variant_decodes_the_panels() -> None:
    # activations "float": matmul.c's tiles decode each row from the panels, exactly dequantize.py's values
    # (F16 and BF16: their own float panels, as in every variant)
    rng = rng_for("float")
    for name in packed.FIELDS:
        w = weight(name, 13, 9, rng)
        pm = mk.pack(w)
        x = rng.standard_normal((3, w.shape[1])).astype(np.float32)
        np.testing.assert_allclose(run(pm, x, "float"), w.matmul(x), rtol=2e-5, atol=1e-5 * np.abs(x).sum())
        np.testing.assert_array_equal(mk.dequantize_rows(pm, 2, 11), w.dequantize()[2:11])


@needs_lib
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "F16", "BF16"])
def test_a_packed_weight_looks_up_rows_and_decodes_as_its_blocks_do(name: str) -> None:
    from nvllm.model.matrix.packed import PackedWeight

    w = weight(name, 13, 8, rng_for("rows", name))
    pw = PackedWeight.of(w)
    ids = np.array([0, 12, 5, 5, 7, 8])
    np.testing.assert_array_equal(pw.rows(ids), w.rows(ids))
    np.testing.assert_array_equal(pw.dequantize(), w.dequantize())
    for start, stop in ((3, 6), (6, 11), (8, 13)):   # inside a panel, across one, the last (short) one
        np.testing.assert_array_equal(mk.dequantize_rows(pw, start, stop, 2), w.dequantize()[start:stop])
    assert pw.nbytes == 16 * w.blocks.shape[1]   # the file's bytes and three zero rows to a whole panel
    with pytest.raises(ValueError, match=f"row id 13 is out of range for a {name} weight of 13 rows"):
        pw.rows(np.array([13]))


@needs_lib
@pytest.mark.parametrize("activations", ["int8", "exact"])
@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q6_K"])
def test_prefill_rows_get_the_bits_of_decode_rows(name: str, activations: str) -> None:
    # a prefill's rows (more than DECODE_ROWS) go to the integer kernels too, x quantized by the team
    # (each thread its share of the rows): each row's product is the one it gets alone, in a decode step
    from nvllm.model.matrix.packed import PackedWeight
    from nvllm.model.matrix.weight import DECODE_ROWS

    rng = rng_for("prefill", name, activations)
    variant = mk.set_activations(activations)
    w = weight(name, 40, 16, rng)
    pw = PackedWeight.of(w)
    x = rng.standard_normal((3 * DECODE_ROWS + 5, w.shape[1])).astype(np.float32)
    got = pw.apply(x)
    np.testing.assert_array_equal(got[::7], np.concatenate([pw.apply(x[t:t + 1]) for t in range(0, len(x), 7)]))
    if variant != "float":
        np.testing.assert_array_equal(got, twin(w, x, variant))
