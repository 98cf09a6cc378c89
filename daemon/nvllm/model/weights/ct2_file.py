"""CTranslate2's model.bin, mapped and read by a bounded reader: every count, length, rank, dimension and
payload is checked against the bytes the file really holds before anything is made from it, so a hostile or
broken file is one ModelLoadError line naming the file and what is wrong, never a crash or a big allocation.

The layout (CTranslate2's python/ctranslate2/specs/model_spec.py writes it, src/models/model.cc reads it;
little-endian, nothing aligned): uint32 binary version; from version 2 the spec's name (a string) and its
uint32 revision; uint32 variable count, then each variable: its name, uint8 rank, rank uint32 dimensions,
from version 4 a uint8 type id (float32, int8, int16, int32, float16, bfloat16) and a uint32 byte count
(before: a uint8 item size and a uint32 element count), then its bytes; from version 3 a uint32 alias count
and (alias, variable) name pairs. A string is a uint16 length counting its closing NUL, then its bytes.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nvllm.model.config import ModelLoadError
from nvllm.model.quant.formats import FORMATS, QK, BlockFormat
from nvllm.model.weights.bounded_reader import BoundedReader, read_mapped

LATEST_BINARY_VERSION = 6
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")   # by type id (types.h's DataType)
_NUMPY = {"float32": "<f4", "int8": "i1", "int16": "<i2", "int32": "<i4", "float16": "<f2", "bfloat16": "<u2"}
_BY_ITEM_SIZE = {4: "float32", 2: "int16", 1: "int8"}   # versions 1 to 3 stored an item size, not a type
MAX_NAME_BYTES = 1024      # the longest of a real model is under 80
MAX_RANK = 8               # real variables have at most 4 dimensions
MAX_VARIABLES = 1 << 16    # large-v3 has about 1300
_MIN_VARIABLE = 2 + 2 + 1 + 1 + 4   # a one-byte name, rank 0, its type and byte count
_MIN_ALIAS = 2 * (2 + 2)
# float variables kept in their own storage (F32, F16, BF16: GGUF's type ids)
_FLOAT_FORMATS = {"float32": FORMATS[0], "float16": FORMATS[1], "bfloat16": FORMATS[30]}

Tensor = tuple[BlockFormat, np.ndarray, tuple[int, ...]]   # (format, raw uint8 bytes, shape)


@dataclass
class CT2Variable:
    name: str
    dtype: str                 # one of DTYPES
    shape: tuple[int, ...]
    raw: np.ndarray            # its bytes: a uint8 view of the mapping

    def values(self) -> np.ndarray:
        """The values as stored (bfloat16 as float32), a view where the dtype allows."""
        if self.dtype == "bfloat16":
            return (self.raw.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(self.shape)
        return self.raw.view(_NUMPY[self.dtype]).reshape(self.shape)


@dataclass
class CT2File:
    """A checked model.bin: its spec, every variable as a view of the mapping, and the aliases."""
    path: Path
    binary_version: int
    spec: str
    revision: int
    variables: dict[str, CT2Variable]
    aliases: dict[str, str]              # alias -> the variable it names
    mapping: mmap.mmap | None = field(default=None, repr=False)

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {what}")

    def __contains__(self, name: str) -> bool:
        return name in self.variables or name in self.aliases

    def variable(self, name: str) -> CT2Variable:
        """A variable by its name or an alias of it."""
        v = self.variables.get(self.aliases.get(name, name))
        if v is None:
            raise self.fail(f"variable {name!r} is missing")
        return v

    def scalar(self, name: str) -> int | float:
        """A scalar variable's value (the spec's flags and head counts)."""
        v = self.variable(name)
        if v.shape != ():
            raise self.fail(f"variable {name!r} has shape {list(v.shape)}, expected a scalar")
        return v.values().item()

    def tensor(self, name: str) -> Tensor:
        """A weight as nvllm's storage: float32, float16 and bfloat16 as stored; int8 with its per-row
        `<name>_scale` as Q8_0 blocks (the int8 values kept, each row's 1/scale rounded to float16 as Q8_0
        holds it), or as float32 where a row is not whole blocks; int16 with its scale as float32."""
        v = self.variable(name)
        if v.dtype in _FLOAT_FORMATS:
            return _FLOAT_FORMATS[v.dtype], v.raw, v.shape
        if v.dtype not in ("int8", "int16") or len(v.shape) < 1:
            raise self.fail(f"variable {name!r} is {v.dtype} {list(v.shape)}, not a weight")
        scale = self._scale(name, v)
        q = v.values().reshape(v.shape[0], -1)
        if v.dtype == "int8" and len(v.shape) == 2 and v.shape[1] % QK == 0:
            return FORMATS[8], _q8_0(q, scale), v.shape
        values = (q.astype(np.float32) / scale[:, None]).reshape(v.shape)
        return FORMATS[0], values.reshape(-1).view(np.uint8), v.shape

    def _scale(self, name: str, v: CT2Variable) -> np.ndarray:
        """The scale of a quantized variable, one per row (an int16 variable's single one repeated)."""
        scale_name = self.aliases.get(name, name) + "_scale"
        if scale_name not in self.variables:
            raise self.fail(f"variable {name!r} is {v.dtype} but {scale_name!r} is missing")
        s = self.variables[scale_name]
        if s.dtype not in _FLOAT_FORMATS or s.shape not in ((), (v.shape[0],)):
            raise self.fail(f"{scale_name!r} is {s.dtype} {list(s.shape)}, expected float [{v.shape[0]}] or a scalar")
        values = np.broadcast_to(s.values().astype(np.float32), (v.shape[0],))
        if not np.all(np.isfinite(values)) or np.any(values == 0):
            raise self.fail(f"{scale_name!r} holds a zero or non-finite scale")
        return values

    def close(self) -> None:
        """Unmap the file, unless a view of it is still referenced (a traceback's): the GC unmaps it then."""
        self.variables = {}
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:
                pass

    def release(self, raw: np.ndarray) -> None:
        """Drop a view's mapped pages from the resident set once copied (the page cache keeps them)."""
        release_mapped(self.mapping, raw)


def release_mapped(mapping: mmap.mmap | None, raw: np.ndarray) -> None:
    """madvise(DONTNEED) the pages of `raw` when it is a view of `mapping`; anything else is left alone."""
    if mapping is None or not hasattr(mapping, "madvise") or raw.size == 0 or mapping.closed:
        return
    base = np.frombuffer(mapping, np.uint8, count=0).__array_interface__["data"][0]
    begin = raw.__array_interface__["data"][0] - base
    if begin < 0 or begin + raw.size > len(mapping):
        return
    start = begin - begin % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_DONTNEED, start, begin + raw.size - start)


