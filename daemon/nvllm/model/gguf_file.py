"""A llama.cpp GGUF model file -> the same ModelConfig and weights a Hugging Face folder gives.

Llama, Qwen2 and Qwen3 only. The file is memory-mapped, never copied whole. Its header is parsed here by
a small bounded reader that checks every count, length, type, name, shape and offset against the bytes
the file really holds before anything is allocated from what the header claims: a hostile or broken file
gets one GGUFError line naming the file and what is wrong, never a crash or a huge allocation. The
weights are laid out by model/loader.py's _lay_out. Where the C matmul kernels are built, each matrix
stays in its file format (model/quants.py's QuantizedWeight, multiplied in place by model/linear.py):
its blocks are copied out of the mapping (q|k|v and gate|up fused by stacking their rows of blocks) and
the mapped pages dropped, so the model is resident once, at its size in the file. Without the kernels,
and for formats they do not read, the matrices are dequantized to float32 once, as a folder's are.
"""
from __future__ import annotations

import logging
import math
import mmap
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from nvllm.model import matmul_kernels
from nvllm.model.loader import ModelConfig, ModelLoadError, ModelWeights, _lay_out, rope_inv_freq
from nvllm.model.quants import (BlockFormat, QuantizedWeight, UnsupportedTensorType, block_format, dequantize,
                                raw_nbytes)

log = logging.getLogger("nvllm.model.gguf_file")


class GGUFError(ValueError):
    """The GGUF is broken, hostile or holds something nvllm does not handle; the message says what."""


# ---------------------------------------------------------------- tensor names (shared with gguf_convert)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's llama3 rope scaling: one divisor per frequency


