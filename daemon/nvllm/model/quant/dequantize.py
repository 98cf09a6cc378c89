"""The dequantizers of the block formats: a chunk of blocks -> float32, vectorised NumPy over a chunk of
blocks at a time (never a Python loop over blocks), written from llama.cpp's block layouts and the
arithmetic of its reference dequantizers, in the same order, so they agree with them bit for bit in
float32. They are the NumPy twins of the C decoders that read the blocks in place.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nvllm.model.quant.formats import BLOCK_DTYPES, IQ4_VALUES, QK, QK_K, BlockFormat, raw_nbytes

_F16 = "<f2"

# ---------------------------------------------------------------- dequantizers
# Each kernel takes a chunk of blocks as bytes B [m, block_bytes] and writes float32 out [m, block_elems].
# The float operations keep llama.cpp's order (d * q, then + m or - dmin * m), so the results are
# bitwise those of its reference. Bit twiddling runs over the whole chunk's bytes at once (one long
# contiguous loop beats sixteen-byte strided ones), and the fields are sliced out of the result.


def _field_at(fmt: str, name: str) -> tuple[np.dtype, int]:
    """Field `name` of a block of format fmt: its dtype and its byte offset in the block."""
    fields = BLOCK_DTYPES[fmt].fields
    assert fields is not None  # every block dtype is a record
    dtype, offset = fields[name][:2]
    return dtype, offset


def _field(B: np.ndarray, fmt: str, name: str) -> np.ndarray:
    """Field `name` of every block in B [m, block_bytes], as its type: [m, count] (float16 fields [m, 1])."""
    dtype, offset = _field_at(fmt, name)
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
    qs = _field_at(fmt, "qs")[1]
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
    qs = _field_at(fmt, "qs")[1]
    runs = out.reshape(m, 4, 2, 32)  # run, nibble, byte in the run
    runs[:, :, 0] = lo[:, qs:].reshape(m, 4, 32)
    runs[:, :, 1] = hi[:, qs:].reshape(m, 4, 32)


def _k4_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def k4_parts(B: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def q6_parts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


_SHIFT2 = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Q2_K's and Q3_K's 2-bit fields of qs [m, 64] as [m, 256] uint8: two halves of 128 values; in half h,
    value 32j + l is bits 2j, 2j + 1 of qs[32h + l]."""
    m = len(qs)
    return ((qs.reshape(m, 2, 1, 32) >> _SHIFT2) & 3).reshape(m, QK_K)


