"""A Hugging Face model folder -> ModelConfig + weights laid out for the decoder (weights/layout.py).

Only JSON and safetensors are read; a folder holding a pickle checkpoint is refused, never opened.
Each file is validated by safetensors and memory-mapped; every weight is copied once, from the mapping
into its final float32 layout (see _MappedFile), and converted from there for model.quantization
(weights/conversion.py).
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from nvllm.model.config import ModelConfig, ModelLoadError, load_config, read_json
from nvllm.model.encoder_config import EncoderConfig
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.conversion import kept_kind, matrix_rule
from nvllm.model.weights.encoder_layout import EncoderWeights, lay_out_encoder
from nvllm.model.weights.layout import ModelWeights, Parts, lay_out, layer_matrices

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_folder(model_dir: Path) -> None:
    """Refuse pickle checkpoints and links that lead outside the folder before anything is read."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: not a model folder (it does not exist or is not a directory)")
    root = model_dir.resolve()
    for p in sorted(model_dir.rglob("*")):
        if p.is_symlink() and not p.resolve().is_relative_to(root):
            raise ModelLoadError(f"{p}: a link leading outside the model folder ({p.resolve()}); refused")
        if p.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelLoadError(
                f"{p}: pickle checkpoints are never opened (they can run code); "
                "convert the model to safetensors")



def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no 'weight_map'")
        files = sorted({model_dir / name for name in weight_map.values()})
        for f in files:
            if not f.exists():
                raise ModelLoadError(f"{index} names {f.name}, which is missing")
        return files
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise ModelLoadError(f"{model_dir}: no model.safetensors (nor an index of shards)")


# Storage dtypes the loader widens to float32; BF16 is read as its raw 16 bits (NumPy has no bfloat16).
_STORAGE: dict[str, np.dtype] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
                                 "F64": np.dtype("<f8")}
_PAGE = mmap.PAGESIZE
_CHUNK_BYTES = 16 << 20    # mapped bytes copied before their pages are dropped from the resident set


@dataclass
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int                 # byte offsets of the data in the file (header included)
    end: int
    file: _MappedFile