def hf_tensor_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> Hugging Face name (Llama's, plus Qwen2's biases and Qwen3's q/k norms)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if (len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES
            and parts[3] in ("weight", "bias")):
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise GGUFError(f"unexpected GGUF tensor {gguf_name!r}: nvllm knows Llama only "
                    "(with Qwen2's q/k/v biases and Qwen3's q/k norms)")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate_half RoPE applies, as in the HF checkpoint.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3)...; HF rotates x[i] with x[i + d/2].
    Its converter therefore interleaves each head's rows: GGUF row 2*i + j is HF row j*d/2 + i.
    """
    rows = w.shape[0]
    d = rows // n_heads
    # [H*d, in] -> [H, d/2, 2, in] -> [H, 2, d/2, in] -> [H*d, in]  (a bias [H*d] has in = 1)
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape))


def f32_float(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


# ---------------------------------------------------------------- the bounded header reader

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4          # GGML_MAX_DIMS
MAX_NAME_BYTES = 64   # GGML_MAX_NAME: llama.cpp refuses longer tensor names too
MAX_KEY_BYTES = 65535
MAX_NESTING = 4       # arrays of arrays: deeper than this is no model file

# GGUF value type -> (name, little-endian NumPy scalar type or None for string/array)
_STRING, _ARRAY = 8, 9
_SCALARS: Dict[int, Tuple[str, str]] = {
    0: ("uint8", "<u1"), 1: ("int8", "<i1"), 2: ("uint16", "<u2"), 3: ("int16", "<i2"),
    4: ("uint32", "<u4"), 5: ("int32", "<i4"), 6: ("float32", "<f4"), 7: ("bool", "<u1"),
    10: ("uint64", "<u8"), 11: ("int64", "<i8"), 12: ("float64", "<f8"),
}
# Fewest bytes a tensor info and a key/value pair can take: counts above what is left are lies.
_MIN_TENSOR_INFO = 8 + 1 + 4 + 8 + 4 + 8
_MIN_KV = 8 + 1 + 4 + 1


@dataclass
class TensorInfo:
    name: str
    ggml_type: int
    shape: Tuple[int, ...]   # NumPy order (GGUF's ne reversed): [rows, row length]
    offset: int              # from the start of the data section


class _Reader:
    """Reads the header from the mapped bytes; every read is checked against the bytes left."""

    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

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

    def string(self, what: str, limit: Optional[int] = None) -> str:
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

    def array(self, what: str, depth: int) -> List[Any]:
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
        return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(n)]


def _read_header(buf: memoryview, path: Path) -> Tuple[Dict[str, Any], List[TensorInfo], int]:
    """metadata, tensor infos and the data section's offset, all checked against the file's size."""
    r = _Reader(buf, path)
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

    metadata: Dict[str, Any] = {}
    types: Dict[str, int] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}", MAX_KEY_BYTES)
        vtype = r.uint(4, f"the type of {key!r}")
        if key in metadata:
            raise r.fail(f"metadata key {key!r} appears twice")
        metadata[key] = r.value(vtype, f"metadata {key!r}")
        types[key] = vtype

    infos: List[TensorInfo] = []
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


def _check_tensor_data(infos: List[TensorInfo], data_start: int, alignment: int, size: int,
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


# ---------------------------------------------------------------- the model's configuration

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
MAX_CONTEXT = 1 << 31


class _Meta:
    """Typed access to `{arch}.*` metadata with errors naming the file and the key."""

    def __init__(self, metadata: Dict[str, Any], arch: str, path: Path) -> None:
        self.m, self.arch, self.path = metadata, arch, path

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def get(self, key: str, kind: type, default: Any = None, required: bool = True) -> Any:
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        if full not in self.m:
            if required and default is None:
                raise self.fail(f"metadata {full!r} is missing")
            return default
        v = self.m[full]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise self.fail(f"metadata {full!r} is {v!r}, not an integer")
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise self.fail(f"metadata {full!r} is {v!r}, not a number")
        if kind is str and not isinstance(v, str):
            raise self.fail(f"metadata {full!r} is {v!r}, not a string")
        return v

    def positive(self, key: str, default: Optional[int] = None, limit: int = MAX_CONTEXT) -> int:
        v = self.get(key, int, default)
        if not 0 < v <= limit:
            raise self.fail(f"metadata '{self.arch}.{key}' is {v}, out of range (1 to {limit})")
        return v

    def finite(self, key: str, default: Optional[float] = None) -> float:
        v = float(self.get(key, float, default))
        if not (math.isfinite(v) and v > 0):
            raise self.fail(f"metadata '{self.arch}.{key}' is {v}, not a positive number")
        return f32_float(v)


def _config(metadata: Dict[str, Any], infos: Dict[str, TensorInfo], path: Path) -> ModelConfig:
    arch = metadata.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{path}: metadata 'general.architecture' is missing")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    m = _Meta(metadata, arch, path)
    hidden = m.positive("embedding_length")
    heads = m.positive("attention.head_count")
    kv_heads = m.positive("attention.head_count_kv", heads)
    head_dim = m.positive("attention.key_length", hidden // heads if hidden % heads == 0 else None)
    if heads % kv_heads:
        raise m.fail(f"{heads} attention heads cannot share {kv_heads} key/value heads evenly")
    if head_dim % 2:
        raise m.fail(f"head dimension {head_dim} is odd; rotary embedding needs pairs")
    value_dim = m.get("attention.value_length", int, head_dim)
    rot = m.get("rope.dimension_count", int, head_dim)
    if value_dim != head_dim or rot != head_dim:
        raise m.fail(f"key length {head_dim}, value length {value_dim} and rope dimensions {rot} differ; "
                     "nvllm needs them equal")
    embed = infos.get("token_embd.weight")
    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab = embed.shape[0] if embed is not None else (len(tokens) if isinstance(tokens, list) else 0)
    if not vocab:
        raise m.fail("no token_embd.weight tensor and no token list: the vocabulary size is unknown")
    if isinstance(tokens, list) and len(tokens) > vocab:
        raise m.fail(f"{len(tokens)} tokens but the embedding has {vocab} rows")
    bos = m.get("tokenizer.ggml.bos_token_id", int, required=False)
    eos = m.get("tokenizer.ggml.eos_token_id", int, required=False)
    for key, tid in (("bos", bos), ("eos", eos)):
        if tid is not None and not 0 <= tid < vocab:
            raise m.fail(f"metadata 'tokenizer.ggml.{key}_token_id' is {tid}, not a token id (0 to {vocab - 1})")
    bias = "blk.0.attn_q.bias" in infos
    if arch == "qwen3" and bias:
        raise m.fail("qwen3 with attention biases is not supported (it adds an o_proj bias)")
    config = ModelConfig(
        architecture=ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=m.positive("feed_forward_length"),
        num_layers=m.positive("block_count", limit=len(infos)),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=m.finite("attention.layer_norm_rms_epsilon"),
        rope_theta=m.finite("rope.freq_base", 10000.0),
        max_position_embeddings=m.positive("context_length"),
        tie_word_embeddings="output.weight" not in infos,
        attention_bias=bias,
        rope_scaling=None,
        qk_norm=arch == "qwen3",
        bos_token_id=bos,
        eos_token_ids=[] if eos is None else [eos],
    )
    return config


# ---------------------------------------------------------------- rope scaling

def _rope_scaling(config: ModelConfig, m: _Meta, freqs: Optional[np.ndarray]) -> Optional[Dict[str, Any]]:
    """llama3 rope scaling from `{arch}.rope.scaling.*`, or recovered from llama.cpp's rope_freqs.weight
    (its converter writes the per-frequency divisors instead of the parameters); anything else refused."""
    kind = m.get("rope.scaling.type", str, "none")
    if kind == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": m.finite("rope.scaling.factor"),
            "low_freq_factor": m.finite("rope.scaling.low_freq_factor", 1.0),
            "high_freq_factor": m.finite("rope.scaling.high_freq_factor", 4.0),
            "original_max_position_embeddings": m.positive("rope.scaling.original_context_length"),
        }
        if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
            raise m.fail("rope scaling: high_freq_factor must exceed low_freq_factor")
    elif kind == "none":
        scaling = None if freqs is None else _llama3_from_freqs(config, freqs, m)
    else:
        raise m.fail(f"rope scaling type {kind!r} is not supported (supported: none, llama3)")
    if freqs is not None:
        want = _scaled_inv_freq(config, freqs)
        got = rope_inv_freq(_with_scaling(config, scaling))
        if not np.allclose(got, want, rtol=1e-5, atol=0):
            raise m.fail(f"{ROPE_FREQS} does not match llama3 rope scaling {scaling}; "
                         "this rope scaling is not supported")
    return scaling


def _with_scaling(config: ModelConfig, scaling: Optional[Dict[str, Any]]) -> ModelConfig:
    return replace(config, rope_scaling=scaling)


def _scaled_inv_freq(config: ModelConfig, freqs: np.ndarray) -> np.ndarray:
    """llama.cpp's frequencies with rope_freqs: each base frequency divided by its factor."""
    return (rope_inv_freq(_with_scaling(config, None)) / freqs).astype(np.float32)