def q2k_parts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q2_K chunk B [m, 84] as (q [m, 256] uint8 0..3; d * sc [m, 16] and dmin * mn [m, 16] float32, both
    exact): value i is (d * sc)[i // 16] * q[i] - (dmin * mn)[i // 16], scale byte g holding sc in its low
    nibble and mn in its high one. Also qdot.py's view of these weights."""
    scales = _field(B, "Q2_K", "scales")
    sc = (scales & 0x0F).astype(np.float32)
    mn = (scales >> 4).astype(np.float32)
    return _crumbs(_field(B, "Q2_K", "qs")), _scale(B, "Q2_K") * sc, _scale(B, "Q2_K", "dmin") * mn


def q3k_scales(scales: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes [m, 12] -> its sixteen 6-bit scales [m, 16] less 32 (int8): scale k's low four
    bits are nibble k // 8 of byte k % 8, its top two bits 2 (k // 4), 2 (k // 4) + 1 of byte 8 + k % 4."""
    m = len(scales)
    low = (scales[:, :8].reshape(m, 1, 8) >> np.array([0, 4], np.uint8)[:, None]).reshape(m, 16) & 0x0F
    high = (scales[:, 8:].reshape(m, 1, 4) >> _SHIFT2).reshape(m, 16) & 3
    out = (low | (high << 4)).astype(np.int8)
    out -= 32
    return out


def q3k_parts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A Q3_K chunk B [m, 110] as (q [m, 256] int8 in -4..3; d * (sc - 32) [m, 16] float32, exact): value i is
    (d * sc)[i // 16] * q[i]. q is the 2-bit field as Q2_K's, less 4 where value i's bit of hmask is clear
    (bit i // 32 of hmask[i % 32]). Also qdot.py's view of these weights."""
    m = len(B)
    q = _crumbs(_field(B, "Q3_K", "qs")).astype(np.int8)
    hmask = _field(B, "Q3_K", "hmask")
    high = np.unpackbits(hmask, axis=1, bitorder="little").reshape(m, 32, 8).transpose(0, 2, 1)  # bit, l
    q.reshape(m, 8, 32)[...] -= ((1 - high) << 2).astype(np.int8)
    return q, _scale(B, "Q3_K") * q3k_scales(_field(B, "Q3_K", "scales")).astype(np.float32)


def _iq4_values(qs: np.ndarray) -> np.ndarray:
    """IQ4 quants qs [m, 16n] as table values [m, 32n] int8: each run of 16 bytes holds 32 values, the
    low nibbles then the high ones."""
    m = len(qs)
    runs = qs.reshape(m, -1, 1, 16) >> np.array([0, 4], np.uint8)[:, None]
    return IQ4_VALUES[(runs & 0x0F).reshape(m, -1)]


def iq4nl_parts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An IQ4_NL chunk B [m, 18] as (q [m, 32] int8 table values; d [m, 1] float32): value j is d * q[j]."""
    return _iq4_values(_field(B, "IQ4_NL", "qs")), _scale(B, "IQ4_NL")


def iq4xs_scales(B: np.ndarray) -> np.ndarray:
    """IQ4_XS's eight 6-bit sub-block scales less 32 [m, 8] int8: scale s's low four bits are nibble s % 2
    of scales_l[s // 2], its top two bits 2s, 2s + 1 of scales_h."""
    m = len(B)
    low = (_field(B, "IQ4_XS", "scales_l").reshape(m, 4, 1) >> np.array([0, 4], np.uint8)).reshape(m, 8) & 0x0F
    high = (_field(B, "IQ4_XS", "scales_h") >> np.arange(0, 16, 2, dtype=np.uint16)).astype(np.uint8) & 3
    out = (low | (high << 4)).astype(np.int8)
    out -= 32
    return out


def iq4xs_parts(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An IQ4_XS chunk B [m, 136] as (q [m, 256] int8 table values; d * (sc - 32) [m, 8] float32, exact):
    sub-block s (32 values) is (d * sc)[s] * q, its quants the 16 bytes qs[16s:16s+16] as IQ4_NL's.
    Also qdot.py's view of these weights."""
    return _iq4_values(_field(B, "IQ4_XS", "qs")), _scale(B, "IQ4_XS") * iq4xs_scales(B).astype(np.float32)


def _deq_q2_k(B: np.ndarray, out: np.ndarray) -> None:
    q, d, dm = q2k_parts(B)
    out[...] = q
    sub = out.reshape(len(B), 16, 16)
    sub *= d[:, :, None]
    sub -= dm[:, :, None]


def _deq_q3_k(B: np.ndarray, out: np.ndarray) -> None:
    q, d = q3k_parts(B)
    out[...] = q
    out.reshape(len(B), 16, 16)[...] *= d[:, :, None]


def _deq_iq4_nl(B: np.ndarray, out: np.ndarray) -> None:
    q, d = iq4nl_parts(B)
    out[...] = q
    out *= d


def _deq_iq4_xs(B: np.ndarray, out: np.ndarray) -> None:
    q, d = iq4xs_parts(B)
    out[...] = q
    out.reshape(len(B), 8, 32)[...] *= d[:, :, None]


def _deq_f16(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = B.view(_F16)


def _deq_bf16(B: np.ndarray, out: np.ndarray) -> None:
    bits = out.view(np.uint32)
    bits[...] = B.view("<u2")
    bits <<= 16  # bfloat16 is the top half of a float32


def _deq_f32(B: np.ndarray, out: np.ndarray) -> None:
    out[...] = B.view("<f4")


_KERNELS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "F32": _deq_f32, "F16": _deq_f16, "BF16": _deq_bf16,
    "Q4_0": _deq_q4_0, "Q4_1": _deq_q4_1, "Q5_0": _deq_q5_0, "Q5_1": _deq_q5_1, "Q8_0": _deq_q8_0,
    "Q2_K": _deq_q2_k, "Q3_K": _deq_q3_k, "Q4_K": _deq_q4_k, "Q5_K": _deq_q5_k, "Q6_K": _deq_q6_k,
    "IQ4_NL": _deq_iq4_nl, "IQ4_XS": _deq_iq4_xs,
}

_CHUNK_BYTES = 1 << 17  # bytes of blocks per kernel call: its temporaries stay in cache


def dequantize_into(fmt: BlockFormat, raw: np.ndarray, out: np.ndarray) -> None:
    """Raw bytes (1-D uint8, whole blocks) -> out (float32, contiguous, as many values), a chunk at a time."""
    n_blocks = raw.size // fmt.block_bytes
    blocks = raw.reshape(n_blocks, fmt.block_bytes)
    values = out.reshape(n_blocks, fmt.block_elems)
    kernel = _KERNELS[fmt.name]
    # the float types make no temporaries: one pass
    step = max(1, n_blocks if fmt.block_elems == 1 else _CHUNK_BYTES // fmt.block_bytes)
    for start in range(0, n_blocks, step):
        kernel(blocks[start:start + step], values[start:start + step])


def check_raw(fmt: BlockFormat, raw: np.ndarray, shape: tuple[int, ...]) -> None:
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 1:
        what = f"{raw.dtype} {raw.shape}" if isinstance(raw, np.ndarray) else type(raw).__name__
        raise ValueError(f"{fmt.name} data must be a 1-D uint8 array, got {what}")
    want = raw_nbytes(fmt, shape)
    if raw.size != want:
        raise ValueError(f"{fmt.name} tensor of shape {tuple(shape)} takes {want} bytes, got {raw.size}")


def dequantize(fmt: BlockFormat, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor's values as float32 [*shape] from its raw bytes (1-D uint8, exactly raw_nbytes).

    F32 comes back as a view of `raw` (read-only when `raw` maps a file); the others are computed.
    """
    check_raw(fmt, raw, shape)
    shape = tuple(int(n) for n in shape)
    if fmt.name == "F32":
        return raw.view("<f4").reshape(shape)
    out = np.empty(shape, np.float32)
    dequantize_into(fmt, raw, out)
    return out

