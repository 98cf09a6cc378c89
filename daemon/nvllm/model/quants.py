"""GGUF weight types: the block formats llama.cpp stores tensors in, and the weight as a type of its own.

A tensor is rows of blocks along its last axis; each block holds `block_elems` values in `block_bytes`
bytes (little-endian, as in the file). The dequantizers below are vectorised NumPy over a chunk of
blocks at a time (never a Python loop over blocks), written from llama.cpp's block layouts (ggml-common.h) and the arithmetic of its reference
dequantizers, in the same order, so they agree with them bit for bit in float32. They are the NumPy
twins of the C kernels that read the blocks in place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np


class UnsupportedTensorType(ValueError):
    """A tensor is stored in a type nvllm does not read; the message names the tensor and the type."""


@dataclass(frozen=True)
class BlockFormat:
    name: str  # llama.cpp's name: "F32", "Q4_K", ...
    ggml_type: int  # the type id in the GGUF tensor info
    block_elems: int  # values per block (1 for the plain float types)
    block_bytes: int  # bytes per block


QK = 32  # values per block of the legacy formats (Q4_0 ... Q8_0)
QK_K = 256  # values per super-block of the K-quants

_FORMAT_LIST = [
    BlockFormat("F32", 0, 1, 4),
    BlockFormat("F16", 1, 1, 2),
    BlockFormat("Q4_0", 2, QK, 2 + QK // 2),
    BlockFormat("Q4_1", 3, QK, 4 + QK // 2),
    BlockFormat("Q5_0", 6, QK, 2 + 4 + QK // 2),
    BlockFormat("Q5_1", 7, QK, 4 + 4 + QK // 2),
    BlockFormat("Q8_0", 8, QK, 2 + QK),
    BlockFormat("Q4_K", 12, QK_K, 4 + 12 + QK_K // 2),
    BlockFormat("Q5_K", 13, QK_K, 4 + 12 + QK_K // 8 + QK_K // 2),
    BlockFormat("Q6_K", 14, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    BlockFormat("BF16", 30, 1, 2),
]
FORMATS: Dict[int, BlockFormat] = {f.ggml_type: f for f in _FORMAT_LIST}

# One block as a NumPy record, field by field in file order (ggml-common.h's block_* structs).
_F16 = "<f2"
_BLOCK_DTYPES: Dict[str, np.dtype] = {
    "Q4_0": np.dtype([("d", _F16), ("qs", "u1", QK // 2)]),
    "Q4_1": np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", QK // 2)]),
    "Q5_0": np.dtype([("d", _F16), ("qh", "u1", 4), ("qs", "u1", QK // 2)]),
    "Q5_1": np.dtype([("d", _F16), ("m", _F16), ("qh", "u1", 4), ("qs", "u1", QK // 2)]),
    "Q8_0": np.dtype([("d", _F16), ("qs", "i1", QK)]),
    "Q4_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", QK_K // 2)]),
    "Q5_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", QK_K // 8),
                      ("qs", "u1", QK_K // 2)]),
    "Q6_K": np.dtype([("ql", "u1", QK_K // 2), ("qh", "u1", QK_K // 4), ("scales", "i1", QK_K // 16),
                      ("d", _F16)]),
}


def _type_name(ggml_type: int) -> str:
    """llama.cpp's name for a type id, for error messages."""
    try:
        from gguf import GGMLQuantizationType  # the enum of every type llama.cpp knows

        return f"{GGMLQuantizationType(ggml_type).name} (type {ggml_type})"
    except (ImportError, ValueError):
        return f"unknown type {ggml_type}"


def block_format(ggml_type: int, tensor_name: str) -> BlockFormat:
    """The format of a tensor's type id, or UnsupportedTensorType naming the tensor and the type."""
    fmt = FORMATS.get(int(ggml_type))
    if fmt is None:
        supported = ", ".join(f.name for f in _FORMAT_LIST)
        raise UnsupportedTensorType(
            f"tensor {tensor_name!r} is stored as {_type_name(int(ggml_type))}, which nvllm does not read; "
            f"it reads {supported}: use a GGUF quantized to one of these")
    return fmt