def _tidy(x: float) -> float:
    """A fitted parameter as the round number it was made from, when it is one to float32 precision."""
    r = round(x)
    return float(r) if abs(x - r) <= 1e-4 * max(1.0, abs(x)) else float(np.float32(x))


def _llama3_from_freqs(config: ModelConfig, freqs: np.ndarray, m: _Meta) -> Optional[Dict[str, Any]]:
    """The llama3 parameters that give these per-frequency divisors.

    llama3 keeps short wavelengths (divisor 1), slows long ones by `factor`, and between them blends
    with smooth = old_len / wavelength * a - b, where a = 1 / (high - low), b = low / (high - low):
    1 / divisor = (1 - smooth) / factor + smooth. Two blended frequencies fix a and b; with low = 1
    (llama 3's value; any other gives the same curve) high and old_len follow.
    """
    if not np.all(np.isfinite(freqs)) or np.any(freqs < 1.0 - 1e-6):
        raise m.fail(f"{ROPE_FREQS} holds factors below 1 or not finite; not llama3 rope scaling")
    factor = float(freqs.max())
    if factor <= 1.0 + 1e-6:
        return None
    inv = rope_inv_freq(_with_scaling(config, None)).astype(np.float64)
    wavelen = 2 * math.pi / inv
    blended = (freqs > 1.0 + 1e-6) & (freqs < factor * (1 - 1e-6))
    if blended.sum() < 2:
        raise m.fail(f"{ROPE_FREQS} has fewer than two blended frequencies: its llama3 parameters "
                     "cannot be recovered; not supported")
    smooth = (1.0 / freqs[blended].astype(np.float64) - 1.0 / factor) / (1.0 - 1.0 / factor)
    # smooth = A / wavelen - B, with A = old_len / (high - low), B = low / (high - low)
    A, negB = np.polyfit(1.0 / wavelen[blended], smooth, 1)
    B = -negB
    if not (A > 0 and B > 0):
        raise m.fail(f"{ROPE_FREQS} does not follow llama3 rope scaling; not supported")
    high = 1.0 + 1.0 / B
    return {
        "rope_type": "llama3",
        "factor": _tidy(factor),
        "low_freq_factor": 1.0,
        "high_freq_factor": _tidy(high),
        "original_max_position_embeddings": int(round(A / B)),
    }


