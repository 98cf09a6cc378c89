"""Whisper's weights as every reader lays them out, by the Hugging Face names of WhisperForConditionalGeneration:
a folder's reader (whisper_files.py), a CTranslate2 folder's and a whisper.cpp file's answer the same
TensorReader calls (weights/layout.py).

What the forward pass wants of them: each attention's q|k|v fused into one matrix (Whisper's k has no bias: a
zero one here, so one bias add serves all three), the cross-attention's k|v likewise, the two convolutions as
matrices over an im2col of their input (model/whisper_encoder.py), the position tables as float32 arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from nvllm.model.kernels import matmul
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.packed import in_kernel_layout
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.conversion import quantize_weight
from nvllm.model.weights.layout import Parts, TensorReader
from nvllm.model.whisper_config import WhisperConfig

Norm = tuple[np.ndarray, np.ndarray]   # LayerNorm's weight and bias [d]


@dataclass
class Attention:
    """Self-attention: q|k|v (3d, d) with its bias [3d] (k's zeros), the output projection (d, d) and bias."""
    qkv: Weight
    qkv_bias: np.ndarray
    o: Weight
    o_bias: np.ndarray


@dataclass
class CrossAttention:
    """The decoder's attention to the encoder: q from the decoder's rows, k|v (2d, d) from the encoder's states
    (computed once per window, model/whisper_cross.py), the output projection."""
    q: Weight
    q_bias: np.ndarray
    kv: Weight
    kv_bias: np.ndarray
    o: Weight
    o_bias: np.ndarray


@dataclass
class Mlp:
    fc1: Weight                # (ffn, d)
    fc1_bias: np.ndarray
    fc2: Weight                # (d, ffn)
    fc2_bias: np.ndarray


@dataclass
class EncoderLayer:
    """Pre-norm: x += attn(LN(x)); x += fc2(gelu(fc1(LN(x))))."""
    attn_norm: Norm
    attn: Attention
    ffn_norm: Norm
    ffn: Mlp


@dataclass
class DecoderLayer:
    """Pre-norm: x += self-attn(LN(x)); x += cross-attn(LN(x)); x += fc2(gelu(fc1(LN(x))))."""
    attn_norm: Norm
    attn: Attention
    cross_norm: Norm
    cross: CrossAttention
    ffn_norm: Norm
    ffn: Mlp


@dataclass
class WhisperWeights:
    conv1: Weight              # (d, 3 n_mels): column k * n_mels + m is the kernel's tap k on mel bin m
    conv1_bias: np.ndarray
    conv2: Weight              # (d, 3 d): column k * d + c is tap k on channel c
    conv2_bias: np.ndarray
    encoder_positions: np.ndarray   # [1500, d] float32 (sinusoids, as the checkpoint stores them)
    encoder_layers: list[EncoderLayer]
    encoder_norm: Norm
    embed: Weight              # (V, d): the tokens' rows, and (tied) the logits' matrix
    decoder_positions: np.ndarray   # [max_target_positions, d] float32, learnt
    decoder_layers: list[DecoderLayer]
    decoder_norm: Norm

    @property
    def nbytes(self) -> int:
        """Bytes the weights hold, each buffer once."""
        seen: dict[int, int] = {}
        _count(self, seen)
        return sum(seen.values())


def _count(value: Any, seen: dict[int, int]) -> None:
    if isinstance(value, np.ndarray):
        seen[id(value)] = value.nbytes
    elif isinstance(value, Weight):
        for b in value.buffers():
            seen[id(b)] = b.nbytes
    elif isinstance(value, (list, tuple)):
        for v in value:
            _count(v, seen)
    elif is_dataclass(value):
        for f in fields(value):
            _count(getattr(value, f.name), seen)


def whisper_tensor_names(c: WhisperConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the layout reads, by Hugging Face name, with its shape."""
    d, m = c.d_model, c.num_mel_bins
    e, dec = "model.encoder.", "model.decoder."
    names: dict[str, tuple[int, ...]] = {
        e + "conv1.weight": (d, m, 3), e + "conv1.bias": (d,), e + "conv2.weight": (d, d, 3), e + "conv2.bias": (d,),
        e + "embed_positions.weight": (c.max_source_positions, d),
        e + "layer_norm.weight": (d,), e + "layer_norm.bias": (d,),
        dec + "embed_tokens.weight": (c.vocab_size, d), dec + "embed_positions.weight": (c.max_target_positions, d),
        dec + "layer_norm.weight": (d,), dec + "layer_norm.bias": (d,)}
    blocks: list[tuple[str, int, tuple[str, ...]]] = [(f"{e}layers.{n}.", c.encoder_ffn_dim, ("self_attn",))
                                                      for n in range(c.encoder_layers)]
    blocks += [(f"{dec}layers.{n}.", c.decoder_ffn_dim, ("self_attn", "encoder_attn"))
               for n in range(c.decoder_layers)]
    for p, ffn, attns in blocks:
        for a in attns:
            for x in ("q", "k", "v", "out"):
                names[f"{p}{a}.{x}_proj.weight"] = (d, d)
                if x != "k":
                    names[f"{p}{a}.{x}_proj.bias"] = (d,)
            names[f"{p}{a}_layer_norm.weight"] = names[f"{p}{a}_layer_norm.bias"] = (d,)
        names[f"{p}fc1.weight"], names[f"{p}fc1.bias"] = (ffn, d), (ffn,)
        names[f"{p}fc2.weight"], names[f"{p}fc2.bias"] = (d, ffn), (d,)
        names[f"{p}final_layer_norm.weight"] = names[f"{p}final_layer_norm.bias"] = (d,)
    return names


def lay_out_whisper(t: TensorReader, c: WhisperConfig, where: str) -> WhisperWeights:
    """The weights in the forward pass's layout, from `t` (Hugging Face names); `where` names the files in
    errors (the reader's own name a missing tensor)."""
    d, m = c.d_model, c.num_mel_bins
    e, dec = "model.encoder.", "model.decoder."

    def norm(name: str) -> Norm:
        return t.get(f"{name}.weight", (d,)), t.get(f"{name}.bias", (d,))

    def attention(p: str) -> Attention:
        parts: Parts = [(f"{p}.{x}_proj.weight", (d, d)) for x in ("q", "k", "v")]
        bias = np.concatenate([t.get(f"{p}.q_proj.bias", (d,)), np.zeros(d, np.float32),
                               t.get(f"{p}.v_proj.bias", (d,))])
        return Attention(t.joined(parts), bias, t.get(f"{p}.out_proj.weight", (d, d)),
                         t.get(f"{p}.out_proj.bias", (d,)))

    def cross(p: str) -> CrossAttention:
        kv: Parts = [(f"{p}.k_proj.weight", (d, d)), (f"{p}.v_proj.weight", (d, d))]
        return CrossAttention(t.get(f"{p}.q_proj.weight", (d, d)), t.get(f"{p}.q_proj.bias", (d,)), t.joined(kv),
                              np.concatenate([np.zeros(d, np.float32), t.get(f"{p}.v_proj.bias", (d,))]),
                              t.get(f"{p}.out_proj.weight", (d, d)), t.get(f"{p}.out_proj.bias", (d,)))

    def mlp(p: str, ffn: int) -> Mlp:
        return Mlp(t.get(f"{p}fc1.weight", (ffn, d)), t.get(f"{p}fc1.bias", (ffn,)),
                   t.get(f"{p}fc2.weight", (d, ffn)), t.get(f"{p}fc2.bias", (d,)))

    encoder_layers = []
    for n in range(c.encoder_layers):
        p = f"{e}layers.{n}."
        encoder_layers.append(EncoderLayer(norm(p + "self_attn_layer_norm"), attention(p + "self_attn"),
                                           norm(p + "final_layer_norm"), mlp(p, c.encoder_ffn_dim)))
    decoder_layers = []
    for n in range(c.decoder_layers):
        p = f"{dec}layers.{n}."
        decoder_layers.append(DecoderLayer(norm(p + "self_attn_layer_norm"), attention(p + "self_attn"),
                                           norm(p + "encoder_attn_layer_norm"), cross(p + "encoder_attn"),
                                           norm(p + "final_layer_norm"), mlp(p, c.decoder_ffn_dim)))
    embed = t.get(dec + "embed_tokens.weight", (c.vocab_size, d))
    kind = _sixteen_bits(embed)
    conv1 = _conv(t.get(e + "conv1.weight", (d, m, 3)), kind, e + "conv1.weight")
    conv2 = _conv(t.get(e + "conv2.weight", (d, d, 3)), kind, e + "conv2.weight")
    return WhisperWeights(
        conv1=conv1, conv1_bias=t.get(e + "conv1.bias", (d,)), conv2=conv2, conv2_bias=t.get(e + "conv2.bias", (d,)),
        encoder_positions=_table(t.get(e + "embed_positions.weight", (c.max_source_positions, d))),
        encoder_layers=encoder_layers, encoder_norm=norm(e + "layer_norm"),
        embed=embed, decoder_positions=_table(t.get(dec + "embed_positions.weight", (c.max_target_positions, d))),
        decoder_layers=decoder_layers, decoder_norm=norm(dec + "layer_norm"))


def _table(w: Weight | np.ndarray) -> np.ndarray:
    """A position table as float32, whatever storage the reader gave it."""
    a = w.dequantize() if isinstance(w, Weight) else w
    return np.ascontiguousarray(a, dtype=np.float32)


def _sixteen_bits(embed: Weight) -> str:
    """The 16-bit kind the checkpoint's matrices are held in ("f16", "bf16"), read off the embedding; "" else."""
    kinds: dict[tuple[str, ...], str] = {("F16",): "f16", ("BF16",): "bf16"}
    return kinds.get(tuple(embed.formats), "") if matmul.lib is not None else ""


def _conv(w: np.ndarray, kind: str, name: str) -> Weight:
    """A convolution's weight [out, in, 3] as the matrix (out, 3 in) the im2col multiplies: the taps outermost,
    so each tap's block of columns meets a shifted copy of the input. Kept in the checkpoint's 16 bits when its
    matrices are so (exact: the values came from them), else float32; never quantized further (whisper.cpp and
    CTranslate2 keep their convolutions in float too)."""
    w = np.asarray(w, dtype=np.float32)
    out, inp, taps = w.shape
    matrix = np.ascontiguousarray(w.transpose(0, 2, 1).reshape(out, taps * inp))
    return in_kernel_layout(quantize_weight(matrix, kind, name)) if kind else DenseWeight(matrix)