def _rows_and_blocks(fmt: BlockFormat, shape: Tuple[int, ...]) -> Tuple[int, int]:
    """(rows, blocks per row) of a tensor of `shape`, or ValueError for a shape the format cannot hold."""
    if len(shape) == 0 or any(int(n) < 0 for n in shape):
        raise ValueError(f"tensor shape {tuple(shape)} is not a list of non-negative sizes")
    row = int(shape[-1])
    if row % fmt.block_elems:
        raise ValueError(f"{fmt.name} row length {row} is not a multiple of its block of {fmt.block_elems} values")
    rows = 1
    for n in shape[:-1]:
        rows *= int(n)
    return rows, row // fmt.block_elems


def raw_nbytes(fmt: BlockFormat, shape: Tuple[int, ...]) -> int:
    """Bytes the data of a tensor of `shape` takes in `fmt`."""
    rows, blocks = _rows_and_blocks(fmt, shape)
    return rows * blocks * fmt.block_bytes


# ---------------------------------------------------------------- dequantizers
# Each kernel takes a chunk of blocks as bytes B [m, block_bytes] and writes float32 out [m, block_elems].
# The float operations keep llama.cpp's order (d * q, then + m or - dmin * m), so the results are
# bitwise those of its reference. Bit twiddling runs over the whole chunk's bytes at once (one long
# contiguous loop beats sixteen-byte strided ones), and the fields are sliced out of the result.


def _field(B: np.ndarray, fmt: str, name: str) -> np.ndarray:
    """Field `name` of every block in B [m, block_bytes], as its type: [m, count] (float16 fields [m, 1])."""
    dtype, offset = _BLOCK_DTYPES[fmt].fields[name][:2]
    base = dtype.base
    count = dtype.itemsize // base.itemsize
    return B[:, offset:offset + dtype.itemsize].view(base).reshape(len(B), count)


def _scale(B: np.ndarray, fmt: str, name: str = "d") -> np.ndarray:
    """A float16 scale field as float32 [m, 1], to broadcast over each block."""
    return _field(B, fmt, name).astype(np.float32)


