"""A CTranslate2 Whisper folder written from Hugging Face tensors, as CTranslate2's converter writes one
(python/ctranslate2/converters/transformers.py's WhisperLoader names and fuses the tensors; specs/model_spec.py
serializes them): model.bin, config.json, tokenizer.json. Written here from the format, for the reader's tests."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.model.weights.whisper_hf_config import WhisperDims

DTYPE_IDS = {"float32": 0, "int8": 1, "int16": 2, "int32": 3, "float16": 4, "bfloat16": 5}


def ct2_variables(t: dict[str, np.ndarray], x: WhisperDims) -> dict[str, np.ndarray]:
    """CTranslate2's variables of a Whisper model from its Hugging Face tensors (float32), before quantization:
    q|k|v fused with a zero k bias, the cross-attention's k|v likewise, the spec's flags as small integers."""
    v: dict[str, np.ndarray] = {}
    e, dec = "model.encoder.", "model.decoder."

    def linear(dst: str, src: str) -> None:
        v[dst + "/weight"], v[dst + "/bias"] = t[src + ".weight"], t[src + ".bias"]

    def norm(dst: str, src: str) -> None:
        v[dst + "/gamma"], v[dst + "/beta"] = t[src + ".weight"], t[src + ".bias"]

    def fused(dst: str, src: str, parts: tuple[str, ...]) -> None:
        v[dst + "/weight"] = np.concatenate([t[f"{src}.{p}_proj.weight"] for p in parts])
        v[dst + "/bias"] = np.concatenate([np.zeros(x.d_model, np.float32) if p == "k" else t[f"{src}.{p}_proj.bias"]
                                           for p in parts])

    linear("encoder/conv1", e + "conv1")
    linear("encoder/conv2", e + "conv2")
    v["encoder/position_encodings/encodings"] = t[e + "embed_positions.weight"]
    norm("encoder/layer_norm", e + "layer_norm")
    v["decoder/embeddings/weight"] = t[dec + "embed_tokens.weight"]
    v["decoder/position_encodings/encodings"] = t[dec + "embed_positions.weight"]
    norm("decoder/layer_norm", dec + "layer_norm")
    for side, hf, n_layers in (("encoder", e, x.encoder_layers), ("decoder", dec, x.decoder_layers)):
        for n in range(n_layers):
            p, h = f"{side}/layer_{n}/", f"{hf}layers.{n}."
            norm(p + "self_attention/layer_norm", h + "self_attn_layer_norm")
            fused(p + "self_attention/linear_0", h + "self_attn", ("q", "k", "v"))
            linear(p + "self_attention/linear_1", h + "self_attn.out_proj")
            if side == "decoder":
                norm(p + "attention/layer_norm", h + "encoder_attn_layer_norm")
                linear(p + "attention/linear_0", h + "encoder_attn.q_proj")
                fused(p + "attention/linear_1", h + "encoder_attn", ("k", "v"))
                linear(p + "attention/linear_2", h + "encoder_attn.out_proj")
            norm(p + "ffn/layer_norm", h + "final_layer_norm")
            linear(p + "ffn/linear_0", h + "fc1")
            linear(p + "ffn/linear_1", h + "fc2")
    flags = {"decoder/activation": (3, "int8"), "decoder/alibi": (0, "int8"), "decoder/pre_norm": (1, "int8"),
             "decoder/scale_embeddings": (0, "int8"), "decoder/start_from_zero_embedding": (0, "int8"),
             "decoder/alignment_heads": (1, "int16"), "decoder/alignment_layer": (-1, "int16"),
             "decoder/num_heads": (x.decoder_attention_heads, "int16"),
             "encoder/num_heads": (x.encoder_attention_heads, "int16")}
    for name, (value, dtype) in flags.items():
        v[name] = np.array(value, dtype=dtype)
    return v


def _quantizable(name: str) -> bool:
    """The weights CTranslate2 quantizes (LinearSpec, Conv1DSpec and EmbeddingsSpec have a weight_scale)."""
    return name.endswith("/weight")


def quantized(v: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """The variables as model_spec.py's _quantize leaves them for `dtype`: int8 weights with a float32 scale
    per output row (127 / the row's largest magnitude, the conv weights' rows flattened), float16 / float32
    everything float."""
    out = {}
    for name, a in v.items():
        if a.dtype.kind != "f":
            out[name] = a
        elif dtype == "int8" and _quantizable(name):
            rows = a.reshape(a.shape[0], -1).astype(np.float32)
            amax = np.abs(rows).max(axis=1)
            amax[amax == 0] = 127.0
            scale = (127.0 / amax).astype(np.float32)
            out[name] = np.rint(rows * scale[:, None]).astype(np.int8).reshape(a.shape)
            out[name + "_scale"] = scale
        else:
            out[name] = a.astype(np.float16 if dtype in ("float16", "int8") else np.float32)
    return out


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def model_bin(v: dict[str, np.ndarray], aliases: dict[str, str], spec: str = "WhisperSpec", revision: int = 3,
              version: int = 6) -> bytes:
    """model.bin's bytes (binary version 6: type ids and byte counts; 3+: aliases), variables in name order."""
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", revision), struct.pack("<I", len(v))]
    for name in sorted(v):
        a = np.array(v[name], order="C")   # ascontiguousarray would make a scalar 1-D
        out += [_string(name), struct.pack("<B", a.ndim), *(struct.pack("<I", n) for n in a.shape),
                struct.pack("<B", DTYPE_IDS[a.dtype.name]), struct.pack("<I", a.nbytes), a.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in sorted(aliases.items()):
        out += [_string(alias), _string(target)]
    return b"".join(out)


def write_ct2_whisper(folder: Path, t: dict[str, np.ndarray], x: WhisperDims, tokenizer_json: dict[str, Any] | None,
                      dtype: str = "float16", config: dict[str, Any] | None = None) -> Path:
    """The folder faster-whisper loads: model.bin (the projection an alias of the embeddings), config.json
    (`config`: the suppress tables), tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    v = quantized(ct2_variables(t, x), dtype)
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    (folder / "model.bin").write_bytes(model_bin(v, aliases))
    (folder / "config.json").write_text(json.dumps(config or {}) + "\n", encoding="utf-8")
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    return folder