class _MappedFile:
    """One .safetensors file, validated by safetensors and memory-mapped read-only.

    safetensors (safe_open) checks the file and gives each tensor's dtype and shape; the 8-byte length
    and the JSON header that follow it give the data offsets, which safetensors' Python API does not
    expose. The data region is the format's raw little-endian arrays: they are viewed in place through
    the mapping, never read into an intermediate buffer, and each tensor is copied exactly once, into
    its final float32 layout. Only safetensors and JSON are read: no pickle, no other parser.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in f.keys()}
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"{path}: cannot read as safetensors ({e})") from None
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            n = int.from_bytes(fh.read(8), "little")
            if not 0 < n <= size - 8:
                raise ModelLoadError(f"{path}: cannot read as safetensors (header length {n})")
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise ModelLoadError(f"{path}: cannot read as safetensors (header: {e})") from None
            self.mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.entries: dict[str, _Entry] = {}
        for name, (dtype, shape) in meta.items():
            info = header.get(name) or {}
            begin, end = (info.get("data_offsets") or (0, -1))
            if ((info.get("dtype"), tuple(info.get("shape", ()))) != (dtype, shape)
                    or not 0 <= begin <= end <= size - 8 - n):
                raise ModelLoadError(f"{path}: tensor {name!r}: the header disagrees with safetensors' reading")
            self.entries[name] = _Entry(dtype, shape, 8 + n + begin, 8 + n + end, self)

    def view(self, entry: _Entry, name: str) -> np.ndarray:
        """The tensor in its storage dtype, viewed in the mapping (no copy)."""
        dt = _STORAGE.get(entry.dtype)
        if dt is None:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has dtype {entry.dtype}; "
                                 f"supported: {', '.join(_STORAGE)}")
        count = math.prod(entry.shape)
        if count * dt.itemsize != entry.end - entry.begin:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r}: {entry.end - entry.begin} bytes "
                                 f"for shape {list(entry.shape)} of {entry.dtype}")
        if count == 0:
            return np.zeros(entry.shape, dtype=dt)
        assert self.mm is not None  # only an empty file is left unmapped, and it holds no bytes
        return np.frombuffer(self.mm, dtype=dt, count=count, offset=entry.begin).reshape(entry.shape)

    def release(self, begin: int, end: int) -> None:
        """Drop bytes [begin, end) of the file from this process's resident set (the page cache keeps
        them), so a mapped tensor and its copy are not both resident for longer than one chunk."""
        if self.mm is not None and hasattr(self.mm, "madvise") and end > begin:
            start = begin - begin % _PAGE
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def _fill(dst: np.ndarray, src: np.ndarray, dtype: str) -> None:
    """dst[...] = src widened to float32, in one pass over the mapped bytes."""
    if dtype == "BF16":
        bits = dst.view(np.uint32)   # bf16 is float32's top half: place the 16 bits, then shift them up
        bits[...] = src
        bits <<= 16
    else:
        dst[...] = src


class _Tensors:
    """Every tensor of the checkpoint's files, by name; arrays come out as float32 copies in their final
    layout, each made in one pass from the mapped file. With `matrix` (load_weights' quantization), each
    2-D tensor (a matrix, the embedding) is handed to matrix(float32 [out, in], name, storage dtypes of
    its parts), and what that returns, unless None, comes out instead: the float32 copy is dropped as
    soon as it returns."""

    def __init__(self, files: list[Path], model_dir: Path,
                 matrix: Callable[[np.ndarray, str, set[str]], Weight | None] | None = None) -> None:
        self.model_dir = model_dir
        self.matrix = matrix
        self.entries: dict[str, _Entry] = {}
        for path in files:
            self.entries.update(_MappedFile(path).entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def close(self) -> None:
        """Unmap the files now (entries and files refer to each other, so this is not left to the GC)."""
        for f in {id(e.file): e.file for e in self.entries.values()}.values():
            if f.mm is not None:
                try:
                    f.mm.close()
                except BufferError:   # an error's traceback still holds a view: the GC unmaps it later
                    pass
        self.entries.clear()

    def _entry(self, name: str, shape: tuple[int, ...]) -> _Entry:
        if name not in self.entries:
            raise ModelLoadError(f"{self.model_dir}: tensor {name!r} is missing from the checkpoint")
        e = self.entries[name]
        if e.shape != shape:
            raise ModelLoadError(
                f"{e.file.path.name}: tensor {name!r} has shape {list(e.shape)}, expected {list(shape)}")
        return e

    def get(self, name: str, shape: tuple[int, ...]) -> Any:
        """The tensor: a vector as float32, a matrix as a Weight (see joined)."""
        return self.joined([(name, shape)])

    def joined(self, parts: Parts) -> Any:
        """Tensors concatenated along their first axis (see array): a vector as float32, a matrix as a
        DenseWeight of that array, or as what `matrix` makes of it."""
        out = self.array(parts)
        if out.ndim != 2:
            return out
        if self.matrix is not None:
            name = parts[0][0] + (f" (+{len(parts) - 1} fused)" if len(parts) > 1 else "")
            kept = self.matrix(out, name, {self.entries[n].dtype for n, _ in parts})
            if kept is not None:
                return kept
        return DenseWeight(out)

    def array(self, parts: Parts) -> np.ndarray:
        """Tensors concatenated along their first axis, in one copy: [a, K] + [b, K] -> [a+b, K] float32,
        C-contiguous."""
        entries = [self._entry(n, s) for n, s in parts]
        rows = sum(e.shape[0] for e in entries)
        out = np.empty((rows,) + entries[0].shape[1:], dtype=np.float32)
        at = 0
        for (name, _), e in zip(parts, entries):
            src = e.file.view(e, name)
            k = e.shape[0]
            row_bytes = (e.end - e.begin) // k if k else 0
            step = max(1, _CHUNK_BYTES // max(1, row_bytes))
            for r in range(0, k, step):                      # a chunk of rows at a time, then drop its pages
                part = src[r:r + step]
                _fill(out[at + r:at + r + len(part)], part, e.dtype)
                e.file.release(e.begin + r * row_bytes, e.begin + (r + len(part)) * row_bytes)
            at += k
        return out


def load_weights(model_dir: str | Path, config: ModelConfig | None = None,
                 quantization: str = "") -> tuple[ModelConfig, ModelWeights]:
    """Read and lay out every weight; each ends in its own float32 array, copied once from the mapped
    file (q|k|v and gate|up are fused in that same copy; a matrix is a DenseWeight of its C-contiguous
    [out, in]). The mappings are closed when this returns, so the resident set holds
    the weights once.

    quantization is model.quantization. "" (as stored): a matrix whose parts are all stored as bfloat16,
    or all as float16, stays in those 16 bits (a QuantizedWeight BF16 / F16, exactly the file's values,
    multiplied in place by the C kernels: half the memory of float32 and no rounding), the others
    float32; without the C kernels every matrix is float32. "f32": every matrix float32. q8_0, q4_0, q4_k,
    bf16, f16: every matrix and the embedding (with a tied lm_head, the same one) a QuantizedWeight of
    that kind (weights/conversion.py). Each is converted as soon as it is laid out: loading peaks at the
    weights as held plus one float32 matrix, not at the float32 model. Norms and biases stay float32."""
    model_dir = Path(model_dir)
    check_folder(model_dir)
    config = config or load_config(model_dir)
    t = _Tensors(_safetensors_files(model_dir), model_dir, matrix_rule(quantization))
    try:
        return config, lay_out(t, config, model_dir)
    finally:
        t.close()



def load_encoder_weights(model_dir: str | Path, config: EncoderConfig,
                         quantization: str = "") -> EncoderWeights:
    """An encoder folder's weights (weights/encoder_layout.py), read and converted as load_weights reads
    a decoder's."""
    model_dir = Path(model_dir)
    check_folder(model_dir)
    t = _Tensors(_safetensors_files(model_dir), model_dir, matrix_rule(quantization))
    try:
        return lay_out_encoder(t, config, str(model_dir))
    finally:
        t.close()


def _config_dtype(model_dir: Path) -> str:
    """The 16-bit kind config.json's torch_dtype (transformers 5: dtype) names, or "" for float32."""
    try:
        cfg = read_json(model_dir / "config.json")
    except ModelLoadError:
        return ""
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return {"bfloat16": "bf16", "float16": "f16"}.get(dtype, "") if isinstance(dtype, str) else ""


def stored_weights(model_dir: str | Path, config: ModelConfig) -> tuple[int, dict[str, int]]:
    """What load_weights(model_dir, config) holds with model.quantization "" (as stored), from the files'
    headers alone: its bytes (float32 less half of every matrix kept in 16 bits) and its matrices by
    format ({"BF16": 120, "float32": 1}). A folder without weight files (config.json only, for planning)
    is planned as its config's torch_dtype says the checkpoint is stored (float32 if it says nothing)."""
    groups = [parts for n in range(config.num_layers) for parts in layer_matrices(config, n).values()]
    groups.append([("model.embed_tokens.weight", (config.vocab_size, config.hidden_size))])
    if not config.tie_word_embeddings:
        groups.append([("lm_head.weight", (config.vocab_size, config.hidden_size))])
    model_dir = Path(model_dir)
    planned = ""
    try:
        files = _safetensors_files(model_dir) if matrix_rule("") is not None else []
    except ModelLoadError:
        files, planned = [], _config_dtype(model_dir)
    t = _Tensors(files, model_dir)
    try:
        saved = 0
        formats: dict[str, int] = {}
        for parts in groups:
            kind = ""
            if all(name in t for name, _ in parts):
                kind = kept_kind({t.entries[name].dtype for name, _ in parts})
            elif planned:
                kind = planned
            if kind:
                saved += 2 * sum(math.prod(shape) for _, shape in parts)
            name = kind.upper() if kind else "float32"
            formats[name] = formats.get(name, 0) + 1
        return config.weight_bytes - saved, formats
    finally:
        t.close()

