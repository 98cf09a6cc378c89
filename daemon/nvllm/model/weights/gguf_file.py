"""A llama.cpp GGUF model file, mapped and checked whole: its header (gguf_reader.py), hyperparameters
(gguf_config.py) and every tensor's type, shape and bytes, before anything is allocated from it; the
weights are laid out from it by gguf_weights.py. Llama, Qwen2 and Qwen3 only. The file is memory-mapped,
never copied whole.
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
from nvllm.model.weights.gguf_reader import GGUFError, read_header


@dataclass
class GGUFModel:
    path: Path
    config: ModelConfig
    metadata: dict[str, Any]
    tensors: dict[str, tuple[BlockFormat, np.ndarray, tuple[int, ...]]]  # name -> (format, raw uint8, shape)
    mapping: mmap.mmap | None = field(default=None, repr=False)   # the file, mapped read-only

    def release(self, raw: np.ndarray) -> None:
        """Drop a tensor's mapped pages from the resident set once copied (the page cache keeps them)."""
        if self.mapping is None or not hasattr(self.mapping, "madvise") or raw.size == 0:
            return
        base = np.frombuffer(self.mapping, np.uint8, count=0).__array_interface__["data"][0]
        begin = raw.__array_interface__["data"][0] - base
        start = begin - begin % mmap.PAGESIZE
        self.mapping.madvise(mmap.MADV_DONTNEED, start, begin + raw.size - start)


def _map(path: Path) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes is too short for a GGUF header (truncated?)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from None


def read_gguf(path: str | Path) -> GGUFModel:
    """Map the file and check all of it (header, hyperparameters, every tensor's type, shape and bytes)
    before anything is allocated from its contents; nothing is dequantized here."""
    path = Path(path)
    mm = _map(path)
    try:
        return _read(path, mm)
    except BaseException:
        try:
            mm.close()
        except BufferError:   # a view is still referenced (by the traceback): the GC unmaps it later
            pass
        raise


def _read(path: Path, mm: mmap.mmap) -> GGUFModel:
    buf = memoryview(mm)
    try:
        metadata, info_list, data_start = read_header(buf, path)
    finally:
        buf.release()
    infos = {t.name: t for t in info_list}
    config = gguf_config(metadata, infos, path)
    arch = metadata["general.architecture"]
    check_tensors(config, arch, infos, path)
    tensors: dict[str, tuple[BlockFormat, np.ndarray, tuple[int, ...]]] = {}
    for t in info_list:
        fmt = block_format(t.ggml_type, t.name)
        n = raw_nbytes(fmt, t.shape)
        tensors[t.name] = (fmt, np.frombuffer(mm, np.uint8, count=n, offset=data_start + t.offset), t.shape)
    freqs = None
    if ROPE_FREQS in tensors:
        fmt, raw, shape = tensors[ROPE_FREQS]
        freqs = np.array(dequantize(fmt, raw, shape), dtype=np.float32)
    factors = {n: np.array(dequantize(*tensors[n]), dtype=np.float32) for n in ROPE_FACTORS if n in tensors}
    config.rope_scaling = (longrope_scaling(config, Meta(metadata, arch, path), factors) if factors
                           else rope_scaling(config, Meta(metadata, arch, path), freqs))
    return GGUFModel(path, config, metadata, tensors, mm)


