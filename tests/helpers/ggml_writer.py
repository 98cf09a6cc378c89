"""A whisper.cpp ggml .bin written from Hugging Face tensors, as whisper.cpp's models/convert-h5-to-ggml.py
writes one (openai-whisper's tensor names, F16 matrices and float32 vectors, positions and conv biases) and its
quantize tool requantizes it (every 2-D tensor but the positions and conv biases in the chosen block format,
ftype + 1000 x the block layout's version). Written here from the format, for the reader's tests; the blocks
are nvllm's quantizer's (model/quant/quantize.py), which are ggml's."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from nvllm.model.quant.formats import FORMATS
from nvllm.model.quant.quantize import quantize
from nvllm.model.weights.whisper_hf_config import WhisperDims

MAGIC = 0x67676D6C
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}   # ggml's ggml_ftype
TYPE_IDS = {f.name: f.ggml_type for f in FORMATS.values()}
# convert-h5-to-ggml.py's map from Hugging Face's names to openai-whisper's
_LAYER = {"self_attn.k_proj": "attn.key", "self_attn.q_proj": "attn.query", "self_attn.v_proj": "attn.value",
          "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
          "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
          "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
          "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln"}
_TOP = {"encoder.layer_norm.bias": "encoder.ln_post.bias", "encoder.layer_norm.weight": "encoder.ln_post.weight",
        "encoder.embed_positions.weight": "encoder.positional_embedding",
        "decoder.layer_norm.bias": "decoder.ln.bias", "decoder.layer_norm.weight": "decoder.ln.weight",
        "decoder.embed_positions.weight": "decoder.positional_embedding",
        "decoder.embed_tokens.weight": "decoder.token_embedding.weight"}
_KEEP_FLOAT = ("encoder.conv1.bias", "encoder.conv2.bias", "encoder.positional_embedding",
               "decoder.positional_embedding")


def openai_name(hf: str) -> str:
    """model.encoder.layers.0.self_attn.q_proj.weight -> encoder.blocks.0.attn.query.weight, as the converter."""
    parts = hf.split(".")[1:]
    if parts[1] == "layers":
        return ".".join([parts[0], "blocks", parts[2], _LAYER[".".join(parts[3:-1])], parts[-1]])
    name = ".".join(parts)
    return _TOP.get(name, name)


def hparams(x: WhisperDims, ftype: int) -> list[int]:
    return [x.vocab_size, x.max_source_positions, x.d_model, x.encoder_attention_heads, x.encoder_layers,
            x.max_target_positions, x.d_model, x.decoder_attention_heads, x.decoder_layers, x.num_mel_bins, ftype]


def q4_1_blocks(a: np.ndarray) -> np.ndarray:
    """Q4_1 blocks of a 2-D float32 array (nvllm does not write Q4_1): per 32 values d = (max - min) / 15 and
    m = min as float16, each value's 4-bit step, the first 16 in the low nibbles, the last 16 in the high."""
    x = a.reshape(-1, 32).astype(np.float32)
    lo, hi = x.min(axis=1), x.max(axis=1)
    d = ((hi - lo) / 15).astype(np.float16)
    inv = np.where(d != 0, 1 / np.maximum(d.astype(np.float32), 1e-30), 0)
    q = np.clip(np.rint((x - lo.astype(np.float16).astype(np.float32)[:, None]) * inv[:, None]), 0, 15)
    q = q.astype(np.uint8)
    blocks = np.empty((len(x), 20), np.uint8)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = lo.astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 4:] = q[:, :16] | (q[:, 16:] << 4)
    return blocks.reshape(-1)


def blocks(type_name: str, a: np.ndarray) -> np.ndarray:
    """A 2-D float32 array's bytes in a block format, as whisper.cpp's quantize writes them."""
    if type_name == "Q4_1":
        return q4_1_blocks(a)
    return quantize(FORMATS[TYPE_IDS[type_name]], np.ascontiguousarray(a, np.float32)).reshape(-1)


def tensor_record(name: str, a: np.ndarray, type_name: str) -> bytes:
    """One tensor: n_dims, name length, type, the sizes innermost first, the name, the data."""
    raw = name.encode("utf-8")
    if type_name in ("F32", "F16"):
        data = a.astype(np.float32 if type_name == "F32" else np.float16).tobytes()
    else:
        data = blocks(type_name, a).tobytes()
    dims = struct.pack(f"<{a.ndim}i", *reversed(a.shape))
    return struct.pack("<iii", a.ndim, len(raw), TYPE_IDS[type_name]) + dims + raw + data


def tensor_type(name: str, a: np.ndarray, weights: str) -> str:
    """The type whisper.cpp's tools give a tensor in a file of `weights` (F32, F16 or a block format)."""
    if weights == "F32" or a.ndim < 2 or name in _KEEP_FLOAT:
        return "F32"
    if weights == "F16" or a.ndim != 2:
        return "F16"            # quantize only touches 2-D tensors: the conv weights stay F16
    return weights


def ggml_bytes(t: dict[str, np.ndarray], x: WhisperDims, vocab: list[bytes], weights: str = "F16",
               qnt_version: int = 2) -> bytes:
    """The file: header, mel filters (zeros: nvllm computes its own), vocabulary, tensors in `t`'s order."""
    ftype = FTYPES[weights] + (1000 * qnt_version if weights not in ("F32", "F16") else 0)
    out = [struct.pack("<I", MAGIC), struct.pack("<11i", *hparams(x, ftype)),
           struct.pack("<ii", x.num_mel_bins, 201), bytes(4 * x.num_mel_bins * 201), struct.pack("<i", len(vocab))]
    out += [struct.pack("<I", len(token)) + token for token in vocab]
    for hf, a in t.items():
        name = openai_name(hf)
        if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
            a = a.reshape(-1, 1)    # the converter keeps the conv biases [n, 1]
        out.append(tensor_record(name, a, tensor_type(name, a, weights)))
    return b"".join(out)


def write_ggml_whisper(path: Path, t: dict[str, np.ndarray], x: WhisperDims, vocab: list[bytes],
                       weights: str = "F16", qnt_version: int = 2) -> Path:
    path.write_bytes(ggml_bytes(t, x, vocab, weights, qnt_version))
    return path
