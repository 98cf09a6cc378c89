"""A checked GGUF's tensors -> a model's weights (a decoder's, weights/layout.py; an encoder's,
weights/encoder_layout.py), each matrix in its file format where a C kernel multiplies it in place
(model/matrix/quantized.py's QuantizedWeight): its blocks are copied out of the mapping (llama's Q/K rows
unpermuted, q|k|v and gate|up fused by stacking their rows of blocks) and the mapped pages dropped, so the
model is resident once, at its size in the file. Without the kernels, and for formats they do not read,
the matrices are dequantized to float32 once, as a folder's are.
"""
from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import numpy as np

from nvllm.model.config import ModelConfig, ModelLoadError
from nvllm.model.kernels import matmul
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.fused import FusedWeight
from nvllm.model.matrix.packed import PackedWeight
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import BlockFormat, raw_nbytes
from nvllm.model.quant.packed import PANEL, packable
from nvllm.model.weights.gguf_file import GGUFFile, GGUFModel
from nvllm.model.weights.gguf_names import ROPE_TABLES, hf_tensor_name, unpermute_rope_rows
from nvllm.model.weights.layout import ModelWeights, Parts, TensorReader, lay_out

log = logging.getLogger(__name__)

_CHUNK_BYTES = 16 << 20   # raw bytes dequantized at a time