def _deq_q8_0(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = _field(B, "Q8_0", "qs")  # int8 [m, 32]
    out *= _scale(B, "Q8_0")


def _legacy_nibbles(B: np.ndarray, fmt: str, out: np.ndarray) -> None:
    """The 4-bit quants [m, 32] of a legacy block: value j is the low nibble of qs[j], j + 16 its high one."""
    lo, hi = B & 0x0F, B >> 4  # [m, block_bytes]
    qs = _BLOCK_DTYPES[fmt].fields["qs"][1]
    out[:, :QK // 2] = lo[:, qs:]
    out[:, QK // 2:] = hi[:, qs:]


def _deq_q4_0(B: np.ndarray, out: np.ndarray) -> None:
    _legacy_nibbles(B, "Q4_0", out)
    out -= 8
    out *= _scale(B, "Q4_0")


def _deq_q4_1(B: np.ndarray, out: np.ndarray) -> None:
    _legacy_nibbles(B, "Q4_1", out)
    out *= _scale(B, "Q4_1")
    out += _scale(B, "Q4_1", "m")


def _q5_quants(B: np.ndarray, fmt: str) -> np.ndarray:
    """The 5-bit quants [m, 32] (uint8): a nibble from qs, the fifth from qh, a little-endian uint32
    whose bit j (bit j % 8 of byte j // 8) belongs to value j."""
    q = np.empty((len(B), QK), np.uint8)
    _legacy_nibbles(B, fmt, q)
    high = np.unpackbits(_field(B, fmt, "qh"), axis=1, bitorder="little")  # [m, 32]
    high <<= 4
    q |= high
    return q


def _deq_q5_0(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = _q5_quants(B, "Q5_0")
    out -= 16
    out *= _scale(B, "Q5_0")


def _deq_q5_1(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = _q5_quants(B, "Q5_1")
    out *= _scale(B, "Q5_1")
    out += _scale(B, "Q5_1", "m")


def _k_nibbles(B: np.ndarray, fmt: str, out: np.ndarray) -> None:
    """The 4-bit parts of a K-quant block: qs [128] in four runs of 32 bytes, run i holding sub-block
    2i in its low nibbles and 2i + 1 in its high ones; out [m, 256]."""
    m = len(B)
    lo, hi = B & 0x0F, B >> 4  # [m, block_bytes]
    qs = _BLOCK_DTYPES[fmt].fields["qs"][1]
    runs = out.reshape(m, 4, 2, 32)  # run, nibble, byte in the run
    runs[:, :, 0] = lo[:, qs:].reshape(m, 4, 32)
    runs[:, :, 1] = hi[:, qs:].reshape(m, 4, 32)


def _k4_scales(scales: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes [m, 12] -> the eight 6-bit scales and mins [m, 8] (get_scale_min_k4).

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales and mins 4-7 are the
    nibbles of bytes 8-11 with their top two bits in the top bits of bytes 0-3 and 4-7. Each group of
    four bytes is taken as one little-endian uint32, so every step works on four scales at once.
    """
    words = scales.view("<u4")  # [m, 3]: bytes 0-3, 4-7, 8-11
    a, m, c = words[:, 0], words[:, 1], words[:, 2]
    low6, nib, top2 = np.uint32(0x3F3F3F3F), np.uint32(0x0F0F0F0F), np.uint32(0x30303030)
    out = np.empty((len(scales), 4), "<u4")  # scales 0-3, 4-7, mins 0-3, 4-7
    np.bitwise_and(a, low6, out=out[:, 0])
    out[:, 1] = (c & nib) | ((a >> 2) & top2)  # a byte's top two bits land on bits 4-5
    np.bitwise_and(m, low6, out=out[:, 2])
    out[:, 3] = ((c >> 4) & nib) | ((m >> 2) & top2)
    both = out.view(np.uint8)  # [m, 16]
    return both[:, :8], both[:, 8:]


def k4_parts(B: np.ndarray, fmt: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K or Q5_K chunk B [m, block_bytes] as (q [m, 256] uint8: 0..15, or 0..31 for Q5_K;
    d * sc [m, 8] and dmin * m [m, 8] float32, both exact): sub-block s (32 values) is
    (d * sc)[s] * q - (dmin * m)[s]. Also qdot.py's view of these weights."""
    m = len(B)
    q = np.empty((m, QK_K), np.uint8)
    _k_nibbles(B, fmt, q)
    if fmt == "Q5_K":   # bit s of qh[l] is the fifth bit of value l of sub-block s
        high = np.unpackbits(_field(B, "Q5_K", "qh"), axis=1, bitorder="little").reshape(m, 32, 8)  # l, s
        high <<= 4
        q.reshape(m, 8, 32)[...] |= high.transpose(0, 2, 1)
    sc, mn = _k4_scales(_field(B, fmt, "scales"))
    return q, _scale(B, fmt) * sc.astype(np.float32), _scale(B, fmt, "dmin") * mn.astype(np.float32)


def _deq_k4(B: np.ndarray, fmt: str, out: np.ndarray) -> None:
    q, d, dm = k4_parts(B, fmt)
    out[...] = q
    sub = out.reshape(len(B), 8, 32)
    sub *= d[:, :, None]
    sub -= dm[:, :, None]


def _deq_q4_k(B: np.ndarray, out: np.ndarray) -> None:
    _deq_k4(B, "Q4_K", out)


def _deq_q5_k(B: np.ndarray, out: np.ndarray) -> None:
    _deq_k4(B, "Q5_K", out)


_SHIFT6 = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]


def q6_parts(B: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A Q6_K chunk B [m, 210] as (q [m, 256] int8, each quant less 32; d * scale [m, 16] float32, exact):
    value i is (d * scale)[i // 16] * q[i]. Also qdot.py's view of these weights.

    Two halves of 128 values; in each, value 32k + l takes nibble k // 2 of ql[l + 32 (k % 2)] and bits 2k,
    2k + 1 of qh[l] above it; the 16 int8 scales each cover 16 consecutive values."""
    m = len(B)
    lo, hi = B & 0x0F, B >> 4  # [m, block_bytes]; ql is the first 128 bytes
    q = np.empty((m, 2, 2, 2, 32), np.uint8)  # half, nibble, ql quarter, l
    q[:, :, 0] = lo[:, :QK_K // 2].reshape(m, 2, 2, 32)
    q[:, :, 1] = hi[:, :QK_K // 2].reshape(m, 2, 2, 32)
    high = (_field(B, "Q6_K", "qh").reshape(m, 2, 1, 32) >> _SHIFT6) & 3  # [m, 2, 4, 32]: half, k, l
    high <<= 4
    q4 = q.reshape(m, 2, 4, 32)
    q4 |= high
    signed = q.reshape(m, QK_K).astype(np.int8)
    signed -= 32
    return signed, _scale(B, "Q6_K") * _field(B, "Q6_K", "scales").astype(np.float32)


def _deq_q6_k(B: np.ndarray, out: np.ndarray) -> None:
    q, scales = q6_parts(B)
    out[...] = q
    out.reshape(len(B), 16, 16)[...] *= scales[:, :, None]


def _deq_f16(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = B.view(_F16)


def _deq_bf16(B: np.ndarray, out: np.ndarray) -> None:
    bits = out.view(np.uint32)
    bits[...] = B.view("<u2")
    bits <<= 16  # bfloat16 is the top half of a float32


def _deq_f32(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = B.view("<f4")


_KERNELS: Dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "F32": _deq_f32, "F16": _deq_f16, "BF16": _deq_bf16,
    "Q4_0": _deq_q4_0, "Q4_1": _deq_q4_1, "Q5_0": _deq_q5_0, "Q5_1": _deq_q5_1, "Q8_0": _deq_q8_0,
    "Q4_K": _deq_q4_k, "Q5_K": _deq_q5_k, "Q6_K": _deq_q6_k,
}

_CHUNK_BYTES = 1 << 17  # bytes of blocks per kernel call: its temporaries stay in cache


def _dequantize_into(fmt: BlockFormat, raw: np.ndarray, out: np.ndarray) -> None:
    """Raw bytes (1-D uint8, whole blocks) -> out (float32, contiguous, as many values), a chunk at a time."""
    n_blocks = raw.size // fmt.block_bytes
    blocks = raw.reshape(n_blocks, fmt.block_bytes)
    values = out.reshape(n_blocks, fmt.block_elems)
    kernel = _KERNELS[fmt.name]
    # the float types make no temporaries: one pass
    step = max(1, n_blocks if fmt.block_elems == 1 else _CHUNK_BYTES // fmt.block_bytes)
    for start in range(0, n_blocks, step):
        kernel(blocks[start:start + step], values[start:start + step])


def _check_raw(fmt: BlockFormat, raw: np.ndarray, shape: Tuple[int, ...]) -> None:
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
        what = f"{raw.dtype} {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ValueError(f"{fmt.name} data must be a 1-D uint8 array, got {what}")
    want = raw_nbytes(fmt, shape)
    if raw.size != want:
        raise ValueError(f"{fmt.name} tensor of shape {tuple(shape)} takes {want} bytes, got {raw.size}")


def dequantize(fmt: BlockFormat, raw: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    """The tensor's values as float32 [*shape] from its raw bytes (1-D uint8, exactly raw_nbytes).

    F32 comes back as a view of `raw` (read-only when `raw` maps a file); the others are computed.
    """
    _check_raw(fmt, raw, shape)
    shape = tuple(int(n) for n in shape)
    if fmt.name == "F32":
        return raw.view("<f4").reshape(shape)
    out = np.empty(shape, np.float32)
    _dequantize_into(fmt, raw, out)
    return out


# ---------------------------------------------------------------- the weight type

_CHUNK_VALUES = 1 << 18  # values matmul dequantizes at a time: 1 MB of float32, near the cache


@dataclass
class QuantizedWeight:
    """A linear layer's weight kept in its file format: its blocks, and one way to multiply by it."""

    fmt: BlockFormat
    blocks: np.ndarray  # uint8 [rows, row_bytes], a view of the mapped file
    shape: Tuple[int, int]  # (out_features, in_features): GGUF's [rows, row length]

    def __post_init__(self) -> None:
        self.shape = tuple(int(n) for n in self.shape)  # type: ignore[assignment]
        if len(self.shape) != 2:
            raise ValueError(f"a {self.fmt.name} weight is 2-D, got shape {self.shape}")
        rows, per_row = _rows_and_blocks(self.fmt, self.shape)
        want = (rows, per_row * self.fmt.block_bytes)
        b = self.blocks
        if not isinstance(b, np.ndarray) or b.dtype != np.uint8 or b.shape != want:
            got = f"{b.dtype} {b.shape}" if isinstance(b, np.ndarray) else type(b).__name__
            raise ValueError(f"{self.fmt.name} weight of shape {self.shape} needs uint8 blocks {want}, got {got}")

    @classmethod
    def from_raw(cls, fmt: BlockFormat, raw: np.ndarray, shape: Tuple[int, int]) -> "QuantizedWeight":
        """From the tensor's raw bytes (1-D uint8, exactly raw_nbytes), without copying them."""
        if len(shape) != 2:
            raise ValueError(f"a {fmt.name} weight is 2-D, got shape {tuple(shape)}")
        _check_raw(fmt, raw, shape)
        rows = int(shape[0])
        return cls(fmt, raw.reshape(rows, raw_nbytes(fmt, shape[1:])), shape)

    @property
    def nbytes(self) -> int:
        return int(self.blocks.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 [out, in] (for F32, a view of the blocks)."""
        return self._rows(0, self.shape[0])

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """Rows start:stop as float32 [stop - start, in]."""
        raw = self.blocks[start:stop].reshape(-1)  # rows are contiguous in the file: a view
        return dequantize(self.fmt, raw, (stop - start, self.shape[1]))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (1-D integers, each in 0..out-1) as float32 [len(ids), in], dequantizing only those
        rows: an embedding lookup in a token table kept in its file format."""
        ids = np.asarray(ids)
        n_rows = self.shape[0]
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise ValueError(f"rows of a {self.fmt.name} weight need 1-D integer ids, got {ids.dtype} {ids.shape}")
        bad = ids[(ids < 0) | (ids >= n_rows)]
        if bad.size:
            raise ValueError(f"row id {int(bad[0])} is out of range for a {self.fmt.name} weight of "
                             f"{n_rows} rows")
        raw = self.blocks[ids.astype(np.intp)].reshape(-1)  # [n, row_bytes] gathered, then flat
        return dequantize(self.fmt, raw, (len(ids), self.shape[1]))

    def matmul(self, x: np.ndarray, decode: Optional[Callable[[int, int, np.ndarray], None]] = None,
               scratch: Optional[np.ndarray] = None) -> np.ndarray:
        """x [T, in] -> x @ W.T [T, out] float32, dequantizing a bounded chunk of rows at a time and
        multiplying by it with BLAS. decode(start, stop, out) writes rows start:stop dequantized into `out`
        (NumPy's dequantizer unless given: matmul_kernels passes its C one); scratch, float32 of at least
        one row, holds the chunk (one of _CHUNK_VALUES is made unless given)."""
        x = np.asarray(x, dtype=np.float32)
        n_out, n_in = self.shape
        if x.ndim != 2 or x.shape[1] != n_in:
            raise ValueError(f"matmul by a {self.fmt.name} weight {self.shape} needs x [T, {n_in}], got {x.shape}")
        if self.fmt.name == "F32":
            return x @ self._rows(0, n_out).T
        if decode is None:
            def decode(start: int, stop: int, out: np.ndarray) -> None:
                _dequantize_into(self.fmt, self.blocks[start:stop].reshape(-1), out)
        if scratch is None:
            scratch = np.empty(_CHUNK_VALUES, np.float32)
        step = max(1, min(n_out, scratch.size // max(1, n_in)))
        if step >= n_out:   # one chunk: BLAS writes y itself
            w = scratch[:n_out * n_in].reshape(n_out, n_in)
            decode(0, n_out, w)
            return x @ w.T
        y = np.empty((x.shape[0], n_out), np.float32)
        for start in range(0, n_out, step):
            stop = min(n_out, start + step)
            w = scratch[:(stop - start) * n_in].reshape(stop - start, n_in)
            decode(start, stop, w)
            np.matmul(x, w.T, out=y[:, start:stop])
        return y
