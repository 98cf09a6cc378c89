"""A matrix repacked into panels of 8 rows for the kernels of kernels/csrc/dot_*.c (integer dot products;
F16 and BF16 in float): kernels/csrc/packed.h's layout, and its NumPy twin (what kernels/csrc/pack.c is
tested against).

A panel holds 8 rows block by block: a strip per block of a row, each field of the 8 rows' blocks (d,
m, qh, qs, scales, ...) interleaved in chunks of min(4, field bytes), so a SIMD lane of 32 bits is one
row's four consecutive bytes. The bytes are the file's, rearranged (rows padded to a whole panel with
zero blocks); `unpack_twin` gives the blocks back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvllm.model.quant.blocks import BlockMatrix
from nvllm.model.quant.formats import BlockFormat

PANEL = 8

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
    "F16": ((0, 2),),    # one value a block: a strip is the 8 rows' values at one k, side by side
    "BF16": ((0, 2),),
}


def packable(fmt: BlockFormat) -> bool:
    return fmt.name in FIELDS


@dataclass(eq=False)
class PackedMatrix:
    """W [out, in] of format `fmt` in panels of PANEL rows: `data` uint8 [panels * nb * PANEL * block_bytes]."""

    fmt: BlockFormat
    data: np.ndarray
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        self.shape = (int(self.shape[0]), int(self.shape[1]))
        if not packable(self.fmt):
            raise ValueError(f"w: {self.fmt.name} is not packed; the packed formats are {', '.join(FIELDS)}")
        rows, n_in = self.shape
        if n_in % self.fmt.block_elems:
            raise ValueError(f"w: {self.fmt.name} rows of {n_in} values are not whole blocks of {self.fmt.block_elems}")
        want = self.panels * PANEL * self.row_bytes
        d = self.data
        if not isinstance(d, np.ndarray) or d.dtype != np.uint8 or d.shape != (want,) or not d.flags.c_contiguous:
            got = f"{d.dtype} {d.shape}" if isinstance(d, np.ndarray) else type(d).__name__
            raise ValueError(f"packed {self.fmt.name} weight of shape {self.shape} needs uint8 ({want},), got {got}")

    @property
    def panels(self) -> int:
        return -(-self.shape[0] // PANEL)

    @property
    def row_bytes(self) -> int:
        return self.shape[1] // self.fmt.block_elems * self.fmt.block_bytes

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def check_blocks(w: BlockMatrix) -> None:
    if not packable(w.fmt):
        raise ValueError(f"w: {w.fmt.name} is not packed; the packed formats are {', '.join(FIELDS)}")


def pack_twin(w: BlockMatrix) -> np.ndarray:
    """The packed bytes of w in NumPy: the reference for pack.c."""
    check_blocks(w)
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


def unpack_twin(pm: PackedMatrix, start: int, stop: int) -> np.ndarray:
    """Rows start .. stop of pm as GGUF blocks [stop - start, row bytes], in NumPy."""
    bb, nb = pm.fmt.block_bytes, pm.shape[1] // pm.fmt.block_elems
    out = np.empty((pm.panels * PANEL, nb * bb), np.uint8)
    strips = pm.data.reshape(pm.panels, nb, PANEL * bb)
    at = 0
    for offset, size in FIELDS[pm.fmt.name]:
        g = min(4, size)
        field = strips[:, :, at:at + PANEL * size].reshape(pm.panels, nb, size // g, PANEL, g)
        out.reshape(pm.panels, PANEL, nb, bb)[:, :, :, offset:offset + size] = (
            field.transpose(0, 3, 1, 2, 4).reshape(pm.panels, PANEL, nb, size))
        at += PANEL * size
    return out[start:stop].copy()