# ---------------------------------------------------------------- shapes

def _expected_shapes(c: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """Every tensor the model needs (and may have), NumPy order, from the hyperparameters."""
    h, i, d, v = c.hidden_size, c.intermediate_size, c.head_dim, c.vocab_size
    q, kv = c.num_heads * d, c.num_kv_heads * d
    shapes: Dict[str, Tuple[int, ...]] = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["output.weight"] = (v, h)
    for n in range(c.num_layers):
        p = f"blk.{n}."
        shapes.update({
            p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
            p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
            p + "attn_output.weight": (h, q),
            p + "ffn_gate.weight": (i, h), p + "ffn_up.weight": (i, h), p + "ffn_down.weight": (h, i),
        })
        if c.attention_bias:
            shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,)})
    return shapes


def _check_tensors(c: ModelConfig, arch: str, infos: Dict[str, TensorInfo], path: Path) -> None:
    want = _expected_shapes(c)
    if ROPE_FREQS in infos:
        want[ROPE_FREQS] = (c.head_dim // 2,)
    for name, shape in want.items():
        t = infos.get(name)
        if t is None:
            raise GGUFError(f"{path}: tensor {name!r} is missing")
        if t.shape != shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} "
                            "from the hyperparameters")
    extra = sorted(set(infos) - set(want))
    if extra:
        raise GGUFError(f"{path}: unexpected tensor {extra[0]!r} for a {c.num_layers}-layer {arch} model")


# ---------------------------------------------------------------- the file

@dataclass
class GGUFModel:
    path: Path
    config: ModelConfig
    metadata: Dict[str, Any]
    tensors: Dict[str, Tuple[BlockFormat, np.ndarray, Tuple[int, ...]]]  # name -> (format, raw uint8, shape)
    mapping: Optional[mmap.mmap] = field(default=None, repr=False)   # the file, mapped read-only

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
        metadata, info_list, data_start = _read_header(buf, path)
    finally:
        buf.release()
    infos = {t.name: t for t in info_list}
    config = _config(metadata, infos, path)
    arch = metadata["general.architecture"]
    _check_tensors(config, arch, infos, path)
    tensors: Dict[str, Tuple[BlockFormat, np.ndarray, Tuple[int, ...]]] = {}
    for t in info_list:
        fmt = block_format(t.ggml_type, t.name)
        n = raw_nbytes(fmt, t.shape)
        tensors[t.name] = (fmt, np.frombuffer(mm, np.uint8, count=n, offset=data_start + t.offset), t.shape)
    freqs = None
    if ROPE_FREQS in tensors:
        fmt, raw, shape = tensors[ROPE_FREQS]
        freqs = np.array(dequantize(fmt, raw, shape), dtype=np.float32)
    config.rope_scaling = _rope_scaling(config, _Meta(metadata, arch, path), freqs)
    return GGUFModel(path, config, metadata, tensors, mm)


# ---------------------------------------------------------------- weights

_CHUNK_BYTES = 16 << 20   # raw bytes dequantized at a time


