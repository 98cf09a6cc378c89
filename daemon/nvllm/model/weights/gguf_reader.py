"""The GGUF header, read by a small bounded reader that checks every count, length, type, name, shape and
offset against the bytes the file really holds before anything is allocated from what the header claims:
a hostile or broken file gets one GGUFError line naming the file and what is wrong, never a crash or a
huge allocation."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.model.quant.formats import UnsupportedTensorType, block_format, raw_nbytes


class GGUFError(ValueError):
    """The GGUF is broken, hostile or holds something nvllm does not handle; the message says what."""



GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4          # GGML_MAX_DIMS
MAX_NAME_BYTES = 64   # GGML_MAX_NAME: llama.cpp refuses longer tensor names too
MAX_KEY_BYTES = 65535
MAX_NESTING = 4       # arrays of arrays: deeper than this is no model file

# GGUF value type -> (name, little-endian NumPy scalar type or None for string/array)
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("uint8", "<u1"), 1: ("int8", "<i1"), 2: ("uint16", "<u2"), 3: ("int16", "<i2"),
    4: ("uint32", "<u4"), 5: ("int32", "<i4"), 6: ("float32", "<f4"), 7: ("bool", "<u1"),
    10: ("uint64", "<u8"), 11: ("int64", "<i8"), 12: ("float64", "<f8"),
}
# Fewest bytes a tensor info and a key/value pair can take: counts above what is left are lies.
_MIN_TENSOR_INFO = 8 + 1 + 4 + 8 + 4 + 8
_MIN_KV = 8 + 1 + 4 + 1


@dataclass(frozen=True)
class SkippedStrings:
    """An array of strings checked (every length inside the file, every string UTF-8) but not decoded: a
    vocabulary's 150k tokens and merges are 30 MiB of Python objects, which planning from the header never
    reads (read_header(..., strings=False))."""
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]   # NumPy order (GGUF's ne reversed): [rows, row length]
    offset: int              # from the start of the data section


class _Reader:
    """Reads the header from the mapped bytes; every read is checked against the bytes left."""

    def __init__(self, buf: memoryview, path: Path, strings: bool = True) -> None:
        self.buf, self.path, self.pos = buf, path, 0
        self.strings = strings   # decode arrays of strings (else SkippedStrings)

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.left():
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos} but the file ends "
                            f"{self.left()} bytes later (truncated or corrupt)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "little")

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.uint(8, f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit})")
        raw = self.take(n, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            name, dt = _SCALARS[vtype]
            v = np.frombuffer(self.take(np.dtype(dt).itemsize, what), dtype=dt)[0]
            return bool(v) if name == "bool" else v.item()
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            return self.array(what, depth)
        raise self.fail(f"{what} has unknown value type {vtype}")

    def array(self, what: str, depth: int) -> list[Any] | SkippedStrings:
        if depth >= MAX_NESTING:
            raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
        etype = self.uint(4, f"the element type of {what}")
        n = self.uint(8, f"the length of {what}")
        if etype in _SCALARS:
            name, dt = _SCALARS[etype]
            size = np.dtype(dt).itemsize
            if n > self.left() // size:
                raise self.fail(f"{what}: array of {n} {name} values, but only {self.left()} bytes are left "
                                "(truncated or corrupt)")
            values = np.frombuffer(self.take(n * size, what), dtype=dt)
            return [bool(v) for v in values] if name == "bool" else values.tolist()
        least = {_STRING: 8, _ARRAY: 12}.get(etype)
        if least is None:
            raise self.fail(f"{what}: array of unknown value type {etype}")
        if n > self.left() // least:
            raise self.fail(f"{what}: array of {n} elements, but only {self.left()} bytes are left "
                            "(truncated or corrupt)")
        if etype == _STRING and not self.strings:
            for i in range(n):
                self.string(f"{what}[{i}]")   # checked as ever, and dropped at once
            return SkippedStrings(n)
        return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(n)]


def read_header(buf: memoryview, path: Path, strings: bool = True) -> tuple[dict[str, Any], list[TensorInfo], int]:
    """metadata, tensor infos and the data section's offset, all checked against the file's size; with strings
    False, each array of strings is only checked, a SkippedStrings of its length (a vocabulary's tokens and
    merges: planning needs their count at most)."""
    r = _Reader(buf, path, strings)
    magic = bytes(r.take(4, "the magic"))
    if magic != GGUF_MAGIC:
        raise r.fail(f"not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
    version = r.uint(4, "the version")
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"GGUF version {version} is not supported (supported: 2, 3, little-endian)")
    n_tensors = r.uint(8, "the tensor count")
    n_kv = r.uint(8, "the key/value count")
    if n_kv > r.left() // _MIN_KV:
        raise r.fail(f"claims {n_kv} metadata keys, more than its {len(buf)} bytes can hold "
                     "(truncated or corrupt)")
    if n_tensors > r.left() // _MIN_TENSOR_INFO:
        raise r.fail(f"claims {n_tensors} tensors, more than its {len(buf)} bytes can hold "
                     "(truncated or corrupt)")

    metadata: dict[str, Any] = {}
    types: dict[str, int] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}", MAX_KEY_BYTES)
        vtype = r.uint(4, f"the type of {key!r}")
        if key in metadata:
            raise r.fail(f"metadata key {key!r} appears twice")
        metadata[key] = r.value(vtype, f"metadata {key!r}")
        types[key] = vtype

    infos: list[TensorInfo] = []
    seen = set()
    for i in range(n_tensors):
        name = r.string(f"the name of tensor #{i}", MAX_NAME_BYTES)
        if not name:
            raise r.fail(f"tensor #{i} has an empty name")
        if name in seen:
            raise r.fail(f"tensor {name!r} appears twice")
        seen.add(name)
        n_dims = r.uint(4, f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
        ne = [r.uint(8, f"the dimensions of {name!r}") for _ in range(n_dims)]
        if any(n == 0 for n in ne):
            raise r.fail(f"tensor {name!r} has an empty dimension {ne}")
        ggml_type = r.uint(4, f"the type of {name!r}")
        offset = r.uint(8, f"the data offset of {name!r}")
        infos.append(TensorInfo(name, ggml_type, tuple(reversed(ne)), offset))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in metadata and types["general.alignment"] != 4:
        raise r.fail("general.alignment is not a uint32")
    if not (isinstance(alignment, int) and alignment > 0 and alignment & (alignment - 1) == 0):
        raise r.fail(f"general.alignment {alignment} is not a power of two")
    data_start = -(-r.pos // alignment) * alignment
    _check_tensor_data(infos, data_start, alignment, len(buf), r)
    return metadata, infos, data_start


def _check_tensor_data(infos: list[TensorInfo], data_start: int, alignment: int, size: int,
                       r: _Reader) -> None:
    """Every tensor's type is one nvllm reads, and its bytes are aligned and inside the file."""
    for t in infos:
        try:
            fmt = block_format(t.ggml_type, t.name)
            nbytes = raw_nbytes(fmt, t.shape)
        except UnsupportedTensorType as e:
            raise r.fail(str(e)) from None
        except ValueError as e:   # a row that is not a whole number of blocks
            raise r.fail(f"tensor {t.name!r}: {e}") from None
        if t.offset % alignment:
            raise r.fail(f"tensor {t.name!r}: data offset {t.offset} is not a multiple of the "
                         f"alignment {alignment}")
        if data_start + t.offset + nbytes > size:
            raise r.fail(f"tensor {t.name!r}: its {nbytes} bytes at offset {data_start + t.offset} run "
                         f"past the end of the file ({size} bytes: truncated or corrupt)")