class _DequantizedTensors:
    """The GGUF's tensors under their Hugging Face names, as a layout asks for them (get, joined, `in`;
    layout.lay_out's TensorReader): each dequantized to float32 straight into its final layout, the Q/K
    rows of the kinds in `rope_heads` unpermuted; a matrix comes out as a DenseWeight of that array.
    names: Hugging Face name -> GGUF name; rope_heads: a layer tensor's kind ("attn_q") -> its heads, for
    the kinds whose rows llama.cpp's converter permuted."""

    def __init__(self, model: GGUFFile, names: Mapping[str, str], rope_heads: Mapping[str, int]) -> None:
        self.model = model
        self.names = dict(names)
        self.rope_heads = dict(rope_heads)

    def __contains__(self, hf_name: str) -> bool:
        return hf_name in self.names

    def get(self, name: str, shape: tuple[int, ...]) -> Any:
        return self.joined([(name, shape)])

    def joined(self, parts: Parts) -> Any:
        """Tensors concatenated along their first axis: a vector as float32, a matrix as a Weight."""
        out = self.array(parts)
        return DenseWeight(out) if out.ndim == 2 else out

    def array(self, parts: Parts) -> np.ndarray:
        """Tensors concatenated along their first axis, in one copy: [a, K] + [b, K] -> [a+b, K] float32."""
        rows = sum(s[0] for _, s in parts)
        rest = tuple(parts[0][1][1:])
        out = np.empty((rows,) + rest, dtype=np.float32)
        at = 0
        for name, shape in parts:
            k = shape[0]

            def rows_at(r0: int, r1: int, at: int = at) -> np.ndarray:  # bound now: the loop moves `at` on
                return out[at + r0:at + r1]

            self._fill(name, shape, rows_at)
            at += k
        return out

    def _lookup(self, hf_name: str, shape: tuple[int, ...]) -> tuple[str, BlockFormat, np.ndarray]:
        """(GGUF name, format, raw bytes) of a tensor, checked to have `shape`."""
        if hf_name not in self.names:
            raise ModelLoadError(f"{self.model.path}: tensor {hf_name!r} is missing")
        gname = self.names[hf_name]
        fmt, raw, gshape = self.model.tensors[gname]
        if tuple(gshape) != tuple(shape):
            raise ModelLoadError(f"{self.model.path}: tensor {gname!r} has shape {list(gshape)}, "
                                 f"expected {list(shape)}")
        return gname, fmt, raw

    def _fill(self, hf_name: str, shape: tuple[int, ...], dst: Callable[[int, int], np.ndarray]) -> None:
        gname, fmt, raw = self._lookup(hf_name, shape)
        heads = self._rope_heads(gname)
        rows = shape[0]
        row_bytes = raw.size // rows
        step = rows if heads else max(1, _CHUNK_BYTES // max(1, row_bytes))   # Q/K: whole, to unpermute
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            w = dequantize(fmt, raw[r0 * row_bytes:r1 * row_bytes], (r1 - r0,) + tuple(shape[1:]))
            if heads:
                w = unpermute_rope_rows(w, heads)
            dst(r0, r1)[...] = w
        self.model.release(raw)

    def _rope_heads(self, gguf_name: str) -> int:
        """Heads to unpermute for llama's Q and K (weights and biases), else 0."""
        kind = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        return self.rope_heads.get(kind, 0)


def decoder_names(model: GGUFModel) -> tuple[dict[str, str], dict[str, int]]:
    """A decoder's tensors by Hugging Face name, and the heads of the Q/K rows its converter permuted
    (llama's; SmolLM3's converter is Llama's too; phi3's rope pairs as HF's does)."""
    arch = model.metadata.get("general.architecture", "llama")
    names = {hf_tensor_name(n, arch): n for n in model.tensors if n not in ROPE_TABLES}
    c = model.config
    heads = {"attn_q": c.num_heads, "attn_k": c.num_kv_heads} if arch in ("llama", "smollm3") else {}
    return names, heads


# The formats the C matmul kernels multiply in place; any other (F32) is laid out as float32.
IN_PLACE_FORMATS = frozenset({"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL",
                              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"})


class _InPlaceTensors(_DequantizedTensors):
    """As _DequantizedTensors, but a matrix in a format the kernels read comes back as a QuantizedWeight
    (out, in) holding a copy of its blocks (llama's Q/K rows unpermuted, q|k|v and gate|up stacked), its
    mapped pages dropped; a matrix in another format is laid out as float32, and named in `as_float`
    when that dequantized it (F32 is laid out as it is, a DenseWeight). Fused parts in different formats
    (a Q4_K_M file's Q6_K attn_v beside Q4_K attn_q and attn_k) make a FusedWeight of each run of parts
    in one format, stacked."""

    def __init__(self, model: GGUFFile, names: Mapping[str, str], rope_heads: Mapping[str, int]) -> None:
        super().__init__(model, names, rope_heads)
        self.as_float: list[str] = []   # "name (format)" of each matrix dequantized to float32

    def joined(self, parts: Parts) -> Any:
        if len(parts[0][1]) != 2:
            return super().joined(parts)                                  # norms and biases: float32
        found = [self._lookup(name, shape) for name, shape in parts]
        formats = {fmt.name for _, fmt, _ in found}
        if not formats <= IN_PLACE_FORMATS:
            self.as_float += [f"{gname} ({fmt.name})" for gname, fmt, _ in found if fmt.name != "F32"]
            return super().joined(parts)
        runs: list[Weight] = []
        for _, run in itertools.groupby(zip(found, parts), key=lambda fp: fp[0][1].name):
            pairs = list(run)
            runs.append(self._stacked([f for f, _ in pairs], [part[1] for _, part in pairs]))
        return runs[0] if len(runs) == 1 else FusedWeight(runs)

    def _stacked(self, found: list[tuple[str, BlockFormat, np.ndarray]],
                 shapes: list[tuple[int, ...]]) -> Weight:
        """The tensors' rows of blocks stacked into one matrix [sum of rows, row bytes]: packed for the
        kernels where the format is (matrix/packed.py), a chunk of rows at a time; otherwise one new array.
        Q and K rows are unpermuted on the way (unpermute_rope_rows on whole rows of blocks, exact: HF row
        j*d/2 + i of a head is GGUF row 2*i + j). Each tensor's mapped pages are dropped once copied."""
        fmt = found[0][1]
        row_bytes = raw_nbytes(fmt, shapes[0][1:])
        rows = sum(s[0] for s in shapes)
        parts = []   # (first row, rows, source rows, source row of each row or None)
        at = 0
        for (gname, _, raw), shape in zip(found, shapes):
            k = shape[0]
            heads = self._rope_heads(gname)
            order = None
            if heads:   # [heads, 2, d/2] <- [heads, d/2, 2]
                d = k // heads
                order = np.arange(k).reshape(heads, d // 2, 2).swapaxes(1, 2).reshape(-1)
            parts.append((at, k, raw.reshape(k, row_bytes), order, raw))
            at += k

        def fill(r0: int, r1: int, out: np.ndarray) -> None:
            for first, k, src, order, raw in parts:
                a, b = max(r0, first), min(r1, first + k)
                if a >= b:
                    continue
                dst = out[a - r0:b - r0]
                if order is not None:
                    dst[...] = src[order[a - first:b - first]]
                    if b == first + k:
                        self.model.release(raw)
                else:
                    dst[...] = src[a - first:b - first]
                    self.model.release(src[a - first:b - first].reshape(-1))

        if matmul.lib is not None and packable(fmt):
            pm = matmul.pack_rows(fmt, (rows, shapes[0][1]), fill, _CHUNK_BYTES)
            return PackedWeight(pm.fmt, pm.data, pm.shape)
        out = np.empty((rows, row_bytes), np.uint8)
        step = max(1, _CHUNK_BYTES // max(1, row_bytes))
        for r0 in range(0, rows, step):   # a chunk at a time, then drop its pages
            fill(r0, min(rows, r0 + step), out[r0:r0 + step])
        return QuantizedWeight(fmt, out, (rows, shapes[0][1]))


def _release_all(model: GGUFFile) -> None:
    """Every tensor's mapped pages dropped again once all are copied: each page fault maps the cached
    pages around it too (fault-around), so pages released earlier come back while later tensors are
    read."""
    for _, raw, _ in model.tensors.values():
        model.release(raw)


def in_place_kernels() -> bool:
    """Whether the C matmul kernels that multiply quantized weights in place are built."""
    return matmul.lib is not None


class _Sized(Protocol):
    @property
    def nbytes(self) -> int: ...


W = TypeVar("W", bound=_Sized)


def lay_out_gguf(model: GGUFFile, names: Mapping[str, str], rope_heads: Mapping[str, int],
                 lay: Callable[[TensorReader], W], in_place: bool | None = None) -> W:
    """The weights `lay` lays out from the file's tensors (by Hugging Face name, `names`), a decoder's or an
    encoder's. In place (the default where the C matmul kernels are built) the matrices keep their file
    format; otherwise, or for a format the kernels do not read, they are float32, and one log line says
    which and why."""
    if in_place is None:
        in_place = in_place_kernels()
    if not in_place:
        weights = lay(_DequantizedTensors(model, names, rope_heads))
        _release_all(model)
        if any(fmt.name != "F32" for name, (fmt, _, shape) in model.tensors.items() if len(shape) == 2):
            log.info("%s: every matrix dequantized to float32 (%.0f MiB): the C matmul kernels are not built",
                     model.path, weights.nbytes / 2**20)
        return weights
    tensors = _InPlaceTensors(model, names, rope_heads)
    weights = lay(tensors)
    _release_all(model)
    if tensors.as_float:
        shown = ", ".join(tensors.as_float[:6]) + (f" and {len(tensors.as_float) - 6} more"
                                                   if len(tensors.as_float) > 6 else "")
        log.info("%s: %d matrices dequantized to float32, their formats having no in-place kernel "
                 "(kept in place: %s): %s", model.path, len(tensors.as_float), ", ".join(sorted(IN_PLACE_FORMATS)),
                 shown)
    return weights


def load_gguf_weights(model: GGUFModel, in_place: bool | None = None) -> ModelWeights:
    """A decoder's weights in the layout a folder's give (layout.lay_out), in place or float32 as
    lay_out_gguf decides."""
    names, heads = decoder_names(model)
    return lay_out_gguf(model, names, heads, lambda t: lay_out(t, model.config, model.path), in_place)


def _matrix_groups(c: ModelConfig) -> list[list[str]]:
    """The matrices lay_out fuses, as GGUF names: each group is one weight of the decoder."""
    groups = [["token_embd.weight"]] + ([] if c.tie_word_embeddings else [["output.weight"]])
    for n in range(c.num_layers):
        p = f"blk.{n}."
        if c.architecture == "Phi3ForCausalLM":
            groups += [[p + "attn_qkv.weight"], [p + "attn_output.weight"], [p + "ffn_up.weight"],
                       [p + "ffn_down.weight"]]
            continue
        groups += [[p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], [p + "attn_output.weight"],
                   [p + "ffn_gate.weight", p + "ffn_up.weight"], [p + "ffn_down.weight"]]
    return groups


def resident_weight_bytes(model: GGUFModel, in_place: bool | None = None) -> int:
    """The bytes load_gguf_weights(model, in_place) will hold (its ModelWeights.nbytes), from the header
    alone: for planning memory before loading."""
    return resident_bytes(model, _matrix_groups(model.config), ROPE_TABLES, in_place)


def resident_bytes(model: GGUFFile, groups: list[list[str]], unused: Collection[str],
                   in_place: bool | None = None) -> int:
    """The bytes lay_out_gguf will hold for the file's tensors, from the header alone: `groups` are the
    matrices the layout stacks into one weight (GGUF names), every other tensor but the `unused` ones a
    float32 array."""
    if in_place is None:
        in_place = in_place_kernels()
    total, grouped = 0, set()
    for group in groups:
        found = [model.tensors[name] for name in group]
        grouped.update(group)
        if in_place and all(fmt.name in IN_PLACE_FORMATS for fmt, _, _ in found):
            for fmt, run in itertools.groupby(found, key=lambda f: f[0]):   # as _stacked stacks them
                tensors = list(run)
                rows = sum(shape[0] for _, _, shape in tensors)
                row_bytes = tensors[0][1].size // tensors[0][2][0]
                total += (-(-rows // PANEL) * PANEL if packable(fmt) else rows) * row_bytes
        else:
            total += sum(4 * math.prod(shape) for _, _, shape in found)
    return total + sum(4 * math.prod(shape) for name, (_, _, shape) in model.tensors.items()
                       if name not in grouped and name not in unused)


def hf_tensors(model: GGUFModel) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor under its Hugging Face name as float32 [out, in] (HF's Q/K row order), one at a time:
    what `nvllm models pull` writes into a folder's model.safetensors."""
    tensors = _DequantizedTensors(model, *decoder_names(model))
    for hf_name, gname in tensors.names.items():
        yield hf_name, tensors.array([(hf_name, tuple(model.tensors[gname][2]))])

