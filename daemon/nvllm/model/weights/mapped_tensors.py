"""The tensors of a mapped weight file that is not a GGUF (CTranslate2's model.bin, whisper.cpp's ggml .bin),
under Hugging Face names, as a layout's TensorReader (weights/layout.py): read as gguf_weights.py reads a
GGUF's, so a matrix keeps its file's format where the C kernels multiply it in place (F16 as F16, Q8_0 /
Q5_0 / Q5_1 / Q4_0 / Q4_1 blocks as they are, packed where the kernels pack them), everything else float32;
or, for model.quantization, each matrix converted as a folder's are (weights/conversion.py).
"""
from __future__ import annotations

import mmap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvllm.model.config import ModelLoadError
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.weights.conversion import matrix_rule
from nvllm.model.weights.ct2_file import release_mapped
from nvllm.model.weights.gguf_file import GGUFFile, Tensor
from nvllm.model.weights.gguf_weights import _DequantizedTensors, _InPlaceTensors, in_place_kernels
from nvllm.model.weights.layout import Parts

QUANTIZATIONS = ("", "f32", "q8_0", "q4_0", "q4_k", "bf16", "f16")   # model.quantization's values


class MappedTensors(GGUFFile):
    """A mapped file's tensors in GGUFFile's shape (what gguf_weights' readers take): name -> (format, raw
    bytes, shape). Raw bytes are views of the mapping, or arrays made at read time (CTranslate2's int8 as
    Q8_0 blocks); only views have pages to release."""

    def __init__(self, path: Path, tensors: dict[str, Tensor], mapping: mmap.mmap | None) -> None:
        super().__init__(path, {}, {}, tensors, mapping)

    def release(self, raw: Any) -> None:
        release_mapped(self.mapping, raw)


class _Converted(_DequantizedTensors):
    """Every matrix float32 first, then converted by model.quantization's rule (None keeps it float32)."""

    def __init__(self, model: GGUFFile, names: Mapping[str, str], quantization: str) -> None:
        super().__init__(model, names, {})
        self.rule = matrix_rule(quantization)

    def joined(self, parts: Parts) -> Any:
        out = self.array(parts)
        if out.ndim != 2:
            return out
        dtypes = {self.model.tensors[self.names[name]][0].name for name, _ in parts}
        converted = None if self.rule is None else self.rule(out, parts[0][0], dtypes)
        return DenseWeight(out) if converted is None else converted


class FileTensors:
    """A TensorReader over a MappedTensors (get, joined, `in`, and array for float32 of any rank), which
    unmaps the file on close()."""

    def __init__(self, file: MappedTensors, names: Mapping[str, str], quantization: str = "") -> None:
        if quantization not in QUANTIZATIONS:
            raise ModelLoadError(f"{file.path}: model.quantization {quantization!r} is not one of "
                                 f"{', '.join(repr(q) for q in QUANTIZATIONS)}")
        self.file = file
        reader: _DequantizedTensors
        if quantization == "":
            reader = (_InPlaceTensors if in_place_kernels() else _DequantizedTensors)(file, names, {})
        elif quantization == "f32":
            reader = _DequantizedTensors(file, names, {})
        else:
            reader = _Converted(file, names, quantization)
        self.reader = reader

    def __contains__(self, name: str) -> bool:
        return name in self.reader

    def get(self, name: str, shape: tuple[int, ...]) -> Any:
        return self.reader.get(name, shape)

    def joined(self, parts: Parts) -> Any:
        return self.reader.joined(parts)

    def array(self, parts: Parts) -> Any:
        """Tensors stacked along their first axis as one float32 array, whatever their rank and format."""
        return self.reader.array(parts)

    def close(self) -> None:
        """Drop the tensors and unmap the file: every weight laid out from it is a copy."""
        self.file.tensors = {}
        self.file.close()


def file_reader(file: MappedTensors, names: Mapping[str, str], quantization: str = "") -> FileTensors:
    """The TensorReader the layout asks (layout.py's protocol): Hugging Face name -> the file's tensor name in
    `names`."""
    return FileTensors(file, names, quantization)