class _DequantizedTensors:
    """The GGUF's tensors under their Hugging Face names, as loader._lay_out asks for them (get, joined,
    `in`): each dequantized to float32 straight into its final layout, llama's Q/K rows unpermuted."""

    def __init__(self, model: GGUFModel) -> None:
        self.model = model
        self.names = {hf_tensor_name(n): n for n in model.tensors if n != ROPE_FREQS}
        self.permute = model.metadata.get("general.architecture") == "llama"

    def __contains__(self, hf_name: str) -> bool:
        return hf_name in self.names

    def get(self, name: str, shape: Tuple[int, ...], transpose: bool = False) -> np.ndarray:
        return self.joined([(name, shape)], transpose)

    def joined(self, parts: List[Tuple[str, Tuple[int, ...]]], transpose: bool = False) -> np.ndarray:
        """Tensors concatenated along their first axis, in one copy: [a, K] + [b, K] -> [a+b, K]; when
        transposed, [K, a+b] as the transposed view of that array (loader.py's layout for linear.py)."""
        rows = sum(s[0] for _, s in parts)
        rest = tuple(parts[0][1][1:])
        out = np.empty((rows,) + rest, dtype=np.float32)
        at = 0
        for name, shape in parts:
            k = shape[0]
            self._fill(name, shape, lambda r0, r1: out[at + r0:at + r1])
            at += k
        return out.T if transpose else out

    def _lookup(self, hf_name: str, shape: Tuple[int, ...]) -> Tuple[str, BlockFormat, np.ndarray]:
        """(GGUF name, format, raw bytes) of a tensor, checked to have `shape`."""
        if hf_name not in self.names:
            raise ModelLoadError(f"{self.model.path}: tensor {hf_name!r} is missing")
        gname = self.names[hf_name]
        fmt, raw, gshape = self.model.tensors[gname]
        if tuple(gshape) != tuple(shape):
            raise ModelLoadError(f"{self.model.path}: tensor {gname!r} has shape {list(gshape)}, "
                                 f"expected {list(shape)}")
        return gname, fmt, raw

    def _fill(self, hf_name: str, shape: Tuple[int, ...], dst: Callable[[int, int], np.ndarray]) -> None:
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
        if not self.permute:
            return 0
        kind = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        c = self.model.config
        return {"attn_q": c.num_heads, "attn_k": c.num_kv_heads}.get(kind, 0)


# The formats the C matmul kernels multiply in place; the others (Q5_0, Q5_1, F32) are laid out as float32.
IN_PLACE_FORMATS = frozenset({"F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"})


