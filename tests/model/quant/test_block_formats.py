"""The GGUF block formats (model/quant/: formats, dequantize, blocks): sizes, dequantizers bitwise equal to
gguf-py's reference, the QuantizedWeight type's multiply, and the refusals (unsupported types, wrong shapes
and sizes)."""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize as reference_quantize

from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.quant import blocks
from nvllm.model.quant import dequantize as dequantizers
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS, BlockFormat, UnsupportedTensorType, block_format, raw_nbytes

ALL = sorted(f.name for f in FORMATS.values())
FORMAT = {f.name: f for f in FORMATS.values()}
BLOCKED = [n for n in ALL if FORMAT[n].block_elems > 1]
# the types gguf-py can write (it dequantizes the K-quants but does not quantize to them)
WRITABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# byte offsets of each block's float16 scale fields: random bytes there could be NaN or infinity
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ4_NL": [0], "IQ4_XS": [0]}
# (rows..., blocks per row): one block, several rows, rows of several blocks, a 3-D tensor
SHAPES = [(1, 1), (1, 5), (4, 1), (3, 7), (2, 3, 2)]


def seed(*what: object) -> int:
    """A seed fixed by the test case (hash() of a str changes between runs)."""
    return zlib.crc32(repr(what).encode())


def shape_of(fmt: BlockFormat, layout: tuple[int, ...]) -> tuple[int, ...]:
    """The tensor shape of `layout` (rows..., blocks per row); the float types get 16 values a block."""
    *rows, blocks = layout
    return (*rows, blocks * fmt.block_elems * (16 if fmt.block_elems == 1 else 1))


def random_raw(fmt: BlockFormat, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random bytes for a tensor of `shape`, with finite scales; for the float types, finite values."""
    n = raw_nbytes(fmt, shape)
    if fmt.name == "F32":
        return rng.standard_normal(n // 4).astype(np.float32).view(np.uint8)
    if fmt.name == "F16":
        return rng.standard_normal(n // 2).astype(np.float16).view(np.uint8)
    if fmt.name == "BF16":
        return (rng.standard_normal(n // 2).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=n, dtype=np.uint8)
    blocks = raw.reshape(-1, fmt.block_bytes)
    for off in F16_FIELDS[fmt.name]:
        scale = (rng.standard_normal(len(blocks)) * rng.choice([1e-4, 1e-2, 1.0], len(blocks))).astype(np.float16)
        blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw


def reference(fmt: BlockFormat, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's dequantization of the same bytes, as float32 [*shape]."""
    rows = raw.reshape(*shape[:-1], -1)
    return np.asarray(reference_dequantize(rows, GGMLQuantizationType(fmt.ggml_type)), np.float32).reshape(shape)


def assert_bitwise_equal(mine: np.ndarray, ref: np.ndarray) -> None:
    assert mine.dtype == np.float32 and mine.shape == ref.shape
    np.testing.assert_array_equal(mine.view(np.uint32), ref.view(np.uint32))


# ---------------------------------------------------------------- the formats


def test_the_formats_are_llamacpps_and_exactly_the_supported_ones() -> None:
    assert sorted(FORMAT) == sorted(["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"])
    for type_id, fmt in FORMATS.items():
        qtype = GGMLQuantizationType(type_id)
        assert fmt.ggml_type == type_id and fmt.name == qtype.name
        assert (fmt.block_elems, fmt.block_bytes) == GGML_QUANT_SIZES[qtype]
        assert block_format(type_id, "t") is fmt


@pytest.mark.parametrize("name", ALL)
def test_raw_nbytes_is_the_files_size(name: str) -> None:
    fmt = FORMAT[name]
    for layout in SHAPES:
        shape = shape_of(fmt, layout)
        rows = int(np.prod(shape[:-1]))
        assert raw_nbytes(fmt, shape) == rows * shape[-1] // fmt.block_elems * fmt.block_bytes
    assert raw_nbytes(fmt, (0, fmt.block_elems)) == 0
    assert raw_nbytes(fmt, (fmt.block_elems * 3,)) == 3 * fmt.block_bytes  # a 1-D tensor is one row


# ---------------------------------------------------------------- dequantize against gguf-py


@pytest.mark.parametrize("layout", SHAPES)
@pytest.mark.parametrize("name", WRITABLE)
def test_dequantize_equals_gguf_on_data_gguf_quantized(name: str, layout: tuple[int, ...]) -> None:
    fmt = FORMAT[name]
    shape = shape_of(fmt, layout)
    rng = np.random.default_rng(seed(name, layout))
    data = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0])).astype(np.float32)
    data.reshape(-1, shape[-1])[0, : max(fmt.block_elems, 2)] = 0  # an all-zero block: scale 0
    raw = np.ascontiguousarray(reference_quantize(data, GGMLQuantizationType(fmt.ggml_type))).view(np.uint8).reshape(-1)
    assert raw.size == raw_nbytes(fmt, shape)
    assert_bitwise_equal(dequantize(fmt, raw, shape), reference(fmt, raw, shape))


