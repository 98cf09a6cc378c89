"""Weights repacked at load into panels of 8 rows, and the integer kernels that multiply by them
(csrc/packed.h has the layout and the arithmetic; csrc/pack.c, dot.c and one dot_*.c per instruction set).

`pack` turns a BlockMatrix into a PackedMatrix of the same bytes rearranged (rows padded to a whole
panel); `unpack_rows` gives blocks back, byte for byte. `pack_twin` is the layout in NumPy, what the C
packing is tested against; kernels/qdot.py's `matmul` (with `qmax=EXACT_QMAX` for exact activations) is
what every kernel computes, bit for bit. `matmul` here runs one variant on one thread, for the tests and
the bench; the model's path goes through matmul.py.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from nvllm.model.kernels import matmul as _matmul
from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.formats import BlockFormat

PANEL = 8
EXACT_QMAX = 32512   # 127 * 255 + 127: x's 16-bit quants as two int8 planes, q = 255 hi + lo (packed.h)

# Each packed format's block fields (offset, bytes), in order: the twin of pack.c's pack_fields.
FIELDS: dict[str, tuple[tuple[int, int], ...]] = {
    "Q4_0": ((0, 2), (2, 16)),
    "IQ4_NL": ((0, 2), (2, 16)),
    "Q4_1": ((0, 2), (2, 2), (4, 16)),
    "Q5_0": ((0, 2), (2, 4), (6, 16)),
    "Q5_1": ((0, 2), (2, 2), (4, 4), (8, 16)),
    "Q8_0": ((0, 2), (2, 32)),
    "Q4_K": ((0, 2), (2, 2), (4, 12), (16, 128)),
    "Q5_K": ((0, 2), (2, 2), (4, 12), (16, 32), (48, 128)),
    "Q6_K": ((0, 128), (128, 64), (192, 16), (208, 2)),
    "Q2_K": ((0, 16), (16, 64), (80, 2), (82, 2)),
    "Q3_K": ((0, 32), (32, 64), (96, 12), (108, 2)),
    "IQ4_XS": ((0, 2), (2, 2), (4, 4), (8, 128)),
}
# dot.c's variant numbers (0: no integer kernel); the names of 2, 3, 5 and 6 are the instruction set's.
_KINDS = {"scalar": 1, "avx2": 2, "neon": 2, "avx512vnni": 3, "neon-dotprod": 3}

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
lib = _matmul.lib
if lib is not None:
    lib.pack_bytes.argtypes = [ctypes.c_int, _I64, _I64]
    lib.pack_bytes.restype = _I64
    lib.pack_panels.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P]
    lib.pack_panels.restype = None
    lib.unpack_rows.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _P]
    lib.unpack_rows.restype = None
    lib.dot_variants.argtypes = []
    lib.dot_variants.restype = ctypes.c_int
    lib.dot_variant_name.argtypes = [ctypes.c_int]
    lib.dot_variant_name.restype = ctypes.c_char_p
    lib.dot_x_bytes.argtypes = [ctypes.c_int, _I64, _I64]
    lib.dot_x_bytes.restype = ctypes.c_size_t
    lib.dot_quantize_x.argtypes = [ctypes.c_int, _P, _I64, _I64, _I64, _I64, _P]
    lib.dot_quantize_x.restype = None
    lib.dot_panels.argtypes = [ctypes.c_int, ctypes.c_int, _P, _I64, _I64, _I64, _P, _I64, _P, _I64, _I64]
    lib.dot_panels.restype = ctypes.c_int


@dataclass(frozen=True)
class PackedMatrix:
    """W [out, in] of format `fmt` in panels of PANEL rows: `data` uint8, panels * nb * PANEL * block_bytes."""

    fmt: BlockFormat
    shape: tuple[int, int]
    data: np.ndarray

    @property
    def panels(self) -> int:
        return -(-self.shape[0] // PANEL)


def packable(fmt: BlockFormat) -> bool:
    return fmt.name in FIELDS


def _check(w: BlockMatrix) -> None:
    if not packable(w.fmt):
        raise ValueError(f"w: {w.fmt.name} is not packed; the packed formats are {', '.join(FIELDS)}")
    rows, n_in = w.shape
    if n_in % w.fmt.block_elems:
        raise ValueError(f"w: {w.fmt.name} rows of {n_in} values are not whole blocks of {w.fmt.block_elems}")
    row_bytes = n_in // w.fmt.block_elems * w.fmt.block_bytes
    if w.blocks.dtype != np.uint8 or w.blocks.shape != (rows, row_bytes):
        raise ValueError(f"w.blocks: need uint8 [{rows}, {row_bytes}], got {w.blocks.dtype} {w.blocks.shape}")


def pack_twin(w: BlockMatrix) -> np.ndarray:
    """The packed bytes of w in NumPy (packed.h's layout): the reference for pack.c."""
    _check(w)
    rows, n_in = w.shape
    bb, nb = w.fmt.block_bytes, n_in // w.fmt.block_elems
    panels = -(-rows // PANEL)
    blocks = np.zeros((panels * PANEL, nb * bb), np.uint8)
    blocks[:rows] = w.blocks
    b = blocks.reshape(panels, PANEL, nb, bb)
    strips = []
    for offset, size in FIELDS[w.fmt.name]:
        g = min(4, size)
        field = b[:, :, :, offset:offset + size].reshape(panels, PANEL, nb, size // g, g)
        strips.append(field.transpose(0, 2, 3, 1, 4).reshape(panels, nb, PANEL * size))   # chunk, row, byte
    return np.ascontiguousarray(np.concatenate(strips, axis=2)).reshape(-1)


def pack(w: BlockMatrix) -> PackedMatrix:
    """w repacked (by pack.c; by pack_twin without the library)."""
    _check(w)
    if lib is None:
        return PackedMatrix(w.fmt, w.shape, pack_twin(w))
    rows, n_in = w.shape
    data = np.empty(lib.pack_bytes(w.fmt.ggml_type, rows, n_in), np.uint8)
    blocks = np.ascontiguousarray(w.blocks)
    lib.pack_panels(w.fmt.ggml_type, blocks.ctypes.data, rows, n_in, 0, -(-rows // PANEL), data.ctypes.data)
    return PackedMatrix(w.fmt, w.shape, data)


def unpack_rows(pm: PackedMatrix, start: int, stop: int) -> np.ndarray:
    """Rows start .. stop of W as its GGUF blocks [stop - start, row bytes], byte for byte."""
    rows, n_in = pm.shape
    if not 0 <= start <= stop <= rows:
        raise ValueError(f"rows: need 0 <= start <= stop <= {rows}, got {start}, {stop}")
    row_bytes = n_in // pm.fmt.block_elems * pm.fmt.block_bytes
    if lib is None:
        nb, bb = n_in // pm.fmt.block_elems, pm.fmt.block_bytes
        out = np.empty((-(-rows // PANEL) * PANEL, nb * bb), np.uint8)
        strips = pm.data.reshape(-1, nb, PANEL * bb)
        at = 0
        for offset, size in FIELDS[pm.fmt.name]:
            g = min(4, size)
            field = strips[:, :, at:at + PANEL * size].reshape(-1, nb, size // g, PANEL, g)
            out.reshape(-1, PANEL, nb, bb)[:, :, :, offset:offset + size] = (
                field.transpose(0, 3, 1, 2, 4).reshape(-1, PANEL, nb, size))
            at += PANEL * size
        return out[start:stop].copy()
    out = np.empty((stop - start, row_bytes), np.uint8)
    lib.unpack_rows(pm.fmt.ggml_type, pm.data.ctypes.data, n_in, start, stop, out.ctypes.data)
    return out


def variants() -> list[str]:
    """The integer variants this build runs on this CPU, by name ("-i16": exact activations)."""
    if lib is None:
        return []
    mask = lib.dot_variants()
    return [lib.dot_variant_name(v).decode() for v in range(1, 7) if mask >> v & 1]


def variant_number(name: str) -> int:
    if name not in variants():
        raise ValueError(f"variant: {name!r} does not run here (runs: {', '.join(variants()) or 'none'})")
    exact = name.endswith("-i16")
    return _KINDS[name.removesuffix("-i16")] + (3 if exact else 0)


def matmul(pm: PackedMatrix, x: np.ndarray, variant: str) -> np.ndarray:
    """x [T, in] float32 -> x @ W.T [T, out] float32 by one variant's kernels on this thread."""
    v = variant_number(variant)
    assert lib is not None   # variant_number found the variant
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, n_in = pm.shape
    if x.ndim != 2 or x.shape[1] != n_in:
        raise ValueError(f"x: need float32 [T, {n_in}], got {list(x.shape)}")
    T = x.shape[0]
    qx = np.empty(max(1, lib.dot_x_bytes(v, T, n_in)), np.uint8)
    lib.dot_quantize_x(v, x.ctypes.data, n_in, n_in, 0, T, qx.ctypes.data)
    y = np.empty((T, rows), np.float32)
    rc = lib.dot_panels(v, pm.fmt.ggml_type, pm.data.ctypes.data, n_in, 0, pm.panels, qx.ctypes.data, T,
                        y.ctypes.data, rows, rows)
    if rc:
        raise RuntimeError(f"dot_panels returned {rc}")
    return y