def _q8_0(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int8 rows [rows, cols] whose value is q / scale[row] as Q8_0 blocks (d = 1/scale as float16, the
    32 quants as they are), raw bytes."""
    rows, cols = q.shape
    blocks = np.empty((rows, cols // QK, 2 + QK), np.uint8)
    d = (1.0 / scale).astype("<f2").view(np.uint8).reshape(rows, 1, 2)
    blocks[:, :, :2] = d
    blocks[:, :, 2:] = q.reshape(rows, cols // QK, QK).view(np.uint8)
    return blocks.reshape(-1)


class _Reader(BoundedReader):
    """model.bin's fields: little-endian integers and length-prefixed strings."""

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.take(size, what), "little")

    def string(self, what: str) -> str:
        n = self.uint(2, f"the length of {what}")
        if n == 0:
            raise self.fail(f"{what} has length 0 (a string counts its closing NUL)")
        if n - 1 > MAX_NAME_BYTES:
            raise self.fail(f"{what} is {n - 1} bytes long (at most {MAX_NAME_BYTES})")
        raw = bytes(self.take(n, what))
        if raw[-1] != 0:
            raise self.fail(f"{what} does not end with a NUL")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None


def open_ct2(path: str | Path) -> CT2File:
    """Map model.bin and check all of it (header, every variable's rank, dimensions, type and bytes, the
    aliases) against the file's size; the variables are views of the mapping, nothing is copied."""
    return read_mapped(Path(path), 4, "a CTranslate2 model", _Reader, _read)


