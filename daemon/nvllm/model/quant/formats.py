"""GGUF weight types: the block formats llama.cpp stores tensors in, what each block holds and the
arithmetic of a tensor's size in them.

A tensor is rows of blocks along its last axis; each block holds `block_elems` values in `block_bytes`
bytes (little-endian, as in the file), laid out as llama.cpp's ggml-common.h says (BLOCK_DTYPES).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    BlockFormat("Q2_K", 10, QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    BlockFormat("Q3_K", 11, QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    BlockFormat("Q4_K", 12, QK_K, 4 + 12 + QK_K // 2),
    BlockFormat("Q5_K", 13, QK_K, 4 + 12 + QK_K // 8 + QK_K // 2),
    BlockFormat("Q6_K", 14, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    BlockFormat("IQ4_NL", 20, QK, 2 + QK // 2),
    BlockFormat("IQ4_XS", 23, QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),
    BlockFormat("BF16", 30, 1, 2),
]
FORMATS: dict[int, BlockFormat] = {f.ggml_type: f for f in _FORMAT_LIST}

# One block as a NumPy record, field by field in file order (ggml-common.h's block_* structs).
_F16 = "<f2"
BLOCK_DTYPES: dict[str, np.dtype] = {
    "Q4_0": np.dtype([("d", _F16), ("qs", "u1", QK // 2)]),
    "Q4_1": np.dtype([("d", _F16), ("m", _F16), ("qs", "u1", QK // 2)]),
    "Q5_0": np.dtype([("d", _F16), ("qh", "u1", 4), ("qs", "u1", QK // 2)]),
    "Q5_1": np.dtype([("d", _F16), ("m", _F16), ("qh", "u1", 4), ("qs", "u1", QK // 2)]),
    "Q8_0": np.dtype([("d", _F16), ("qs", "i1", QK)]),
    "Q2_K": np.dtype([("scales", "u1", QK_K // 16), ("qs", "u1", QK_K // 4), ("d", _F16), ("dmin", _F16)]),
    "Q3_K": np.dtype([("hmask", "u1", QK_K // 8), ("qs", "u1", QK_K // 4), ("scales", "u1", 12), ("d", _F16)]),
    "Q4_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qs", "u1", QK_K // 2)]),
    "Q5_K": np.dtype([("d", _F16), ("dmin", _F16), ("scales", "u1", 12), ("qh", "u1", QK_K // 8),
                      ("qs", "u1", QK_K // 2)]),
    "Q6_K": np.dtype([("ql", "u1", QK_K // 2), ("qh", "u1", QK_K // 4), ("scales", "i1", QK_K // 16),
                      ("d", _F16)]),
    "IQ4_NL": np.dtype([("d", _F16), ("qs", "u1", QK // 2)]),
    "IQ4_XS": np.dtype([("d", _F16), ("scales_h", "<u2"), ("scales_l", "u1", QK_K // 64), ("qs", "u1", QK_K // 2)]),
}

# IQ4_NL's and IQ4_XS's 4-bit quants index this non-linear table (ggml-common.h's kvalues_iq4nl).
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


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


def rows_and_blocks(fmt: BlockFormat, shape: tuple[int, ...]) -> tuple[int, int]:
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


def raw_nbytes(fmt: BlockFormat, shape: tuple[int, ...]) -> int:
    """Bytes the data of a tensor of `shape` takes in `fmt`."""
    rows, blocks = rows_and_blocks(fmt, shape)
    return rows * blocks * fmt.block_bytes