class _InPlaceTensors(_DequantizedTensors):
    """As _DequantizedTensors, but a matrix in a format the kernels read comes back as a QuantizedWeight
    (out, in) holding a copy of its blocks (llama's Q/K rows unpermuted, q|k|v and gate|up stacked), its
    mapped pages dropped; a matrix in another format is laid out as float32, and named in `as_float`
    when that dequantized it (F32 is laid out as it is, for linear.py)."""

    def __init__(self, model: GGUFModel) -> None:
        super().__init__(model)
        self.as_float: List[str] = []   # "name (format)" of each matrix dequantized to float32

    def joined(self, parts: List[Tuple[str, Tuple[int, ...]]], transpose: bool = False):
        if len(parts[0][1]) != 2:
            return super().joined(parts, transpose)                       # norms and biases: float32
        found = [self._lookup(name, shape) for name, shape in parts]
        formats = {fmt.name for _, fmt, _ in found}
        if not formats <= IN_PLACE_FORMATS:
            self.as_float += [f"{gname} ({fmt.name})" for gname, fmt, _ in found if fmt.name != "F32"]
            return super().joined(parts, transpose)
        if len(formats) == 1:
            return self._stacked(found, [shape for _, shape in parts])
        # parts in different formats (a Q4_K_M file's Q6_K attn_v): each kept, outputs side by side
        return tuple(self._stacked([f], [shape]) for f, (_, shape) in zip(found, parts))

    def _stacked(self, found: List[Tuple[str, BlockFormat, np.ndarray]],
                 shapes: List[Tuple[int, ...]]) -> QuantizedWeight:
        """The tensors' rows of blocks stacked into one new array [sum of rows, row bytes]."""
        fmt = found[0][1]
        row_bytes = raw_nbytes(fmt, shapes[0][1:])
        out = np.empty((sum(s[0] for s in shapes), row_bytes), np.uint8)
        at = 0
        for (gname, _, raw), shape in zip(found, shapes):
            k = shape[0]
            src, dst = raw.reshape(k, row_bytes), out[at:at + k]
            heads = self._rope_heads(gname)
            if heads:
                # unpermute_rope_rows on whole rows of blocks, exact: HF row j*d/2 + i of a head is
                # GGUF row 2*i + j.  [heads, d/2, 2, bytes] -> [heads, 2, d/2, bytes]
                d = k // heads
                dst.reshape(heads, 2, d // 2, row_bytes)[...] = src.reshape(heads, d // 2, 2, row_bytes).swapaxes(1, 2)
                self.model.release(raw)
            else:
                step = max(1, _CHUNK_BYTES // max(1, row_bytes))
                for r0 in range(0, k, step):                    # a chunk at a time, then drop its pages
                    dst[r0:r0 + step] = src[r0:r0 + step]
                    self.model.release(src[r0:r0 + step].reshape(-1))
            at += k
        return QuantizedWeight(fmt, out, (len(out), shapes[0][1]))


def _release_all(model: GGUFModel) -> None:
    """Every tensor's mapped pages dropped again once all are copied: each page fault maps the cached
    pages around it too (fault-around), so pages released earlier come back while later tensors are
    read."""
    for _, raw, _ in model.tensors.values():
        model.release(raw)


def in_place_kernels() -> bool:
    """Whether the C matmul kernels that multiply quantized weights in place are built."""
    return matmul_kernels.lib is not None


def load_gguf_weights(model: GGUFModel, in_place: Optional[bool] = None) -> ModelWeights:
    """The weights in the layout a folder's give (model/loader.py's _lay_out). In place (the default
    where the C matmul kernels are built) the matrices keep their file format; otherwise, or for a
    format the kernels do not read, they are float32, and one log line says which and why."""
    if in_place is None:
        in_place = in_place_kernels()
    if not in_place:
        weights = _lay_out(_DequantizedTensors(model), model.config, model.path)
        _release_all(model)
        if any(fmt.name != "F32" for name, (fmt, _, shape) in model.tensors.items() if len(shape) == 2):
            log.info("%s: every matrix dequantized to float32 (%.0f MiB): the C matmul kernels are not built",
                     model.path, weights.nbytes / 2**20)
        return weights
    tensors = _InPlaceTensors(model)
    weights = _lay_out(tensors, model.config, model.path)
    _release_all(model)
    if tensors.as_float:
        shown = ", ".join(tensors.as_float[:6]) + (f" and {len(tensors.as_float) - 6} more"
                                                   if len(tensors.as_float) > 6 else "")
        log.info("%s: %d matrices dequantized to float32, their formats having no in-place kernel "
                 "(kept in place: %s): %s", model.path, len(tensors.as_float), ", ".join(sorted(IN_PLACE_FORMATS)),
                 shown)
    return weights


def _matrix_groups(c: ModelConfig) -> List[List[str]]:
    """The matrices _lay_out fuses, as GGUF names: each group is one weight of the decoder."""
    groups = [["token_embd.weight"]] + ([] if c.tie_word_embeddings else [["output.weight"]])
    for n in range(c.num_layers):
        p = f"blk.{n}."
        groups += [[p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], [p + "attn_output.weight"],
                   [p + "ffn_gate.weight", p + "ffn_up.weight"], [p + "ffn_down.weight"]]
    return groups


def resident_weight_bytes(model: GGUFModel, in_place: Optional[bool] = None) -> int:
    """The bytes load_gguf_weights(model, in_place) will hold (its ModelWeights.nbytes), from the header
    alone: for planning memory before loading."""
    if in_place is None:
        in_place = in_place_kernels()
    total, grouped = 0, set()
    for group in _matrix_groups(model.config):
        found = [model.tensors[name] for name in group]
        grouped.update(group)
        if in_place and all(fmt.name in IN_PLACE_FORMATS for fmt, _, _ in found):
            total += sum(raw.size for _, raw, _ in found)
        else:
            total += sum(4 * math.prod(shape) for _, _, shape in found)
    return total + sum(4 * math.prod(shape) for name, (_, _, shape) in model.tensors.items()
                       if name not in grouped and name != ROPE_FREQS)


def hf_tensors(model: GGUFModel) -> Iterator[Tuple[str, np.ndarray]]:
    """Every tensor under its Hugging Face name as float32 [out, in] (HF's Q/K row order), one at a time:
    what `nvllm models pull` writes into a folder's model.safetensors."""
    tensors = _DequantizedTensors(model)
    for hf_name, gname in tensors.names.items():
        yield hf_name, tensors.get(hf_name, tuple(model.tensors[gname][2]))

