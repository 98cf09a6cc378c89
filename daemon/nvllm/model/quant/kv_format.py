"""The formats a KV page pool stores keys and values in (`cache.dtype`): f32, f16, bf16 and q8_0.

Each is a GGUF block format (model/quant/formats.py) applied to one head's hd values: f16 and bf16
halve the pool, q8_0 (blocks of 32 int8 values and an fp16 scale, as llama.cpp's `-ctk q8_0`) takes
34 bytes per 32 values. The pool's element type names its format: float32, float16, uint16 (bf16) or
the Q8_0 block record, one of them per head dimension hd/32. The C kernels (csrc/ops.c) write and read
each in place; `encode` and `decode` are their NumPy twins, and `encode` gives the same bits as the C
write (tests/model/kernels/test_kv_formats.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import BLOCK_DTYPES, FORMATS, BlockFormat
from nvllm.model.quant.quantize import quantize

_BY_NAME = {f.name: f for f in FORMATS.values()}


@dataclass(frozen=True)
class KVFormat:
    name: str            # the setting's value: "f32", "f16", "bf16", "q8_0"
    block: BlockFormat   # its GGUF block format; the C kernels take block.ggml_type
    dtype: np.dtype      # the pool's element type

    @property
    def code(self) -> int:
        return self.block.ggml_type

    @property
    def per_element(self) -> int:
        """Values per pool element: 32 for q8_0's blocks, 1 for the float types."""
        return self.block.block_elems

    def head_bytes(self, head_dim: int) -> int:
        """Bytes of one head's keys (or values) of one token."""
        return head_dim // self.per_element * self.block.block_bytes

    def check_head_dim(self, head_dim: int) -> None:
        if head_dim % self.per_element:
            raise ValueError(f"cache.dtype={self.name!r} stores blocks of {self.per_element} values, which "
                             f"do not divide the model's head size {head_dim}: take f16 or f32")

    def encode(self, x: np.ndarray) -> np.ndarray:
        """float32 [..., hd] -> the pool's elements [..., hd / per_element], as csrc/ops.c writes them
        (the weight quantizers' arithmetic: model/quant/quantize.py)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.name == "f32":
            return x
        raw = quantize(self.block, x.reshape(-1, x.shape[-1]))
        return raw.view(self.dtype).reshape(x.shape[:-1] + (x.shape[-1] // self.per_element,))

    def decode(self, e: np.ndarray) -> np.ndarray:
        """The pool's elements [..., n] -> float32 [..., n * per_element] (a view for f32)."""
        if self.name == "f32":
            return e
        e = np.ascontiguousarray(e)
        raw = e.reshape(-1).view(np.uint8)
        shape = e.shape[:-1] + (e.shape[-1] * self.per_element,)
        return dequantize(self.block, raw, shape)

    def round_trip(self, x: np.ndarray) -> np.ndarray:
        """x as the pool gives it back: what attention reads for keys and values it has just written."""
        return x if self.name == "f32" else self.decode(self.encode(x))


FORMATS_BY_NAME: dict[str, KVFormat] = {
    "f32": KVFormat("f32", _BY_NAME["F32"], np.dtype(np.float32)),
    "f16": KVFormat("f16", _BY_NAME["F16"], np.dtype(np.float16)),
    "bf16": KVFormat("bf16", _BY_NAME["BF16"], np.dtype(np.uint16)),
    "q8_0": KVFormat("q8_0", _BY_NAME["Q8_0"], BLOCK_DTYPES["Q8_0"]),
}
NAMES = tuple(FORMATS_BY_NAME)
F32 = FORMATS_BY_NAME["f32"]


def by_name(name: str) -> KVFormat:
    if name not in FORMATS_BY_NAME:
        raise ValueError(f"cache.dtype: need one of {', '.join(NAMES)} (or auto), got {name!r}")
    return FORMATS_BY_NAME[name]


def of_pool(pool: np.ndarray) -> KVFormat:
    """The format a pool's element type names (ValueError for any other type)."""
    for f in FORMATS_BY_NAME.values():
        if pool.dtype == f.dtype:
            return f
    raise ValueError(f"kv_pool: need elements of float32, float16, uint16 (bf16) or Q8_0 blocks, got {pool.dtype}")
