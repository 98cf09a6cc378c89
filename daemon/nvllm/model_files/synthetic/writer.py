"""A random-weight GGUF of a real model's exact shape, in the file types llama.cpp's tools make.

The file is what llama.cpp's converter and quantize tool would write for such a model: the same
metadata keys, tensor names and order, and each tensor in the block format mixture.py picks, quantized
by model/quant/quantize.py (llama.cpp's reference quantizers). The weights are seeded normals, scaled
as trained weights are (matrices ~ N(0, 0.02) rounded to float16, norm gains ~1), so speed and memory
figures taken on the file are those of the real model; its answers are noise. The same seed gives the
same values in every type: the Q4_K_M file is the F16 file quantized.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import gguf
import numpy as np

from nvllm.model.quant.formats import FORMATS
from nvllm.model.quant.quantize import quantize
from nvllm.model_files.synthetic.bert import bert_metadata, bert_tensor_specs
from nvllm.model_files.synthetic.mixture import FILE_TYPES, TensorSpec, tensor_types
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.vocab import vocabulary

BY_NAME = {f.name: f for f in FORMATS.values()}
_ROWS_VALUES = 1 << 22  # values drawn and quantized at a time


def tensor_specs(shape: Shape) -> list[TensorSpec]:
    """Every tensor of the model, in the order llama.cpp's converter writes them."""
    if shape.arch == "bert":
        return bert_tensor_specs(shape)
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    specs = []
    if shape.rope_scaling:
        specs.append(TensorSpec("rope_freqs.weight", "norm", (shape.head_dim // 2,)))
    if shape.longrope[0]:   # phi3: a divisor per rotated frequency, past the original context and within it
        specs += [TensorSpec(f"rope_factors_{kind}.weight", "norm", (shape.rotary_dim // 2,))
                  for kind in ("long", "short")]
    specs.append(TensorSpec("token_embd.weight", "token_embd", (shape.vocab, h)))
    for i in range(shape.layers):
        b = f"blk.{i}."
        specs.append(TensorSpec(b + "attn_norm.weight", "norm", (h,)))
        if shape.arch == "phi3":
            specs += _phi3_layer(shape, b)
            continue
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            specs.append(TensorSpec(f"{b}attn_{part}.weight", f"attn_{part}", (rows, h)))
            if shape.qkv_bias:
                specs.append(TensorSpec(f"{b}attn_{part}.bias", "bias", (rows,)))
        if shape.qk_norm:
            specs += [TensorSpec(b + "attn_q_norm.weight", "norm", (shape.head_dim,)),
                      TensorSpec(b + "attn_k_norm.weight", "norm", (shape.head_dim,))]
        specs += [TensorSpec(b + "attn_output.weight", "attn_output", (h, q))]
        if shape.arch == "gemma3":   # the attention's output norm (its ffn_norm is the pre-feedforward norm)
            specs.append(TensorSpec(b + "post_attention_norm.weight", "norm", (h,)))
        specs += [TensorSpec(b + "ffn_norm.weight", "norm", (h,)),
                  TensorSpec(b + "ffn_gate.weight", "ffn_gate", (shape.intermediate, h)),
                  TensorSpec(b + "ffn_up.weight", "ffn_up", (shape.intermediate, h)),
                  TensorSpec(b + "ffn_down.weight", "ffn_down", (h, shape.intermediate))]
        if shape.arch == "gemma3":
            specs.append(TensorSpec(b + "post_ffw_norm.weight", "norm", (h,)))
    specs.append(TensorSpec("output_norm.weight", "norm", (h,)))
    return specs


def _phi3_layer(shape: Shape, b: str) -> list[TensorSpec]:
    """A phi3 layer after its attn_norm: q|k|v in one matrix, gate|up in one ffn_up, as its checkpoint holds them."""
    h, i = shape.hidden, shape.intermediate
    return [TensorSpec(b + "attn_qkv.weight", "attn_qkv", ((shape.heads + 2 * shape.kv_heads) * shape.head_dim, h)),
            TensorSpec(b + "attn_output.weight", "attn_output", (h, shape.heads * shape.head_dim)),
            TensorSpec(b + "ffn_norm.weight", "norm", (h,)),
            TensorSpec(b + "ffn_up.weight", "ffn_up", (2 * i, h)),
            TensorSpec(b + "ffn_down.weight", "ffn_down", (h, i))]


def llama3_rope_divisors(theta: float, head_dim: int, scaling: Mapping[str, float]) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for llama3 rope scaling: per frequency, how
    many times slower it turns (1 for short wavelengths, `factor` for long ones, a blend between)."""
    factor, low = float(scaling["factor"]), float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    out = []
    for f in freqs.astype(np.float64):
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def _values(shape: Shape, spec: TensorSpec, rng: np.random.Generator, rows: int) -> np.ndarray:
    """`rows` rows of the tensor's float32 values."""
    if spec.name == "rope_freqs.weight":
        return llama3_rope_divisors(shape.rope_theta, shape.head_dim, shape.rope_scaling)
    if spec.role == "norm":
        return (1 + 0.05 * rng.standard_normal(spec.shape, np.float32)).astype(np.float32)
    if len(spec.shape) == 1:
        return rng.standard_normal(spec.shape, np.float32) * np.float32(0.02)
    # matrices as a 16-bit checkpoint holds them, so that a quantized file is the F16 file quantized
    x = rng.standard_normal((rows, spec.shape[1]), np.float32) * np.float32(0.02)
    return x.astype(np.float16).astype(np.float32)


def _encoded(shape: Shape, spec: TensorSpec, type_name: str, seed: int, index: int) -> np.ndarray:
    """The tensor's bytes in `type_name`, drawn and quantized a slice of rows at a time."""
    rng = np.random.default_rng([seed, index])
    fmt = BY_NAME[type_name]
    if len(spec.shape) == 1:
        return quantize(fmt, _values(shape, spec, rng, 1).reshape(1, -1)).reshape(-1)
    rows, n = spec.shape
    out = np.empty((rows, n // fmt.block_elems * fmt.block_bytes), np.uint8)
    step = max(1, _ROWS_VALUES // n)
    for r in range(0, rows, step):
        out[r:r + step] = quantize(fmt, _values(shape, spec, rng, min(step, rows - r)))
    return out


def _metadata(w: gguf.GGUFWriter, shape: Shape, file_type: str, seed: int) -> None:
    if shape.arch == "bert":
        bert_metadata(w, shape, FILE_TYPES[file_type], seed)
        return
    w.add_type("model")
    w.add_name(f"{shape.name} (synthetic, random weights, seed {seed})")
    w.add_file_type(FILE_TYPES[file_type])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.norm_eps)
    if shape.head_dim * shape.heads != shape.hidden:
        w.add_key_length(shape.head_dim)
        w.add_value_length(shape.head_dim)
    if shape.arch in ("llama", "smollm3"):   # smollm3's converter is Llama's
        w.add_vocab_size(shape.vocab)
        w.add_rope_dimension_count(shape.head_dim)
    if shape.arch == "phi3":
        w.add_rope_dimension_count(shape.rotary_dim or shape.head_dim)
        if shape.longrope[0]:
            w.add_rope_scaling_orig_ctx_len(shape.longrope[0])
            w.add_rope_scaling_attn_factors(shape.longrope[1])
    if shape.sliding_window:
        w.add_sliding_window(shape.sliding_window)
    if shape.pooling:
        w.add_pooling_type(gguf.PoolingType(shape.pooling))
    tokens, types, merges = vocabulary(shape, seed)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(shape.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(shape.bos)
    w.add_eos_token_id(shape.eos)
    w.add_add_bos_token(shape.add_bos)
    w.add_chat_template(shape.chat_template)


def write_header(w: gguf.GGUFWriter, specs: list[TensorSpec], types: list[str]) -> None:
    """Every tensor's name, shape and type, then the header, metadata and tensor infos: the tensors'
    bytes follow one at a time (write_tensor_data), so no tensor need be held whole."""
    for spec, t in zip(specs, types):
        fmt = BY_NAME[t]
        row_bytes = spec.shape[-1] // fmt.block_elems * fmt.block_bytes
        rows = int(np.prod(spec.shape[:-1], dtype=np.int64))
        w.add_tensor_info(spec.name, [*spec.shape[:-1], row_bytes], np.dtype(np.uint8), rows * row_bytes,
                          raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()


def synthesize(shape: Shape, file_type: str, out: Path, seed: int = 0, progress: bool = False) -> Path:
    """Write the file; returns its path. Tensors are drawn, quantized and written one at a time, so the
    memory held is one tensor's blocks."""
    specs = tensor_specs(shape)
    types = tensor_types(file_type, specs, shape.layers, shape.heads // shape.kv_heads)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")   # renamed when whole: a stopped run leaves no broken FILE
    try:
        w = gguf.GGUFWriter(str(tmp), shape.arch)
        _metadata(w, shape, file_type, seed)
        write_header(w, specs, types)
        start = time.monotonic()
        for i, (spec, t) in enumerate(zip(specs, types)):
            w.write_tensor_data(_encoded(shape, spec, t, seed, i))
            if progress and spec.role == "ffn_down":
                print(f"\rlayer {spec.name.split('.')[1]} of {shape.layers}: {i + 1}/{len(specs)} tensors, "
                      f"{time.monotonic() - start:.0f} s", end="", file=sys.stderr, flush=True)
        w.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if progress:
        print(file=sys.stderr)
    tmp.replace(out)
    return out


def iter_types(shape: Shape, file_type: str) -> Iterator[tuple[str, str]]:
    """(tensor name, type) of the file synthesize would write, without writing it."""
    specs = tensor_specs(shape)
    yield from zip((s.name for s in specs), tensor_types(file_type, specs, shape.layers, shape.heads // shape.kv_heads))