def _read(r: _Reader, mm: mmap.mmap) -> CT2File:
    version = r.uint(4, "the binary version")
    if not 1 <= version <= LATEST_BINARY_VERSION:
        raise r.fail(f"binary version {version} is not a CTranslate2 model nvllm reads (1 to "
                     f"{LATEST_BINARY_VERSION}; a newer CTranslate2 wrote it, or it is no model.bin)")
    spec, revision = "", 1
    if version >= 2:
        spec = r.string("the spec name")
        revision = r.uint(4, "the spec revision")
    count = r.uint(4, "the variable count")
    if count > MAX_VARIABLES:
        raise r.fail(f"claims {count} variables (nvllm reads at most {MAX_VARIABLES})")
    if count > r.left() // _MIN_VARIABLE:
        raise r.fail(f"claims {count} variables, more than its {len(r.buf)} bytes can hold (truncated or corrupt)")
    variables: dict[str, CT2Variable] = {}
    for i in range(count):
        v = _variable(r, version, i, mm)
        if v.name in variables:
            raise r.fail(f"variable {v.name!r} appears twice")
        variables[v.name] = v
    aliases: dict[str, str] = {}
    if version >= 3:
        n = r.uint(4, "the alias count")
        if n > count or n > r.left() // _MIN_ALIAS:
            raise r.fail(f"claims {n} aliases for {count} variables in {r.left()} bytes (truncated or corrupt)")
        for i in range(n):
            alias, target = r.string(f"alias #{i}"), r.string(f"the variable of alias #{i}")
            if alias in variables or alias in aliases:
                raise r.fail(f"alias {alias!r} is also a variable's or another alias's name")
            if target not in variables:
                raise r.fail(f"alias {alias!r} names {target!r}, which the file does not hold")
            aliases[alias] = target
    return CT2File(r.path, version, spec, revision, variables, aliases, mm)


def _variable(r: _Reader, version: int, i: int, mm: mmap.mmap) -> CT2Variable:
    name = r.string(f"the name of variable #{i}")
    if not name:
        raise r.fail(f"variable #{i} has an empty name")
    rank = r.uint(1, f"the rank of {name!r}")
    if rank > MAX_RANK:
        raise r.fail(f"variable {name!r} has rank {rank} (at most {MAX_RANK})")
    shape = tuple(r.uint(4, f"the dimensions of {name!r}") for _ in range(rank))
    if any(n == 0 for n in shape):
        raise r.fail(f"variable {name!r} has an empty dimension {list(shape)}")
    if version >= 4:
        type_id = r.uint(1, f"the type of {name!r}")
        if type_id >= len(DTYPES):
            raise r.fail(f"variable {name!r} has unknown type id {type_id} (CTranslate2's are 0 to "
                         f"{len(DTYPES) - 1}: {', '.join(DTYPES)})")
        dtype = DTYPES[type_id]
        nbytes = r.uint(4, f"the byte count of {name!r}")
    else:
        item = r.uint(1, f"the item size of {name!r}")
        if item not in _BY_ITEM_SIZE:
            raise r.fail(f"variable {name!r} has item size {item} (1, 2 or 4)")
        dtype = _BY_ITEM_SIZE[item]
        nbytes = r.uint(4, f"the element count of {name!r}") * item
    want = math.prod(shape) * np.dtype(_NUMPY[dtype]).itemsize
    if nbytes != want:
        raise r.fail(f"variable {name!r}: {nbytes} bytes for {dtype} {list(shape)}, which takes {want}")
    at = r.pos
    r.take(nbytes, f"the data of {name!r}")
    return CT2Variable(name, dtype, shape, np.frombuffer(mm, np.uint8, count=nbytes, offset=at))
