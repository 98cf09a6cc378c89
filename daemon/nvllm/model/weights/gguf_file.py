"""A llama.cpp GGUF file, mapped and checked: `open_gguf` maps it and checks its header (gguf_reader.py)
and every tensor's type, shape and bytes before anything is allocated from it, whatever the model;
`read_gguf` then reads a decoder's hyperparameters (gguf_config.py) and checks its tensors against them
(Llama, Qwen2, Qwen3, Phi-3, SmolLM3, Gemma 3), an encoder's are gguf_encoder.py's. The weights are laid
out from it by gguf_weights.py. The file is memory-mapped, never copied whole.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.model.config import ModelConfig
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import BlockFormat, block_format, raw_nbytes
from nvllm.model.weights.gguf_config import Meta, check_tensors, gguf_config, longrope_scaling, rope_scaling
from nvllm.model.weights.gguf_names import ROPE_FACTORS, ROPE_FREQS
from nvllm.model.weights.gguf_reader import GGUFError, TensorInfo, read_header

Tensor = tuple[BlockFormat, np.ndarray, tuple[int, ...]]   # (format, raw uint8 view of the mapping, shape)


@dataclass
class GGUFFile:
    """A GGUF whose header and tensor bytes are checked: its metadata, its tensors' infos, and each tensor
    as a view of the mapping (nothing copied)."""
    path: Path
    metadata: dict[str, Any]
    infos: dict[str, TensorInfo]
    tensors: dict[str, Tensor]
    mapping: mmap.mmap | None = field(repr=False)   # the file, mapped read-only (None: not a file)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def release(self, raw: np.ndarray) -> None:
        """Drop a tensor's mapped pages from the resident set once copied (the page cache keeps them)."""
        if self.mapping is None or not hasattr(self.mapping, "madvise") or raw.size == 0:
            return
        base = np.frombuffer(self.mapping, np.uint8, count=0).__array_interface__["data"][0]
        begin = raw.__array_interface__["data"][0] - base
        start = begin - begin % mmap.PAGESIZE
        self.mapping.madvise(mmap.MADV_DONTNEED, start, begin + raw.size - start)

    def close(self) -> None:
        """Unmap the file, unless a view of it is still referenced (a traceback's): the GC unmaps it then."""
        if self.mapping is None:
            return
        try:
            self.mapping.close()
        except BufferError:
            pass


@dataclass
class GGUFModel(GGUFFile):
    """A decoder's GGUF: the file and the ModelConfig its hyperparameters give."""
    config: ModelConfig


def _map(path: Path) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes is too short for a GGUF header (truncated?)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from None


def open_gguf(path: str | Path, vocabulary: bool = True) -> GGUFFile:
    """Map the file and check its header and every tensor's type, shape and bytes against the file's
    size; nothing is allocated from what the header claims and nothing is dequantized."""
    path = Path(path)
    mm = _map(path)
    try:
        buf = memoryview(mm)
        try:
            metadata, info_list, data_start = read_header(buf, path, vocabulary)
        finally:
            buf.release()
        tensors: dict[str, Tensor] = {}
        for t in info_list:   # read_header checked each type and that its bytes lie inside the file
            fmt = block_format(t.ggml_type, t.name)
            n = raw_nbytes(fmt, t.shape)
            tensors[t.name] = (fmt, np.frombuffer(mm, np.uint8, count=n, offset=data_start + t.offset), t.shape)
        return GGUFFile(path, metadata, {t.name: t for t in info_list}, tensors, mm)
    except BaseException:
        try:
            mm.close()
        except BufferError:   # a view is still referenced (by the traceback): the GC unmaps it later
            pass
        raise


def read_gguf(path: str | Path | GGUFFile) -> GGUFModel:
    """A decoder's GGUF (a path, or a file open_gguf opened), all of it checked (header, hyperparameters,
    every tensor's type, shape and bytes) before anything is allocated from its contents; nothing is
    dequantized here but rope's small tables. A file opened here is unmapped again when refused."""
    if isinstance(path, GGUFFile):
        return _decoder(path)
    f = open_gguf(path)
    try:
        return _decoder(f)
    except BaseException:
        f.close()
        raise


def _decoder(f: GGUFFile) -> GGUFModel:
    config = gguf_config(f.metadata, f.infos, f.path)
    arch = f.metadata["general.architecture"]
    check_tensors(config, arch, f.infos, f.path)
    tensors = f.tensors
    freqs = None
    if ROPE_FREQS in tensors:
        fmt, raw, shape = tensors[ROPE_FREQS]
        freqs = np.array(dequantize(fmt, raw, shape), dtype=np.float32)
    factors = {n: np.array(dequantize(*tensors[n]), dtype=np.float32) for n in ROPE_FACTORS if n in tensors}
    meta = Meta(f.metadata, arch, f.path)
    config.rope_scaling = (longrope_scaling(config, meta, factors) if factors else rope_scaling(config, meta, freqs))
    return GGUFModel(f.path, f.metadata, f.infos, tensors, f.mapping, config)