@pytest.mark.parametrize("layout", SHAPES)
@pytest.mark.parametrize("name", ALL)
def test_dequantize_equals_gguf_on_random_blocks(name: str, layout: tuple[int, ...]) -> None:
    # random bytes reach every bit pattern of the quants and scales (the K-quants' packed 6-bit ones too)
    fmt = FORMAT[name]
    shape = shape_of(fmt, layout)
    raw = random_raw(fmt, shape, np.random.default_rng(seed(name, layout, 1)))
    assert_bitwise_equal(dequantize(fmt, raw, shape), reference(fmt, raw, shape))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_in_several_chunks_equals_gguf(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # large tensors go through the kernels a chunk of blocks at a time; here 2 blocks a chunk, 1 left over
    monkeypatch.setattr(dequantizers, "_CHUNK_BYTES", 2 * FORMAT[name].block_bytes + 1)
    fmt = FORMAT[name]
    shape = shape_of(fmt, (3, 7))
    raw = random_raw(fmt, shape, np.random.default_rng(seed(name, "chunks")))
    assert_bitwise_equal(dequantize(fmt, raw, shape), reference(fmt, raw, shape))


@pytest.mark.parametrize("name", ["F16", "BF16", "F32"])
def test_float_types_keep_every_bit_pattern(name: str) -> None:
    # nan, infinities, subnormals and -0 come through as gguf-py gives them
    fmt = FORMAT[name]
    raw = np.random.default_rng(3).integers(0, 256, size=4096 * fmt.block_bytes, dtype=np.uint8)
    assert_bitwise_equal(dequantize(fmt, raw, (64, 64)), reference(fmt, raw, (64, 64)))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_reads_a_memory_mapped_file_at_any_offset(name: str, tmp_path: Path) -> None:
    fmt = FORMAT[name]
    shape = shape_of(fmt, (3, 2))
    raw = random_raw(fmt, shape, np.random.default_rng(5))
    path = tmp_path / "t.bin"
    path.write_bytes(b"\0" * 35 + raw.tobytes())  # an odd offset: nothing may assume alignment
    mapped = np.memmap(path, dtype=np.uint8, mode="r")[35:]
    assert_bitwise_equal(dequantize(fmt, mapped, shape), reference(fmt, raw, shape))
    w = QuantizedWeight.from_raw(fmt, mapped, shape)  # type: ignore[arg-type]
    assert np.shares_memory(w.blocks, mapped)  # the blocks stay in the mapped file
    assert_bitwise_equal(w.dequantize(), reference(fmt, raw, shape))


def test_an_empty_tensor_dequantizes_to_an_empty_array() -> None:
    for fmt in FORMATS.values():
        out = dequantize(fmt, np.zeros(0, np.uint8), (0, fmt.block_elems))
        assert out.shape == (0, fmt.block_elems) and out.dtype == np.float32


def test_f32_is_not_copied() -> None:
    raw = np.arange(12, dtype=np.float32).view(np.uint8)
    out = dequantize(FORMAT["F32"], raw, (3, 4))
    assert np.shares_memory(out, raw) and out.dtype == np.float32
    np.testing.assert_array_equal(out, np.arange(12, dtype=np.float32).reshape(3, 4))


# ---------------------------------------------------------------- the weight type


def matmul_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What float32 rounding may move x @ w.T by, elementwise (a generous multiple of eps * sum |x||w|)."""
    return 64 * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64)) + 1e-30


@pytest.mark.parametrize("name", ALL)
def test_matmul_equals_x_times_the_dequantized_weight(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = FORMAT[name]
    out_features, in_features = 37, shape_of(fmt, (1, 3))[1]
    raw = random_raw(fmt, (out_features, in_features), np.random.default_rng(7))
    w = QuantizedWeight.from_raw(fmt, raw, (out_features, in_features))
    assert w.nbytes == raw.size == raw_nbytes(fmt, w.shape)
    dense = w.dequantize()
    assert_bitwise_equal(dense, reference(fmt, raw, w.shape))
    x = np.random.default_rng(8).standard_normal((5, in_features)).astype(np.float32)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    for chunk in (1 << 20, 3 * in_features, in_features):  # one chunk, chunks with a remainder, row by row
        monkeypatch.setattr(blocks, "_CHUNK_VALUES", chunk)
        y = w.matmul(x)
        assert y.dtype == np.float32 and y.shape == (5, out_features)
        assert np.all(np.abs(y - want) <= matmul_bound(x, dense))
        assert np.all(np.abs(y - x @ dense.T) <= matmul_bound(x, dense))
    assert w.matmul(x[:0]).shape == (0, out_features)


def test_matmul_takes_one_token_and_casts_the_input() -> None:
    fmt = FORMAT["Q8_0"]
    raw = random_raw(fmt, (4, 64), np.random.default_rng(9))
    w = QuantizedWeight.from_raw(fmt, raw, (4, 64))
    x = np.random.default_rng(10).standard_normal((1, 64))  # float64 in, float32 out
    y = w.matmul(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, x.astype(np.float32) @ w.dequantize().T, rtol=1e-5, atol=1e-4)


def test_quantized_weight_checks_its_blocks() -> None:
    fmt = FORMAT["Q4_0"]
    good = np.zeros((4, 2 * fmt.block_bytes), np.uint8)
    QuantizedWeight(fmt, good, (4, 64))
    with pytest.raises(ValueError, match=r"needs uint8 blocks \(4, 36\)"):
        QuantizedWeight(fmt, good[:, :-1], (4, 64))
    with pytest.raises(ValueError, match="needs uint8 blocks"):
        QuantizedWeight(fmt, good.astype(np.int8), (4, 64))
    with pytest.raises(ValueError, match="2-D"):
        QuantizedWeight(fmt, good, (4, 2, 32))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a multiple"):
        QuantizedWeight(fmt, good, (4, 60))
    with pytest.raises(ValueError, match="2-D"):
        QuantizedWeight.from_raw(fmt, good.reshape(-1), (256,))  # type: ignore[arg-type]
    w = QuantizedWeight(fmt, good, (4, 64))
    with pytest.raises(ValueError, match=r"needs x \[T, 64\]"):
        w.matmul(np.zeros((2, 32), np.float32))
    with pytest.raises(ValueError, match=r"needs x \[T, 64\]"):
        w.matmul(np.zeros(64, np.float32))


# ---------------------------------------------------------------- refusals

UNSUPPORTED = [t for t in GGMLQuantizationType if int(t) not in FORMATS]


def test_the_unsupported_list_has_the_families_the_issue_names() -> None:
    names = {t.name for t in UNSUPPORTED}
    assert {"Q8_1", "Q8_K", "TQ1_0", "TQ2_0", "MXFP4", "IQ2_XXS", "IQ3_S", "IQ1_S"} <= names


@pytest.mark.parametrize("qtype", UNSUPPORTED, ids=lambda t: t.name)
def test_an_unsupported_type_names_the_tensor_and_the_type(qtype: GGMLQuantizationType) -> None:
    with pytest.raises(UnsupportedTensorType) as e:
        block_format(int(qtype), "blk.3.ffn_down.weight")
    assert "'blk.3.ffn_down.weight'" in str(e.value) and qtype.name in str(e.value)
    assert isinstance(e.value, ValueError)


def test_an_unknown_type_id_names_the_tensor_and_the_id() -> None:
    with pytest.raises(UnsupportedTensorType, match=r"'output\.weight'.*unknown type 9999"):
        block_format(9999, "output.weight")


@pytest.mark.parametrize("name", BLOCKED)
def test_a_row_length_off_the_block_is_refused(name: str) -> None:
    fmt = FORMAT[name]
    for row in (fmt.block_elems - 1, fmt.block_elems + 1, 3 * fmt.block_elems // 2 + 1):
        with pytest.raises(ValueError, match=f"{name} row length {row} is not a multiple"):
            raw_nbytes(fmt, (2, row))
        with pytest.raises(ValueError, match="not a multiple"):
            dequantize(fmt, np.zeros(fmt.block_bytes * 4, np.uint8), (2, row))


@pytest.mark.parametrize("name", ALL)
def test_raw_of_the_wrong_size_or_kind_is_refused(name: str) -> None:
    fmt = FORMAT[name]
    shape = shape_of(fmt, (2, 2))
    n = raw_nbytes(fmt, shape)
    for size in (n - 1, n + 1, n - fmt.block_bytes, n + fmt.block_bytes, 0):
        with pytest.raises(ValueError, match=f"takes {n} bytes, got {size}"):
            dequantize(fmt, np.zeros(size, np.uint8), shape)
        with pytest.raises(ValueError, match=f"takes {n} bytes"):
            QuantizedWeight.from_raw(fmt, np.zeros(size, np.uint8), shape)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1-D uint8"):
        dequantize(fmt, np.zeros(n, np.int8), shape)
    with pytest.raises(ValueError, match="1-D uint8"):
        dequantize(fmt, np.zeros((2, n // 2), np.uint8), shape)
    with pytest.raises(ValueError, match="non-negative"):
        dequantize(fmt, np.zeros(n, np.uint8), (-2, *shape[1:]))
    with pytest.raises(ValueError, match="non-negative"):
        raw_nbytes(fmt, ())
