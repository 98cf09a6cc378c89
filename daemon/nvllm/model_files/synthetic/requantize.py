"""An existing GGUF written again in another file type, tensor by tensor as llama.cpp's quantize tool does.

Each matrix is read back to float32 (model/quant/dequantize.py) and quantized again in the type
mixture.py picks for it from its name, role and row length; vectors stay F32; every metadata key is
copied with its own GGUF value type, general.file_type set to the new type. From an F16 or F32 file the
tensors are those llama-quantize writes, byte for byte; from a file already quantized they are
llama-quantize --allow-requantize's (the float values read back, quantized again: quality is lost twice).
The file is read mapped and written one tensor at a time.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np

from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import BlockFormat
from nvllm.model.quant.quantize import quantize
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model_files.synthetic.mixture import FILE_TYPES, TensorSpec, tensor_types
from nvllm.model_files.synthetic.writer import BY_NAME, write_header

_ROWS_VALUES = 1 << 22  # values read back and quantized at a time
_LAYER = re.compile(r"blk\.(\d+)\.")
_LAYER_ROLE = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
# written by GGUFWriter itself, or replaced here
_OWN_KEYS = {"general.architecture", "general.file_type", "general.quantization_version"}


def role(name: str, shape: tuple[int, ...]) -> str:
    """A tensor's role for mixture.py: token_embd, output, a layer's projection, or norm for a vector and
    other for any other matrix (quantized to the file type's own format)."""
    if len(shape) < 2:
        return "norm"
    if name in ("token_embd.weight", "output.weight"):
        return name.split(".")[0]
    m = _LAYER_ROLE.fullmatch(name)
    return m.group(1) if m else "other"


def quantize_order(names: Iterable[str]) -> list[str]:
    """The order llama-quantize takes and writes tensors in: by name (its loader keeps them in a map),
    then stably by layer, the tensors of no layer first. attn_v's and ffn_down's rules count tensors in
    this order, so blk.10 comes after blk.9, not after blk.1 as in a file sorted by name."""
    def layer(name: str) -> int:
        m = _LAYER.match(name)
        return int(m.group(1)) if m else -1
    return sorted(sorted(names), key=layer)


def _copy_metadata(src: Path, w: gguf.GGUFWriter) -> None:
    reader = gguf.GGUFReader(str(src))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key in _OWN_KEYS:
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[1]) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)


def _requantized(fmt: BlockFormat, raw: np.ndarray, shape: tuple[int, ...], new: BlockFormat) -> np.ndarray:
    """A tensor's bytes in `new`, read back and quantized a slice of rows at a time."""
    n = shape[-1]
    rows = raw.size // (n // fmt.block_elems * fmt.block_bytes)
    src = raw.reshape(rows, -1)
    out = np.empty((rows, n // new.block_elems * new.block_bytes), np.uint8)
    step = max(1, _ROWS_VALUES // n)
    for r in range(0, rows, step):
        part = src[r:r + step]
        values = np.asarray(dequantize(fmt, part.reshape(-1), (len(part), n)), dtype=np.float32)
        out[r:r + step] = quantize(new, values)
    return out.reshape(-1)


def requantize(src: Path, file_type: str, out: Path) -> Path:
    """Write `src` as `file_type` (a key of FILE_TYPES) to `out`; returns `out`. A malformed `src` raises
    the loader's error (a ValueError that says what; read_gguf checks the file whole first) and nothing
    is written."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"file type must be one of {', '.join(FILE_TYPES)}, got {file_type!r}")
    model = read_gguf(src)
    arch = model.metadata["general.architecture"]
    specs = [TensorSpec(name, role(name, model.tensors[name][2]), model.tensors[name][2])
             for name in quantize_order(model.tensors)]
    types = tensor_types(file_type, specs, model.config.num_layers,
                         model.config.num_heads // model.config.num_kv_heads)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")   # renamed when whole
    try:
        w = gguf.GGUFWriter(str(tmp), arch)
        _copy_metadata(src, w)
        w.add_file_type(FILE_TYPES[file_type])
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        write_header(w, specs, types)
        for spec, t in zip(specs, types):
            w.write_tensor_data(_requantized(*model.tensors[spec.name], BY_NAME[t]))
            model.release(model.tensors[spec.name][1])
        w.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    return out
